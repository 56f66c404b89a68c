"""Cache-blocked schedules whose block sizes come from the host's caches.

A large matmul reuses each operand from a cache level. Two loop orders (outermost first) block
a register tile of ``mr`` x ``nr`` (its accumulators in registers for the ``kc`` loop):

* the *panel* order ``n/nc, k/kc, m/mr, nc/nr, kc, mr, nr``: a ``kc`` x ``nc`` block of the
  right operand stays in L2 while every row tile passes over it, the tile's ``mr`` x ``kc``
  slice of the left operand in L1 while it passes over the block's column tiles;
* BLIS's order ``n/nc, k/kc, m/mc, nc/nr, mc/mr, kc, mr, nr``: a ``kc`` x ``nr`` micro-panel of
  the right operand in L1, the ``mc`` x ``kc`` block of the left one in L2, the ``kc`` x ``nc``
  panel of the right one in the last level.

Both are :func:`blocked_steps` (the panel order is BLIS's without a row block), the right
operand packed into ``nr``-wide column panels or read in place. :func:`derive_blocks` sizes the
blocks from :class:`Caches` (never a constant of one CPU), :func:`block_candidates` fits them
to a problem, :func:`host_caches` reads the sizes the OS reports.

Measured on a Zen 4 (L1d 32 KB, L2 1 MB, one thread, AVX-512 code): the panel blocks read in
place ran 1.16x numpy on 128x8192x4096 and 1.59x on 16x10240x2560, where the flat tile ran
1.08x and 1.42x; on 2048x2048x2048 the flat packed tile (1.08x) beat every block (1.04x at
best), and BLIS's order with the left operand read in place (not packed per block) never won.
With the right operand an input (packed on every call), AVX2 code, one thread, informally
beside other work: packing it per k block at the ``k/kc`` loop (``stage="k"``) instead of
whole ran 93.5 against 85.8 GFLOPS on 128x8192x4096 (flat packed tile 88.1, numpy 104.9),
50.4 against 40.5 on 16x10240x2560 (42.6, numpy 66.4), 105.4 against 102.4 on 384x4096x1024,
and 99.1 against 100.2 on 2048x2048x2048.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import lift, pack_right_step
from looprl.ir.step import MAX_FACTOR, SPLIT, STAGE, Step

SYSFS_CACHES = "/sys/devices/system/cpu/cpu0/cache"


@dataclass(frozen=True)
class Caches:
    """Data-cache sizes in bytes seen by one core: ``l1`` (L1 data), ``l2`` and ``l3`` (the
    last level; its share of one core is not modelled: the right panel takes half of it).
    0: not known (no block is derived from a level not known)."""

    l1: int
    l2: int
    l3: int

    def __post_init__(self):
        for name in ("l1", "l2", "l3"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"cache size {name} must be a non-negative int of bytes, got {value!r:.80}")


@dataclass(frozen=True)
class Blocks:
    """Block sizes in elements: ``k`` (the reduction), ``m`` (output rows), ``n`` (output
    columns); None: that dimension is not blocked."""

    k: int | None
    m: int | None
    n: int | None


def _size_text(text: str) -> int:
    text = text.strip()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


@functools.cache
def host_caches() -> Caches:
    """This machine's data caches as the OS reports them (sysfs, else ``sysconf``; 0 for a
    level it does not report); the last level is the largest level from 2 up."""
    found: dict[int, int] = {}
    try:
        for index in sorted(os.listdir(SYSFS_CACHES)):
            folder = os.path.join(SYSFS_CACHES, index)
            if not index.startswith("index"):
                continue
            with open(os.path.join(folder, "type")) as handle:
                if handle.read().strip() == "Instruction":
                    continue
            with open(os.path.join(folder, "level")) as handle:
                level = int(handle.read())
            with open(os.path.join(folder, "size")) as handle:
                found[level] = _size_text(handle.read())
    except (OSError, ValueError):
        found = {}
        for level, name in ((1, "SC_LEVEL1_DCACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
            try:
                found[level] = max(0, int(os.sysconf(name)))
            except (OSError, ValueError):
                pass
    last = max([size for level, size in found.items() if level >= 2] or [0])
    return Caches(found.get(1, 0), found.get(2, 0), last)


def _rounded_down(value: float, multiple: int) -> int:
    return max(multiple, int(value) // multiple * multiple)


K_MULTIPLE = 16  # a reduction block is a multiple of this many elements (whole cache lines of float32)


def derive_blocks(caches: Caches, rows: int, columns: int, element_bytes: int = 4) -> tuple[Blocks, ...]:
    """The cache blocks of a ``rows`` x ``columns`` register tile on ``caches``, the one rule
    that sizes them (elements; a reduction block a multiple of :data:`K_MULTIPLE`, a row or
    column block a multiple of the tile's), in the order tune measures them:

    * the *panel* block ``n/nc, k/kc, m/mr, nc/nr, kc, mr, nr`` (no row block): ``kc`` so that
      the tile's ``mr`` x ``kc`` slice of the left operand, reused by every column tile of the
      block, fills half of L1; ``nc`` so that the ``kc`` x ``nc`` block of the right operand,
      reused by every row tile, fills half of L2;
    * the same with ``kc`` halved and ``nc`` doubled (a block of the same bytes);
    * first of all, where it is smaller than that half: the panel block whose ``kc`` is BLIS's
      (a ``kc`` x ``nr`` micro-panel of the right operand fills half of L1), ``nc`` from L2 as
      above: the right operand's micro-panel, which every row tile of the block reads again,
      stays in L1. A narrow-row tile needs it most: on a Zen 3 (AVX2, 32 KB L1), informally
      (one-off timings, not committed), 16 rows of a changing 960 x 2560 right operand ran its
      2 x 32 tile, staged per reduction block, in 6.6 ms with 480 x 128 blocks (61 KB
      micro-panels) and 2.5 ms with 240 x 256 (30 KB);
    * BLIS's ``n/nc, k/kc, m/mc, nc/nr, mc/mr, kc, mr, nr``: ``kc`` so that a ``kc`` x ``nr``
      micro-panel of the right operand fills half of L1, ``mc`` so that the ``mc`` x ``kc``
      block of the left one fills half of L2, ``nc`` so that the ``kc`` x ``nc`` panel of the
      right one fills half of the last level.

    A reduction block is at most :data:`~looprl.ir.step.MAX_FACTOR` (the largest split an
    action names); a row or column block of more tiles than that is refused where it is
    offered (:func:`why_not_blocked`). None where a level is not known (size 0): no block is
    derived from it."""
    if not isinstance(caches, Caches):
        raise ValueError(f"caches must be a Caches value, got {type(caches).__name__}")
    if rows < 1 or columns < 1 or element_bytes < 1:
        raise ValueError(f"tile {rows}x{columns} of {element_bytes}-byte elements: all must be positive")
    if not caches.l1:
        return ()

    def fitting(level: int, other: int, multiple: int) -> int | None:
        """The block whose ``other`` x block elements fill half of ``level`` bytes."""
        return _rounded_down(level / 2 / (other * element_bytes), multiple) if level else None

    k = min(fitting(caches.l1, rows, K_MULTIPLE), MAX_FACTOR)
    n = fitting(caches.l2, k, columns)
    half = _rounded_down(k / 2, K_MULTIPLE)
    blis_k = min(fitting(caches.l1, columns, K_MULTIPLE), MAX_FACTOR)
    found = [Blocks(k, None, n), Blocks(half, None, fitting(caches.l2, half, columns))]
    if blis_k < half:
        found.insert(0, Blocks(blis_k, None, fitting(caches.l2, blis_k, columns)))
    found.append(Blocks(blis_k, fitting(caches.l2, blis_k, rows), fitting(caches.l3, blis_k, columns)))
    return tuple(found)


def _balanced(block: int | None, size: int, multiple: int) -> int | None:
    """``block`` evened out over ``size`` elements: as many blocks as ``block`` needs, each
    the same size rounded up to ``multiple`` (so the last is not a sliver); None where one
    block would cover the dimension (the block loop would run once)."""
    if block is None or block >= size:
        return None
    count = -(-size // block)
    even = -(-size // count)
    even = -(-even // multiple) * multiple
    return even if even < size else None


def block_candidates(problem: Problem, rows: int, columns: int, caches: Caches) -> list[Blocks]:
    """The blocks to measure around a ``rows`` x ``columns`` register tile of ``problem`` on
    ``caches``: :func:`derive_blocks`'s, each block evened out over the problem's size; a
    block the problem's dimension does not exceed is dropped, and so is a candidate left
    without a reduction block (the problem's whole reduction fits the block, so the flat tile's
    slices of the operands already fit the caches the blocks are sized for), with a reduction
    block alone (the flat tile with its accumulators stored and reloaded between blocks:
    measured slower), or met before."""
    if len(problem.output) < 2 or not problem.reduction_dims:
        return []
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    found: list[Blocks] = []
    for derived in derive_blocks(caches, rows, columns, problem.dtype.element_bytes):
        blocks = Blocks(_balanced(derived.k, problem.size(red), K_MULTIPLE),
                        _balanced(derived.m, problem.size(row), rows) if derived.m is not None and derived.m > rows else None,
                        _balanced(derived.n, problem.size(col), columns) if derived.n is not None and derived.n > columns else None)
        if (blocks.k is not None and (blocks.m, blocks.n) != (None, None) and blocks not in found
                and why_not_blocked(problem, rows, columns, blocks) is None):
            found.append(blocks)
    return found


# A column strip of a changing right operand holds at least and at most this many of its register
# tile's column panels (strip_candidates). One panel's strip reads a 64-byte line per row of the
# operand as it packs it: on a Zen 3 (AVX2, one thread) 128x960x960 ran at 54.9 GFLOPS in 16-column
# strips, 71.4 in 64-column ones and 60.6 with the whole operand packed on every call
# (experiments/column_strips.py, experiments/results/issue61/session15_znver3/column_strips_znver3.txt).
STRIP_PANELS = (2, 8)


def strip_candidates(problem: Problem, rows: int, columns: int, caches: Caches) -> list[Blocks]:
    """Column strips of ``problem``'s right operand around a ``rows`` x ``columns`` register tile, to
    pack each just before the row tiles read it (:func:`blocked_steps` with ``Blocks(None,
    None, width)`` and ``stage="n"``: the whole reduction by ``width`` columns, packed at each
    iteration of the column block loop, where packing the whole operand on every call writes it
    all to memory and reads it back). The panels whose strip, the whole reduction deep, fills
    half of L2 (at least :data:`STRIP_PANELS` ``[0]``, at most ``[1]``), then twice and half as
    many within those bounds, each evened out over the columns; none where the columns hold
    one strip, or L2 is not known. In the order tune measures them."""
    if len(problem.output) < 2 or not problem.reduction_dims or not caches.l2:
        return []
    col, red = problem.output[-1], problem.reduction_dims[0]
    fewest, most = STRIP_PANELS
    panels = int(caches.l2 / 2 // (problem.size(red) * columns * problem.dtype.element_bytes))
    first = min(max(panels, fewest), most)
    found: list[Blocks] = []
    for count in (first, 2 * first, first // 2):
        if not fewest <= count <= most:
            continue
        width = _balanced(count * columns, problem.size(col), columns)
        blocks = Blocks(None, None, width)
        if width is not None and blocks not in found and why_not_blocked(problem, rows, columns, blocks) is None:
            found.append(blocks)
    return found


def blocked_steps(problem: Problem, rows: int, columns: int, blocks: Blocks, pack: bool = True, stage: str | None = None) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to the blocked schedule
    ``b..., n/nc, k/kc, m/mc, nc/nr, mc/mr, kc, mr, nr`` (``mr`` x ``nr`` = ``rows`` x
    ``columns``, the blocks ``blocks``); a block not smaller than its dimension (or None) drops
    its loop. With ``pack``, the right operand is packed into ``columns``-wide panels (at the
    innermost column loop). With ``stage`` (``"k"`` or ``"n"``; needs ``pack``), those panels
    are not made of the whole right operand on every call but of its block at each iteration of
    the reduction block loop ``k/kc`` (``"k"``: a ``kc`` x ``nc`` block, BLIS's packed B) or of
    the column block loop ``n/nc`` (``"n"``: all of the reduction by ``nc``): a ``stage`` step
    (:meth:`LoopNest.stage <looprl.ir.nest.LoopNest.stage>`). Sizes the blocks do not divide
    leave tails. ValueError with :func:`why_not_blocked`'s reason when there is no such
    schedule, or the stage's (a constant right operand, a loop the block does not make)."""
    why = why_not_blocked(problem, rows, columns, blocks)
    if why is None and stage is not None and (stage not in ("k", "n") or not pack):
        why = f"stage must be 'k' or 'n' (with pack), got {stage!r:.40}"
    if why is not None:
        raise ValueError(why)
    out = problem.output
    row, col, red = out[-2], out[-1], problem.reduction_dims[0]
    nest = initial_nest(problem)
    names = [f"{loop.var}0" for loop in nest.compute]
    steps: list[Step] = []

    def split(name: str, factor: int, inner: str) -> None:
        nonlocal nest
        index = names.index(name)
        nest = nest.split(index, factor)
        steps.append(Step(SPLIT, index, factor))
        names.insert(index + 1, inner)

    def chain(dim: str, block: int | None, tile: int) -> list[tuple[str, int, str]]:
        """The splits of ``dim``: by the tile, then the loop over tiles by the tiles per
        block (so every factor is a count an action can name, however large the block)."""
        size = problem.size(dim)
        tile = tile if 2 <= tile < size else 1
        splits = [(f"{dim}0", tile, f"{dim}_in")] if tile > 1 else []
        if block is not None and tile < block < size:
            splits.append((f"{dim}0", block // tile, f"{dim}_blk"))
        return splits

    pending = {dim: chain(dim, block, tile) for dim, block, tile in ((col, blocks.n, columns), (red, blocks.k, 1), (row, blocks.m, rows))}
    for dim in (col, red, row):
        for outer, factor, inner in pending[dim]:
            split(outer, factor, inner)
    made = set(names)
    # the dimension a tile covers whole is the tile's own loop
    if f"{col}_in" not in made:
        names[names.index(f"{col}_blk" if f"{col}_blk" in made else f"{col}0")] = f"{col}_in"
    if f"{red}_blk" not in made:  # not blocked: the whole reduction runs inside the tiles
        names[names.index(f"{red}0")] = f"{red}_blk"
    if f"{row}_in" not in made and rows >= problem.size(row) and f"{row}_blk" not in made:
        names[names.index(f"{row}0")] = f"{row}_in"
    batch = [f"{d}0" for d in out[:-2]]
    others = [f"{d}0" for d in problem.reduction_dims[1:]]
    if f"{row}_blk" in made and f"{col}_blk" not in made:
        # a row block and no column block (one panel of the right operand covers it): the loop
        # over column tiles goes inside the row block, as BLIS's jr loop inside its ic loop, so
        # that the row block of the left operand is reused by every column tile from L2 (outside
        # the reduction block, it would be read again for each column tile)
        middle = [f"{red}0", f"{row}0", f"{col}0", f"{row}_blk"]
    else:
        middle = [f"{col}0", f"{red}0", f"{row}0", f"{col}_blk", f"{row}_blk"]
    wanted = batch + middle + others + [f"{red}_blk", f"{row}_in", f"{col}_in"]
    for place, name in enumerate(n for n in wanted if n in names):
        nest = lift(nest, names, steps, name, place)
    if pack:
        step = pack_right_step(nest)
        if step is not None:
            steps.append(step)
            nest = nest.apply((step,))
    if stage is not None:
        name = f"{red}0" if stage == "k" else f"{col}0"
        if name not in names:
            raise ValueError(f"no {stage} block loop to stage the right operand at: blocks {blocks} make none for {problem.name}")
        step = Step(STAGE, names.index(name), tensor="in1")
        why = nest.why_not(step)
        if why is not None:
            raise ValueError(f"cannot stage the right operand at the {stage} block loop: {why}")
        steps.append(step)
    return steps


def why_not_blocked(problem: Problem, rows: int, columns: int, blocks: Blocks) -> str | None:
    """Why :func:`blocked_steps` has no such schedule of ``problem``, or None."""
    if len(problem.output) < 2 or not problem.reduction_dims:
        return f"{problem.name}: a blocked schedule needs two output dimensions and a reduction"
    if rows < 1 or columns < 1:
        return f"tile {rows}x{columns}: rows and columns must be positive"
    if not isinstance(blocks, Blocks):
        return f"blocks must be a Blocks value, got {type(blocks).__name__}"
    sizes = {"m": problem.size(problem.output[-2]), "n": problem.size(problem.output[-1]), "k": problem.size(problem.reduction_dims[0])}
    for name, block, tile in (("m", blocks.m, rows), ("n", blocks.n, columns), ("k", blocks.k, 1)):
        if block is not None and (block < 2 or block % tile):
            return f"the {name} block {block} must be at least 2 and a multiple of the tile's {tile}"
        if block is not None and block < sizes[name] and block // tile > MAX_FACTOR:
            # its loop over tiles would be split by block // tile: no split step (no action) names a count that large
            return f"the {name} block {block} holds {block // tile} tiles of {tile}: more than a split can name ({MAX_FACTOR})"
    return None
