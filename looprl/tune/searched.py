"""What tune knows of the problem it searches, read from the IR once.

:func:`~looprl.tune.api.tune` turns the problem asked into one :class:`Searched`
(:meth:`Searched.read`) before anything is loaded or measured, and hands that to its parts: the
proposers, the fast path, the measured searches' wiring and the store read its fields (the
fused view, the re-laid start, the winner rule's row test, whether a bfloat16 weight pairs)
where each would otherwise ask the IR again, so the problem goes down into the IR in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from looprl.backend.pairs import pairs_a_weight
from looprl.ir.problem import Problem
from looprl.ir.rewrites import Relaid, plan_rewrites, relaid
from looprl.tune.winner import in_place_facts


@dataclass(frozen=True)
class Searched:
    """The problem tune searches and its facts, each computed once by the rule that owns it."""

    original: Problem  # the problem asked
    problem: Problem  # the problem searched: ``original`` or its fused view (looprl.ir.rewrites.plan_rewrites); every answer is a schedule of it
    fused: bool  # whether ``problem`` is the fused view, the answer's kernel then called through reshapes
    start: Relaid | None  # the re-laid start of the searched problem's right operand (looprl.ir.rewrites.relaid), or None
    pairs: bool  # a bfloat16 weight its kernels may take in pairs (looprl.backend.pairs.pairs_a_weight)
    few_rows: bool  # searched in place as a few-row problem (looprl.tune.winner.in_place_rows, read by in_place_facts)
    dots: bool  # dot-product tiles apply, whatever its rows (in_place_rows with no bound on rows)

    @classmethod
    def read(cls, problem: Problem) -> "Searched":
        """The facts of ``problem`` as tune searches it. Whether a weight pairs is asked of the
        problem asked: its fused view keeps its dtype and which inputs are constant."""
        pairs = pairs_a_weight(problem)
        rewrites = plan_rewrites(problem)
        searched = rewrites.searched
        start = relaid(searched)
        few_rows, dots = in_place_facts(searched)
        return cls(problem, searched, rewrites.through_fused_view, start, pairs, few_rows, dots)

    @property
    def exact_start(self) -> Relaid | None:
        """The re-laid start where the weight is re-laid once (a constant, at bind), else None:
        tune searches from it rather than from the untuned nest."""
        return self.start if self.start is not None and self.start.exact else None
