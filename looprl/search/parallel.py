"""Tune's parallel proposals: the best schedules found on one thread, with their outermost
eligible loops made parallel, measured on the threads offered.

No policy was trained with the ``parallel`` action: where to divide the work among threads is
rarely a question of the register tile, and almost always the answer is the outermost loop
over the output that has enough iterations for every thread (one team per call, each thread
a contiguous block of the output). So :func:`parallel_proposals` takes tune's best serial
schedules, marks in each the outermost compute loop over an output dimension with at least
as many iterations as threads (and, so that the copy to the output is not left to one
thread, the outermost such write-back loop), and measures them on ``threads`` threads; when
that loop has few iterations (fewer than :data:`MANY` per thread, where contiguous shares of
unequal blocks or a tail iteration can leave one thread longer at work), the outermost loop
with that many is proposed as well; and for the best candidate, the variant that leaves the
write-back copy serial (a second team per call costs more than a small copy saves). Where that
loop sits inside a reduction loop (a one-row kernel streaming its weight row by row), two
variants start one team a call instead: the loop split into one share per thread, the shares'
loop moved outermost (:func:`shares_variant`: each thread streams its own columns in the
serial order), and the whole loop moved outermost (:func:`hoisted_variant`). A team whose
calling thread would pack a changing right operand whole before the team starts, where its
parallel loop walks the operand's panels, is also proposed with each thread packing its own
panels at that loop (:func:`staged_team`); a team over column strips packed at each iteration
is also proposed dividing the rows inside each strip instead (:func:`inside_stage_variant`). Tune
returns the fastest parallel proposal only where it beats the serial best in a duel of
interleaved rounds (:func:`looprl.tune.winner.team_or_serial`): where parallelism does not pay
(small problems, where forming a team costs more than it saves, or a core taken by other work)
the answer stays serial.
"""

from __future__ import annotations

import math

from looprl.actions import ActionSet, State, replay
from looprl.ir.nest import COMPUTE, WRITE_BACK, LoopNest, initial_nest
from looprl.defaults import MAX_LOOPS
from looprl.ir.action import STAGED_TENSOR
from looprl.ir.step import KSPLIT, MAX_FACTOR, PARALLEL, SPILL, SPLIT, STAGE, SWAP, Step
from looprl.search.context import BudgetExhausted, SearchContext
from looprl.search.dots import few_rows
from looprl.measurement.schedule_record import ScheduleRecord


MANY = 4  # iterations per thread from which a loop's shares are taken to be balanced


def outermost_parallel_loop(nest: LoopNest, which: str, iterations: int, after: int = -1) -> int | None:
    """Index of the outermost loop of nest ``which`` (compute or write-back) after loop
    ``after`` that may be made parallel and has at least ``iterations`` iterations, or None."""
    for index, loop in enumerate(nest.loops):
        if index > after and loop.nest == which and loop.iterations >= iterations and nest.why_not_parallel(index) is None:
            return index
    return None


def parallel_variants(nest: LoopNest, threads: int, serial_copy: bool = False) -> list[tuple[LoopNest, tuple[int, ...]]]:
    """:func:`parallel_variant`; with ``serial_copy``, the same with the write-back nest left
    serial; then, if its compute loop has fewer than :data:`MANY` iterations per thread, the
    variant whose compute loop is the outermost with that many."""
    first = parallel_variant(nest, threads)
    if first is None:
        return []
    serial = nest.serial()
    variants = [first]
    if serial_copy and len(first[1]) > 1:
        variants.append((serial.parallel(first[1][0]), first[1][:1]))
    if serial.loops[first[1][0]].iterations < MANY * threads:
        balanced = parallel_variant(nest, threads, MANY * threads)
        if balanced is not None and balanced[0] != first[0]:
            variants.append(balanced)
    elif serial.loops[first[1][0]].staged:
        inside = inside_stage_variant(serial, first[1][0], threads)
        if inside is not None:
            variants.append(inside)
    return variants


def inside_stage_variant(serial: LoopNest, staged: int, threads: int) -> tuple[LoopNest, tuple[int, ...]] | None:
    """Where the loop a team would divide, ``staged``, packs an operand's block at each of its
    iterations (a column strip of a changing right operand), the variant whose team divides
    the outermost loop inside it with at least :data:`MANY` iterations per thread instead (the
    row tiles): each block is packed once, by the calling thread, and read by every thread,
    where the strips' team has each thread pack its own strips. Informally on a 2-vCPU Zen 3
    (AVX2, 15 interleaved rounds, 6x16 tiles) it beat the strips' team on 4 of 7 GEMMs by 6-28%
    (512x960x960: 122.7 against 95.5 GFLOPS) and lost 21% on 384x4096x1024: tune measures both.
    ``(nest, the loops marked)``, or None where no such loop may be made parallel."""
    return parallel_variant(serial, threads, MANY * threads, after=staged)


