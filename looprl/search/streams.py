"""Tune's streaming tiles of a few-row problem: the fixed :data:`~looprl.ir.schedules.STREAM_TILES`
and, where each row of the right operand is read in short segments, deeper ones that keep more
of its rows streaming at once (:func:`stream_tiles`), each a ``(k_inner, columns)`` of
:func:`~looprl.ir.schedules.stream_steps`; and before them, where the segments are short, the
tiles of :data:`SPILLED_TILES` with the output spilled at their block loop
(:func:`spilled_stream_steps`, :mod:`looprl.ir.nest_spill`), which keep the nest's order so
that the segments are whole rows.

Why deeper streams pay there, read from the generated code: when the output's rows fit the
code generator's register-blocked tile (:data:`~looprl.backend.register_plan.BLOCKED_TILE_FLOATS`:
``1 x 960`` does, ``1 x 4864`` does not), it keeps the accumulators of one register block (about
a register file of columns: 320 on AVX-512) in registers across the whole reduction, whatever
the nest's loop order. Each row of ``B[k, n]`` is then read a register block's width at a time
(1280 bytes on AVX-512), and every segment starts a new stream that the hardware prefetchers
have to pick up again: only the reads in flight at once hide that start, and they are the
``k_inner`` rows the tile streams. Where the rows do not fit, the nest's order holds, each of
the ``k_inner`` rows is one long stream across the whole row, and more of them than the
prefetchers track ran far slower (``k_inner`` 32 at 7 GFLOPS against 29 for 8, 1 x 4864 x 896).

Informal figures (a 2-vCPU Zen 4 shared with other work, one thread, AVX-512 code, best of 40
interleaved rounds, numpy in the same rounds): ``matmul(1, 960, 960)`` ran 37.9 GFLOPS with
``(32, 64)`` and 36.7 with ``(32, 32)`` where the best fixed tile ran 31.0 (numpy 49.8);
``matmul(1, 1000, 1280)`` 35.8 against 28.7. With AVX2 code the fixed ``(8, 16)`` won on
``1 x 960 x 960`` (31 against 19 at best). How many rows pay depends on the host's prefetchers
and fill buffers and on the code, so the depths are measured, never chosen: :data:`STREAM_DEPTHS`,
bounded by the host's L1 (:func:`stream_tiles`), after the fixed tiles and as far as the budget
goes (``looprl.tune(matmul(1, 960, 960))`` reached two fixed tiles in its default budget; with
``budget_s=6`` it measured every deep tile and returned ``(32, 64)``).
"""

from __future__ import annotations

import math

from looprl.backend.register_plan import BLOCKED_TILE_FLOATS
from looprl.ir.cache_blocks import Caches, host_caches
from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem
from looprl.ir.schedules import STREAM_TILES, stream_steps, why_not_stream
from looprl.ir.step import SPILL, Step

# Rows of the right operand a deep streaming tile reads at once (its k_inner), each measured.
STREAM_DEPTHS = (16, 32, 64)
# Columns of a deep streaming tile: 2 and 4 cache lines of float32.
STREAM_COLUMNS = (32, 64)
# A deep tile's block (k_inner rows x columns) holds at most this share of L1: its lines are
# read a few at a time from each row and must stay in L1 until the tile's last row is read.
L1_SHARE = 4
# An x86 core's L1 data cache picks a line's set from the address bits within a 4 KB page (its
# size is ways x 4 KB: 32 KB is 8 ways, 48 KB 12), so lines of rows a power of two apart share
# sets. A deep tile's lines fill at most half of any set's ways: measured on a Zen 4, ``(32, 64)``
# over rows 2 KB apart (1 x 512 x 2048: 16 of its lines in each of 8 sets) ran at 14.6 GFLOPS
# where ``(4, 64)`` ran 32.8.
SET_BYTES = 4096
LINE_BYTES = 64
# The (k_inner, columns) streaming tiles also measured with the output spilled at their block
# loop (:func:`spilled_stream_steps`), first, for a problem of :func:`short_segments`: each of
# the k_inner rows then streams front to back across the whole row of the right operand. Informal
# (a 2-vCPU Zen 4 beside other work, one thread, GFLOPS, numpy in the same rounds), 1 x 960 x 2560:
# AVX2 code (8, 16) 42.6, (8, 32) 42.3, (4, 32) 42.0 spilled, against 35.6 for the best
# unspilled tile (numpy 39.4); AVX-512 code (16, 32) 44.0, (8, 32) 43.9 (numpy 42.9).
SPILLED_TILES = ((8, 32), (16, 32), (8, 16))


