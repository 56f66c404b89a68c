"""The one winner rule of ``looprl.tune``: every choice between candidates the proposers
found and the measurer timed, with the rules' constants.

* Among a search's stage winners (and the tiles stage's runners-up, :data:`TILE_CONTENDERS`):
  the contenders within :data:`CONTENDER_WITHIN` of the fastest are timed again in interleaved
  rounds and ranked by their paired scores before one is returned (:func:`confirmed`).
* Teams against the serial best they were made of, in measured tune and in the fast path's
  split alike: the fastest team is returned only where it wins a duel of interleaved rounds
  against the serial best, by :data:`TEAM_MARGIN` (:func:`team_or_serial`).
* The policy alone (the fast path): the fastest of its timed proposals, the earliest among
  equals (:func:`fastest`).
* A linear layer's weight read where it lies, or through a re-laid copy: which problems are
  searched from the weight as stored as well as from its re-laid start
  (:class:`~looprl.ir.rewrites.Relaid`; :data:`IN_PLACE_ROWS`, :data:`COMPARISON_SHARE`,
  :func:`searches_in_place`), what the as-stored episode may not do where weights change
  (:func:`relaying_actions`), and which of one problem's schedules is returned: the one rule
  :func:`preferred` (a schedule that reads a re-laid copy of a constant input,
  :func:`reads_a_copy`, pays the copy's comparison where weights are followed, and must beat
  the fastest schedule that keeps no copy by :data:`IN_PLACE_MARGIN`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable

from looprl.actions import ActionSet
from looprl.actions.action_set import LAYOUT_ACTIONS
from looprl.backend.placement import places_teams
from looprl.ir.plans import Plan
from looprl.ir.problem import Problem
from looprl.ir.nest import LoopNest
from looprl.ir.schedules import why_not_dot
from looprl.measurement.duels import chosen_in_rounds, schedule_duel
from looprl.measurement.load import OTHERS_BUSY_CORES, TEAM_SETTLE_S, others_busy, team_runs_now, wait_for_teams
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.context import SearchContext
from looprl.search.dots import FEW_ROWS
from looprl.search.staged import StagedSearch
from looprl.tune.results import Answer

# Stage winners this close to the best (at most CONTENDERS of them) are timed again together, in
# CONTENDER_ROUNDS to CONTENDER_MAX_ROUNDS interleaved rounds (as many as CONFIRM_SHARE of the
# search's budget pays for), and ranked by their timings over each round's fastest
# (looprl.measurement.duels.paired_scores) before one is returned: a first timing that caught the
# machine's slow phase must not decide (two tune calls on one problem should return kernels of the
# same speed). On a 2-vCPU Zen 3 whose L3 other guests share, four fresh tunes of 32x1000x1280
# answered with schedules that, timed again together, ran at 0.67-0.85 of the fastest schedule the
# tunes had measured between them (experiments/results/issue61/stability_v20_znver3/
# tune_candidates_znver3_v19.txt): 0.9 and two rounds of the best samples kept too few contenders
# and let one lucky sample decide.
CONTENDER_WITHIN = 0.75
CONTENDERS = 5
CONTENDER_ROUNDS = 3
CONTENDER_MAX_ROUNDS = 6
CONFIRM_SHARE = 0.5
# The tiles stage offers its runners-up within CONTENDER_WITHIN too, up to this many schedules in
# all: on a Zen 3 whose shared L3 made one kernel's timings move by 20% from second to second, a
# stage that kept its fastest timing alone returned a different answer on every tune.
TILE_CONTENDERS = 4
# A team is returned only where it beats the serial best it was made of by this much, in the rounds
# of a duel and at best (looprl.measurement.duels): a team takes every core offered, and a near-tie
# goes to the kernel that leaves the other cores free. 5%: what two timings of one kernel differ
# by (torch.routes).
TEAM_MARGIN = 0.05
# Problems with at most this many output rows are searched in place too: a decode step's few
# rows stream the weight once, bound by its bandwidth, where a dot-product tile reads it as fast
# as a re-laid copy and keeps no copy. Above it the register tiles' broadcasts win (two loads
# per multiply-add in a dot-product tile against one per few in a register tile). The same few
# rows whose weight the searches prefetch (looprl.search.dots.FEW_ROWS): one rule, one number.
IN_PLACE_ROWS = FEW_ROWS
# Where the weights may change, a problem of more rows than IN_PLACE_ROWS is searched in place
# too when comparing the re-laid start's copy would cost at least this share of its call: below it
# the in-place answer would have to win on speed alone, which dot-product tiles do not at many
# rows (two loads per multiply-add), and its search would cost measurements for nothing (at 512
# rows of 640->1920 the comparison is 0.5% of the call; at 64 rows, 4%).
COMPARISON_SHARE = 0.02
# A schedule that keeps no copy of a weight is kept unless one that reads a re-laid copy is at
# least this much faster: the copy is one a model must keep in step with the weight (compared
# on every call unless frozen); a near-tie goes to the schedule that keeps nothing.
# 5%: what two timings of one kernel differ by (torch.routes).
IN_PLACE_MARGIN = 0.05
# A team that lost its duel is duelled once more, settled, where its best round or its figure from
# the team stage was this many times the serial best's speed: a bimodal team (full speed while
# both cores were its own).
BIMODAL_RATIO = 1.5
# The teams timed again once a team's threads run together again, where the serial best was
# returned while they did not (team_or_serial), at most TEAM_RETRIES times: in one run of the
# models benchmark (Zen 4, 2026-11-30) 128x320x960's teams, timed again once a reading found the
# threads together, ran at the serial speed again (113.8 GFLOPS against the stage's 218.0).
TEAMS_RETIMED = 3
TEAM_RETRIES = 3


def confirmed(search: StagedSearch, context: SearchContext) -> list[ScheduleRecord]:
    """The search's candidates ranked, the contenders re-timed in interleaved rounds and first
    in the order of their paired scores (as many rounds and contenders as :data:`CONFIRM_SHARE`
    of the search's budget pays for), the rest fastest first."""
    return search.confirm(context, within=CONTENDER_WITHIN, rounds=CONTENDER_ROUNDS, max_rounds=CONTENDER_MAX_ROUNDS, most=CONTENDERS,
                          max_cost_s=CONFIRM_SHARE * search.budget_s).ranked


def team_or_serial(evaluator, serial: ScheduleRecord, teams: Iterable[ScheduleRecord], retries: int = TEAM_RETRIES) -> tuple[ScheduleRecord, float]:
    """The answer of a tune on more threads than one, and the serial best's speed as last
    timed: the fastest of ``teams`` (each timed on the threads offered) where it wins the duel
    against ``serial`` (:func:`~looprl.measurement.duels.schedule_duel` through ``evaluator``,
    which times a team on its threads and a serial schedule on one: interleaved rounds until a
    sign test tells them apart, the team shown faster by :data:`TEAM_MARGIN` in the rounds and
    at best), else ``serial``. A team whose figure is not above the serial best's is timed once
    more beside it, and not duelled where it is still not above (the serial best returned). Each side returned carries the measurement
    cache's figure for its schedule, the duel's rounds included.

    Why a duel: a team is slowed by anything on any of its cores, so its timings on a shared
    machine are bimodal (both cores free, or one taken), and its best sample is a lucky one.
    Ranked by best samples, 32x1000x1280 on two threads returned a team at 38.9 GFLOPS where
    its own one-thread answer ran at 55.3 (a 2-vCPU Zen 3); on a busy 2-vCPU Zen 4 the same
    problem's team timed 207 GFLOPS at best and 105 at the median, its serial best 113.

    A team that loses its duel while its best round, or its figure from the team stage, ran
    :data:`BIMODAL_RATIO` times the serial best's speed or more is duelled once more after running alone for
    :data:`~looprl.measurement.load.TEAM_SETTLE_S`, and that duel decides: in one run of
    ``looprl-bench tune --dataset models --split test --threads 1,2`` on a quiet Zen 4 three
    compute-bound GEMMs came back serial (0.51x the libraries at two threads) where alone they
    returned teams at 2.0x their serial speed (the benchmark's peers stay up in child processes
    whose threads had just run). The team stage's figure counts too: in a later run (Zen 4,
    2026-11-30) 1x2560x960's team timed 73.1 GFLOPS in its stage against the serial best's 42.4,
    then ran at the serial speed in all four rounds of its duel (best 40.0), and the answer came
    back serial (0.54x the libraries at two threads).

    Where the serial best is returned though teams were timed, looprl places its teams
    (:func:`~looprl.backend.placement.places_teams`: elsewhere teams may share a core for good,
    and waiting would not end it), and a team's threads do not run
    together just now while no other process keeps a core busy
    (:func:`~looprl.measurement.load.team_runs_now`, :func:`~looprl.measurement.load.others_busy`:
    a busy machine's answer is its load's business, :mod:`looprl.measurement.load`; on a 2-vCPU guest a pool
    thread woken late left whole seconds of team timings at one thread's speed, every team of a
    problem then timed no faster than its serial best), tune waits until they do
    (:func:`~looprl.measurement.load.wait_for_teams`, at most
    :data:`~looprl.measurement.load.TEAM_WAIT_S`), times the :data:`TEAMS_RETIMED` fastest teams
    again and applies the rule again, up to ``retries`` times: a reading that found the threads
    together can fall just before another such spell."""
    timed = [record for record in teams if record.nest is not None and record.gflops > 0]
    chosen = _duelled(evaluator, serial, timed)
    returned_serial = chosen[0].nest is None or not chosen[0].nest.is_parallel
    if (retries > 0 and timed and returned_serial and places_teams()
            and not team_runs_now(evaluator.target, evaluator.threads, evaluator.timing_lock) and others_busy() < OTHERS_BUSY_CORES):
        # The team's threads did not run together just now with no other process in the way (a
        # pool thread woken late): its figures may be one thread's. Once they do, the fastest
        # teams are timed again and judged again.
        if wait_for_teams(evaluator.target, evaluator.threads, evaluator.timing_lock):
            retimed = [record.with_gflops(evaluator.remeasure(record.nest).gflops) for record in sorted(timed, key=lambda r: -r.gflops)[:TEAMS_RETIMED]]
            return team_or_serial(evaluator, serial, retimed, retries - 1)
    return chosen


def _duelled(evaluator, serial: ScheduleRecord, timed: list[ScheduleRecord]) -> tuple[ScheduleRecord, float]:
    """:func:`team_or_serial`'s rule once, on the teams ``timed`` (each with a schedule and a figure)."""
    team = _confirmed_team(evaluator, timed)
    if team is None or serial.nest is None:
        return serial, serial.gflops
    if not team.gflops > serial.gflops:
        # One more timing each, side by side: the team's figure may come from a slow moment
        # the serial best's did not see (4x960x2560 on a Zen 3 came back serial at 40 GFLOPS in
        # one of three tunes, teams at 71-75 in the others).
        team = team.with_gflops(evaluator.remeasure(team.nest).gflops)
        serial = serial.with_gflops(evaluator.remeasure(serial.nest).gflops)
        if not team.gflops > serial.gflops:
            return serial, serial.gflops
    duel = schedule_duel(evaluator, team.nest, serial.nest, TEAM_MARGIN)
    far_ahead = duel.incumbent_s >= BIMODAL_RATIO * duel.challenger_s or team.gflops >= BIMODAL_RATIO * serial.gflops
    if not duel.shown_faster(TEAM_MARGIN) and far_ahead:
        duel = schedule_duel(evaluator, team.nest, serial.nest, TEAM_MARGIN, settle_s=TEAM_SETTLE_S)  # its best far ahead: once more, settled
    team_gflops, serial_gflops = _cached(evaluator, team), _cached(evaluator, serial)  # the duel decides, the cache says how fast
    if duel.shown_faster(TEAM_MARGIN):
        return team.with_gflops(team_gflops), serial_gflops
    return serial.with_gflops(serial_gflops), serial_gflops


def _confirmed_team(evaluator, timed: list[ScheduleRecord]) -> ScheduleRecord | None:
    """The team that duels the serial best: the fastest of ``timed`` by one timing each, or,
    where others came within :data:`CONTENDER_WITHIN` of it, the best by paired scores over
    :data:`CONTENDER_ROUNDS` interleaved rounds of the :data:`CONTENDERS` fastest, as among the
    serial stage winners (:func:`confirmed`): on a 2-vCPU Zen 3, a team's timings move with
    what the host's other guests run on both cores, and six tunes of 1x4864x896 on two threads
    returned five teams that ran at 24 to 40 GFLOPS and one serial answer (informal, 2026-12-01)."""
    if not timed:
        return None
    chosen, in_rounds = chosen_in_rounds(timed, lambda r: r.gflops, lambda r: r.nest, evaluator.remeasure, CONTENDER_WITHIN,
                                         CONTENDERS, CONTENDER_ROUNDS)
    if not in_rounds:
        return chosen  # its figure as timed
    return chosen.with_gflops(_cached(evaluator, chosen))  # timed again: the cache's figure, the rounds included


def _cached(evaluator, record: ScheduleRecord) -> float:
    """The measurement cache's figure of ``record``'s schedule on ``evaluator``'s threads (its
    timings, the duel's rounds included: every figure tune reports is the cache's), or the
    record's own where the cache has none."""
    known = evaluator.cache.lookup(record.nest, evaluator.target, evaluator.budget_s, evaluator.threads)
    return known.gflops if known is not None and known.gflops > 0 else record.gflops


def fastest(records: Iterable[ScheduleRecord]) -> ScheduleRecord | None:
    """The fastest of timed proposals, the earliest among equals (None: none)."""
    best = None
    for record in records:
        best = record if best is None or record.gflops > best.gflops else best
    return best


def in_place_rows(problem: Problem, most: int | None = IN_PLACE_ROWS) -> bool:
    """Whether ``problem`` is searched in place: dot-product tiles apply and its output rows
    (all but the last dimension) are at most ``most`` (None: any number; tune's choice where
    the weights may change between calls, and a re-laid copy of them costs a comparison)."""
    return why_not_dot(problem) is None and (most is None or _rows(problem) <= most)


def in_place_facts(problem: Problem) -> tuple[bool, bool]:
    """``(in_place_rows(problem), in_place_rows(problem, None))``: whether ``problem`` is
    searched in place as a few-row problem, and whether dot-product tiles apply at all, the IR
    asked once."""
    few = _rows(problem) <= IN_PLACE_ROWS
    dots = why_not_dot(problem) is None
    return dots and few, dots


def _rows(problem: Problem) -> int:
    """The output rows of ``problem``: all its output's dimensions but the last."""
    return math.prod(problem.output_shape[:-1])


def relaying_actions(actions: ActionSet) -> frozenset[str]:
    """The actions that re-lay an operand (the layout actions and the plans that pack): barred
    from the fast path's in-place episode where the weights change."""
    plans = {name for name in actions.names if (plan := Plan.parse(name)) is not None and plan.packed}
    return frozenset(plans | {name for name in actions.names if name in LAYOUT_ACTIONS})


def searches_in_place(problem: Problem | None, answer: Answer, compare_s: float) -> bool:
    """Whether tune searches ``problem`` (or None) from its weight as stored too, the re-laid
    start's ``answer`` in hand: few rows always; more where the comparison ``compare_s`` of the
    answer's copy is :data:`COMPARISON_SHARE` of its call or more."""
    if problem is None:
        return False
    if in_place_rows(problem):
        return True
    call_s = problem.flops / (answer.gflops * 1e9) if answer.gflops > 0 else math.inf
    return compare_s >= COMPARISON_SHARE * call_s


def reads_a_copy(nest: LoopNest) -> bool:
    """Whether ``nest``'s kernel reads a re-laid copy of a constant input (made once, at bind:
    a copy a model keeps in step with the weight)."""
    return any(tensor in nest.problem.constant for tensor, _ in nest.layouts)


def preferred(answers: Iterable[Answer | None], compare_s: float = 0.0) -> Answer:
    """The one winner rule between answers for one problem (None entries left out; every
    search counted in the answer returned). Each answer's call costs its measured time plus,
    where it reads a re-laid copy of a constant input (:func:`reads_a_copy`), ``compare_s``
    (the copy's comparison where weights are followed; 0 where constant means constant). The
    fastest by that cost among the answers keeping no copy, and the fastest among those
    reading one (earliest among equals), are compared: the copy wins only where it is
    :data:`IN_PLACE_MARGIN` faster; with only one kind, the fastest of it."""
    found = [answer for answer in answers if answer is not None]
    if not found:
        raise ValueError("preferred needs at least one answer")

    def gflops(answer: Answer) -> float:
        if answer.gflops <= 0:
            return 0.0
        if not reads_a_copy(answer.nest):
            return answer.gflops
        flops = answer.nest.problem.flops
        return flops / (flops / (answer.gflops * 1e9) + compare_s) / 1e9

    def best(kind: list[Answer]) -> Answer | None:
        chosen = None
        for answer in kind:
            chosen = answer if chosen is None or gflops(answer) > gflops(chosen) else chosen
        return chosen

    copy, kept = best([a for a in found if reads_a_copy(a.nest)]), best([a for a in found if not reads_a_copy(a.nest)])
    if copy is None or kept is None:
        chosen = copy or kept
    else:
        chosen = copy if gflops(copy) >= (1.0 + IN_PLACE_MARGIN) * gflops(kept) else kept
    if len(found) == 1:
        return chosen
    return replace(chosen, measured=sum(a.measured for a in found), waited_s=sum(a.waited_s for a in found))
