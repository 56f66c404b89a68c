"""The one place a schedule gets the pair step of its bfloat16 weight.

A schedule is a problem and its steps, and the nest handed to the code generator carries every
layout: the code generator decides none. A bfloat16 problem whose second input is a weight
computes at twice the float32 rate where its kernel takes the reduction in pairs
(:mod:`looprl.backend.pairs`), which needs the weight stored paired: a ``pair`` step. The
searches' actions have no such step (the policies were trained on float32), so whatever makes a
schedule to compile or measure adds it here: :func:`with_pairs`, asked by the producers of
schedules (the search context, the rollouts and the environment, tune's measurer, a record of a
schedule for a target, the replay of an action path) with the target the code is made for.
Where the kernel can pair is the code generator's capability (:func:`~looprl.backend.pairs.pair_step`:
its rule needs the register plan); adding the step is decided here, never in the backend.
"""

from __future__ import annotations

from functools import lru_cache

from looprl.backend.pairs import pair_step, pairs_a_weight
from looprl.ir.nest import LoopNest
from looprl.ir.step import Step
from looprl.target import Target


def added_pairs(nest: LoopNest, target: Target | None) -> tuple[Step, ...]:
    """The steps :func:`with_pairs` adds to ``nest``: the pair step of its bfloat16 weight where
    its kernel for ``target`` can take the reduction in pairs
    (:func:`~looprl.backend.pairs.pair_step`, remembered per schedule and target), else none (a
    nest paired already, a schedule the rule does not admit, no target; a problem that cannot
    pair, the float32 ones, answered at once: every env step and every measurement asks)."""
    if target is None or not pairs_a_weight(nest.problem):
        return ()
    step = pair_step(nest, target)
    return () if step is None else (step,)


def with_pairs(nest: LoopNest, target: Target | None) -> LoopNest:
    """``nest`` as the schedule to compile for ``target``: with :func:`added_pairs` applied, so
    its kernel pairs wherever it can; any other nest as it is (the float32 ones at once)."""
    if target is None or not pairs_a_weight(nest.problem):
        return nest
    return _paired(nest, target)


@lru_cache(maxsize=4096)  # asked once per schedule by each producer that measures or records it
def _paired(nest: LoopNest, target: Target) -> LoopNest:
    step = pair_step(nest, target)  # with_pairs has answered a problem that cannot pair
    return nest if step is None else nest.apply((step,))
