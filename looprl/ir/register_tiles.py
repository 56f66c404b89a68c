"""The register-tile rule, in one place: which (rows, columns) output tiles a problem gets on a
target, the IR steps that build one from the untiled nest, and which tile a schedule computes.

What *fits* the register file is the target's (:meth:`looprl.target.Target.fits`,
:meth:`~looprl.target.Target.register_tiles`: accumulators, the shared input row and a
broadcast within the architectural registers): the code generator plans its register scope
with it, and everything that chooses tiles (tune's tile stage, the expert schedules, training's
demonstrations) chooses among :func:`tile_shapes` and builds them with :func:`tile_steps`.
"""

from __future__ import annotations

from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.step import PACK, SPLIT, SWAP, Step
from looprl.target import Target


def tile_shapes(problem: Problem, target: Target) -> list[tuple[int, int]]:
    """(rows, columns) register tiles of ``problem``'s output for ``target``: each of
    :meth:`~looprl.target.Target.register_tiles`, clipped to the output; when the output has
    fewer rows than a tile (a GEMV-like m), the tile is widened instead to the most vectors that
    fit with those rows, so that it still keeps most registers busy. Columns are a whole number
    of vectors; a tile wider than the output is clipped to it."""
    Target.required(target, "tile_shapes")
    if len(problem.output) < 2:
        raise ValueError(f"{problem.name}: register tiles need two output dimensions")
    shapes = []
    for rows, vectors in target.register_tiles():
        shape = clipped_tile(problem, target, rows, vectors)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def clipped_tile(problem: Problem, target: Target, rows: int, vectors: int) -> tuple[int, int]:
    """(rows, columns) of a register tile of ``rows`` x ``vectors`` (the target's vectors) on
    ``problem``'s output: with fewer output rows, all of them and as many vectors as fit them;
    columns clipped to the output's."""
    row_size, col_size = problem.size(problem.output[-2]), problem.size(problem.output[-1])
    if row_size < rows:
        rows = row_size
        vectors = max(1, target.most_vectors(rows))
    return rows, min(vectors * target.vector_width, col_size)


def pack_right_step(nest: LoopNest) -> Step | None:
    """The step that packs ``nest``'s right operand by its innermost output-column loop's tile
    width (the step of the column loop around it), at that loop; None when that changes nothing
    (a tile one column wide, or a layout the nest refuses)."""
    column = nest.problem.output[-1]
    indices = [i for i, loop in enumerate(nest.compute) if loop.var == column]
    width = nest.compute[indices[-2]].step if len(indices) > 1 else 1
    if width < 2:
        return None
    step = Step(PACK, indices[-1], width, "in1")
    return step if nest.why_not(step) is None else None


def packed_right(nest: LoopNest) -> LoopNest | None:
    """``nest`` with the right operand packed (:func:`pack_right_step`), or None when that
    changes nothing."""
    step = pack_right_step(nest)
    return None if step is None else nest.apply((step,))


