"""Register tiles, their cache-blocked variants and a packed right operand, measured as env
action paths from the untiled nest.

A large problem needs a tile as wide as the target's register file allows and, where the
operands outgrow the caches, blocks of the reduction and of the columns around it, which an
episode of a dozen actions cannot also build. ``looprl.tune`` takes the tile the policy built
(:func:`tile_of` its best state) and :func:`measure_tiles` refines it; given no tile shapes it
proposes the target's own in order of how often they pay (the flat register tiles of
:func:`~looprl.ir.register_tiles.tile_shapes`; for a problem of a few output rows, the streaming
tiles next (below); then the cache blocks of
:func:`~looprl.ir.schedules.cache_blocks` around the fastest, sized from the host's caches
(:func:`~looprl.ir.cache_blocks.blocked_steps`; where the right operand changes per call, its
column strips packed strip by strip, then those blocks with its panels packed block by block,
:func:`staged_path`, come first), and for a few-row problem with a long reduction the fastest with
its reduction blocks outermost (:mod:`looprl.search.kblocks`); the streaming tiles are those of
:func:`~looprl.search.streams.stream_tiles` (:func:`~looprl.ir.schedules.stream_steps`), after those of
:func:`~looprl.search.streams.spilled_tiles` with the output spilled at their block loop, and the fastest of them with its right operand
prefetched ahead (:func:`~looprl.search.dots.prefetch_variants`); then the fastest with the right operand packed into
column panels (for a cold problem, whose weights come from memory on every call, the packed
panels read side by side of :func:`~looprl.ir.schedules.stream_panel_steps`, then those read one
at a time of :func:`~looprl.ir.schedules.panel_steps`, come first of all); when
the output's columns are not the right operand's contiguous dimension, as in ``A @ B.T``,
every tile is packed, since unpacked it gathers lane by lane; so is every tile of a bfloat16
problem whose weight the kernel pairs (:mod:`looprl.backend.pairs`: re-laid once when bound
either way, and whole panels stream where a row-major weight's pairs lie a row apart), each
as the actions that build it, so the answer replays in the env like any other path.
"""

from __future__ import annotations

from looprl.actions import ActionSet, State, follow
from looprl.backend.pairs import pairs_a_weight
from looprl.ir.cache_blocks import blocked_steps
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import packed_right, tile_of, tile_shapes, tile_steps, why_not_tile
from looprl.measurement.duels import chosen_in_rounds
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.ir.schedules import (cache_blocks, column_strips, panel_steps, panel_widths, stream_panel_shapes, stream_panel_steps,
                                 stream_steps)
from looprl.ir.step import PACK, SPILL, SPLIT, STAGE, Step
from looprl.search.context import BudgetExhausted, SearchContext
from looprl.search.dots import prefetch_variants
from looprl.search.kblocks import kblock_sizes, kblock_steps
from looprl.search.streams import spilled_stream_steps, spilled_tiles, stream_tiles

# The flat register tiles (and the streaming tiles) within FLAT_WITHIN of the fastest (its
# FLAT_CONTENDERS fastest) are timed again in FLAT_ROUNDS interleaved rounds before one is refined
# (_chosen_in_rounds).
FLAT_WITHIN = 0.75
FLAT_CONTENDERS = 3
FLAT_ROUNDS = 2


def measure_tiles(context: SearchContext, actions: ActionSet, shapes=None, lead=None) -> tuple[ScheduleRecord | None, int]:
    """Measure register tiles of the context's problem (until its budget is spent) and return
    the fastest, its actions a path of action names from the untiled nest (``actions`` extended
    as needed), or None if none was measured; and how many tiles were tried (measured, or
    refused by the deadline). ``shapes``: the (rows, columns) tiles to start from (default: the target's
    :func:`~looprl.ir.register_tiles.tile_shapes`), after ``lead`` (e.g. the tile a policy built)
    when given; each is measured in the canonical order, then the fastest with cache blocks
    and packed."""
    found, tried = tile_contenders(context, actions, shapes, lead, within=1.0)
    return (found[0] if found else None), tried


