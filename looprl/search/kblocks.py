"""Tune's reduction-block proposals for a few-row problem with a long reduction: the fastest flat
register tile with its reduction split into blocks and the block loop moved outermost
(``k/kc, m/mr, n/nr, kc, mr, nr``), so that each ``kc`` x ``n`` block of the right operand is
read from memory once and then reused from L2 by every row tile, where the flat tile streams
the whole right operand once per row tile (:func:`kblock_sizes`, :func:`kblock_steps`).

The cache blocks of :func:`~looprl.ir.schedules.cache_blocks` keep the register tile's column
loop outside their reduction block, so none of them has this order. It pays only where the code
generator keeps the block loop outside its register scope: where the whole output is more than
:data:`~looprl.backend.register_plan.BLOCKED_TILE_FLOATS` elements; at or below that, the scope
takes the block loop in and every register block runs the whole reduction again (16 x 128 is
exactly that many: there the order is reached only as a split-k team's, whose parallel loop
bounds the scope: :mod:`looprl.search.ksplit`).

Informal figures (a 2-vCPU Zen 4 shared with other work, load average 5 to 9, one thread, best
of 10 interleaved rounds, GFLOPS): ``matmul(16, 256, 16384)`` with AVX2 code ran 51.5 with
``kc`` 512 (4 x 24 tile) against 7.2 flat (numpy 65.2); with AVX-512 code 61.5 (9 x 48) against
15.3 flat. ``looprl.tune`` of it from an empty cache (``threads=1``) now returns the blocks
outermost: 70.9 GFLOPS in its measurements with AVX-512 code, where every flat tile it measured
ran 6 to 12. A constant weight stored as ``nn.Linear`` holds it (``W[n, k]``) is packed into
column panels as every tile of it is (:func:`~looprl.search.tiles.measure_tiles`).
"""

from __future__ import annotations

import math

from looprl.backend.register_plan import BLOCKED_TILE_FLOATS
from looprl.ir.cache_blocks import K_MULTIPLE, Caches, host_caches
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem
from looprl.ir.step import MAX_FACTOR, SPLIT, SWAP, Step
from looprl.search.dots import few_rows

# The shortest reduction block proposed: the tile's accumulators are stored and reloaded once per
# block, under 2 / MIN_BLOCK (about 3%) of its multiply-adds from this length on.
MIN_BLOCK = 64


def kblock_sizes(problem: Problem, rows: int, caches: Caches | None = None) -> tuple[int, ...]:
    """The reduction blocks (elements) to measure around a ``rows``-row register tile of
    ``problem`` on ``caches`` (None: this host's, :func:`~looprl.ir.cache_blocks.host_caches`):
    ``kc`` so that a ``kc`` x ``n`` block of the right operand fills half of L2, then half of
    that; each evened out over the reduction (as many blocks as ``kc`` needs, each the same
    size rounded up to :data:`~looprl.ir.cache_blocks.K_MULTIPLE`), from :data:`MIN_BLOCK` to
    :data:`~looprl.ir.step.MAX_FACTOR` (the largest split an action names), and below the
    reduction's size. None for a problem that is not :func:`~looprl.search.dots.few_rows`, has
    not one reduction, has no more rows than the tile (no row tile would reuse a block), or
    whose output is at most :data:`~looprl.backend.register_plan.BLOCKED_TILE_FLOATS` elements
    (see the module's text); none on an L2 not known, or whose half holds the whole right
    operand (the flat tile reuses it from L2 already)."""
    if caches is not None and not isinstance(caches, Caches):
        raise ValueError(f"caches must be a Caches value or None, got {type(caches).__name__}")
    if type(rows) is not int or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r:.40}")
    caches = host_caches() if caches is None else caches
    if len(problem.reduction_dims) != 1 or not few_rows(problem) or not caches.l2:
        return ()
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    if problem.size(row) <= rows or math.prod(problem.output_shape) <= BLOCKED_TILE_FLOATS:
        return ()
    reduction, row_bytes = problem.size(red), problem.size(col) * problem.dtype.element_bytes
    whole = max(K_MULTIPLE, caches.l2 // 2 // row_bytes // K_MULTIPLE * K_MULTIPLE)
    if whole >= reduction:
        return ()  # the whole right operand fits the block: the flat tile reuses it from L2 already
    found: list[int] = []
    for block in (whole, max(K_MULTIPLE, whole // 2 // K_MULTIPLE * K_MULTIPLE)):
        count = _ceil(reduction, min(block, MAX_FACTOR))
        even = _ceil(_ceil(reduction, count), K_MULTIPLE) * K_MULTIPLE
        if MIN_BLOCK <= even <= MAX_FACTOR and even < reduction and even not in found:
            found.append(even)
    return tuple(found)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def kblock_steps(nest: LoopNest, block: int) -> list[Step]:
    """IR steps (``nest.apply``) that split ``nest``'s outermost reduction loop by ``block``
    and move the block loop outermost; a ValueError where ``nest`` has no reduction loop or a
    step is refused (the reason named)."""
    output = nest.problem.output
    index = next((i for i, loop in enumerate(nest.compute) if loop.var not in output), None)
    if index is None:
        raise ValueError(f"{nest.problem.name}: the nest has no reduction loop to block")
    steps = [Step(SPLIT, index, block)] + [Step(SWAP, at) for at in range(index - 1, -1, -1)]
    reached = nest
    for step in steps:
        why = reached.why_not(step)
        if why is not None:
            raise ValueError(f"{nest.problem.name}: reduction block {block}: {why}")
        reached = reached.apply((step,))
    return steps
