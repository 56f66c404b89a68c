"""Tune's split-k proposals: where a problem's output is too small to share out among the
threads offered, the best serial schedules with their reduction divided among the threads
instead (:meth:`LoopNest.ksplit <looprl.ir.nest.LoopNest.ksplit>`: each thread sums its share
into a partial output, the partials added before the epilogue), measured on those threads
beside the other parallel proposals (:mod:`looprl.search.parallel`); the winner rule decides.

**When.** A team that divides the output hands each thread whole register tiles (a parallel
loop's iterations are tiles or blocks of them), so with fewer than :data:`MANY
<looprl.search.parallel.MANY>` tiles per thread its shares are coarse (one thread takes a tile
more: a third more work at three tiles each) or a thread's part no longer fills a tile. That is
the problem and target's rule (:func:`shares_out`): the output's elements per thread against
:data:`MANY` of the target's largest register tile (:meth:`Target.register_tiles
<looprl.target.Target.register_tiles>`, rows x vectors x lanes). A 8x64 output on two threads is
256 elements a thread: below 4 tiles on AVX-512 (448 elements each) and on AVX2 (96). A split
needs a reduction long enough that the final sum (one addition per partial per output element,
by the calling thread) stays small: at least :data:`MIN_SHARE` terms per thread.

**How.** Of each serial schedule, the outermost reduction loop: made parallel where it is the
compute nest's outermost loop and has an iteration per thread (moved there first where the nest
has :data:`~looprl.defaults.MAX_LOOPS` loops already); else split into one share per thread (an
outer loop of ``threads`` iterations), that outer loop moved outermost and made parallel
(:func:`ksplit_variant`): one team per call, each thread walking its share of the
reduction in the serial schedule's order, the write-back serial (the output is small). The split
takes at most :data:`~looprl.ir.step.MAX_FACTOR` iterations a share (more shares than threads
where the loop is longer: the team still takes contiguous, balanced shares), so that the
proposal's record replays as actions: the candidate's, then the split, the swaps and ``ksplit``
(an action of a set extended by a path that names it, never of the env's:
:mod:`looprl.actions.action_set`)."""

from __future__ import annotations

import math
from dataclasses import replace

from looprl.defaults import MAX_LOOPS
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem
from looprl.ir.step import KSPLIT, MAX_FACTOR, SPLIT, SWAP, Step
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.context import BudgetExhausted, SearchContext
from looprl.search.parallel import MANY, action_path, best_serial_gflops, timed_team
from looprl.target import Target

FOUND_BY = "parallel"  # how a split-k team is found: by the team stage, as the other teams
# Terms of the reduction each thread sums at least: the final sum adds one term per thread to
# each output element, under 1% of a two-thread team's work (2 / 256).
MIN_SHARE = 256


def tile_elements(target: Target) -> int:
    """Output elements of ``target``'s largest register tile (rows x vectors x lanes)."""
    rows, vectors = target.register_tiles()[0]
    return rows * vectors * target.vector_width


def shares_out(problem: Problem, target: Target, threads: int) -> bool:
    """Whether ``problem``'s output gives each of ``threads`` threads at least :data:`MANY` of
    ``target``'s largest register tiles (the module docstring): else a split-k is proposed."""
    return math.prod(problem.output_shape) >= threads * MANY * tile_elements(target)


def splits_reduction(problem: Problem, target: Target, threads: int) -> bool:
    """Whether tune proposes split-k teams of ``problem`` on ``threads`` threads for ``target``:
    an output too small to share out, a reduction of at least :data:`MIN_SHARE` terms a thread."""
    reduction = math.prod(problem.size(d) for d in problem.reduction_dims)
    return threads > 1 and reduction >= threads * MIN_SHARE and not shares_out(problem, target, threads)


def ksplit_variant(nest: LoopNest, threads: int) -> tuple[LoopNest, tuple[Step, ...]] | None:
    """``nest`` (made serial) with its outermost reduction loop divided among ``threads``
    threads with partial sums, in one team per call (the module docstring): ``(the nest, the
    steps from the serial nest that reach it)``, or None where there is no reduction loop or a
    step is refused."""
    serial = nest.serial()
    output = serial.problem.output
    index = next((i for i, lp in enumerate(serial.compute) if lp.var not in output), None)
    if index is None:
        return None
    loop = serial.compute[index]
    hoisted = tuple(Step(SWAP, at) for at in range(index - 1, -1, -1)) + (Step(KSPLIT, 0),)
    if loop.iterations >= threads and (index == 0 or len(serial.loops) >= MAX_LOOPS):
        steps = hoisted  # (a split past MAX_LOOPS would not replay as an action)
    else:
        factor = min(math.ceil(loop.size / threads), MAX_FACTOR)  # (a split an action can name: the path replays)
        if factor < 2 or factor >= loop.size:
            return None  # (no split leaves more than one share)
        steps = (Step(SPLIT, index, factor),) + hoisted
    reached = serial
    for step in steps:
        if reached.why_not(step) is not None:
            return None
        reached = reached.apply((step,))
    return reached, steps


def ksplit_records(candidates, threads: int, target) -> list[ScheduleRecord]:
    """The split-k team of each of ``candidates`` (serial records, best first) that has a
    :func:`ksplit_variant` (duplicates skipped), unmeasured (speed NaN), its
    steps the candidate's and the variant's (None where the candidate has none), its actions
    the candidate's and those of the variant's steps (None where they do not replay), found by
    :data:`FOUND_BY` on ``threads`` threads; none where :func:`splits_reduction` says no (a
    ``target`` of None: the default target)."""
    target = Target.resolve(target)
    found, seen = [], set()
    for candidate in candidates:
        if candidate.nest is None or not splits_reduction(candidate.problem, target, threads):
            continue
        variant = ksplit_variant(candidate.nest, threads)
        if variant is None or variant[0].key in seen:
            continue
        seen.add(variant[0].key)
        steps = None if candidate.steps is None else candidate.steps + variant[1]
        actions = None if candidate.actions is None else action_path(candidate.nest, tuple(candidate.actions), variant[1], target)
        found.append(ScheduleRecord(variant[0], math.nan, actions, FOUND_BY, target, threads, steps=steps))
    return found


def ksplit_proposals(candidates, context: SearchContext, threads: int) -> list[ScheduleRecord]:
    """The split-k teams of ``candidates`` (:func:`ksplit_records`) measured through ``context``
    (whose evaluator measures on ``threads`` threads, and whose budget ends the stage) as
    :func:`~looprl.search.parallel.parallel_proposals` measures its teams; the winner rule decides
    between them, the other teams and the serial best."""
    found = []
    serial_best = best_serial_gflops(candidates)
    try:
        for team in ksplit_records(candidates, threads, context.target):
            measurement = timed_team(context, team.nest, serial_best)
            if measurement.ok:
                found.append(team.with_gflops(measurement.gflops))
    except BudgetExhausted:
        pass  # the stage ends at the deadline with what it measured
    return found


def ksplit_split_proposals(record: ScheduleRecord, threads: int, target) -> list[ScheduleRecord]:
    """The split-k team of ``record`` (a serial answer) that :func:`ksplit_proposals` would
    measure, unmeasured, found as ``record`` was: the fast path's thread split (none on one
    thread)."""
    if threads < 2:
        return []
    return [replace(team, found_by=record.found_by) for team in ksplit_records([record], threads, target)]
