"""Register tiles, their cache-blocked variants and a packed right operand, measured as env
action paths from the untiled nest.

A large problem needs a tile as wide as the target's register file allows and, where the
operands outgrow the caches, blocks of the reduction and of the columns around it, which an
episode of a dozen actions cannot also build. ``looprl.tune`` takes the tile the policy built
(:func:`tile_of` its best state) and :func:`measure_tiles` refines it; given no tile shapes it
proposes the target's own in order of how often they pay (the flat register tiles of
:func:`~looprl.ir.schedules.tile_shapes`, then :func:`~looprl.ir.schedules.cache_blocks`
around the fastest, then that fastest with the right operand packed into column panels; when
the output's columns are not the right operand's contiguous dimension, as in ``A @ B.T``,
every tile is packed, since unpacked it gathers lane by lane), each
as the actions that build it, so the answer replays in the env like any other path.
"""

from __future__ import annotations

from dataclasses import dataclass

from looprl.env.actions import ActionSet, State
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.schedules import cache_blocks, tile_shapes, tile_steps


@dataclass(frozen=True)
class TileResult:
    actions: tuple[str, ...]  # the best tile's path from the untiled nest (empty if none measured)
    nest: LoopNest | None
    gflops: float
    tried: int  # tiles measured (or refused by the deadline)


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


def measure_tiles(problem: Problem, evaluator, actions: ActionSet, target, shapes=None) -> TileResult:
    """Measure register tiles of ``problem`` through ``evaluator`` (e.g. a
    :class:`~looprl.policy.budget.DeadlineEvaluator`, which may refuse some) and return the
    fastest as a path of action names from the untiled nest (``actions`` extended as needed).
    ``shapes``: the (rows, columns) tiles to start from (default: the target's
    :func:`~looprl.ir.schedules.tile_shapes`); each is measured in the canonical order, then
    the fastest with cache blocks and packed."""
    root = State(initial_nest(problem), 0)
    best: tuple = (0.0, (), 0, None)  # gflops, names, columns, nest
    tried = 0

    def attempt(steps, columns: int) -> None:
        nonlocal best, tried
        names = [f"split_{step[2]}" for step in steps if step[0] == "split"]
        extended = actions.extended(names)
        planned = extended.path(root, steps)
        if planned is None:
            return  # e.g. more loops than max_loops
        path, state = planned
        names = tuple(extended.names[a] for a in path)
        if transposed:  # gathers across B's rows unless B is packed into column panels
            packed = _packed(problem, names, actions)
            if packed is None:
                return
            names, state = packed
        tried += 1
        measurement = evaluator(state.nest)
        if measurement.ok and measurement.gflops > best[0]:
            best = (measurement.gflops, names, columns, state.nest)

    if len(problem.output) < 2 or not problem.reduction_dims:
        return TileResult((), None, 0.0, 0)
    # The output's columns are the vectors' lanes: if they are not the right operand's
    # contiguous dimension (A @ B.T, attention's q . k^T), every tile is measured packed.
    transposed = problem.operands[1][-1] != problem.output[-1]
    flat = {}
    for rows, columns in (tile_shapes(problem, target) if shapes is None else shapes):
        try:
            steps = tile_steps(problem, rows, columns)
        except ValueError:
            continue
        before = best
        attempt(steps, columns)
        if best is not before:
            flat = {"rows": rows, "columns": columns}
    if flat:
        for k_block, n_block in cache_blocks(problem, flat["columns"]):
            try:
                steps = tile_steps(problem, flat["rows"], flat["columns"], k_block, n_block)
            except ValueError:
                continue
            attempt(steps, flat["columns"])
    if best[1] and not transposed:
        packed = _packed(problem, best[1], actions)
        if packed is not None:
            names, state = packed
            tried += 1
            measurement = evaluator(state.nest)
            if measurement.ok and measurement.gflops > best[0]:
                best = (measurement.gflops, names, best[2], state.nest)
    return TileResult(best[1], best[3], best[0], tried)


def _packed(problem: Problem, names: tuple[str, ...], actions: ActionSet):
    """The path ``names`` followed by packing the right operand along the output's columns at
    the innermost column loop (its tile width), or None if that does not apply."""
    extended = actions.extended(list(names) + ["pack"])
    state = State(initial_nest(problem), 0)
    for name in names:
        state = extended.apply(state, extended.index(name))
        if state is None:
            return None
    column = problem.output[-1]
    inner = max(i for i, loop in enumerate(state.nest.compute) if loop.var == column)
    moves = ["up" if inner < state.cursor else "down"] * abs(state.cursor - inner)
    for name in moves + ["pack"]:
        state = extended.apply(state, extended.index(name))
        if state is None:
            return None
    return tuple(names) + tuple(moves) + ("pack",), state


def all_tiles(problem: Problem, target) -> list[LoopNest]:
    """Every schedule :func:`measure_tiles` could propose for ``problem`` on ``target``: each
    register tile, flat and with each cache block, with the right operand row-major and packed
    (the hand-written reference an experiment measures exhaustively)."""
    nests: list[LoopNest] = []
    if len(problem.output) < 2 or not problem.reduction_dims:
        return nests
    column = problem.output[-1]
    for rows, columns in tile_shapes(problem, target):
        for blocks in [(None, None)] + cache_blocks(problem, columns):
            try:
                nest = initial_nest(problem).apply(tile_steps(problem, rows, columns, *blocks))
            except ValueError:
                continue
            for variant in (nest, _pack_right(nest, column)):
                if variant is not None and variant not in nests:
                    nests.append(variant)
    return nests


def _pack_right(nest: LoopNest, column: str) -> LoopNest | None:
    """``nest`` with the right operand packed by its innermost column loop's tile width."""
    loops = [loop for loop in nest.compute if loop.var == column]
    width = loops[-2].step if len(loops) > 1 else 1
    if width < 2:
        return None
    try:
        return nest.layout_pack("in1", column, width)
    except ValueError:
        return None
