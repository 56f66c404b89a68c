"""Tune's in-place proposals: the target's dot-product tiles (:func:`~looprl.ir.schedules.dot_steps`)
of a problem whose inputs both store the reduction contiguously, measured as the problem is
given (``nn.Linear``'s ``mk,nk->mn``, its weight read where it lies).

:func:`dot_proposals` measures every dot-product plan (a handful: each is one action of the
plan actions) through a search context, then, for a problem of few output rows, the fastest
with its weight prefetched ahead (:func:`prefetch_variants`); which of them wins, and whether a
team of one does, is tune's to decide (``looprl.tune``). The records' actions are plan actions
of :func:`in_place_actions` (and ``prefetch_<bytes>``): they replay from the untuned nest.

A few-row kernel streams its weight from the level it lives in, reading each element once: the
hardware prefetchers start on their own only so many streams, so many lines ahead, and one
thread reaches the level's bandwidth only with more reads in flight, which software prefetches
issue (``looprl.backend.stream_kernel`` measures the bound both ways). How far ahead pays
depends on the host (its latency, its prefetchers, its line fill buffers), so the distance is
measured, never chosen: :data:`PREFETCH_DISTANCES`, the same on every host.
"""

from __future__ import annotations

import math

from looprl.actions import ActionSet, State, follow
from looprl.ir.action import PREFETCHED_TENSOR
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.plans import plan_catalogue
from looprl.ir.problem import Problem
from looprl.ir.step import PREFETCH, Step
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.context import BudgetExhausted, SearchContext

# Output rows up to which a problem's weight is streamed once per call, so prefetched: the
# few-row problems of issue 61 (decode steps, small batches).
FEW_ROWS = 16
# The distances (bytes ahead) a few-row schedule's weight is prefetched at, each one measured:
# from 8 lines to a page, host-independent (4 measurements more per problem at most).
PREFETCH_DISTANCES = (512, 1024, 2048, 4096)


def in_place_actions(target, parallel: bool = False) -> ActionSet:
    """The actions the in-place search's records replay with: the dot-product plans of
    ``target`` (and ``parallel``)."""
    return ActionSet.for_target(target, parallel=parallel, plans=tuple(p.name for p in plan_catalogue(target) if p.dot))


def dot_proposals(context: SearchContext, actions: ActionSet) -> list[ScheduleRecord]:
    """Each dot-product plan of ``actions`` (:func:`in_place_actions`) applied to the untuned
    nest and measured through ``context`` (all of them, whatever the budget), then the
    fastest's :func:`prefetch_variants` (until the budget is spent), as records found "in
    place" on one thread; plans that do not apply or compile are left out."""
    root = context.root()
    found = []
    for action, name in enumerate(actions.names):
        if name.startswith("plan_dot_"):
            node = context.child(root, action)
            if node is not None:
                found.append(ScheduleRecord(node.state.nest, node.gflops, actions.named(node.path), "in place",
                                            context.target, 1))
    best = max(found, key=lambda record: record.gflops, default=None)
    if best is not None:
        try:
            for names, state in prefetch_variants(context.problem, best.actions, actions):
                measurement = context.measure(state.nest)
                if measurement.ok:
                    found.append(ScheduleRecord(state.nest, measurement.gflops, names, "in place", context.target, 1))
        except BudgetExhausted:
            pass  # the stage ends at the deadline with what it measured
    return found


def few_rows(problem: Problem) -> bool:
    """Whether ``problem`` has at most :data:`FEW_ROWS` output rows (the output's elements
    over its last dimension's extent)."""
    return len(problem.output) >= 2 and math.prod(problem.size(d) for d in problem.output[:-1]) <= FEW_ROWS


def prefetch_loop(nest: LoopNest, ahead: int = PREFETCH_DISTANCES[0]) -> int | None:
    """The compute loop at which ``nest`` would prefetch its right operand ``ahead`` bytes: the
    outermost that takes the step (the fewest places issuing prefetches, each iteration's
    block at most :data:`~looprl.ir.nest_layouts.PREFETCH_MAX_LINES` lines), or None."""
    return next((i for i in range(len(nest.compute)) if nest.why_not(Step(PREFETCH, i, ahead, PREFETCHED_TENSOR)) is None), None)


def prefetch_variants(problem: Problem, names, actions: ActionSet) -> list[tuple[tuple[str, ...], State]]:
    """Only proposes: the schedule that the action path ``names`` reaches from ``problem``'s
    untuned nest, with its right operand prefetched at each of :data:`PREFETCH_DISTANCES` at
    :func:`prefetch_loop`, each as ``(its path: names, cursor moves, prefetch_<bytes>; the
    state)``. None for a problem of more than :data:`FEW_ROWS` rows, a path that does not
    replay, or a schedule that takes no prefetch."""
    if names is None or not few_rows(problem):
        return []
    extended = actions.extended(list(names) + [f"{PREFETCH}_{ahead}" for ahead in PREFETCH_DISTANCES])
    state = follow(extended, State(initial_nest(problem), 0), names)
    loop = None if state is None else prefetch_loop(state.nest)
    if loop is None:
        return []
    moves = extended.moves(state.cursor, loop)
    found = []
    for ahead in PREFETCH_DISTANCES:
        tail = moves + (extended.index(f"{PREFETCH}_{ahead}"),)
        reached = follow(extended, state, tail)
        if reached is not None:
            found.append((tuple(names) + extended.named(tail), reached))
    return found
