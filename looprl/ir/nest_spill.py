"""The spill step of a schedule (:class:`SpillSteps`, a part of :class:`~looprl.ir.nest.LoopNest`):
``spill`` marks a compute loop over a reduction dimension whose every iteration stores the
output tile to the accumulator and loads it again at the next, so that the code generator's
register scope (:mod:`looprl.backend.register_plan`) lies inside the loop.

Why it is a step. Where a whole output tile is at most a few register files
(:data:`~looprl.backend.register_plan.BLOCKED_TILE_FLOATS`), the code generator keeps each
register block's accumulators in registers across the whole reduction, whatever the nest's
loop order: the right choice where each block reuses what it reads, and the wrong one for a
few-row GEMM bound by reading its right operand. There ``1 x 960`` outputs (one row of
``B[k, n]`` is 960 floats) were read a register block's width at a time, every block over all
2560 rows of ``B``, a stream of one cache line per 3840-byte row: 35.6 GFLOPS with AVX2 code on
a Zen 4, against 42.6 for the nest's own order (``k/8, n/16, k8, n16``: eight rows of ``B``
read front to back at once, the output reloaded once per block of eight; numpy 39.4; informal,
one thread, beside other work). The mark says which order the schedule means, so both kernels
are reachable and the measurements choose.

The mark shows in the printed nest (``spill for k ...``) and as a ``~`` after the loop in
:attr:`LoopNest.key <looprl.ir.nest.LoopNest.key>` (keys of unmarked schedules are unchanged);
a split keeps it on the outer loop (the blocks), a swap moves it with its loop, a merge keeps
it. At most one compute loop is spilled. Sums run in the nest's order either way: a spilled
kernel's result is the unmarked kernel's within float32 summation rounding."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from looprl import checks

if TYPE_CHECKING:
    from looprl.ir.nest import LoopNest


class SpillSteps:
    """The spill step of :class:`~looprl.ir.nest.LoopNest` (which supplies ``problem``,
    ``loops``, ``compute``, ``_loop`` and ``_replace_range``)."""

    def spill(self, index: int) -> "LoopNest":
        """Mark compute loop ``index``, over a reduction dimension, spilled: the output tile is
        stored and reloaded at each of its iterations (the module's text)."""
        index = checks.integer(index, "loop index")
        loop = self._loop(index)
        why = self.why_not_spill(index)
        if why is not None:
            raise ValueError(f"cannot spill at loop {index} ({loop.describe()}): {why}")
        return self._replace_range(index, index + 1, (replace(loop, spilled=True),))

    def why_not_spill(self, index: int) -> str | None:
        """Why :meth:`spill` refuses loop ``index``, or None if it applies."""
        index = checks.integer(index, "loop index")
        loop = self._loop(index)
        if loop.is_write_back:
            return "it is a write-back loop (only a compute loop runs the reduction)"
        if loop.var in self.problem.output:
            return f"it walks {loop.var!r}, an output dimension (only a reduction loop carries the output tile across iterations)"
        if any(lp.spilled for lp in self.compute):
            return "a compute loop is spilled already (at most one is)"
        return None

    @property
    def spilled_loop(self) -> int | None:
        """The spilled compute loop's index, or None."""
        return next((i for i, lp in enumerate(self.compute) if lp.spilled), None)
