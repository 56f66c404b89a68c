"""Hand-written schedules expressed with split/swap: expert baselines for benchmarks."""

from __future__ import annotations

from looprl.ir.cache_blocks import Blocks, Caches, block_candidates, host_caches, strip_candidates
from looprl.ir.layout import Layout
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import lift
from looprl.ir.step import INNERMOST, SPLIT, Step
from looprl.target import Target


def reorder_compute(nest: LoopNest, order: list[int]) -> LoopNest:
    """Permute the compute loops with adjacent swaps so that new position i holds old loop
    ``order[i]``. Loops of the same dimension must keep their relative order."""
    count = len(nest.compute)
    if sorted(order) != list(range(count)):
        raise ValueError(f"order must be a permutation of 0..{count - 1}, got {order}")
    rank = {old: new for new, old in enumerate(order)}
    current = list(range(count))  # current[i] = original index of the loop at position i
    changed = True
    while changed:
        changed = False
        for i in range(count - 1):
            if rank[current[i]] > rank[current[i + 1]]:
                nest = nest.swap(i)
                current[i], current[i + 1] = current[i + 1], current[i]
                changed = True
    return nest


def why_not_expert(problem: Problem, m_tile: int, n_tile: int) -> str | None:
    """Why :func:`expert_matmul` has no such schedule of ``problem``, or None."""
    if problem.spec != "mk,kn->mn":
        return f"expert_matmul needs a 'mk,kn->mn' problem, got {problem.spec!r}"
    if not (1 <= m_tile <= problem.size("m") and 1 <= n_tile <= problem.size("n")):
        return f"tiles {m_tile}x{n_tile} do not fit the problem {problem.name}"
    return None


def expert_matmul(problem: Problem, m_tile: int, n_tile: int, k_unroll: int | None = None) -> LoopNest:
    """The classic register-blocked order ``n/n_tile, m/m_tile, k, m_tile, n_tile`` (with the k
    loop split by ``k_unroll`` when given) for ``mk,kn->mn``."""
    why = why_not_expert(problem, m_tile, n_tile)
    if why is not None:
        raise ValueError(why)
    nest = initial_nest(problem)  # m, k, n
    m, n, k = problem.size("m"), problem.size("n"), problem.size("k")
    m_split = m_tile < m and m_tile > 1
    n_split = n_tile < n and n_tile > 1
    k_split = k_unroll is not None and 1 < k_unroll <= k
    if n_split:
        nest = nest.split(2, n_tile)
    if k_split:
        nest = nest.split(1, k_unroll)
    if m_split:
        nest = nest.split(0, m_tile)
    # Loops now: m[, m_in], k[, k_in], n[, n_in]; name their positions.
    names = []
    names += ["m", "m_in"] if m_split else ["m"]
    names += ["k", "k_in"] if k_split else ["k"]
    names += ["n", "n_in"] if n_split else ["n"]
    wanted = (
        ["n"]
        + (["m"] if m_split else [])
        + ["k"]
        + (["k_in"] if k_split else [])
        + (["m_in"] if m_split else ["m"])
        + (["n_in"] if n_split else [])
    )
    if not n_split:
        wanted.remove("n")
        wanted.append("n")
    return reorder_compute(nest, [names.index(w) for w in wanted])


def target_split_factors(target: Target, base=(4, 8, 16), largest: int = 64) -> tuple[int, ...]:
    """Split factors that can form ``target``'s register tiles: ``base`` (the paper's 4, 8, 16)
    plus the rows and the vector widths (vectors x lanes) of :meth:`Target.register_tiles`, up
    to ``largest``. With 4, 8 and 16 alone an AVX2 tile (16 registers of 8 lanes) is at best
    4 rows x 16 columns, 8 accumulators; 6 x 16 and 4 x 24 need splits by 6 and 24."""
    lanes = Target.required(target, "target_split_factors").vector_width
    factors = set(base)
    for rows, vectors in target.register_tiles():
        factors.update(f for f in (rows, vectors * lanes) if 2 <= f <= largest)
    return tuple(sorted(factors))