def parallel_variant(nest: LoopNest, threads: int, iterations: int | None = None,
                     after: int = -1) -> tuple[LoopNest, tuple[int, ...]] | None:
    """``nest`` (made serial first) with its outermost eligible compute loop after loop
    ``after`` (at least ``iterations`` iterations, default ``threads``) and write-back loop (at
    least ``threads``) parallel, and the indices marked; None when no compute loop qualifies."""
    serial = nest.serial()
    compute = outermost_parallel_loop(serial, COMPUTE, threads if iterations is None else iterations, after)
    if compute is None:
        return None
    marked, indices = serial.parallel(compute), (compute,)
    write_back = outermost_parallel_loop(marked, WRITE_BACK, threads)
    if write_back is not None:
        marked, indices = marked.parallel(write_back), indices + (write_back,)
    return marked, indices


def parallel_proposals(candidates, context: SearchContext, threads: int, at_least: int = 0) -> list[ScheduleRecord]:
    """The parallel variants of ``candidates`` (:class:`~looprl.measurement.schedule_record.
    ScheduleRecord` s, best first; duplicates skipped), measured through ``context`` (whose evaluator measures on
    ``threads`` threads, and whose budget ends the stage), as candidates. Each one's actions
    replay it from the untuned nest: the candidate's, then cursor moves and ``parallel`` at
    each marked loop; each is found by ``"parallel"`` on ``threads`` threads. Which of them, or the serial best,
    wins is decided by tune's winner rule (:func:`looprl.tune.winner.team_or_serial`: a duel of
    interleaved rounds, as a team is slowed by anything else running on its cores). The first
    ``at_least`` proposals are measured whatever the budget."""
    proposals, seen = [], set()
    for candidate in candidates:
        if candidate.nest is None:  # e.g. no tile was measured
            continue
        variants = [found for found in proposed_variants(candidate.nest, threads, serial_copy=not proposals) if found[0].key not in seen]
        for order, (marked, steps, indices) in enumerate(variants):
            seen.add(marked.key)
            proposals.append((teams_per_call(marked, indices[0]), order, len(proposals), candidate, marked, steps, indices))
    # Fewest teams per call first (stable): a loop made parallel inside a reduction loop of 2,560
    # iterations starts 2,560 teams a call (3 GFLOPS on a decode GEMV, against 93 for the same
    # schedule's variant with one team); the budget may end the stage before the last proposals.
    # Among equals, each candidate's first variant before any candidate's second: the serial
    # ranking's first two can be close while their teams are not (1500x384x384 on a 2-vCPU Zen 3:
    # the 6x16 tile's teams ran at 100-104 GFLOPS, the 4x24 tile's at 124-128), and the forced
    # first proposals were all the first candidate's.
    proposals.sort(key=lambda proposal: proposal[:3])
    found = []
    serial_best = best_serial_gflops(candidates)
    try:
        for rank, (_, _, _, candidate, marked, steps, indices) in enumerate(proposals):
            measurement = timed_team(context, marked, serial_best, force=rank < at_least)
            if measurement.ok:
                actions = _path(candidate.nest, tuple(candidate.actions or ()), steps, indices, context.target)
                found.append(ScheduleRecord(marked, measurement.gflops, actions, "parallel", context.target, threads))
    except BudgetExhausted:
        pass  # the stage ends at the deadline with what it measured
    return found


def best_serial_gflops(candidates) -> float:
    """The speed of the fastest of ``candidates`` (serial records) that has a schedule."""
    return max((c.gflops for c in candidates if c.nest is not None), default=0.0)


def timed_team(context: SearchContext, nest: LoopNest, serial_best: float, force: bool = False):
    """The measurement of team ``nest`` through ``context``: a team slower than ``serial_best``
    (the serial schedules it was made of) was likely slowed by something on one of its cores (a
    2-vCPU host's other vCPU taken away), so it is timed once more before it is ranked
    (1024x960x960 on a Zen 4 came back serial at 112 GFLOPS in one run of the models bench, where
    its team runs at 210). BudgetExhausted ends it as it ends any measurement (``force``: whatever
    the budget)."""
    measurement = context.measure(nest, force=force)
    if measurement.ok and measurement.gflops < serial_best:
        measurement = context.remeasure(nest, force=force)
    return measurement