def tile_steps(problem: Problem, rows: int, columns: int, k_block: int | None = None, n_block: int | None = None) -> list[Step]:
    """IR steps (``nest.apply``) from ``problem``'s untiled nest to a register tile of ``rows``
    output rows by ``columns`` output columns, optionally cache-blocked.

    Without blocks: ``b..., n/columns, m/rows, k..., m_rows, n_columns`` (the register-blocked
    order of BLIS's micro-kernel: the tile's accumulators stay in registers while every
    reduction loop runs). With ``k_block`` (elements of the first reduction dimension) and
    ``n_block`` (a multiple of ``columns``): ``b..., n/n_block, k/k_block, m/rows, n_block/columns,
    k_block, m_rows, n_columns``: a k_block x n_block panel of the right operand is reused by
    every row tile (it stays in L2), a rows x k_block panel of the left one by every column
    tile of the panel (in L1). Sizes the factors do not divide leave tails. Raises ValueError
    with :func:`why_not_tile`'s reason when there is no such tile."""
    why = why_not_tile(problem, rows, columns, k_block, n_block)
    if why is not None:
        raise ValueError(why)
    out = problem.output
    row, col = out[-2], out[-1]
    red = problem.reduction_dims[0]
    nest = initial_nest(problem)
    names = [f"{loop.var}0" for loop in nest.compute]  # one loop per dimension, first appearance
    steps: list[Step] = []

    def split(name: str, factor: int, inner: str) -> None:
        nonlocal nest
        index = names.index(name)
        if not 2 <= factor <= nest.compute[index].size:
            raise ValueError(f"{problem.name}: cannot split {name} by {factor}")
        nest = nest.split(index, factor)
        steps.append(Step(SPLIT, index, factor))
        names.insert(index + 1, inner)

    blocked = k_block is not None and n_block is not None
    pending: dict[str, list[tuple[int, str]]] = {}  # dimension -> splits of its outer loop, in order
    if 2 <= columns < problem.size(col):  # a 1-wide tile keeps the whole loop outside
        pending[col] = [(columns, f"{col}_in")]
        if blocked and n_block < problem.size(col):
            pending[col].append((n_block // columns, f"{col}_mid"))
    if blocked and k_block < problem.size(red):
        pending[red] = [(k_block, f"{red}_in")]
    if 2 <= rows < problem.size(row):
        pending[row] = [(rows, f"{row}_in")]
    made = set(names) | {inner for splits in pending.values() for _, inner in splits}
    # An unsplit dimension the tile covers whole is the tile's own loop: the columns stay
    # innermost (the vectors), rows that all fit the tile sink below the reduction.
    if f"{col}_in" not in made:
        names[names.index(f"{col}0")] = f"{col}_in"
    if f"{row}_in" not in made and rows >= problem.size(row):
        names[names.index(f"{row}0")] = f"{row}_in"
    made = set(names) | {inner for splits in pending.values() for _, inner in splits}
    batch = [f"{d}0" for d in out[:-2]]
    others = [f"{d}0" for d in problem.reduction_dims[1:]]
    tile = [f"{row}_in", f"{col}_in"]
    if f"{col}_mid" in made or f"{red}_in" in made:
        wanted = batch + [f"{col}0", f"{red}0", f"{row}0", f"{col}_mid"] + others + [f"{red}_in"] + tile
    else:
        wanted = batch + [f"{col}0", f"{row}0", f"{red}0"] + others + tile
    wanted = [name for name in wanted if name in made]
    # Outermost first: split a dimension when its first loop is placed, then lift that loop up
    # to its place. Done in this order, an env agent reaches the tile in few actions (the 2-D
    # register tile of a matmul in 9: split n, lift it twice, split m, sink m's inner loop).
    for place, name in enumerate(wanted):
        for factor, inner in pending.pop(name[0], []):
            split(f"{name[0]}0", factor, inner)
        nest = lift(nest, names, steps, name, place)
    return steps


def lift(nest: LoopNest, names: list[str], steps: list[Step], name: str, place: int) -> LoopNest:
    """Swap the loop called ``name`` up to position ``place`` (``names`` and ``steps`` follow)."""
    index = names.index(name)
    while index > place:
        nest = nest.swap(index - 1)
        steps.append(Step(SWAP, index - 1))
        names[index - 1], names[index] = names[index], names[index - 1]
        index -= 1
    return nest


def why_not_tile(problem: Problem, rows: int, columns: int, k_block: int | None = None, n_block: int | None = None) -> str | None:
    """Why :func:`tile_steps` has no such tile of ``problem``, or None."""
    if len(problem.output) < 2 or not problem.reduction_dims:
        return f"{problem.name}: a register tile needs two output dimensions and a reduction"
    if rows < 1 or columns < 1:
        return f"tile {rows}x{columns}: rows and columns must be positive"
    if k_block is not None and n_block is not None and (n_block % columns or n_block <= columns):
        return f"n_block {n_block} must be a multiple of columns {columns}, larger than it"
    return None


def tile_of(nest: LoopNest) -> tuple[int, int] | None:
    """(rows, columns) of the register tile ``nest`` computes, or None: the innermost compute
    loop must walk the output's columns with step 1 inside another loop over them (a split);
    rows is the size of the loop over output rows right above it if that is a split's inner
    loop too, else 1."""
    problem = nest.problem
    if len(problem.output) < 2:
        return None
    row, col = problem.output[-2], problem.output[-1]
    compute = nest.compute
    inner = compute[-1]
    if inner.var != col or inner.step != 1 or not any(loop.var == col for loop in compute[:-1]):
        return None
    rows = 1
    above = compute[:-2]
    if len(compute) > 1 and compute[-2].var == row and compute[-2].step == 1 and any(loop.var not in problem.output for loop in above):
        rows = compute[-2].size  # rows kept in registers while a reduction loop around them runs
    return rows, inner.size
