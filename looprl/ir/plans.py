"""Whole schedules named by what tune chooses among: a register tile of the target, with or
without a cache block, with or without the right operand packed, or a streaming tile for few
output rows. A plan is data (:class:`Plan`, its name such as ``plan_6x2_k256_pack``); the
schedule it stands for on a problem is :func:`plan_nest`, built from the untiled nest by the
same IR steps tune's tile stage measures (:func:`~looprl.ir.register_tiles.tile_steps`,
:func:`~looprl.ir.schedules.stream_steps`); a plan's k block is the one its name gives
(:data:`K_BLOCKS`), with a column block fixed by it.

A plan's tile is named by the target's register tile (rows x vectors), not by the problem's
sizes, so one name means the same decision on every problem of a target: on a problem of
fewer output rows it is clipped as :func:`~looprl.ir.register_tiles.tile_shapes` clips it
(the rows it has, as many vectors as fit them). The plan actions of
:class:`~looprl.actions.ActionSet` apply them: an episode reaches any of tune's tiles in one
decision instead of the 10-21 cursor moves, splits and swaps that build it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import clipped_tile, pack_right_step, tile_steps, why_not_tile
from looprl.ir.step import Step
from looprl.ir.schedules import STREAM_TILES, dot_steps, dot_tiles, stream_steps, why_not_dot, why_not_stream
from looprl.target import Target

PLAN_PREFIX = "plan_"
K_BLOCKS = (256, 512)  # the reduction blocks a plan's name may give (_named_blocks)
# A named k block's column block: about this many elements of the right operand's block row
# (k_block x n_block elements: 512 columns for k 256, 256 for k 512). A plan's name is data
# (shipped policies and records name these plans), so the block it stands for is fixed by its
# name, not derived from the host's caches as tune's tile stage derives its own
# (looprl.ir.schedules.cache_blocks).
NAMED_BLOCK_ELEMENTS = 256 * 512
_TILE_NAME = re.compile(re.escape(PLAN_PREFIX) + r"(\d+)x(\d+)(?:_k(\d+))?(_pack)?")
_STREAM_NAME = re.compile(re.escape(PLAN_PREFIX) + r"stream_(\d+)x(\d+)")
_DOT_NAME = re.compile(re.escape(PLAN_PREFIX) + r"dot_(\d+)x(\d+)")


@dataclass(frozen=True)
class Plan:
    """A register tile of ``rows`` x ``vectors`` (the target's vectors), cache-blocked by
    ``k_block`` reduction elements (0: not blocked), its right operand packed or not; or,
    with ``stream=True``, a streaming tile of ``rows`` (k_inner) reduction rows by ``vectors``
    (here: columns) output columns; or, with ``dot=True``, a dot-product tile of ``rows`` output
    rows by ``vectors`` (here: columns) output columns that reads both inputs along the
    reduction, where both store it contiguously (``nn.Linear``'s weight as it lies: nothing
    copied, nothing re-laid; :func:`~looprl.ir.schedules.dot_steps`)."""

    rows: int
    vectors: int
    k_block: int = 0
    packed: bool = False
    stream: bool = False
    dot: bool = False

    def __post_init__(self):
        if self.rows < 1 or self.vectors < 1:
            raise ValueError(f"a plan's tile must be positive, got {self.rows}x{self.vectors}")
        if self.k_block not in (0,) + K_BLOCKS:
            raise ValueError(f"a plan's k block is one of {(0,) + K_BLOCKS}, got {self.k_block}")
        if (self.stream or self.dot) and (self.k_block or self.packed):
            raise ValueError("a streaming or dot-product plan has no cache block and no packing")
        if self.stream and self.dot:
            raise ValueError("a plan is a streaming tile or a dot-product tile, not both")

    @property
    def name(self) -> str:
        if self.stream:
            return f"{PLAN_PREFIX}stream_{self.rows}x{self.vectors}"
        if self.dot:
            return f"{PLAN_PREFIX}dot_{self.rows}x{self.vectors}"
        return f"{PLAN_PREFIX}{self.rows}x{self.vectors}" + (f"_k{self.k_block}" if self.k_block else "") + ("_pack" if self.packed else "")

    @classmethod
    def parse(cls, name: str) -> "Plan | None":
        """The plan named ``name``, or None for no such name (:attr:`name` and this are the
        one pair that writes and reads plan names)."""
        if not isinstance(name, str):
            return None
        stream = _STREAM_NAME.fullmatch(name)
        if stream:
            return _or_none(lambda: cls(int(stream[1]), int(stream[2]), stream=True))
        dot = _DOT_NAME.fullmatch(name)
        if dot:
            return _or_none(lambda: cls(int(dot[1]), int(dot[2]), dot=True))
        tile = _TILE_NAME.fullmatch(name)
        if tile:
            return _or_none(lambda: cls(int(tile[1]), int(tile[2]), int(tile[3] or 0), bool(tile[4])))
        return None


def _or_none(make):
    try:
        return make()
    except ValueError:
        return None


def plan_catalogue(target: Target) -> tuple[Plan, ...]:
    """Every plan of ``target``: each of its register tiles flat, with each k block, each
    unpacked and packed; then the streaming tiles; then the dot-product tiles."""
    target = Target.required(target, "plan_catalogue")
    plans = [Plan(rows, vectors, k_block, packed) for rows, vectors in target.register_tiles()
             for k_block in (0,) + K_BLOCKS for packed in (False, True)]
    return (tuple(plans) + tuple(Plan(k_inner, columns, stream=True) for k_inner, columns in STREAM_TILES)
            + tuple(Plan(rows, columns, dot=True) for rows, columns in dot_tiles(target)))


def plan_steps(problem: Problem, target: Target, plan: Plan) -> tuple[Step, ...] | str:
    """The steps from ``problem``'s untiled nest to the schedule ``plan`` stands for on it, or
    why there is none."""
    if len(problem.output) < 2 or not problem.reduction_dims:
        return f"{problem.name}: a plan needs two output dimensions and a reduction"
    if plan.stream:
        why = why_not_stream(problem, plan.rows, plan.vectors)
        return why if why is not None else tuple(stream_steps(problem, plan.rows, plan.vectors))
    if plan.dot:
        why = why_not_dot(problem)
        return why if why is not None else tuple(dot_steps(problem, target, plan.rows, plan.vectors))
    rows, columns = clipped_tile(problem, target, plan.rows, plan.vectors)  # as tile_shapes clips the target's tiles
    blocks = (None, None)
    if plan.k_block:
        blocks = _named_blocks(problem, columns, plan.k_block)
        if blocks is None:
            return f"{problem.name}: no k block of {plan.k_block} around a tile {columns} wide (the problem is too small)"
    why = why_not_tile(problem, rows, columns, *blocks)
    if why is not None:
        return why
    steps = tuple(tile_steps(problem, rows, columns, *blocks))
    if not plan.packed:
        return steps
    pack = pack_right_step(initial_nest(problem).apply(steps))
    return steps + (pack,) if pack is not None else f"{problem.name}: tile {rows}x{columns} leaves nothing to pack"


def _named_blocks(problem: Problem, columns: int, k_block: int) -> tuple[int, int] | None:
    """(k_block, n_block) of a plan named with ``k_block`` around a tile ``columns`` wide: the
    column block a whole number of tiles of about :data:`NAMED_BLOCK_ELEMENTS` / ``k_block``
    columns (at least two); None where the problem is too small for both blocks to leave more
    than one iteration."""
    k_size, n_size = problem.size(problem.reduction_dims[0]), problem.size(problem.output[-1])
    n_block = max(2, round(NAMED_BLOCK_ELEMENTS / k_block / columns)) * columns
    return (k_block, n_block) if k_block < k_size and n_block < n_size else None


def planned(problem: Problem, target: Target, plan: Plan) -> LoopNest | str:
    """The schedule ``plan`` stands for on ``problem``, or why there is none (built once: what
    :func:`why_not_plan` and :func:`plan_nest` ask, and what plan actions remember)."""
    steps = plan_steps(problem, target, plan)
    return steps if isinstance(steps, str) else initial_nest(problem).apply(steps)


def why_not_plan(problem: Problem, target: Target, plan: Plan) -> str | None:
    """Why ``plan`` has no schedule of ``problem`` on ``target``, or None."""
    found = planned(problem, target, plan)
    return found if isinstance(found, str) else None


def plan_nest(problem: Problem, target: Target, plan: Plan) -> LoopNest:
    """The schedule ``plan`` stands for on ``problem`` (ValueError with
    :func:`why_not_plan`'s reason when there is none)."""
    found = planned(problem, target, plan)
    if isinstance(found, str):
        raise ValueError(found)
    return found


def counterpart(plan: Plan, plans) -> Plan:
    """The plan among ``plans`` (another target's catalogue, say) that makes the same decision
    as ``plan``: ``plan`` itself if it is there; a streaming plan's nearest streaming tile; a
    register tile's with the same cache block and packing whose vectors per row are closest
    (the catalogue's tiles are "as many rows as fit for v vectors", so ``plan_14x2`` on
    AVX-512 and ``plan_6x2`` on AVX2 are one role), the first in ``plans``' order on a tie.
    ValueError when ``plans`` hold nothing of the kind."""
    plans = tuple(plans)
    if plan in plans:
        return plan
    if plan.stream or plan.dot:
        kin = [p for p in plans if p.stream == plan.stream and p.dot == plan.dot]
        key = lambda p: (abs(p.rows - plan.rows) + abs(p.vectors - plan.vectors))  # noqa: E731
    else:
        kin = [p for p in plans if not p.stream and not p.dot and p.k_block == plan.k_block and p.packed == plan.packed]
        key = lambda p: abs(p.vectors - plan.vectors)  # noqa: E731
    if not kin:
        raise ValueError(f"no plan among {[p.name for p in plans]} makes the decision {plan.name} makes")
    return min(kin, key=key)