def proposed_variants(nest: LoopNest, threads: int, serial_copy: bool) -> list[tuple[LoopNest, tuple[Step, ...], tuple[int, ...]]]:
    """The parallel variants proposed of one serial schedule, as ``(nest, the steps that move or
    split a loop first, the loops marked)``: :func:`parallel_variants` (with ``serial_copy``),
    then :func:`shares_variant` and :func:`hoisted_variant` where there are, each followed by its
    :func:`spilled_team` where there is one (in that order: of two proposals that start one team
    a call, the first is measured first)."""
    variants = []
    for marked, indices in parallel_variants(nest, threads, serial_copy=serial_copy):
        variants.append((marked, (), indices))
        stage = staged_team(marked, indices[0])
        if stage is not None:
            variants.append((marked.apply((stage,)), (stage,), indices))
    shares = shares_variant(nest, threads)
    hoisted = hoisted_variant(nest, threads)
    if hoisted is not None:
        hoisted = (hoisted[0], tuple(Step(SWAP, index) for index in hoisted[1]), hoisted[2])
    for variant in (shares, hoisted):
        if variant is not None:
            variants.append(variant)
            spill = spilled_team(variant[0], variant[2][0])
            if spill is not None:
                variants.append((variant[0].apply((spill,)), variant[1] + (spill,), variant[2]))
    return variants


def spilled_team(marked: LoopNest, index: int) -> Step | None:
    """Where team ``marked`` of a few-row problem streams its right operand in blocks of the
    reduction inside its parallel loop ``index`` (a reduction loop with a loop over tiles of the
    output inside it: a streaming tile's order) and spills at no loop, the step that spills the output at that
    block loop (:meth:`~looprl.ir.nest.LoopNest.spill`); None otherwise. A thread's share of the
    columns can fit the code generator's register-blocked tile where the whole row did not, and
    the scope then takes the block loop in, each register block running the whole reduction
    (4x960x2560, AVX2 code: shares over columns at 57-77 GFLOPS against 81-88 serial; informal)."""
    if not few_rows(marked.problem) or marked.spilled_loop is not None:
        return None
    output = marked.problem.output
    inside = marked.compute[index + 1:]
    block = next((i for i, loop in enumerate(inside) if loop.var not in output), None)
    if block is None or not any(loop.var in output and loop.step > 1 and loop.size > 1 for loop in inside[block + 1:]):
        return None  # no loop over tiles of the output inside the block loop: the tile stays in registers there
    step = Step(SPILL, index + 1 + block)
    return None if marked.why_not(step) is not None else step


def staged_team(marked: LoopNest, index: int) -> Step | None:
    """Where team ``marked`` converts its right operand whole on every call (a changing input
    packed into panels) and its parallel loop ``index`` walks that operand's panels, the step
    that makes it the same team staging the operand at that loop instead: each thread packs
    the panels its own iterations read, into a buffer of its own, right before it reads them
    (:meth:`~looprl.ir.nest.LoopNest.stage`); None otherwise (a constant weight is converted
    once, when bound, and is never staged). The calling thread's whole pack ran before the
    team started and left the panels in its own core's caches: 128x320x960 on a 2-vCPU Zen 4,
    AVX2 code, ran at 167-173 GFLOPS so and 186-195 staged (informal)."""
    tensor = STAGED_TENSOR
    if tensor not in dict(marked.layouts) or marked.loops[index].var not in marked.tensor_index(tensor):
        return None
    step = Step(STAGE, index, tensor=tensor)
    return None if marked.why_not(step) is not None else step


def hoisted_variant(nest: LoopNest, threads: int) -> tuple[LoopNest, tuple[int, ...], tuple[int, ...]] | None:
    """Where the loop :func:`parallel_variant` would make parallel sits inside other loops (a
    decode GEMV whose schedule starts with the reduction: ``k320, n3, ...`` starts 320 teams a
    call), the same schedule with that loop moved outermost, made parallel: ``(nest, the swaps
    that move it, the loops marked)``; None where it is outermost already or cannot move."""
    found = _inner_parallel_loop(nest, threads)
    if found is None:
        return None
    serial, index, start = found
    return _moved_outermost(serial, index, start, threads)


def shares_variant(nest: LoopNest, threads: int) -> tuple[LoopNest, tuple[Step, ...], tuple[int, ...]] | None:
    """Where the loop :func:`parallel_variant` would make parallel sits inside a reduction loop
    (a one-row kernel streaming its weight row by row: ``k112s8, n19s256, ...``), that loop
    split into one share of its iterations per thread (an outer loop of ``threads`` iterations,
    its last one a tail where they do not divide) and that outer loop moved outermost, made
    parallel: each thread walks its own columns in the serial schedule's order, where
    :func:`hoisted_variant` walks them panel by panel across every reduction block (rows of a
    panel's width, not of a share's). ``(nest, the split and swaps, the loops marked)``; None
    where the loop is outermost already, has fewer iterations than twice ``threads`` or the
    outer loop cannot move, or where the split would not replay as an action (a factor above
    :data:`~looprl.ir.step.MAX_FACTOR`, a nest of :data:`~looprl.defaults.MAX_LOOPS` loops)."""
    found = _inner_parallel_loop(nest, threads)
    if found is None:
        return None
    serial, index, start = found
    loop = serial.loops[index]
    factor = math.ceil(loop.size / threads)
    if loop.size < 2 * threads or factor > MAX_FACTOR or len(serial.loops) >= MAX_LOOPS:
        return None  # (a factor or a loop more than the actions can name: its path would not replay)
    split = Step(SPLIT, index, factor)
    moved = _moved_outermost(serial.apply([split]), index, start, threads)  # the split's outer part, where the loop was
    if moved is None:
        return None
    return moved[0], (split,) + tuple(Step(SWAP, position) for position in moved[1]), moved[2]


