"""One schedule step as data: :class:`Step` (``op``, ``loop``, ``arg``), what
:meth:`LoopNest.apply <looprl.ir.nest.LoopNest.apply>` applies.

Every change of a schedule's loops is one of four ops, each a transform of
:class:`~looprl.ir.nest.LoopNest` of the same name, whose ``why_not_<op>`` says why it refuses:

* ``split``: loop ``loop`` (size s) becomes an outer loop of ``s // arg`` iterations plus a
  tail and an inner loop of ``arg`` iterations;
* ``swap``: loop ``loop`` and the next loop of its nest change places;
* ``merge``: loop ``loop`` and the next loop, a split of one dimension, become one loop again
  (the inverse of a split);
* ``parallel``: loop ``loop`` is marked parallel.

``loop`` indexes :attr:`LoopNest.loops <looprl.ir.nest.LoopNest.loops>` (compute loops, then
write-back loops); only a split has an ``arg``, its factor. A step is legal where its transform
does not refuse it (:meth:`LoopNest.why_not <looprl.ir.nest.LoopNest.why_not>`). An env action
names a step relative to the cursor (:meth:`looprl.actions.Action.step`); the searches,
the hand-written schedules and the plans build steps; AutoTVM's annealing proposes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from looprl import checks

SPLIT, SWAP, MERGE, PARALLEL = "split", "swap", "merge", "parallel"
OPS = (SPLIT, SWAP, MERGE, PARALLEL)
# The split factors an action or a search may name (the IR itself takes any factor from 2):
# wide enough for cache blocks (k blocks of 256, n blocks of 512).
MIN_FACTOR, MAX_FACTOR = 2, 512


@dataclass(frozen=True)
class Step:
    """One transform of a schedule: ``op`` (one of :data:`OPS`) at loop ``loop``; ``arg`` is a
    split's factor (0 for the other ops). Python and numpy integers are taken alike."""

    op: str
    loop: int
    arg: int = 0

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown transform {self.op!r}; expected one of {', '.join(OPS)}")
        # Plain ints (what the actions and searches pass, on env.step's path) are taken as they
        # are; anything else (numpy integers, bools) goes through the one integer check.
        if type(self.op) is not str:
            object.__setattr__(self, "op", str(self.op))
        if type(self.loop) is not int:
            object.__setattr__(self, "loop", checks.integer(self.loop, "loop index"))
        if type(self.arg) is not int:
            object.__setattr__(self, "arg", checks.integer(self.arg, "split factor" if self.op == SPLIT else "step argument"))
        if self.op != SPLIT and self.arg != 0:
            raise ValueError(f"only a split takes an argument: {self.op} of loop {self.loop} with {self.arg}")

    @property
    def args(self) -> tuple[int, ...]:
        """The transform's arguments: ``(loop, factor)`` for a split, else ``(loop,)``."""
        return (self.loop, self.arg) if self.op == SPLIT else (self.loop,)

    def __str__(self) -> str:
        return f"{self.op}({', '.join(map(str, self.args))})"
