"""Register planning of the compute nest: which loop the innermost one vectorises along, the
*register scope* (the largest suffix of the nest whose output tile stays in registers: it is
loaded once before the scope and stored once after it), and the register blocks a tile that
just misses the register file is split into.

What fits is the target's rule (:meth:`looprl.target.Target.holds`), read once per target into
:func:`register_room` (the most accumulators per row width), which the planning asks; how a
loop covers its elements is :func:`tile_walk`, the one walk every count and every enumeration
of the tile goes through; how far moving along a dimension goes in a tensor, row-major or
through its layout, is :func:`offset_along`. No IR is
emitted here."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from looprl.backend.layout_plan import layouts_applied
from looprl.ir.layout import Layout
from looprl.ir.nest import Loop, LoopNest
from looprl.ir.problem import Problem
from looprl.target import Target

# Independent accumulators that hide multiply-add latency (x86 cores from Haswell/Zen on:
# two FMA pipes of latency 4). Register blocks smaller than this run latency-bound.
FMA_CHAINS = 8
# A register-blocked scope's output tile is at most this many floats (8 KB: it stays in L1
# while each block runs the reduction) and this many vectors (bounds the unrolled code); beyond
# that the scope stays where the whole tile fits. That is 128 AVX-512 vectors and 256 AVX2 or
# SSE4 ones. It used to be 4 register files: 128 AVX-512 vectors but 64 AVX2 ones, so an AVX2
# tile of 4 rows x 139 columns (72 vectors) streamed at a quarter of the speed, and 4 x 379
# (190 vectors) ran at 21 GFLOPS where blocking gives 97 (compiling such a kernel takes ~45 ms
# instead of ~12).
BLOCKED_TILE_FLOATS = 2048
BLOCKED_TILE_VECTORS = 256

Slot = tuple[int, int, int]  # a register of the tile: (accumulator offset, lanes, active lanes)


@dataclass(frozen=True)
class ComputePlan:
    """Decisions the generator made for the compute nest (exposed for tests and tooling)."""

    vector_var: str | None  # dimension vectorised along the innermost loop, if any
    scope_start: int  # first loop index of the register scope (== len(loops): leaf only)
    streaming: bool  # the innermost vectorised loop alone does not fit in registers
    zero_init: bool  # every reduction loop is inside the scope: tiles start at zero
    tile_registers: int  # registers the output tile takes in the full context
    blocks: int = 1  # register blocks the tile is split into (1: the whole tile fits)
    block_registers: int = 0  # accumulators of the largest block (== tile_registers when 1 block)
    reduces_vector: bool = False  # vector_var is a reduction dimension: one vector of partial sums per output element


def strides(problem: Problem, term: str) -> dict[str, int]:
    """Element stride of each dimension of a row-major tensor indexed by ``term``."""
    result, stride = {}, 1
    for dim in reversed(term):
        result[dim] = stride
        stride *= problem.size(dim)
    return result


@lru_cache(maxsize=65536)
def _layout_offset(layout: Layout, var: str, elements: int) -> int:
    return layout.offset(var, elements)


def offset_along(row_major: dict[str, int], layout: Layout | None, var: str, elements: int) -> int:
    """Offset in a tensor of moving ``elements`` along ``var``: by its row-major ``row_major``,
    or through its ``layout`` when it has one (within a range the schedule walks affinely: see
    :func:`~looprl.backend.layout_plan.layouts_applied`)."""
    if layout is None:
        return row_major.get(var, 0) * elements
    return _layout_offset(layout, var, elements)


def lanes_for(budget: int, width: int) -> int:
    """Vector length for an innermost loop of ``budget`` elements: full width, or the next
    power of two for short loops."""
    lanes = 1
    while lanes < budget and lanes < width:
        lanes *= 2
    return lanes


def vector_chunks(count: int, width: int) -> list[tuple[int, int, int]]:
    """``count`` consecutive floats as vectors of :func:`lanes_for` lanes: (first element, lanes,
    active lanes) of each, the last one masked when the lanes do not divide ``count``."""
    lanes = lanes_for(count, width)
    return [(c, lanes, min(lanes, count - c)) for c in range(0, count, lanes)]


def reduction_chunks(count: int, width: int) -> list[tuple[int, int, int]]:
    """``count`` consecutive floats of a reduction read as full-width vectors (partial sums of
    one output element keep one register type whatever the loop's budget): (first element,
    lanes, active lanes), the last one masked (its other lanes read as zeros)."""
    return [(c, width, min(width, count - c)) for c in range(0, count, width)]


def tile_walk(budget: int, step: int) -> tuple[tuple[int, int], ...]:
    """How a loop of ``step`` covers ``budget`` elements: (elements, iterations) groups, the
    full steps first, then the tail (a group is left out when it has no iteration)."""
    full, rem = divmod(budget, step)
    return tuple((elements, count) for elements, count in ((step, full), (rem, 1)) if elements and count)


def iterations(budget: int, step: int) -> list[tuple[int, int]]:
    """The iterations of :func:`tile_walk` one by one: (first element, elements)."""
    result, start = [], 0
    for elements, count in tile_walk(budget, step):
        for _ in range(count):
            result.append((start, elements))
            start += elements
    return result


def entry_budgets(loops: tuple[Loop, ...], level: int) -> tuple[tuple[str, int], ...]:
    """Budgets (full context) of the vars that still have loops at ``level`` or below."""
    seen: dict[str, int] = {}
    for loop in loops[level:]:
        seen.setdefault(loop.var, loop.budget)
    return tuple(sorted(seen.items()))


def with_budget(budgets, var: str, elements: int) -> tuple[tuple[str, int], ...]:
    """``budgets`` (pairs) with ``var``'s replaced, as sorted pairs (a memo key)."""
    return tuple(sorted({**dict(budgets), var: elements}.items()))