def short_segments(problem: Problem) -> bool:
    """Whether ``problem``'s output rows fit the code generator's register-blocked tile
    (:data:`~looprl.backend.register_plan.BLOCKED_TILE_FLOATS` elements), so that its right
    operand's rows are read one register block's width at a time (see the module's text)."""
    return len(problem.output) >= 2 and math.prod(problem.size(d) for d in problem.output) <= BLOCKED_TILE_FLOATS


def set_crowding(problem: Problem, k_inner: int, columns: int) -> int:
    """The most lines of one streaming tile's block (``k_inner`` rows of the right operand, from
    their first ``columns`` elements, the right operand row-major) that fall in one L1 set
    (sets of :data:`LINE_BYTES` lines picked by the address within :data:`SET_BYTES`)."""
    element = problem.dtype.element_bytes
    row_bytes = problem.size(problem.output[-1]) * element
    counts: dict[int, int] = {}
    for row in range(k_inner):
        start = row * row_bytes
        for line in range(start // LINE_BYTES, (start + columns * element - 1) // LINE_BYTES + 1):
            key = line % (SET_BYTES // LINE_BYTES)
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=0)


def stream_tiles(problem: Problem, caches: Caches | None = None) -> tuple[tuple[int, int], ...]:
    """The ``(k_inner, columns)`` streaming tiles tune measures for ``problem``, in order: each
    of :data:`~looprl.ir.schedules.STREAM_TILES` that applies (:func:`why_not_stream`), then,
    for a problem of :func:`short_segments`, each of :data:`STREAM_COLUMNS` x
    :data:`STREAM_DEPTHS` that applies, whose block (``k_inner`` x ``columns`` elements) is
    at most 1/:data:`L1_SHARE` of ``caches``' L1 (None: this host's,
    :func:`~looprl.ir.cache_blocks.host_caches`; an L1 not known: no deep tile) and puts at
    most half of L1's ways (its size over :data:`SET_BYTES`) of lines in one set
    (:func:`set_crowding`)."""
    if caches is not None and not isinstance(caches, Caches):
        raise ValueError(f"caches must be a Caches value or None, got {type(caches).__name__}")
    caches = host_caches() if caches is None else caches
    found = [tile for tile in STREAM_TILES if why_not_stream(problem, *tile) is None]
    if not found or not short_segments(problem):
        return tuple(found)
    for columns in STREAM_COLUMNS:
        for depth in STREAM_DEPTHS:
            fits = depth * columns * problem.dtype.element_bytes * L1_SHARE <= caches.l1
            fits = fits and set_crowding(problem, depth, columns) <= caches.l1 // SET_BYTES // 2
            if fits and (depth, columns) not in found and why_not_stream(problem, depth, columns) is None:
                found.append((depth, columns))
    return tuple(found)


def spilled_tiles(problem: Problem) -> tuple[tuple[int, int], ...]:
    """The ``(k_inner, columns)`` tiles of :data:`SPILLED_TILES` that tune measures spilled for
    ``problem`` (:func:`spilled_stream_steps`): those that apply (:func:`why_not_stream`), for a
    problem of :func:`short_segments` only (elsewhere the code generator keeps the nest's order
    unspilled: the spill changes nothing)."""
    if not short_segments(problem):
        return ()
    return tuple(tile for tile in SPILLED_TILES if why_not_stream(problem, *tile) is None)


def spilled_stream_steps(problem: Problem, k_inner: int, columns: int) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to the streaming tile
    ``(k_inner, columns)`` (:func:`~looprl.ir.schedules.stream_steps`) with the output spilled
    at its block loop (the outer reduction loop, :meth:`LoopNest.spill
    <looprl.ir.nest.LoopNest.spill>`): the output is reloaded once per block of ``k_inner``
    rows, as the nest's order says, where the code generator would otherwise keep each register
    block's accumulators across the whole reduction. Raises ValueError where there is no such
    tile (the reason named)."""
    steps = stream_steps(problem, k_inner, columns)
    nest = initial_nest(problem).apply(steps)
    block = next(i for i, loop in enumerate(nest.compute) if loop.var == problem.reduction_dims[0])
    return steps + [Step(SPILL, block)]