def tile_contenders(context: SearchContext, actions: ActionSet, shapes=None, lead=None, within: float = 1.0,
                    most: int = 1) -> tuple[list[ScheduleRecord], int]:
    """:func:`measure_tiles`'s measurements, the fastest first and after it the others within
    ``within`` of its figure (at most ``most`` in all, each schedule once), so that a winner
    rule can time them again together: a tile's one timing can fall in the machine's slow
    phase; and how many tiles were tried."""
    problem, target = context.problem, context.target
    root = State(initial_nest(problem), 0)
    best: tuple = (0.0, (), 0, None)  # gflops, names, columns, nest
    timed: list[tuple] = []  # every (gflops, names, columns, nest) measured
    tried = 0

    def attempt(names: tuple[str, ...], state: State, columns: int) -> float | None:
        """Measure ``state``; its GFLOPS (None: it failed)."""
        nonlocal best, tried
        tried += 1
        measurement = context.measure(state.nest)
        if not measurement.ok:
            return None
        timed.append((measurement.gflops, names, columns, state.nest))
        if measurement.gflops > best[0]:
            best = (measurement.gflops, names, columns, state.nest)
        return measurement.gflops

    def planned(rows: int, columns: int) -> tuple[tuple[str, ...], State] | None:
        """The tile's path and state (packed when the right operand is transposed), or None."""
        if why_not_tile(problem, rows, columns) is not None:
            return None
        return reached(tile_steps(problem, rows, columns))

    def reached(steps: list[Step]) -> tuple[tuple[str, ...], State] | None:
        """The path of actions that takes the untiled nest through IR ``steps``, and its state."""
        extended = actions.with_splits(step.arg for step in steps if step.op == SPLIT)
        extended = extended.extended([SPILL]) if any(step.op == SPILL for step in steps) else extended
        found = extended.path(root, steps)
        if found is None:
            return None  # e.g. more loops than max_loops
        names = extended.named(found[0])
        return packed_path(problem, names, actions) if packed_first else (names, found[1])

    if len(problem.output) < 2 or not problem.reduction_dims:
        return None, 0
    # The output's columns are the vectors' lanes: if they are not the right operand's
    # contiguous dimension (A @ B.T, attention's q . k^T), every tile is measured packed.
    transposed = problem.operands[1][-1] != problem.output[-1]
    # A constant right operand (a weight) is packed once, when the kernel is bound: panels cost
    # nothing per call, so every tile is measured with them. Measured packed last (the best tile
    # only), a large layer's budget was spent before its panels were timed: 128 rows of a
    # 4096->4096 layer came back unpacked at 101.9 GFLOPS, where its 9x48 tile packed ran at 113
    # (a quiet Zen 4; oneDNN's packed linear 110.8).
    packed_first = transposed or pairs_a_weight(problem) or "in1" in problem.constant
    flat = None
    try:
        if problem.cold and not transposed:  # weights from memory: whole panels, packed in order, first
            panels = [(stream_panel_steps(problem, streams, columns), columns) for streams, columns in stream_panel_shapes(problem, target)]
            panels += [(panel_steps(problem, columns), columns) for columns in panel_widths(problem, target)]
            for steps, columns in panels:  # several panels read side by side, then one at a time
                tile = reached(steps)
                packed = tile if tile is None or packed_first else packed_path(problem, tile[0], actions)
                if packed is not None:
                    attempt(*packed, columns)
        shapes = tile_shapes(problem, target) if shapes is None else list(shapes)
        flats = []  # (gflops, (rows, columns), nest) of every flat tile timed
        before = best[0]  # a cold problem's panels, timed first: a flat tile is refined only where one beat them
        for rows, columns in ([lead] if lead else []) + [s for s in shapes if s != lead]:
            tile = planned(rows, columns)
            if tile is not None and (gflops := attempt(*tile, columns)) is not None:
                flats.append((gflops, (rows, columns), tile[1].nest))
        flat = _chosen_in_rounds(context, flats) if any(gflops > before for gflops, _, _ in flats) else None
        if not transposed:
            # Few output rows: stream the right operand, right after the flat tiles and before their
            # blocks. Measured after the blocks, four rows of 4864x896 returned a 2x32 register tile
            # at 15 GFLOPS in two tunes of four, the budget spent on its cache blocks (one timed
            # at 0.7 GFLOPS) before any streaming tile was timed; the other two timed the streams
            # and returned them at 38-44 (experiments/results/issue61/stability_v20_znver3/
            # tune_candidates_znver3_4rows.txt).
            streamed = []
            tiles = [(spilled_stream_steps, tile) for tile in spilled_tiles(problem)] + [(stream_steps, tile) for tile in stream_tiles(problem)]
            for steps_of, (k_inner, columns) in tiles:  # the spilled ones first (looprl.search.streams)
                tile = reached(steps_of(problem, k_inner, columns))
                if tile is not None:
                    attempt(*tile, columns)
                    streamed.append((context.measure(tile[1].nest).gflops, (tile[0], columns), tile[1].nest))  # (its memo)
            if streamed:  # the fastest streaming tile (by paired rounds among the close ones), its right operand prefetched ahead
                names, columns = _chosen_in_rounds(context, streamed)
                for variant in prefetch_variants(problem, names, actions):
                    attempt(*variant, columns)
        # A right operand that changes per call: its panels packed block by block, not whole on
        # every call, before the other blocks (measured last, a 16-row GEMM's budget ran out
        # before them; read by one row tile, a one-row GEMM's staged tiles timed 0.2-0.8 GFLOPS in its tunes).
        # Cache blocks keep the right operand's panels for the row tiles that read them again:
        # with one row tile they only store and reload its accumulators, and their time is the
        # streaming tiles' (in a one-row GEMM's tunes on a Zen 3 its k32 blocks took 0.3 s and timed
        # 1.7-2.5 GFLOPS against 4-6 flat, and the budget was spent before the streams were timed).
        reused = flat is not None and problem.size(problem.output[-2]) > flat[0]
        if reused and not packed_first and "in1" not in problem.constant:
            # Column strips first, each packed the whole reduction deep just before its row tiles
            # (stage "n"), then the reduction blocks packed block by block (stage "k").
            staged = [(blocks, "n") for blocks in column_strips(problem, *flat)]
            staged += [(blocks, "k") for blocks in cache_blocks(problem, *flat)]
            for blocks, stage in staged:
                tile = staged_path(problem, *flat, blocks, actions, stage)
                if tile is not None:
                    attempt(*tile, flat[1])
        if reused:  # cache blocks around the fastest (packed afterwards if the fastest)
            for blocks in cache_blocks(problem, *flat):
                tile = reached(blocked_steps(problem, *flat, blocks, pack=False))
                if tile is not None:
                    attempt(*tile, flat[1])
        if flat is not None:
            blocks = kblock_sizes(problem, flat[0])  # few rows, a long reduction: its blocks outermost
            if blocks:
                flat_steps = tile_steps(problem, *flat)
                flat_nest = initial_nest(problem).apply(flat_steps)
                for block in blocks:
                    tile = reached(flat_steps + kblock_steps(flat_nest, block))
                    if tile is not None:
                        attempt(*tile, flat[1])
        if best[1] and not packed_first:
            packed = packed_path(problem, best[1], actions)
            if packed is not None:
                attempt(*packed, best[2])
    except BudgetExhausted:
        pass  # the stage ends at the deadline with what it measured
    if best[3] is None:
        return [], tried
    # Each schedule's figure as the context holds it now (the flat tiles' rounds may have raised it).
    ranked = sorted(((context.values.get(nest.key, gflops), names, nest) for gflops, names, _, nest in timed), key=lambda t: -t[0])
    found, keys = [], set()
    for gflops, names, nest in ranked:
        if len(found) >= most or gflops < within * ranked[0][0]:
            break
        if nest.key not in keys:
            keys.add(nest.key)
            found.append(ScheduleRecord(nest, gflops, names, "tiles", target, context.threads))
    return found, tried


