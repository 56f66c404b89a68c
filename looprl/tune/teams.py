"""Tune's teams: the best serial schedules proposed again with their outermost eligible loops
parallel (:mod:`looprl.search.parallel`), and where the output is too small to share out with
their reduction split among the threads (:mod:`looprl.search.ksplit`), measured on the threads
offered, after a search of one thread. One tail for every measured search (the policy-guided one and the in-place one),
and the fast path's split of its answer."""

from __future__ import annotations

from dataclasses import replace

from looprl.actions import ActionSet
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.ksplit import ksplit_proposals, ksplit_split_proposals
from looprl.search.parallel import parallel_proposals, split_proposals
from looprl.search.staged import Stage, StagedSearch
from looprl.tune.measurer import Measurer
from looprl.tune.results import Answer
from looprl.tune.winner import team_or_serial

# The share of a measured search's budget the teams get, after the serial stages (which keep
# their whole budget).
TEAM_SHARE = 0.25
# Teams measured however long the serial stages took (the stage's deadline moves for them): on a
# large problem the serial stages spend the whole budget (512x11008x4096: one untuned execution
# of 6.7 s against a scaled budget of 1.5 s), and a team predicted from the serial best's speed
# was then refused before any was timed, so two threads returned the serial answer (0.49x the
# libraries). Two: the team of the best's outermost output loop and one more variant.
TEAM_REFINEMENTS = 2
# Teams measured whatever the budget (the first proposals, fewest teams a call first): a few-row
# streaming tile's column shares are proposed twice, unspilled and spilled, before its panels,
# and the refinements' deadline (predicted from the serial best's speed) ended the stage after the
# first: 4x960x2560 with AVX2 code came back serial at 97 GFLOPS, where its panels ran at 135
# (informal, 2026-11-30).
TEAM_MINIMUM = 3


def with_teams(search: StagedSearch, actions: ActionSet, ranked: list[ScheduleRecord], threads: int) -> tuple[ScheduleRecord, float | None]:
    """The search's answer and its best serial schedule's speed (None on one thread). On more
    than one thread, teams are made of ``ranked`` (the serial candidates, fastest first) and
    measured in a context of the search on ``threads`` threads, in :data:`TEAM_SHARE` of its
    budget more (at least :data:`TEAM_REFINEMENTS` of them, whatever the serial stages spent, and
    the first :data:`TEAM_MINIMUM` parallel proposals whatever the budget); the winner rule (:func:`~looprl.tune.winner.team_or_serial`) returns the
    fastest team only where it beats the serial best in a duel of interleaved rounds after
    that stage (the serial speed reported is then its re-timed one)."""
    best = ranked[0]
    if threads == 1:
        return best, None
    context = search.context(actions, evaluator=search.evaluator.with_threads(threads))
    # A team is predicted from the serial schedule it is made of (the best, from_best), not from
    # the last schedule the serial stages measured: that may be a slow one (8 GFLOPS after a
    # 219 GFLOPS best), predicting a 0.5 s measurement and refusing every team.
    proposals: list[ScheduleRecord] = []

    def propose(context):
        # Split-k teams first: they are proposed only where the output is too small to share out
        # (looprl.search.ksplit), where the teams that divide it are the weaker bet.
        proposals.extend(ksplit_proposals(ranked, context, threads))
        proposals.extend(parallel_proposals(ranked, context, threads, at_least=TEAM_MINIMUM))
        return proposals

    search.run(context, Stage("parallel", propose, share=TEAM_SHARE, refinements=TEAM_REFINEMENTS, from_best=True))
    return team_or_serial(context.evaluator, best, proposals)


def split(found: Answer, measurer: Measurer) -> Answer:
    """The fast path's thread split of ``found`` (a serial answer): its parallel variants
    (those measured tune's teams are made of), each timed once on the threads offered, and
    the fastest returned only where it beats ``found`` by measured tune's rule
    (:func:`~looprl.tune.winner.team_or_serial`: a duel of interleaved rounds). A policy
    trained on one thread has no ``parallel`` action: measured tune's rule for where to divide
    the work decides."""
    team = measurer.team
    before = team.compiled
    proposed = ksplit_split_proposals(found.record, measurer.threads, measurer.target)
    proposed += split_proposals(found.record, measurer.threads, measurer.target)
    variants = [measurer.timed(variant, team) for variant in proposed]
    record, serial_gflops = team_or_serial(team, found.record, variants)
    return replace(found, record=record, measured=found.measured + team.compiled - before,
                   serial_gflops=serial_gflops if variants else found.serial_gflops)
