"""Tune's store: answers remembered in the measurement cache per host, target, problem,
threads offered and version of tune (:data:`TUNER`), so tuning the same problem again (with
no larger budget) is a lookup.

:func:`remember` and :func:`recall` are the only ways in and out, and where the busy-machine
rule (:mod:`looprl.measurement.load`) is kept: a measured tune reads the machine's load when it
starts (:func:`load_now`); an answer it finds is stored with the busier of that reading and one
taken when the search ends, so an answer found on a busy machine is remembered as provisional
(the next tune searches again, and the busy search's measurements count one sample each, so they
are timed again); a remembered answer served while the machine is quiet is timed again first,
and one that now runs below :data:`~looprl.measurement.load.BUSY_RATIO` of its recorded speed
(found while something else ran, before a quiet figure was known) is not served: tune searches
again.

A problem is remembered under its own name, and its answer from the re-laid start of a constant
weight (:class:`~looprl.ir.rewrites.Relaid`) apart from its as-stored one: under the name of the
start's coordinates problem, in those coordinates, where tune-v9 remembered its twin's answer
(so those answers, and the measurements under that name, are used as they are). Both turns
between the two forms are here: :func:`remember` and :func:`recall` given the ``relaid``
start; :func:`remembered_names` lists the names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem
from looprl.ir import rewrites
from looprl.ir.rewrites import RELAID, Relaid, replays_on
from looprl.measurement.load import LoadReading, busiest, check_load, measured_under, retime_remembered
from looprl.measurement.pair_steps import with_pairs
from looprl.tune.measurer import Measurer
from looprl.tune.results import Answer, from_relaid_start

# Remembered answers are keyed by this: bump it when what tune finds changes (an upgrade must not
# return an older version's weaker answer). 2: register tiles at the output-row loop.
# 3: two-dimensional register tiles, cache blocks and packing; budgets scaled to the problem.
# 4: the target's own register tiles measured after the policy's (decode GEMMs, q.k^T).
# 5: streaming tiles for problems of few output rows (decode GEMMs whose weights outgrow L2).
# 6: panel schedules for cold problems; a team slower than its serial schedule timed again (answers
# remembered by v5 at two threads included serial ones a noisy moment had chosen).
# 7: the policy's own answer (its unmeasured greedy episode's last state) measured first.
# 8: the default policies act with plan actions (checkpoints/clone-plans*): their answers differ.
# 9: few-row problems whose inputs both store the reduction last are also searched in place
# (dot-product tiles, looprl.search.dots), and kept unless the re-laid twin is IN_PLACE_MARGIN faster.
# (Kept at 9 when the twin became the re-laid start, a layout of the same problem: the same
# searches, the same schedules and the same winner; v9's answers are read as they were written.)
# 10: a team is returned only where it beats the serial best in interleaved rounds (v9 compared
# best samples: a team's lucky moment kept teams slower than one thread); host-derived cache blocks;
# a right operand that changes per call also gets its panels staged block by block (the stage action).
# 11: teams timed however long the serial stages took (v10 refused every team of a problem whose
# untuned execution outlasted the budget: 512x11008x4096 on two threads was remembered serial);
# few-row problems' best dot and streaming tiles also proposed with prefetches (search.dots.prefetch_variants);
# teams whose threads stage their own panels.
# 12: split-k teams (looprl.search.ksplit) proposed where the output is too small to share out.
# 13: few-row problems whose output rows fit the register-blocked tile also get deeper streaming
# tiles (looprl.search.streams: more rows of the right operand read at once); few-row problems
# with a long reduction their fastest flat tile with the reduction blocks outermost (looprl.search.kblocks).
# 14: teams on the private runtime have each thread held to a core of its own (looprl.backend.placement:
# v13's team measurements on a guest that stacked a team on one core found teams at one thread's
# speed); a team whose calling thread packs a changing right operand whole is also proposed with
# each thread packing its own panels at the parallel loop (looprl.search.parallel.staged_team).
# 15: a team that loses its duel is duelled once more, settled, where its team-stage figure (not
# only its best round) was far ahead of the serial best (v14 remembered 1x2560x960 serial at two
# threads after its team ran at the serial speed through one duel); few-row problems whose output
# fits the register-blocked tile also get their streaming tiles with the output spilled at the
# block loop (looprl.search.streams.spilled_tiles: the nest's order kept), and their teams over
# column shares spilled too; the first three team proposals are timed whatever the budget; teams
# timed while their threads did not run together are timed again once they do (tune.winner).
# 16: a cold problem's serial schedules are timed, in a tune on several threads, on the copies its
# teams read (measurement.evaluator.Evaluator.cold_threads; the serial ones read warmer copies and
# won on that), and on up to 256 copies (the cap was 64).
# 17: a packed weight's cold copies are timed on huge pages, where bound kernels now pack their
# weights (looprl.backend.weight_memory): v16 timed them on 4 KB pages, their translations cold.
# 18: a right operand that changes per call also gets its column strips, each packed the whole
# reduction deep just before its row tiles (looprl.ir.cache_blocks.strip_candidates), measured
# before its reduction blocks; a strip schedule's teams also divide its rows, the strip shared
# (looprl.search.parallel.inside_stage_variant); a team timed below the serial best is timed again.
# 19: a cold problem's packed panels are also read several side by side, measured first
# (looprl.ir.schedules.stream_panel_steps); where weights are followed, a copy's comparison is
# costed from memory where other work between calls evicts it (Measurer.comparison_seconds).
# 20: close contenders are ranked by paired scores over interleaved rounds (more of them, more
# rounds), and so are the flat register tiles before one is refined and the teams before one duels
# the serial best (looprl.measurement.duels.paired_scores).
# 21: a few-row problem's streaming tiles are measured right after the flat tiles, before their
# blocks, and the one prefetched ahead is chosen by paired rounds too (looprl.search.tiles).
TUNER = "tune-v21"


@dataclass(frozen=True)
class LoadAtStart:
    """The machine's load when a measured tune started (``reading``) and the wall-clock time
    of that moment (``since``, a ``time.time()``: the measurements written after it are the
    search's)."""

    reading: LoadReading
    since: float


def load_now(measurer: Measurer) -> LoadAtStart:
    """A reading of the machine's load for the measurer's target and threads, against the quiet
    figure of its cache (:func:`~looprl.measurement.load.check_load`: about 10 ms)."""
    since = time.time()
    reading = check_load(measurer.target, measurer.cache, threads=measurer.threads, budget_s=measurer.budget_s)
    return LoadAtStart(reading, since)


def remember(answer: Answer, measurer: Measurer, start: LoadAtStart, relaid: Relaid | None = None) -> Answer:
    """Store ``answer`` (a measured one) as tune's for its problem, target and threads offered,
    timed with the measurer's budget per schedule, with the busier of the load at ``start`` and
    the load now; an answer from the re-laid start of a constant weight, ``relaid``, under its
    coordinates (see the module docstring). On a busy machine the answer is stored as
    provisional and the search's measurements are unsettled
    (:meth:`~looprl.measurement.cache.MeasurementCache.unsettle`). Returns the answer with that
    reading (:attr:`Answer.load`)."""
    load = busiest(start.reading, load_now(measurer).reading)
    record = replace(answer.record, tuner=TUNER)
    if _apart(relaid, record.replays_on):
        record = replace(record, nest=relaid.in_coordinates(record.nest), replays_on=None)
    measurer.cache.put_tuned(measured_under(record, load), measurer.budget_s)
    if load.busy:
        measurer.cache.unsettle(start.since, measurer.target, measurer.budget_s, measurer.threads)
    return replace(answer, load=load)


def recall(measurer: Measurer, problem: Problem, least_budget_s: float, start: LoadAtStart | None = None,
           relaid: Relaid | None = None) -> Answer | None:
    """The answer an earlier measured tune of ``problem`` (given ``relaid``, the re-laid start
    of its constant weight: from that start) on the measurer's threads remembered, if it was
    found with at least ``least_budget_s``, something replays it (its action path, or its steps
    alone: a record replays without an action set; served so, the answer has no action path,
    as the search that found it had none), and it was found on a quiet machine (else None: tune
    again). Where ``start`` says the machine is quiet now, the answer is timed again first and
    not served if it runs below :data:`~looprl.measurement.load.BUSY_RATIO` of its recorded
    speed (:func:`~looprl.measurement.load.retime_remembered`). The untuned nest's speed is
    looked up (or timed) for the report."""
    stored = relaid.coordinates if _apart(relaid, RELAID) else problem
    known = measurer.cache.get_tuned(stored, measurer.target, measurer.budget_s, tuner=TUNER, threads=measurer.threads)
    if known is None or known.budget_s < least_budget_s or (known.actions is None and known.steps is None):
        return None  # (also when another IR version wrote it, or it is provisional, or nothing replays it) tune again
    try:
        known = replace(known, replays_on=replays_on(known.replays_on))
    except ValueError:
        return None  # written for a way of searching this looprl does not know: tune again
    if known.replays_on is not None and (stored is not problem or rewrites.relaid(problem) is None):
        return None  # its actions replay from a start this problem does not have: tune again
    if start is not None and not start.reading.busy and not retime_remembered(known, measurer.evaluator):
        return None  # slower now than when it was found: found during a busy moment; tune again
    root = with_pairs(initial_nest(stored), measurer.target)  # the untuned schedule as compiled
    initial = measurer.cache.get(root, measurer.target, measurer.budget_s) or measurer.evaluator(root).gflops
    answer = Answer(known, "remembered", initial, measured=measurer.compiled)
    return from_relaid_start(answer, relaid) if stored is not problem else answer


def remembered_names(problem: Problem) -> tuple[str, ...]:
    """The names tune remembers answers for ``problem`` under: its own and, for a constant
    weight with a re-laid start, that start's coordinates problem's."""
    start = rewrites.relaid(problem)
    return (problem.name,) + ((start.coordinates.name,) if _apart(start, RELAID) else ())


def _apart(relaid: Relaid | None, replays: str | None) -> bool:
    """Whether an answer replaying from ``replays`` is remembered apart, under ``relaid``'s
    coordinates: one from the re-laid start of a constant weight."""
    return relaid is not None and relaid.exact and replays == RELAID
