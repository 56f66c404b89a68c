"""Tune's in-place search: the target's dot-product tiles (:func:`~looprl.ir.schedules.dot_steps`)
of a problem whose inputs both store the reduction contiguously, measured as the problem is
given (``nn.Linear``'s ``mk,nk->mn``, its weight read where it lies), and with threads their
parallel variants (each thread a share of the output's columns: half the weight each).

:func:`in_place_search` measures every dot-product plan (a handful: each is one action of the
plan actions), confirms the winner among the close ones and, on more than one thread, the
parallel proposals of the best against it, by the rules of the rest of tune's search
(:func:`~looprl.search.staged.confirm_winner`, :func:`~looprl.search.parallel.
parallel_proposals`). The records' actions are plan actions of :func:`in_place_actions`: they
replay from the untuned nest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from looprl.actions import ActionSet
from looprl.ir.plans import plan_catalogue
from looprl.ir.problem import Problem
from looprl.ir.schedules import why_not_dot
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.parallel import parallel_proposals
from looprl.search.staged import CONTENDER_ROUNDS, CONTENDER_WITHIN, TEAM_WITHIN, Stage, StagedSearch, confirm_winner

# Problems with at most this many output rows are searched in place too: a decode step's few
# rows stream the weight once, bound by its bandwidth, where a dot-product tile reads it as fast
# as a re-laid copy and keeps no copy. Above it the register tiles' broadcasts win (two loads
# per multiply-add in a dot-product tile against one per few in a register tile).
IN_PLACE_ROWS = 16


def in_place_rows(problem: Problem, most: int | None = IN_PLACE_ROWS) -> bool:
    """Whether ``problem`` is searched in place: dot-product tiles apply and its output rows
    (all but the last dimension) are at most ``most`` (None: any number; tune's choice where
    the weights may change between calls, and a re-laid copy of them costs a comparison)."""
    return why_not_dot(problem) is None and (most is None or math.prod(problem.output_shape[:-1]) <= most)


def in_place_actions(target, parallel: bool = False) -> ActionSet:
    """The actions the in-place search's records replay with: the dot-product plans of
    ``target`` (and ``parallel``)."""
    return ActionSet.for_target(target, parallel=parallel, plans=tuple(p.name for p in plan_catalogue(target) if p.dot))


@dataclass(frozen=True)
class InPlaceResult:
    """The in-place search's best (``None``: no dot-product tile compiled), the best serial
    schedule's speed, the untuned nest's, and what the search measured and waited."""

    best: ScheduleRecord | None
    serial_gflops: float | None
    initial_gflops: float
    measured: int
    waited_s: float


def in_place_search(problem: Problem, evaluator, threads: int = 1) -> InPlaceResult:
    """Measure ``problem``'s dot-product tiles (all of them, whatever the budget: there are a
    handful), the winner confirmed among the close ones, then with ``threads`` > 1 their
    parallel variants against the serial best. ``evaluator``: tune's."""
    target = evaluator.target
    actions = in_place_actions(target, parallel=threads > 1)
    search = StagedSearch(problem, evaluator, budget_s=math.inf)
    context = search.context(actions)
    root = context.root()
    plan_actions = [index for index, name in enumerate(actions.names) if name.startswith("plan_dot_")]

    def dots(context):
        found = []
        for action in plan_actions:
            node = context.child(root, action)
            if node is not None:
                found.append(ScheduleRecord(node.state.nest, node.gflops, tuple(actions.names[a] for a in node.path), "in place", target, 1))
        return found

    search.run(context, Stage("in place", dots, share=math.inf))
    ranked = confirm_winner(context, search.candidates, within=CONTENDER_WITHIN, rounds=CONTENDER_ROUNDS).ranked
    if not ranked:
        return InPlaceResult(None, None, root.gflops, search.new_measurements, search.waited_s)
    best, serial = ranked[0], ranked[0].gflops
    if threads > 1:
        team_context = search.context(actions, evaluator=evaluator.with_threads(threads))
        proposals = []
        search.run(team_context, Stage("parallel", lambda c: proposals.extend(parallel_proposals(ranked, c, threads)) or proposals,
                                       share=math.inf))
        if proposals:
            best = confirm_winner(team_context, [best] + proposals, within=TEAM_WITHIN, rounds=CONTENDER_ROUNDS).ranked[0]
    return InPlaceResult(best, serial, root.gflops, search.new_measurements, search.waited_s)