def _chosen_in_rounds(context: SearchContext, timed: list[tuple]):
    """What the tiles stage refines next, of ``timed`` (``(gflops, what, nest)``, each timed
    once; ``what``: a flat tile's (rows, columns), or a streaming tile's (action names, columns)):
    :func:`~looprl.measurement.duels.chosen_in_rounds` among them (the close ones within
    :data:`FLAT_WITHIN` of the fastest, at most :data:`FLAT_CONTENDERS`, in :data:`FLAT_ROUNDS`
    rounds; the fastest where the budget ends first), or None. The refinements (cache blocks,
    reduction blocks and streams around a flat tile; prefetching ahead of a streaming one) are
    measured around this one only, so one lucky first timing chose which schedules a tune could
    find at all: four tunes of 32x1000x1280 on a 2-vCPU Zen 3 refined two different flat tiles
    (4x24 and 2x32), their answers 0.67-0.85 of the fastest schedule they had measured between
    them (experiments/results/issue61/stability_v20_znver3/tune_candidates_znver3_v19.txt)."""
    if not timed:
        return None

    def figure(entry):
        return entry[0]

    try:
        chosen, _ = chosen_in_rounds(timed, figure, lambda entry: entry[2], context.remeasure, FLAT_WITHIN, FLAT_CONTENDERS,
                                     FLAT_ROUNDS)
    except BudgetExhausted:
        chosen = max(timed, key=figure)  # the deadline came first: the first timings decide (the earliest among equals)
    return chosen[1]