def expert_candidates(problem: Problem, target: Target) -> list[LoopNest]:
    """A handful of register-blocked schedules for ``target``: its
    :meth:`~looprl.target.Target.register_tiles` as ``n/nt, m/mt, k, mt, nt`` with and without
    the k loop split by 4. Benchmarks keep the fastest."""
    lanes = Target.required(target, "expert_candidates").vector_width
    result = []
    for rows, vectors in target.register_tiles():
        m_tile = min(rows, problem.size("m"))
        n_tile = min(vectors * lanes, problem.size("n"))
        if why_not_expert(problem, m_tile, n_tile) is not None:
            continue
        for k_unroll in (None, 4):
            nest = expert_matmul(problem, m_tile, n_tile, k_unroll)
            if nest not in result:
                result.append(nest)
    return result


def random_schedule(problem: Problem, rng, steps: int = 10, factors=(4, 8, 16), max_loops: int = 10) -> LoopNest:
    """A random walk of ``steps`` split/swap transforms (those that do not apply are
    skipped): a stand-in for states an agent visits. ``rng`` is a ``random.Random``."""
    nest = initial_nest(problem)
    for _ in range(steps):
        index = rng.randrange(len(nest))
        if rng.random() < 0.5:
            factor = rng.choice(factors)
            if len(nest) < max_loops and nest.why_not_split(index, factor) is None:
                nest = nest.split(index, factor)
        elif nest.why_not_swap(index) is None:
            nest = nest.swap(index)
    return nest


def cache_blocks(problem: Problem, rows: int, columns: int, caches: Caches | None = None) -> list[Blocks]:
    """The cache blocks to try around a ``rows`` x ``columns`` register tile of ``problem``
    (:func:`~looprl.ir.cache_blocks.blocked_steps` builds each): derived from ``caches`` (None:
    this host's, :func:`~looprl.ir.cache_blocks.host_caches`) and a few neighbours
    (:func:`~looprl.ir.cache_blocks.block_candidates`); none where the problem is too small
    for a block to leave more than one iteration."""
    return block_candidates(problem, rows, columns, host_caches() if caches is None else caches)


def column_strips(problem: Problem, rows: int, columns: int, caches: Caches | None = None) -> list[Blocks]:
    """The column strips of a changing right operand to try around a ``rows`` x ``columns``
    register tile of ``problem``, each packed as the row tiles come to it
    (:func:`~looprl.ir.cache_blocks.strip_candidates`; ``caches`` None: this host's)."""
    return strip_candidates(problem, rows, columns, host_caches() if caches is None else caches)


# Decode-sized problems (few output rows) whose right operand outgrows the caches are bound by
# how fast that operand streams in. A register tile reads it a few vectors per row of the
# reduction, rows far apart in memory, faster than the prefetchers follow; a streaming tile
# reads a whole cache line or a few per row, of k_inner rows at a time (see stream_steps).
# At most this many output rows: at 16 rows the 4-line tile (which the rows make the fastest in
# tune's timing more often) ran at 35-77 GFLOPS from one timing to the next in one process, where
# at 4 rows it held at 85-100 (AVX2 code on a Zen 4, 16x2048x2048 and 4x2048x2048).
STREAM_ROWS = 8
STREAM_TILES = ((8, 16), (8, 64), (4, 64))  # (k_inner, columns): columns of 1 and 4 64-byte lines