@lru_cache(maxsize=8192)
def leaf_count(loops, repeated, width, vector_var, level, budgets) -> int:
    """Leaves (vectors of the innermost loop, or scalars) the loops from ``level`` down run
    through, every iteration of a loop over a dimension in ``repeated`` counted, one iteration
    of the others: with ``repeated`` the output's dimensions, the registers of the output tile
    of a scope starting at ``level``; with every dimension, the multiply-adds of its body fully
    unrolled."""
    if level == len(loops):
        return 1
    loop = loops[level]
    budget = dict(budgets)[loop.var]
    if level == len(loops) - 1 and vector_var is not None:
        if loop.var not in repeated:  # a reduction vectorised: its vectors update one register
            return 1
        return -(-budget // lanes_for(budget, width))
    walk = tile_walk(budget, loop.step)
    if loop.var not in repeated:  # every iteration runs through the same leaves
        walk = ((walk[0][0], 1),)
    return sum(count * leaf_count(loops, repeated, width, vector_var, level + 1, with_budget(budgets, loop.var, elements)) for elements, count in walk)


def balanced(count: int, most: int) -> list[tuple[int, int]]:
    """``range(count)`` cut into the fewest consecutive parts of at most ``most``, as equal
    as possible, as (start, stop) pairs."""
    parts = -(-count // most)
    bounds = [count * i // parts for i in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


@lru_cache(maxsize=None)  # one entry per target
def register_room(target: Target) -> tuple[int, ...]:
    """What fits ``target``'s register file, read from its rule (:meth:`Target.holds`) once: at
    index ``v``, the most accumulators an output tile in rows of ``v`` vector registers may have
    and stay there with its live inputs (0: not even one); the last index (``target.registers``)
    stands for any wider row. The tiles that hold are a prefix (fewer accumulators of the same
    rows hold too), so :func:`holds` asks this alone."""
    return tuple(max((count for count in range(1, target.registers + 1) if target.holds(count, vectors)), default=0)
                 for vectors in range(target.registers + 1))


def holds(room: tuple[int, ...], accumulators: int, row_vectors: int = 1) -> bool:
    """Whether a tile of ``accumulators`` registers in rows of ``row_vectors`` fits a register
    file whose :func:`register_room` is ``room`` (:meth:`Target.holds`, answered from it)."""
    return accumulators <= room[min(row_vectors, len(room) - 1)]


@lru_cache(maxsize=4096)
def block_shape(rows: int, cols: int, room: tuple[int, ...]) -> tuple[int, int]:
    """Rows x vectors of the register blocks of a ``rows`` x ``cols`` tile that does not fit a
    register file whose :func:`register_room` is ``room``.

    Among the block shapes that fit (:meth:`Target.fits`: r rows of v vectors hold), take the one whose balanced blocks
    cost least per reduction step: a block issues max(r*v, FMA_CHAINS) multiply-add slots (fewer accumulators than that wait
    on latency) and r + v loads, weighted at a quarter of a slot."""
    best = None
    registers = len(room) - 1
    for v in range(1, min(cols, registers) + 1):
        for r in range(1, min(rows, registers) + 1):
            if not holds(room, r * v, v):
                break
            cost = 0.0
            for r0, r1 in balanced(rows, r):
                for c0, c1 in balanced(cols, v):
                    height, width = r1 - r0, c1 - c0
                    cost += max(height * width, FMA_CHAINS) + 0.25 * (height + width)
            candidate = (cost, -r * v, r, v)
            if best is None or candidate < best:
                best = candidate
    if best is None:  # not even one register and its inputs: single registers
        return 1, 1
    return best[2], best[3]


class RegisterScope:
    """The register planning of one compute nest for one target: :attr:`plan`, and the tile's
    registers (:meth:`slots`, :meth:`rows`) and register blocks (:meth:`blocks`) at any level
    of the scope, which the compute emitter walks."""

    def __init__(self, nest: LoopNest, target: Target, layouts=None):
        problem = nest.problem
        self.loops = nest.compute
        self.depth = len(self.loops)
        self.target = target
        self.room = register_room(target)  # the target's register file, asked once
        self.width = target.vector_width
        self.output_dims = set(problem.output)
        self.acc_strides = strides(problem, problem.output)
        self.acc_layout = (layouts or {}).get("out")  # the accumulator's layout is the output's
        self.input_layouts = {t: (layouts or {}).get(t) for t in ("in0", "in1")}
        self.problem = problem
        # Loops down to a parallel loop or a spilled one (looprl.ir.nest_spill) stay runtime
        # loops outside the register scope.
        self.floor = max((i for i, lp in enumerate(self.loops) if lp.parallel or lp.spilled), default=-1)
        self._subtrees: dict[tuple, frozenset[int]] = {}
        self._tile_sizes: dict[int, int] = {}  # level -> tile_size(level)
        self.plan = self._plan(problem)

    def acc_delta(self, var: str, elements: int) -> int:
        """Offset in the accumulator of moving ``elements`` along ``var``."""
        return offset_along(self.acc_strides, self.acc_layout, var, elements)

    def _plan(self, problem) -> ComputePlan:
        n = self.depth
        innermost = self.loops[-1]
        if self.acc_layout is not None:  # vectorise along the accumulator's unit stride
            unit = innermost.var in self.output_dims and self.acc_delta(innermost.var, 1) == 1
            vector_var = innermost.var if unit else None
        else:
            vector_var = innermost.var if problem.output[-1] == innermost.var else None
        if vector_var is None and self._reads_both_along(innermost.var):
            vector_var = innermost.var  # a dot product: vectors of partial sums, summed across at the store
        if self.floor == n - 1:  # a parallel (or spilled) innermost loop runs element by element
            vector_var = None
        self.vector_var = vector_var
        self.reduces_vector = vector_var is not None and vector_var not in self.output_dims
        if vector_var is None:
            start, tile = n, 1
            for level in range(n - 1, self.floor, -1):
                size = self.tile_size(level)
                if not holds(self.room, size):
                    break
                start, tile = level, size
            streaming = False
        else:
            start, tile, streaming = n - 1, 1, True
            inner_chunks = 1 if self.reduces_vector else -(-innermost.budget // lanes_for(innermost.budget, self.width))
            for level in range(n - 1, self.floor, -1):
                size = self.tile_size(level)
                if not holds(self.room, size, inner_chunks):
                    break
                start, tile, streaming = level, size, False
        # Register blocking: reach out to the outermost reduction loop whose tile is at most a
        # few register files, so that the reduction runs with accumulators in registers.
        limit = min(BLOCKED_TILE_FLOATS // self.width, BLOCKED_TILE_VECTORS)
        reach = start
        for level in range(start - 1, self.floor, -1):
            size = self.tile_size(level)
            if size > limit:
                break
            if self.loops[level].var not in self.output_dims:
                reach = level
        if reach < start:
            start, tile, streaming = reach, self.tile_size(reach), False
        reduction_outside = any(lp.var not in self.output_dims for lp in self.loops[:start])
        blocks = [] if streaming else self.blocks(start, dict(entry_budgets(self.loops, start)))
        block_registers = max((len(b) for b in blocks), default=1 if streaming else tile)
        return ComputePlan(vector_var, start, streaming, not reduction_outside, tile, max(len(blocks), 1), block_registers,
                           self.reduces_vector)

    def _reads_both_along(self, var: str) -> bool:
        """Whether ``var`` is a reduction dimension both inputs store contiguously (unit stride,
        through their layouts where applied): the innermost loop over it then vectorises as a
        dot product (``nn.Linear``'s ``x[m, k]`` and ``W[n, k]`` read as they lie)."""
        problem = self.problem
        if var not in problem.reduction_dims:
            return False
        for tensor, term in zip(("in0", "in1"), problem.operands):
            if var not in term or offset_along(strides(problem, term), self.input_layouts[tensor], var, 1) != 1:
                return False
        return True
    def tile_size(self, level: int) -> int:
        """Registers of the tile of a scope starting at ``level`` (in the full context);
        memoised per scope (:meth:`_plan` asks a level again when it reaches out to block)."""
        found = self._tile_sizes.get(level)
        if found is None:
            found = self._tile_sizes[level] = leaf_count(self.loops, frozenset(self.output_dims), self.width, self.vector_var, level,
                                                       entry_budgets(self.loops, level))
        return found

    def rows(self, level: int, budgets: dict[str, int], acc_offset: int) -> list[list[Slot]]:
        """The tile's registers as rows: one row per instance of the innermost loop (its
        vectors, or its scalars when it walks an output dimension without vectorising), in
        the order of :meth:`slots`."""
        if level == self.depth:
            return [[(acc_offset, 1, 1)]]
        loop = self.loops[level]
        budget = budgets[loop.var]
        if level == self.depth - 1 and self.vector_var is not None:
            if self.reduces_vector:  # one output element: one register of partial sums
                return [[(acc_offset, 1, 1)]]
            return [[(acc_offset + self.acc_delta(loop.var, c), lanes, active) for c, lanes, active in vector_chunks(budget, self.width)]]
        if loop.var not in self.output_dims:  # every iteration updates the same registers (the first's elements)
            return self.rows(level + 1, dict(budgets, **{loop.var: min(loop.step, budget)}), acc_offset)
        walk = iterations(budget, loop.step)
        result = []
        for start, elements in walk:
            result += self.rows(level + 1, dict(budgets, **{loop.var: elements}), acc_offset + self.acc_delta(loop.var, start))
        if level == self.depth - 1:  # the innermost loop's scalars are one row
            return [[slot for row in result for slot in row]]
        return result

    def slots(self, level: int, budgets: dict[str, int], acc_offset: int) -> list[Slot]:
        """Every register of the tile, in order."""
        return [slot for row in self.rows(level, budgets, acc_offset) for slot in row]

    def blocks(self, level: int, budgets: dict[str, int]) -> list[list[Slot]]:
        """The scope's tile split into register blocks (each a list of slots); one block
        when the whole tile fits with its live inputs."""
        grid = self.rows(level, budgets, 0)
        size = sum(len(row) for row in grid)
        longest = max(len(row) for row in grid)
        if holds(self.room, size, longest if self.vector_var is not None and not self.reduces_vector else 1):  # as in _plan
            return [[slot for row in grid for slot in row]]
        rows_per, cols_per = block_shape(len(grid), longest, self.room)
        result = []
        for r0, r1 in balanced(len(grid), rows_per):
            for c0, c1 in balanced(longest, cols_per):
                block = [slot for row in grid[r0:r1] for slot in row[c0:c1]]
                if block:
                    result.append(block)
        return result

    def subtree(self, level: int, budgets: dict[str, int]) -> frozenset[int]:
        """Acc offsets (relative to the subtree's own) the scope's subtree at ``level`` updates."""
        key = (level, tuple(sorted(budgets.items())))
        found = self._subtrees.get(key)
        if found is None:
            found = self._subtrees[key] = frozenset(offset for offset, _, _ in self.slots(level, budgets, 0))
        return found

    def touches(self, level: int, budgets: dict[str, int], acc_offset: int, tile: dict) -> list[int]:
        """Keys of ``tile`` that the subtree at ``level`` (at ``acc_offset``) updates."""
        inside = self.subtree(level, budgets)
        return [key for key in tile if key - acc_offset in inside]


def plan(nest: LoopNest, target: Target) -> ComputePlan:
    """The code generator's decisions for ``nest`` on ``target`` (without emitting code)."""
    return RegisterScope(nest, target, layouts_applied(nest)).plan