def _inner_parallel_loop(nest: LoopNest, threads: int) -> tuple[LoopNest, int, int] | None:
    """``(nest made serial, the loop parallel_variant would mark, the first loop of its nest)``
    where that loop is not its nest's outermost; else None."""
    serial = nest.serial()
    first = parallel_variant(serial, threads)
    if first is None:
        return None
    index = first[1][0]
    start = next(i for i, loop in enumerate(serial.loops) if loop.nest == serial.loops[index].nest)
    return None if index == start else (serial, index, start)


def _moved_outermost(nest: LoopNest, index: int, start: int, threads: int) -> tuple[LoopNest, tuple[int, ...], tuple[int, ...]] | None:
    """``nest`` with loop ``index`` swapped past each loop around it (innermost first) to
    ``start`` and made parallel there: ``(nest, the swaps' positions, the loops marked)``, or
    None where a swap is refused or the loop marked is not that one."""
    moved, swaps = nest, []
    for position in range(index - 1, start - 1, -1):
        if moved.why_not_swap(position) is not None:
            return None
        moved = moved.swap(position)
        swaps.append(position)
    marked = parallel_variant(moved, threads)
    if marked is None or marked[1][0] != start:
        return None
    return marked[0], tuple(swaps), marked[1]


def teams_per_call(nest: LoopNest, index: int) -> int:
    """How many times a call starts a team for parallel loop ``index``, as proposals are ranked:
    the iterations of the loops around it (those before it in its own nest), but for loops that
    stage an operand's block at each iteration (each of those iterations packs a block and
    computes all that reads it: a team started per block costs little against that work)."""
    which = nest.loops[index].nest
    return math.prod(loop.iterations for loop in nest.loops[:index] if loop.nest == which and not loop.staged)


def _path(nest: LoopNest, actions: tuple[str, ...], steps: tuple[Step, ...], indices: tuple[int, ...], target) -> tuple[str, ...]:
    """``actions`` (which reach ``nest`` from the untuned nest under the transition rule)
    followed by the actions that carry out ``steps`` (splits and swaps, in order) and the
    ``parallel`` actions that mark ``indices``; just ``actions`` if they do not replay."""
    found = action_path(nest, actions, steps + tuple(Step(PARALLEL, index) for index in indices), target)
    return actions if found is None else found


def action_path(nest: LoopNest, actions: tuple[str, ...], steps: tuple[Step, ...], target) -> tuple[str, ...] | None:
    """``actions`` (which reach ``nest`` from the untuned nest under the transition rule)
    followed by the actions that carry out ``steps`` (splits, swaps, parallel marks and
    split-ks, in order), or None where they do not replay (a split factor or a loop more than
    the actions can name)."""
    if any(step.op == SPLIT and step.arg > MAX_FACTOR for step in steps):
        return None
    splits = [f"split_{step.arg}" for step in steps if step.op == SPLIT]
    marks = list(dict.fromkeys(step.op for step in steps if step.op in (STAGE, PARALLEL, KSPLIT, SPILL)))
    action_set = ActionSet.covering(list(actions) + splits + ["swap_up", "swap_down"] + marks, target=target)
    start = State(initial_nest(nest.problem), 0)
    transitions = replay(action_set, start, math.nan, actions)
    state = transitions[-1].state if transitions else start
    if state.nest != nest:
        return None
    found = action_set.path(state, list(steps))
    if found is None:
        return None
    return actions + action_set.named(found[0])


def split_proposals(record: ScheduleRecord, threads: int, target) -> list[ScheduleRecord]:
    """The parallel variants of ``record`` (a serial answer) that :func:`parallel_proposals`
    makes of it (:func:`proposed_variants`), unmeasured (speed NaN), each with the path that
    replays it and found as ``record`` was, on ``threads`` threads: the thread split of the fast
    path, where no search follows. None on one thread."""
    if threads < 2 or record.nest is None:
        return []
    return [ScheduleRecord(marked, math.nan, _path(record.nest, tuple(record.actions or ()), steps, indices, target), record.found_by,
                           target, threads)
            for marked, steps, indices in proposed_variants(record.nest, threads, serial_copy=True)]