def why_not_stream(problem: Problem, k_inner: int, columns: int) -> str | None:
    """Why :func:`stream_steps` has no such schedule of ``problem``, or None."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        return f"{problem.name}: a streaming tile needs two output dimensions and one reduction"
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    if problem.size(row) > STREAM_ROWS:
        return f"{problem.name}: a streaming tile is for at most {STREAM_ROWS} output rows, not {problem.size(row)}"
    if not 2 <= k_inner < problem.size(red):
        return f"{problem.name}: k_inner {k_inner} must be at least 2 and less than {red}={problem.size(red)}"
    if not 2 <= columns < problem.size(col):
        return f"{problem.name}: columns {columns} must be at least 2 and less than {col}={problem.size(col)}"
    return None


def stream_steps(problem: Problem, k_inner: int, columns: int) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to a streaming tile:
    ``b..., k/k_inner, n/columns, m, k_inner, n_columns``. For each block of ``k_inner``
    reduction rows, each ``columns``-wide panel of them is read once, every output row's
    accumulators for the panel stay in registers across the block's rows, and the output
    (a few rows, small) is reloaded once per block. Sizes the factors do not divide leave
    tails. Raises ValueError with :func:`why_not_stream`'s reason when there is none."""
    why = why_not_stream(problem, k_inner, columns)
    if why is not None:
        raise ValueError(why)
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    return _split_and_ordered(problem, ((red, k_inner), (col, columns)), [red, col, row, f"{red}_in", f"{col}_in"])


# A problem whose inputs both store the reduction contiguously (``nn.Linear``'s ``x[m, k]`` and
# ``W[n, k]``, attention's ``q[b, m, k]`` and ``keys[b, n, k]``) is read in place by a dot-product
# tile: for each panel of ``columns`` output columns and block of ``rows`` output rows, one
# vector of partial sums per output element runs along the whole reduction (the code generator
# vectorises an innermost loop that walks a reduction both inputs hold contiguously), and the
# partial sums are added across once, at the end. Each of the panel's weight rows streams front
# to back; the rows' activations are reread from the cache for every panel. No copy of the
# weight: in a model nothing derived from it has to be kept in step with it.
DOT_ROWS = (1, 2, 4)  # output rows of a dot-product tile
DOT_COLUMNS = 8  # at most this many output columns (weight rows streaming at once)


def dot_tiles(target: Target) -> tuple[tuple[int, int], ...]:
    """(rows, columns) of the target's dot-product tiles: for each of :data:`DOT_ROWS`, the
    most columns (up to :data:`DOT_COLUMNS`) whose partial sums and inputs fit the register file
    (each column's weight vector is reused by every row, as a register tile's vectors are), and
    half of that."""
    tiles = []
    for rows in DOT_ROWS:
        most = min(target.most_vectors(rows), DOT_COLUMNS)
        for columns in dict.fromkeys((most, min(most, 4))):
            if columns >= 2:
                tiles.append((rows, columns))
    return tuple(tiles)


def why_not_dot(problem: Problem) -> str | None:
    """Why :func:`dot_steps` has no schedule of ``problem``, or None: it needs two output
    dimensions and one reduction, stored last (contiguously) by both inputs."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        return f"{problem.name}: a dot-product tile needs two output dimensions and one reduction"
    red = problem.reduction_dims[0]
    if any(term[-1] != red for term in problem.operands):
        return f"{problem.name}: a dot-product tile reads both inputs along the reduction {red!r}; both must store it last"
    return None


def dot_steps(problem: Problem, target: Target, rows: int, columns: int) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to a dot-product tile of at most
    ``rows`` x ``columns`` output elements: ``b..., n/columns, m/rows, k/lanes, m_in, n_in,
    k_in`` (``lanes`` the reduction elements a vector of partial sums takes: the target's
    vector width, twice it for bfloat16 on ``vdpbf16ps``; a loop the problem is too small to split is
    left whole). Sizes the factors do not divide leave tails. Raises ValueError with
    :func:`why_not_dot`'s reason when there is none."""
    why = why_not_dot(problem)
    if why is not None:
        raise ValueError(why)
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    factors = {red: problem.dtype.reduction_lanes(target), col: columns, row: rows}
    splits = [(var, factors[var]) for var in (red, col, row) if 1 < factors[var] < problem.size(var)]
    split = {var for var, _ in splits}
    # a dimension split has an outer loop and an inner one in the tile; one not split is all in
    # the tile, or (a factor of 1) all outside it
    outer = [var for var in (col, row, red) if var in split or factors[var] == 1 < problem.size(var)]
    inner = [f"{var}_in" if var in split else var for var in (row, col, red) if var not in outer or var in split]
    return _split_and_ordered(problem, splits, outer + inner)