def packed_path(problem: Problem, names: tuple[str, ...], actions: ActionSet) -> tuple[tuple[str, ...], State] | None:
    """The path ``names`` followed by packing the right operand along the output's columns at
    the innermost column loop (its tile width), or None if that does not apply."""
    extended = actions.extended(list(names) + ["pack"])
    state = follow(extended, State(initial_nest(problem), 0), names)
    if state is None:
        return None
    column = problem.output[-1]
    inner = max(i for i, loop in enumerate(state.nest.compute) if loop.var == column)
    tail = extended.moves(state.cursor, inner) + (extended.index("pack"),)
    state = follow(extended, state, tail)
    if state is None:
        return None
    return tuple(names) + extended.named(tail), state


def staged_path(problem: Problem, rows: int, columns: int, blocks, actions: ActionSet,
                stage: str = "k") -> tuple[tuple[str, ...], State] | None:
    """The action path of the blocked schedule of ``rows`` x ``columns`` tiles and ``blocks``
    whose right operand is packed into panels block by block, at each iteration of the
    reduction block loop (``stage="k"``) or of the column block loop (``"n"``: a column strip,
    the whole reduction deep) (:func:`~looprl.ir.cache_blocks.blocked_steps`: the blocked path,
    the ``pack`` action, then the ``stage`` action), and its state; None where there is no such
    schedule (no block loop to stage at, a constant right operand, a block over the stage's
    bound)."""
    try:
        steps = blocked_steps(problem, rows, columns, blocks, pack=True, stage=stage)
    except ValueError:
        return None
    plain = [step for step in steps if step.op not in (PACK, STAGE)]
    extended = actions.with_splits(step.arg for step in plain if step.op == SPLIT)
    found = extended.path(State(initial_nest(problem), 0), plain)
    if found is None:
        return None
    packed = packed_path(problem, extended.named(found[0]), extended)
    if packed is None:
        return None
    staging = extended.extended(list(packed[0]) + [STAGE])
    staged = staging.path(packed[1], [step for step in steps if step.op == STAGE])
    if staged is None or staged[1].nest != initial_nest(problem).apply(steps):
        return None
    return packed[0] + staging.named(staged[0]), staged[1]


def all_tiles(problem: Problem, target) -> list[LoopNest]:
    """Every schedule :func:`measure_tiles` could propose for ``problem`` on ``target``: each
    register tile, flat and with each cache block of :func:`~looprl.ir.schedules.cache_blocks`,
    with the right operand row-major and packed (the hand-written reference an experiment
    measures exhaustively)."""
    nests: list[LoopNest] = []
    if len(problem.output) < 2 or not problem.reduction_dims:
        return nests
    for rows, columns in tile_shapes(problem, target):
        if why_not_tile(problem, rows, columns) is not None:
            continue
        flat = initial_nest(problem).apply(tile_steps(problem, rows, columns))
        blocked = [initial_nest(problem).apply(blocked_steps(problem, rows, columns, blocks, pack=False))
                   for blocks in cache_blocks(problem, rows, columns)]
        for nest in [flat] + blocked:
            for variant in (nest, packed_right(nest)):
                if variant is not None and variant not in nests:
                    nests.append(variant)
    return nests
