"""The thread steps of a schedule (:class:`ThreadSteps`, a part of
:class:`~looprl.ir.nest.LoopNest`): the loop ops that divide a loop's iterations among the
kernel's threads, each with its ``why_not_<op>``, and the schedule's one-thread counterpart.

* ``parallel`` marks a loop over an output dimension: its iterations write disjoint output
  elements, each summed by one thread in the serial order (bit-identical to the serial kernel).
* ``ksplit`` marks a loop over a reduction dimension of the compute nest (a *split-k*, for
  outputs too small to share out: a few rows by a few columns with a long reduction). Each
  thread sums its share of the loop's iterations into a partial output of its own (zeroed
  first); once every thread is done, the calling thread adds the partials into the
  accumulator, in thread order, and the write-back nest applies the epilogue to that sum once
  (never to a partial). The sums are associated differently from the serial kernel's (a
  thread's share, then the shares in turn): equal within float32 summation rounding, not bit
  for bit.

Both set the same mark (:attr:`Loop.parallel <looprl.ir.nest.Loop.parallel>`): a parallel loop
over a reduction dimension *is* a split-k, so the key (a ``p`` after the loop) and the printed
nest say it without another mark, a split keeps the mark on the outer loop, a swap moves it, a
merge keeps it. At most one loop per nest (compute, write-back) is parallel either way: nested
parallel loops are refused, not flattened. The ``parallel`` op (the env's action) never marks a
reduction loop; only ``ksplit`` does, and no env action takes it (tune proposes it:
:mod:`looprl.search.ksplit`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from looprl import checks

if TYPE_CHECKING:
    from looprl.ir.nest import LoopNest


class ThreadSteps:
    """The thread steps of :class:`~looprl.ir.nest.LoopNest` (which supplies ``problem``,
    ``loops``, ``compute``, ``write_back``, ``is_parallel``, ``_loop`` and ``_replace_range``)."""

    def parallel(self, index: int) -> "LoopNest":
        """Mark loop ``index`` parallel: its iterations (the tail iteration included) are
        divided among the kernel's threads. The loop must walk an output dimension (a
        reduction loop is :meth:`ksplit`'s), and no other loop of its nest (compute or
        write-back) may be parallel already: nested parallel loops are refused."""
        index = checks.integer(index, "loop index")
        return self._marked(index, self.why_not_parallel(index))

    def why_not_parallel(self, index: int) -> str | None:
        """Why :meth:`parallel` refuses loop ``index``, or None if it may be parallel."""
        index = checks.integer(index, "loop index")
        loop = self._loop(index)
        if loop.var not in self.problem.output:
            return f"it walks {loop.var!r}, a reduction dimension (threads would add into the same outputs; ksplit sums their partials)"
        return self._why_not_mark(index)

    def ksplit(self, index: int) -> "LoopNest":
        """Mark compute loop ``index``, over a reduction dimension, parallel with partial sums:
        each thread sums its share of the iterations into a partial output of its own, and the
        partials are added together before the epilogue (the module docstring). No other
        compute loop may be parallel already."""
        index = checks.integer(index, "loop index")
        return self._marked(index, self.why_not_ksplit(index))

    def why_not_ksplit(self, index: int) -> str | None:
        """Why :meth:`ksplit` refuses loop ``index``, or None if it applies."""
        index = checks.integer(index, "loop index")
        loop = self._loop(index)
        if loop.var in self.problem.output:
            return f"it walks {loop.var!r}, an output dimension (make it parallel instead)"
        return self._why_not_mark(index)

    @property
    def split_reduction(self) -> int | None:
        """The compute loop whose iterations the threads share with partial sums (the
        :meth:`ksplit` loop), or None."""
        output = self.problem.output
        return next((i for i, lp in enumerate(self.compute) if lp.parallel and lp.var not in output), None)

    def serial(self) -> "LoopNest":
        """This schedule with no parallel loop (its one-thread counterpart)."""
        if not self.is_parallel:
            return self
        unmark = lambda loops: tuple(replace(lp, parallel=False) for lp in loops)  # noqa: E731
        return replace(self, compute=unmark(self.compute), write_back=unmark(self.write_back))

    def _why_not_mark(self, index: int) -> str | None:
        """Why loop ``index`` cannot take a parallel mark, whatever its dimension."""
        loop = self.loops[index]
        if loop.parallel:
            return "it is parallel already"
        for other, lp in enumerate(self.loops):
            if lp.parallel and lp.nest == loop.nest:
                return f"loop {other} of the {loop.nest.replace('_', '-')} nest is parallel already (nested parallel loops are refused)"
        return None  # a stage at or inside it: each thread stages into its own buffer

    def _marked(self, index: int, why: str | None) -> "LoopNest":
        """This schedule with loop ``index`` (a Python int) marked parallel, or the ValueError
        ``why`` says."""
        loop = self._loop(index)
        if why is not None:
            raise ValueError(f"cannot make loop {index} ({loop.describe()}) parallel: {why}")
        return self._replace_range(index, index + 1, (replace(loop, parallel=True),))