def _split_and_ordered(problem: Problem, splits, order: list[str]) -> list[Step]:
    """IR steps from ``problem``'s untiled nest that split each ``(dimension, factor)`` of
    ``splits`` (its inner loop named ``<dimension>_in``), then put the loops in ``order``
    after the batch dimensions (the output's dimensions before its last two)."""
    nest = initial_nest(problem)
    names = [loop.var for loop in nest.compute]  # one loop per dimension
    steps: list[Step] = []
    for var, factor in splits:
        index = names.index(var)
        nest = nest.split(index, factor)
        steps.append(Step(SPLIT, index, factor))
        names.insert(index + 1, f"{var}_in")
    for place, name in enumerate(list(problem.output[:-2]) + order):
        nest = lift(nest, names, steps, name, place)
    return steps


# A cold problem's weights (Problem.cold) come from memory on every call: the schedule that
# streams them fastest reads each panel of columns once, front to back, its rows' accumulators
# in registers for the whole reduction (``panel_steps``), the panels packed one after another so
# the whole weight is one sequential read. Panels as wide as this many registers of accumulators
# at most (rows x vectors).
PANEL_COLUMNS = (64, 128, 256)
PANEL_REGISTERS = 16


def panel_widths(problem: Problem, target: Target) -> list[int]:
    """Column widths of the panels :func:`panel_steps` takes for ``problem`` on ``target``:
    those of :data:`PANEL_COLUMNS` narrower than the output's columns whose accumulators, for
    every output row, fit :data:`PANEL_REGISTERS` registers."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        return []
    rows, cols = problem.size(problem.output[-2]), problem.size(problem.output[-1])
    lanes = Target.required(target, "panel_widths").vector_width
    return [w for w in PANEL_COLUMNS if w < cols and rows * -(-w // lanes) <= PANEL_REGISTERS]


def panel_steps(problem: Problem, columns: int) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to a panel schedule:
    ``b..., n/columns, k, m, n_columns``: each panel of ``columns`` output columns is computed
    whole, its accumulators (every row's) in registers across the entire reduction, before the
    next (packed, see :data:`PANEL_COLUMNS`, its weights are read once, in order)."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        raise ValueError(f"{problem.name}: a panel schedule needs two output dimensions and one reduction")
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    if not 2 <= columns < problem.size(col):
        raise ValueError(f"{problem.name}: panel columns {columns} must be at least 2 and less than {col}={problem.size(col)}")
    return _split_and_ordered(problem, ((col, columns),), [col, red, row, f"{col}_in"])


# A cold weight read as several streams side by side (stream_panel_steps): panels of one or two
# vectors' width, packed one after another, ``streams`` of them read at once, a row of each per
# step of the reduction. One sequential stream leaves a core's reads in flight to the hardware
# prefetchers; several regions read side by side keep more of them in flight (the stream kernel
# measures the bound both ways, looprl.backend.stream_kernel). On a 2-vCPU AMD EPYC Zen 3 (AVX2,
# one thread), 1 MB regions read from memory in turn streamed at 12.2 GB/s as one stream and 14.1
# as four; a 1 x 512 -> 2816 linear layer's cold weight at 11.7 GB/s in 64-column panels read one
# after another and 15.3-16.5 four or eight panels at once (experiments/stream_panels.py,
# experiments/results/stream_panels_znver3.txt). Measured, never chosen: the counts are the same on
# every host, and the panels' accumulators, for every row, fit PANEL_REGISTERS registers.
STREAM_PANEL_COUNTS = (4, 8)
STREAM_PANEL_VECTORS = (2, 1)  # a panel's width in the target's vectors


def stream_panel_shapes(problem: Problem, target: Target) -> list[tuple[int, int]]:
    """The ``(streams, columns)`` of :func:`stream_panel_steps` for ``problem`` on ``target``, in
    the order tune measures them: ``streams`` of :data:`STREAM_PANEL_COUNTS` panels of
    :data:`STREAM_PANEL_VECTORS` vectors' width, narrower together than the output's columns, whose
    accumulators, for every output row, fit :data:`PANEL_REGISTERS` registers."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        return []
    rows, cols = problem.size(problem.output[-2]), problem.size(problem.output[-1])
    lanes = Target.required(target, "stream_panel_shapes").vector_width
    shapes = [(streams, vectors * lanes) for streams in STREAM_PANEL_COUNTS for vectors in STREAM_PANEL_VECTORS]
    return [(streams, columns) for streams, columns in shapes
            if streams * columns < cols and rows * streams * (columns // lanes) <= PANEL_REGISTERS]


def stream_panel_steps(problem: Problem, streams: int, columns: int) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to panels read side by side:
    ``b..., n/(streams*columns), k, m, streams, columns``. Packed by ``columns`` (the panels one
    after another, each its reduction's rows in order), each group of ``streams`` panels is
    computed whole, every row's accumulators for the group in registers across the entire
    reduction, reading a row of each of its panels per step: ``streams`` regions of the weight
    read at once. Sizes the factors do not divide leave tails."""
    if len(problem.output) < 2 or len(problem.reduction_dims) != 1:
        raise ValueError(f"{problem.name}: a panel schedule needs two output dimensions and one reduction")
    row, col, red = problem.output[-2], problem.output[-1], problem.reduction_dims[0]
    if streams < 2 or columns < 2 or streams * columns >= problem.size(col):
        raise ValueError(f"{problem.name}: {streams} streams of {columns}-column panels need at least 2 of at least 2 columns, "
                         f"fewer than {col}={problem.size(col)} in all")
    return _split_and_ordered(problem, ((col, streams * columns), (f"{col}_in", columns)),
                              [col, red, row, f"{col}_in", f"{col}_in_in"])


def column_last_layout(problem: Problem, tensor: str) -> Layout | None:
    """The layout that stores input ``tensor`` (``"in0"`` or ``"in1"``) with the output's last
    dimension innermost, when its row-major order puts that dimension elsewhere (B[n, k] of
    ``mk,nk->mn`` becomes B stored as [k, n]: the register tile's vectors become contiguous
    loads instead of gathers); None when the tensor lacks that dimension or has it last."""
    column = problem.output[-1]
    index = dict(zip(("in0", "in1"), problem.operands))[tensor]
    if column not in index or index[-1] == column:
        return None
    order = index.replace(column, "") + column
    return Layout.from_key(index, problem.shape(index), ".".join(f"{var}1" for var in order))


def layout_start_steps(problem: Problem) -> tuple[Step, ...]:
    """The steps that store every input :func:`column_last_layout` re-lays that way (an
    ``innermost`` step at the untuned nest's loop over the output's last dimension), where the
    nest admits them."""
    root = initial_nest(problem)
    column = problem.output[-1]
    steps = []
    for tensor in ("in0", "in1"):
        if column_last_layout(problem, tensor) is not None:
            step = Step(INNERMOST, problem.dims.index(column), tensor=tensor)
            if root.why_not(step) is None:
                root = root.apply((step,))
                steps.append(step)
    return tuple(steps)


def layout_starts(problem: Problem) -> list[LoopNest]:
    """Where a joint layout and loop search starts (ALT's layout candidates): the untuned nest
    with row-major inputs, then with every input that :func:`column_last_layout` re-lays
    stored that way (:func:`layout_start_steps`; a non-constant input is then converted on
    every call, inside the timed kernel). One nest when no input needs it."""
    root = initial_nest(problem)
    steps = layout_start_steps(problem)
    return [root, root.apply(steps)] if steps else [root]
