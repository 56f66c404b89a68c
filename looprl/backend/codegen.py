"""LLVM IR for a :class:`~looprl.nest.LoopNest`, emitted as text, LoopNest-style.

The loop order is taken as given. In the compute nest:

* the innermost loop is vectorised when it walks the output's last (unit-stride) dimension:
  its elements become vectors of the target's width, the last one masked;
* a *register scope* is the largest suffix of the nest whose output tile (in vectors, or
  scalars when nothing vectorises) fits in the target's register file; the tile is loaded
  once before the scope, kept in SSA values (phis across runtime loops) and stored once
  after it;
* when the tile that would keep a reduction loop in registers just misses the register
  file, the scope still reaches out to that reduction loop and the tile is *register-blocked*:
  split into rows x vectors blocks that each fit (with their live inputs) and give enough
  independent accumulators to hide the multiply-add latency; each block runs the scope's
  reduction loops with its accumulators in registers (the other output elements' order of
  accumulation is unchanged, so the results are the same);
* inside the scope, loops over output dimensions are unrolled (register indices must be
  static) and reduction loops are unrolled while the unrolled body stays under a bound;
* outside the scope every loop is a runtime loop; tail iterations call small internal
  functions specialised on the remaining sizes (memoised, so tails never multiply the code);
* when even the innermost vectorised loop does not fit and no reduction loop can be brought
  into a blocked scope, it streams vector by vector through memory;
* targets without FMA instructions multiply, then add (``llvm.fma`` would become a libcall);
* a *parallel* loop (at most one per nest: :meth:`~looprl.ir.nest.LoopNest.parallel`) is a
  runtime loop outside the register scope (the scope starts below it): its body is outlined
  into a function that the OpenMP runtime runs on every thread of a team
  (``GOMP_parallel``, see :mod:`looprl.backend.threads`), each thread taking a contiguous
  share of the iterations, the tail iteration included, balanced by elements. Each output
  element is still summed in the serial order, so results are bit-identical to the serial
  kernel's. A kernel with a parallel loop takes the thread count as an extra ``i32``
  argument; on one thread it calls the outlined body directly.

The write-back nest copies the accumulator to the output and applies the problem's epilogue
(scale, bias, activation, residual: :mod:`looprl.backend.epilogue_ir`) on the way, vectorised
like the copy; the bias and the residual are extra pointer arguments of the kernel after the
accumulator (:func:`kernel_tensors`).

Every number that depends on the CPU (lanes, registers, FMA) comes from the
:class:`~looprl.target.Target`.

No LLVM IR passes run: the IR is already vectorised and in SSA form, so only the backend's
code generation is needed (fast, and it avoids the O3 pipeline's memory leak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from looprl.backend.epilogue_ir import EpilogueIR
from looprl.target import Target
from looprl.ir.layout import Layout
from looprl.ir.nest import Loop, LoopNest
from looprl.ir.problem import Problem

KERNEL_NAME = "looprl_kernel"
# Bump whenever the code generated for an existing schedule key may change speed: it is part of
# the measurement cache key. (Data layouts did not bump it: a schedule without layouts has the
# same key and byte-identical IR as before, and schedules with layouts have new keys.)
CODEGEN_VERSION = 4  # 4: the register-blocking bound counts floats (AVX2 and SSE4 code changed); 3 was an earlier layouts commit
# Unroll a reduction loop inside the register scope while the unrolled body has at most this
# many multiply-adds (the reference backend used ~320).
UNROLL_LIMIT = 64
# Write-back: unroll the copy of the innermost loop up to this many vectors.
COPY_UNROLL = 8
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
TENSORS = ("in0", "in1", "out", "acc")
EPILOGUE_TENSORS = {"bias": "bias", "residual": "residual"}  # epilogue input -> IR pointer name


def kernel_tensors(problem: Problem) -> tuple[str, ...]:
    """The kernel's pointer arguments in order: :data:`TENSORS`, then the epilogue's inputs
    (``bias``, ``residual``) when the problem has them."""
    return TENSORS + tuple(EPILOGUE_TENSORS[name] for name in problem.epilogue.inputs)


def strides(problem: Problem, term: str) -> dict[str, int]:
    """Element stride of each dimension of a row-major tensor indexed by ``term``."""
    result, stride = {}, 1
    for dim in reversed(term):
        result[dim] = stride
        stride *= problem.size(dim)
    return result


def _lanes_for(budget: int, width: int) -> int:
    """Vector length for an innermost loop of ``budget`` elements: full width, or the next
    power of two for short loops."""
    lanes = 1
    while lanes < budget and lanes < width:
        lanes *= 2
    return lanes


def _vtype(lanes: int) -> str:
    return "float" if lanes == 1 else f"<{lanes} x float>"


def _mask(lanes: int, active: int) -> str:
    bits = ", ".join("i1 true" if i < active else "i1 false" for i in range(lanes))
    return f"<{lanes} x i1> <{bits}>"


class _Function:
    """Text of one LLVM function under construction: SSA names, blocks, lines."""

    def __init__(self, header: str):
        self.lines: list[str] = [header, "entry:"]
        self.allocas: list[str] = []  # stack slots, emitted at the top of the entry block
        self.block = "entry"
        self._counter = 0
        self.loads: dict[tuple, str] = {}  # CSE of loads of read-only inputs within a block

    def alloca(self, typ: str, hint: str = "ctx") -> str:
        """A stack slot of ``typ`` allocated once on entry (never inside a loop)."""
        name = self.tmp(hint)
        self.allocas.append(f"  {name} = alloca {typ}, align 8")
        return name

    def text(self) -> str:
        return "\n".join(self.lines[:2] + self.allocas + self.lines[2:])

    def tmp(self, hint: str = "t") -> str:
        self._counter += 1
        return f"%{hint}{self._counter}"

    def label(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}{self._counter}"

    def emit(self, text: str) -> None:
        self.lines.append("  " + text)

    def start_block(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name
        self.loads = {}

    def value(self, text: str, hint: str = "t") -> str:
        name = self.tmp(hint)
        self.emit(f"{name} = {text}")
        return name

    def advance(self, ptr: str, iv: str, stride: int) -> str:
        if stride == 0:
            return ptr
        off = iv if stride == 1 else self.value(f"mul i64 {iv}, {stride}", "o")
        return self.value(f"getelementptr inbounds float, ptr {ptr}, i64 {off}", "p")

    def offset(self, ptr: str, elements: int) -> str:
        if elements == 0:
            return ptr
        return self.value(f"getelementptr inbounds float, ptr {ptr}, i64 {elements}", "p")

    def loop(self, trips: "int | str", carried: dict | None = None):
        """Context manager for a runtime loop of ``trips`` >= 1 iterations (a constant or an
        i64 SSA value); see _Loop."""
        return _Loop(self, trips, carried or {})


class _Loop:
    """``for iv in range(trips)`` as a bottom-tested loop. ``carried`` maps keys to
    (type, SSA value); inside the body the phi values are in ``loop.values``; assign the
    updated values there before leaving, and read the results there afterwards."""

    def __init__(self, fn: _Function, trips: "int | str", carried: dict):
        self.fn, self.trips, self.carried = fn, trips, carried
        self.values: dict = {}

    def __enter__(self) -> "_Loop":
        fn = self.fn
        self.pre = fn.block
        self.head = fn.label("loop")
        self.exit = fn.label("after")
        fn.emit(f"br label %{self.head}")
        fn.start_block(self.head)
        self.iv = fn.tmp("i")
        self.ivnext = fn.tmp("inext")
        self.iv_line = len(fn.lines)
        fn.emit("")  # placeholder: the latch is known only after the body
        self.phi_lines = {}
        for key, (typ, init) in self.carried.items():
            name = fn.tmp("c")
            self.phi_lines[key] = (len(fn.lines), name, typ, init)
            fn.emit("")
            self.values[key] = name
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        fn = self.fn
        latch = fn.block
        fn.lines[self.iv_line] = f"  {self.iv} = phi i64 [0, %{self.pre}], [{self.ivnext}, %{latch}]"
        for key, (line, name, typ, init) in self.phi_lines.items():
            fn.lines[line] = f"  {name} = phi {typ} [{init}, %{self.pre}], [{self.values[key]}, %{latch}]"
        fn.emit(f"{self.ivnext} = add nuw nsw i64 {self.iv}, 1")
        more = fn.value(f"icmp ult i64 {self.ivnext}, {self.trips}", "more")
        fn.emit(f"br i1 {more}, label %{self.head}, label %{self.exit}")
        fn.start_block(self.exit)
        # After the loop the carried values are the phis' last updates.


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


class _NestEmitter:
    """Shared machinery of both nests: budgets, runtime loops, memoised tail functions."""

    def __init__(self, module: "_Module", loops: tuple[Loop, ...], coefs: dict[str, dict[str, int]], name: str, layouts=None):
        self.module, self.loops, self.coefs, self.name = module, loops, coefs, name
        self.layouts: dict[str, Layout] = dict(layouts or {})  # tensors addressed through a layout
        self.depth = len(loops)
        self.width = module.target.vector_width

    def entry_budgets(self, level: int) -> tuple[tuple[str, int], ...]:
        """Budgets (full context) of the vars that still have loops at ``level`` or below."""
        seen: dict[str, int] = {}
        for loop in self.loops[level:]:
            seen.setdefault(loop.var, loop.budget)
        return tuple(sorted(seen.items()))

    def coef(self, tensor: str, var: str) -> int:
        return self.coefs.get(tensor, {}).get(var, 0)

    def delta(self, tensor: str, var: str, elements: int) -> int:
        """Offset in ``tensor`` of moving ``elements`` along ``var`` (within a range the
        schedule walks affinely: see :func:`layouts_applied`)."""
        layout = self.layouts.get(tensor)
        if layout is None:
            return self.coef(tensor, var) * elements
        return _layout_offset(layout, var, elements)

    def emit_outer(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        if level >= self.inner_start:
            self.emit_inner_part(fn, level, budgets, ptrs)
            return
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], loop.step)
        child = dict(budgets, **{loop.var: loop.step})
        if loop.parallel and full + (rem > 0) > 1:
            self.emit_parallel(fn, level, budgets, ptrs)
            return
        if full == 1:
            self.emit_outer(fn, level + 1, child, ptrs)
        elif full > 1:
            with fn.loop(full) as lp:
                moved = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                self.emit_outer(fn, level + 1, child, moved)
        if rem:
            self.emit_tail_call(fn, level, budgets, ptrs)

    def emit_tail_call(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        """Call the function that runs the tail iteration of loop ``level``."""
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], loop.step)
        tail_ptrs = {t: fn.offset(p, self.delta(t, loop.var, loop.step * full)) for t, p in ptrs.items()}
        callee = self.module.tail_function(self, level + 1, dict(budgets, **{loop.var: rem}))
        fn.emit(f"call void @{callee}({self.module.arguments(tail_ptrs)})")

    def emit_parallel(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        """Run parallel loop ``level`` (two or more iterations here) on ``%nthreads`` threads:
        its pointers go into a context on the stack, and the outlined body runs once per thread
        of an OpenMP team (or directly, on one thread)."""
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], loop.step)
        body = self.module.region_function(self, level, budgets)
        tensors = self.module.tensors
        context = fn.alloca(f"[{len(tensors)} x ptr]")
        for slot, tensor in enumerate(tensors):
            place = fn.value(f"getelementptr inbounds [{len(tensors)} x ptr], ptr {context}, i64 0, i64 {slot}", "p")
            fn.emit(f"store ptr {ptrs.get(tensor, 'null')}, ptr {place}, align 8")
        iterations = full + (rem > 0)
        more = fn.value(f"icmp ugt i32 %nthreads, {iterations}", "more")
        team = fn.value(f"select i1 {more}, i32 {iterations}, i32 %nthreads", "team")  # no idle threads
        many = fn.value(f"icmp ugt i32 {team}, 1", "many")
        threaded, single, joined = fn.label("team"), fn.label("single"), fn.label("joined")
        fn.emit(f"br i1 {many}, label %{threaded}, label %{single}")
        fn.start_block(threaded)
        self.module.declare_openmp()
        fn.emit(f"call void @GOMP_parallel(ptr @{body}, ptr {context}, i32 {team}, i32 0)")
        fn.emit(f"br label %{joined}")
        fn.start_block(single)
        fn.emit(f"call void @{body}(ptr {context})")
        fn.emit(f"br label %{joined}")
        fn.start_block(joined)

    def emit_region(self, fn: _Function, level: int, budgets: dict[str, int]) -> None:
        """The outlined body of parallel loop ``level``: this thread's share of its iterations
        (contiguous, balanced by elements, the last thread's ending with the tail iteration)."""
        loop = self.loops[level]
        budget = budgets[loop.var]
        full, rem = divmod(budget, loop.step)
        iterations = full + (rem > 0)
        ptrs = {}
        tensors = self.module.tensors
        for slot, tensor in enumerate(tensors):
            place = fn.value(f"getelementptr inbounds [{len(tensors)} x ptr], ptr %ctx, i64 0, i64 {slot}", "p")
            loaded = fn.value(f"load ptr, ptr {place}, align 8", "q")
            if tensor in self.coefs:
                ptrs[tensor] = loaded
        thread = fn.value("call i32 @omp_get_thread_num()", "tid")
        fn.emit("%nthreads = call i32 @omp_get_num_threads()")
        thread64 = fn.value(f"zext i32 {thread} to i64", "tid")
        team64 = fn.value("zext i32 %nthreads to i64", "team")
        # Thread t starts at iteration round(t * budget / team / step) (at most the last one).
        half = fn.value(f"mul nuw nsw i64 {team64}, {loop.step}", "h")
        denominator = fn.value(f"mul nuw nsw i64 {half}, 2", "d")

        def boundary(index: str) -> str:
            scaled = fn.value(f"mul nuw nsw i64 {index}, {2 * budget}", "x")
            numerator = fn.value(f"add nuw nsw i64 {scaled}, {half}", "x")
            rounded = fn.value(f"udiv i64 {numerator}, {denominator}", "b")
            over = fn.value(f"icmp ugt i64 {rounded}, {iterations}", "b")
            return fn.value(f"select i1 {over}, i64 {iterations}, i64 {rounded}", "b")

        start = boundary(thread64)
        following = fn.value(f"add nuw nsw i64 {thread64}, 1", "next")
        last = fn.value(f"icmp uge i64 {following}, {team64}", "last")
        inner = boundary(following)
        stop = fn.value(f"select i1 {last}, i64 {iterations}, i64 {inner}", "stop")
        capped = fn.value(f"icmp ugt i64 {stop}, {full}", "cap")
        full_stop = fn.value(f"select i1 {capped}, i64 {full}, i64 {stop}", "stop")
        count = fn.value(f"sub nsw i64 {full_stop}, {start}", "count")
        if full:
            work, idle = fn.label("work"), fn.label("idle")
            busy = fn.value(f"icmp sgt i64 {count}, 0", "busy")
            fn.emit(f"br i1 {busy}, label %{work}, label %{idle}")
            fn.start_block(work)
            child = dict(budgets, **{loop.var: loop.step})
            with fn.loop(count) as lp:
                index = fn.value(f"add nuw nsw i64 {start}, {lp.iv}", "it")
                moved = {t: fn.advance(p, index, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                self.emit_outer(fn, level + 1, child, moved)
            fn.emit(f"br label %{idle}")
            fn.start_block(idle)
        if rem:  # the thread whose share reaches the end runs the tail iteration
            owner = fn.value(f"icmp eq i64 {stop}, {iterations}", "own")
            started = fn.value(f"icmp ult i64 {start}, {iterations}", "own")
            owns = fn.value(f"and i1 {owner}, {started}", "own")
            tail, done = fn.label("tail"), fn.label("done")
            fn.emit(f"br i1 {owns}, label %{tail}, label %{done}")
            fn.start_block(tail)
            self.emit_tail_call(fn, level, budgets, ptrs)
            fn.emit(f"br label %{done}")
            fn.start_block(done)

    # Subclasses define inner_start and emit_inner_part.
    inner_start: int

    def emit_inner_part(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        raise NotImplementedError


class _ComputeEmitter(_NestEmitter):
    def __init__(self, module: "_Module", nest: LoopNest, layouts=None):
        problem = nest.problem
        in0, in1 = problem.operands
        coefs = {"in0": strides(problem, in0), "in1": strides(problem, in1), "acc": strides(problem, problem.output)}
        layouts = {("acc" if t == "out" else t): layout for t, layout in (layouts or {}).items()}
        super().__init__(module, nest.compute, coefs, "compute", layouts)
        self.output_dims = set(problem.output)
        # Loops down to a parallel loop stay runtime loops outside the register scope.
        self.floor = max((i for i, lp in enumerate(self.loops) if lp.parallel), default=-1)
        self._subtrees: dict[tuple, frozenset[int]] = {}
        self.plan = self._plan(problem)
        self.inner_start = self.plan.scope_start

    # -- planning --------------------------------------------------------------
    def _plan(self, problem: Problem) -> ComputePlan:
        n = self.depth
        innermost = self.loops[-1]
        if "acc" in self.layouts:  # vectorise along the accumulator's unit stride
            unit = innermost.var in self.output_dims and self.delta("acc", innermost.var, 1) == 1
            vector_var = innermost.var if unit else None
        else:
            vector_var = innermost.var if problem.output[-1] == innermost.var else None
        if self.floor == n - 1:  # a parallel innermost loop runs element by element
            vector_var = None
        target = self.module.target
        self.vector_var = vector_var
        if vector_var is None:
            start, tile = n, 1
            for level in range(n - 1, self.floor, -1):
                size = self.tile_size(level, self.entry_budgets(level), vector_var)
                if not target.holds(size):
                    break
                start, tile = level, size
            streaming = False
        else:
            start, tile, streaming = n - 1, 1, True
            inner_chunks = -(-innermost.budget // _lanes_for(innermost.budget, self.width))
            for level in range(n - 1, self.floor, -1):
                size = self.tile_size(level, self.entry_budgets(level), vector_var)
                if not target.holds(size, inner_chunks):
                    break
                start, tile, streaming = level, size, False
        # Register blocking: reach out to the outermost reduction loop whose tile is at most a
        # few register files, so that the reduction runs with accumulators in registers.
        limit = min(BLOCKED_TILE_FLOATS // self.width, BLOCKED_TILE_VECTORS)
        reach = start
        for level in range(start - 1, self.floor, -1):
            size = self.tile_size(level, self.entry_budgets(level), vector_var)
            if size > limit:
                break
            if self.loops[level].var not in self.output_dims:
                reach = level
        if reach < start:
            start, tile, streaming = reach, self.tile_size(reach, self.entry_budgets(reach), vector_var), False
        reduction_outside = any(lp.var not in self.output_dims for lp in self.loops[:start])
        self.scope_start = start
        blocks = [] if streaming else self.blocks(start, dict(self.entry_budgets(start)))
        block_registers = max((len(b) for b in blocks), default=1 if streaming else tile)
        return ComputePlan(vector_var, start, streaming, not reduction_outside, tile, max(len(blocks), 1), block_registers)

    def tile_size(self, level: int, budgets: tuple[tuple[str, int], ...], vector_var: str | None) -> int:
        return _tile_size(self.loops, frozenset(self.output_dims), self.width, vector_var, level, budgets)

    # -- register blocks -----------------------------------------------------------
    def rows(self, level: int, budgets: dict[str, int], acc_offset: int) -> list[list[tuple[int, int, int]]]:
        """The tile's registers (acc offset, lanes, active lanes) as rows: one row per
        instance of the innermost loop (its vectors, or its scalars when it walks an output
        dimension without vectorising), in the order of :meth:`slots`."""
        if level == self.depth:
            return [[(acc_offset, 1, 1)]]
        loop = self.loops[level]
        budget = budgets[loop.var]
        if level == self.depth - 1 and (self.vector_var is not None or loop.var in self.output_dims):
            return [self.slots(level, budgets, acc_offset)]
        full, rem = divmod(budget, loop.step)
        if loop.var not in self.output_dims:
            return self.rows(level + 1, dict(budgets, **{loop.var: loop.step if full else rem}), acc_offset)
        result = []
        for i in range(full):
            result += self.rows(level + 1, dict(budgets, **{loop.var: loop.step}), acc_offset + self.delta("acc", loop.var, i * loop.step))
        if rem:
            result += self.rows(level + 1, dict(budgets, **{loop.var: rem}), acc_offset + self.delta("acc", loop.var, full * loop.step))
        return result

    def blocks(self, level: int, budgets: dict[str, int]) -> list[list[tuple[int, int, int]]]:
        """The scope's tile split into register blocks (each a list of slots); one block
        when the whole tile fits with its live inputs."""
        grid = self.rows(level, budgets, 0)
        size = sum(len(row) for row in grid)
        longest = max(len(row) for row in grid)
        target = self.module.target
        if target.holds(size, longest if self.vector_var is not None else 1):  # as in _plan
            return [[slot for row in grid for slot in row]]
        rows_per, cols_per = _block_shape(len(grid), longest, target)
        result = []
        for r0, r1 in _balanced(len(grid), rows_per):
            for c0, c1 in _balanced(longest, cols_per):
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

    # -- the register scope ------------------------------------------------------
    def emit_inner_part(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        plan = self.plan
        if plan.streaming:
            # One vector at a time through memory: runtime loop over full vectors + a masked tail.
            loop = self.loops[level]
            full, rem = divmod(budgets[loop.var], self.width)
            if full == 1:
                self.emit_scope(fn, level, dict(budgets, **{loop.var: self.width}), ptrs)
            elif full > 1:
                with fn.loop(full) as lp:
                    moved = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, self.width)) for t, p in ptrs.items()}
                    self.emit_scope(fn, level, dict(budgets, **{loop.var: self.width}), moved)
            if rem:
                tail_ptrs = {t: fn.offset(p, self.delta(t, loop.var, self.width * full)) for t, p in ptrs.items()}
                self.emit_scope(fn, level, dict(budgets, **{loop.var: rem}), tail_ptrs)
            return
        self.emit_scope(fn, level, budgets, ptrs)

    def emit_scope(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        """The scope once per register block: load (or zero) the block, run the scope's loops
        updating only its registers, store it."""
        for block in self.blocks(level, budgets):
            tile: dict[int, str] = {}
            types: dict[int, tuple[int, int]] = {}
            for offset, lanes, active in block:
                types[offset] = (lanes, active)
                if self.plan.zero_init:
                    tile[offset] = "0.0" if lanes == 1 else "zeroinitializer"
                else:
                    tile[offset] = _load(self.module, fn, ptrs["acc"], offset, lanes, active, 1, cache=False)
            self.emit_in_scope(fn, level, budgets, ptrs, {t: 0 for t in ptrs}, tile, types, 1)
            for offset, (lanes, active) in types.items():
                _store(self.module, fn, ptrs["acc"], offset, lanes, active, tile[offset])

    def slots(self, level: int, budgets: dict[str, int], acc_offset: int) -> list[tuple[int, int, int]]:
        """(acc offset, lanes, active lanes) of every register of the tile, in order."""
        if level == self.depth:
            return [(acc_offset, 1, 1)]
        loop = self.loops[level]
        budget = budgets[loop.var]
        if level == self.depth - 1 and self.vector_var is not None:
            lanes = _lanes_for(budget, self.width)
            return [(acc_offset + self.delta("acc", loop.var, c), lanes, min(lanes, budget - c)) for c in range(0, budget, lanes)]
        full, rem = divmod(budget, loop.step)
        if loop.var not in self.output_dims:
            return self.slots(level + 1, dict(budgets, **{loop.var: loop.step if full else rem}), acc_offset)
        result = []
        for i in range(full):
            result += self.slots(level + 1, dict(budgets, **{loop.var: loop.step}), acc_offset + self.delta("acc", loop.var, i * loop.step))
        if rem:
            result += self.slots(level + 1, dict(budgets, **{loop.var: rem}), acc_offset + self.delta("acc", loop.var, full * loop.step))
        return result

    def emit_in_scope(self, fn, level, budgets, ptrs, consts, tile, types, copies) -> None:
        """Emit the scope body from ``level``, updating the registers in ``tile`` (one register
        block: the tile's other registers are skipped); ``copies`` counts how many times the
        enclosing unrolled loops replicate this code (bounds unrolling of reduction loops)."""
        if level == self.depth:
            if consts["acc"] in tile:
                self.leaf(fn, ptrs, consts, tile, 1, 1)
            return
        loop = self.loops[level]
        budget = budgets[loop.var]
        if level == self.depth - 1 and self.vector_var is not None:
            lanes = _lanes_for(budget, self.width)
            for c in range(0, budget, lanes):
                moved = {t: consts[t] + self.delta(t, loop.var, c) for t in consts}
                if moved["acc"] in tile:
                    self.leaf(fn, ptrs, moved, tile, lanes, min(lanes, budget - c))
            return
        full, rem = divmod(budget, loop.step)
        child = dict(budgets, **{loop.var: loop.step})
        unroll = (
            loop.var in self.output_dims
            or copies * _unrolled_ops(self.loops, self.vector_var, self.width, level, tuple(sorted(budgets.items()))) <= UNROLL_LIMIT
        )
        if unroll or full == 1:
            for i in range(full):
                moved = {t: consts[t] + self.delta(t, loop.var, i * loop.step) for t in consts}
                if loop.var in self.output_dims and not self.touches(level + 1, child, moved["acc"], tile):
                    continue  # none of this block's registers down there
                self.emit_in_scope(fn, level + 1, child, ptrs, moved, tile, types, copies * (full + (rem > 0)))
        elif full > 1:
            # Carry (as phis) only the registers this loop updates.
            carried = {key: (_vtype(types[key][0]), tile[key]) for key in self.touches(level + 1, child, consts["acc"], tile)}
            with fn.loop(full, carried) as lp:
                moved_ptrs = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                inner_tile = dict(lp.values)
                self.emit_in_scope(fn, level + 1, child, moved_ptrs, consts, inner_tile, types, copies * (1 + (rem > 0)))
                lp.values.update(inner_tile)
            tile.update({key: lp.values[key] for key in carried})
            # After the loop, the carried registers hold the phis' last updates: reading a phi's
            # update outside the loop is valid SSA because the latch dominates the exit.
        if rem:
            moved = {t: consts[t] + self.delta(t, loop.var, full * loop.step) for t in consts}
            tail = dict(budgets, **{loop.var: rem})
            if loop.var not in self.output_dims or self.touches(level + 1, tail, moved["acc"], tile):
                self.emit_in_scope(fn, level + 1, tail, ptrs, moved, tile, types, copies * (full + 1 if unroll else 2))

    def leaf(self, fn, ptrs, consts, tile, lanes, active) -> None:
        var = self.vector_var
        a = self.operand(fn, "in0", ptrs, consts, lanes, active, var)
        b = self.operand(fn, "in1", ptrs, consts, lanes, active, var)
        key = consts["acc"]
        typ = _vtype(lanes)
        if self.module.target.fma:
            intrinsic = self.module.fma(lanes)
            tile[key] = fn.value(f"call {typ} @{intrinsic}({typ} {a}, {typ} {b}, {typ} {tile[key]})", "f")
        else:  # no FMA instructions: llvm.fma would be a call to fmaf per lane
            product = fn.value(f"fmul {typ} {a}, {b}", "m")
            tile[key] = fn.value(f"fadd {typ} {tile[key]}, {product}", "f")

    def operand(self, fn, tensor, ptrs, consts, lanes, active, var) -> str:
        stride = self.delta(tensor, var, 1) if lanes > 1 else 0
        return _load(self.module, fn, ptrs[tensor], consts[tensor], lanes, active, stride)


def _load(module: "_Module", fn: _Function, ptr: str, offset: int, lanes: int, active: int, stride: int, cache: bool = True) -> str:
    key = (ptr, offset, lanes, active, stride)
    if cache and key in fn.loads:
        return fn.loads[key]
    if lanes == 1 or stride == 0:
        addr = fn.offset(ptr, offset)
        scalar = fn.value(f"load float, ptr {addr}, align 4", "s")
        value = scalar if lanes == 1 else _splat(fn, scalar, lanes)
    elif stride == 1:
        addr = fn.offset(ptr, offset)
        if active == lanes:
            value = fn.value(f"load {_vtype(lanes)}, ptr {addr}, align 4", "v")
        else:
            name = module.masked("load", lanes)
            value = fn.value(
                f"call {_vtype(lanes)} @{name}(ptr align 4 {addr}, {_mask(lanes, active)}, {_vtype(lanes)} zeroinitializer)",
                "v",
            )
    else:  # gather: one scalar load per active lane
        value = "zeroinitializer"
        for lane in range(active):
            addr = fn.offset(ptr, offset + lane * stride)
            scalar = fn.value(f"load float, ptr {addr}, align 4", "s")
            value = fn.value(f"insertelement {_vtype(lanes)} {value}, float {scalar}, i64 {lane}", "g")
    if cache:
        fn.loads[key] = value
    return value


def _splat(fn: _Function, scalar: str, lanes: int) -> str:
    one = fn.value(f"insertelement <{lanes} x float> poison, float {scalar}, i64 0", "b")
    return fn.value(f"shufflevector <{lanes} x float> {one}, <{lanes} x float> poison, <{lanes} x i32> zeroinitializer", "b")


def _store(module: "_Module", fn: _Function, ptr: str, offset: int, lanes: int, active: int, value: str) -> None:
    addr = fn.offset(ptr, offset)
    if active == lanes:
        fn.emit(f"store {_vtype(lanes)} {value}, ptr {addr}, align 4")
    else:
        name = module.masked("store", lanes)
        fn.emit(f"call void @{name}({_vtype(lanes)} {value}, ptr align 4 {addr}, {_mask(lanes, active)})")


class _WriteBackEmitter(_NestEmitter):
    """``out = epilogue(acc)`` over the write-back loops (a copy when the epilogue is the
    identity); the innermost loop is vectorised when it walks the output's last dimension
    (unit stride in the output, the accumulator, the bias and the residual)."""

    def __init__(self, module: "_Module", nest: LoopNest, layouts=None):
        problem = nest.problem
        out_strides = strides(problem, problem.output)
        layouts = {"acc": layouts["out"]} if layouts and "out" in layouts else {}
        coefs = {"acc": out_strides, "out": out_strides}
        epilogue = problem.epilogue
        if epilogue.bias:  # one value per output column: stride 1 along the last dimension only
            coefs[EPILOGUE_TENSORS["bias"]] = {problem.output[-1]: 1}
        if epilogue.residual:
            coefs[EPILOGUE_TENSORS["residual"]] = out_strides
        super().__init__(module, nest.write_back, coefs, "write_back", layouts)
        self.epilogue = None
        if not epilogue.is_identity:
            self.epilogue = epilogue
        var = self.loops[-1].var
        self.vectorised = var == problem.output[-1] and self.delta("acc", var, 1) == 1 and not self.loops[-1].parallel
        self.inner_start = self.depth - 1 if self.vectorised else self.depth

    def emit_inner_part(self, fn: _Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        if not self.vectorised:
            self.copy(fn, ptrs, 0, 1, 1)
            return
        var = self.loops[-1].var
        budget = budgets[var]
        width = self.width
        group = width * 4
        if budget > COPY_UNROLL * width:
            groups = budget // group
            with fn.loop(groups) as lp:
                moved = {t: fn.advance(p, lp.iv, self.delta(t, var, group)) for t, p in ptrs.items()}
                for c in range(0, group, width):
                    self.copy(fn, moved, c, width, width)
            done = groups * group
        else:
            done = 0
        lanes = _lanes_for(budget - done, width)
        for c in range(done, budget, lanes):
            self.copy(fn, ptrs, c, lanes, min(lanes, budget - c))

    def copy(self, fn: _Function, ptrs: dict[str, str], offset: int, lanes: int, active: int) -> None:
        """Store the output's ``lanes`` (``active`` of them) elements at ``offset`` along the
        innermost loop (vector lanes when vectorised, else one scalar)."""
        var = self.loops[-1].var
        value = _load(self.module, fn, ptrs["acc"], self.delta("acc", var, offset) if offset else 0, lanes, active, 1, cache=False)
        if self.epilogue is not None:
            extra = {}
            for name in self.epilogue.inputs:
                pointer = ptrs[EPILOGUE_TENSORS[name]]
                extra[name] = _load(self.module, fn, pointer, self.delta(EPILOGUE_TENSORS[name], var, offset), lanes, active, 1, cache=False)
            module = self.module
            emitter = EpilogueIR(self.epilogue, fn.value, module.declarations.__setitem__, module.target.fma)
            value = emitter.apply(value, lanes, extra.get("bias"), extra.get("residual"))
        _store(self.module, fn, ptrs["out"], offset, lanes, active, value)


def _balanced(count: int, most: int) -> list[tuple[int, int]]:
    """``range(count)`` cut into the fewest consecutive parts of at most ``most``, as equal
    as possible, as (start, stop) pairs."""
    parts = -(-count // most)
    bounds = [count * i // parts for i in range(parts + 1)]
    return list(zip(bounds, bounds[1:]))


@lru_cache(maxsize=4096)
def _block_shape(rows: int, cols: int, target: Target) -> tuple[int, int]:
    """Rows x vectors of the register blocks of a ``rows`` x ``cols`` tile that does not fit.

    Among the block shapes that fit (:meth:`Target.fits`), take the one whose balanced blocks
    cost least per reduction step: a
    block issues max(r*v, FMA_CHAINS) multiply-add slots (fewer accumulators than that wait
    on latency) and r + v loads, weighted at a quarter of a slot."""
    best = None
    for v in range(1, min(cols, target.registers) + 1):
        for r in range(1, min(rows, target.registers) + 1):
            if not target.fits(r, v):
                break
            cost = 0.0
            for r0, r1 in _balanced(rows, r):
                for c0, c1 in _balanced(cols, v):
                    height, width = r1 - r0, c1 - c0
                    cost += max(height * width, FMA_CHAINS) + 0.25 * (height + width)
            candidate = (cost, -r * v, r, v)
            if best is None or candidate < best:
                best = candidate
    if best is None:  # not even one register and its inputs: single registers
        return 1, 1
    return best[2], best[3]


@lru_cache(maxsize=4096)
def _tile_size(loops, output_dims, width, vector_var, level, budgets) -> int:
    """Registers of the output tile of the scope starting at ``level``."""
    b = dict(budgets)
    if level == len(loops):
        return 1
    loop = loops[level]
    budget = b[loop.var]
    if level == len(loops) - 1 and vector_var is not None:
        lanes = _lanes_for(budget, width)
        return -(-budget // lanes)
    full, rem = divmod(budget, loop.step)
    child = tuple(sorted({**b, loop.var: loop.step}.items()))
    tail = tuple(sorted({**b, loop.var: rem}.items()))
    if loop.var not in output_dims:
        return _tile_size(loops, output_dims, width, vector_var, level + 1, child if full else tail)
    size = full * _tile_size(loops, output_dims, width, vector_var, level + 1, child) if full else 0
    if rem:
        size += _tile_size(loops, output_dims, width, vector_var, level + 1, tail)
    return size


@lru_cache(maxsize=4096)
def _unrolled_ops(loops, vector_var, width, level, budgets) -> int:
    """Multiply-adds in the body from ``level`` down if every loop were unrolled."""
    b = dict(budgets)
    if level == len(loops):
        return 1
    loop = loops[level]
    budget = b[loop.var]
    if level == len(loops) - 1 and vector_var is not None:
        return -(-budget // _lanes_for(budget, width))
    full, rem = divmod(budget, loop.step)
    ops = 0
    if full:
        ops += full * _unrolled_ops(loops, vector_var, width, level + 1, tuple(sorted({**b, loop.var: loop.step}.items())))
    if rem:
        ops += _unrolled_ops(loops, vector_var, width, level + 1, tuple(sorted({**b, loop.var: rem}.items())))
    return ops


class _Module:
    """Collects the kernel, its tail functions and the intrinsic declarations."""

    def __init__(self, target: Target, tensors: tuple[str, ...] = TENSORS, threaded: bool = False):
        self.target = target
        self.tensors = tensors  # pointer parameters of the kernel and its internal functions
        self.threaded = threaded  # the schedule has a parallel loop: functions take %nthreads
        self.functions: list[_Function] = []
        self.declarations: dict[str, str] = {}
        self.tails: dict[tuple, str] = {}
        self.regions: dict[tuple, str] = {}

    def parameters(self) -> str:
        """Parameters of the kernel's internal functions (and of its entry points, before reps)."""
        return ", ".join(f"ptr noalias %{t}" for t in self.tensors) + (", i32 %nthreads" if self.threaded else "")

    def arguments(self, ptrs: dict[str, str]) -> str:
        """Arguments of a call to an internal function taking :meth:`parameters`."""
        return ", ".join(f"ptr {ptrs.get(t, 'null')}" for t in self.tensors) + (", i32 %nthreads" if self.threaded else "")

    def declare_openmp(self) -> None:
        self.declarations["GOMP_parallel"] = "declare void @GOMP_parallel(ptr, ptr, i32, i32)"
        self.declarations["omp_get_thread_num"] = "declare i32 @omp_get_thread_num() nounwind"
        self.declarations["omp_get_num_threads"] = "declare i32 @omp_get_num_threads() nounwind"

    def region_function(self, emitter: "_NestEmitter", level: int, budgets: dict[str, int]) -> str:
        """The outlined body of parallel loop ``level`` in a context of ``budgets`` (memoised)."""
        relevant = {lp.var for lp in emitter.loops[level:]}
        key = (emitter.name, level, tuple(sorted((v, b) for v, b in budgets.items() if v in relevant)))
        if key not in self.regions:
            name = f"region{len(self.regions)}_{emitter.name}_l{level}"
            self.regions[key] = name
            self.declare_openmp()
            fn = _Function(f"define internal void @{name}(ptr noalias %ctx) nounwind {{")
            self.functions.append(fn)
            emitter.emit_region(fn, level, budgets)
            fn.emit("ret void")
            fn.lines.append("}")
        return self.regions[key]

    def fma(self, lanes: int) -> str:
        suffix = "f32" if lanes == 1 else f"v{lanes}f32"
        name = f"llvm.fma.{suffix}"
        typ = _vtype(lanes)
        self.declarations[name] = f"declare {typ} @{name}({typ}, {typ}, {typ})"
        return name

    def masked(self, kind: str, lanes: int) -> str:
        name = f"llvm.masked.{kind}.v{lanes}f32.p0"
        typ = _vtype(lanes)
        if kind == "load":
            self.declarations[name] = f"declare {typ} @{name}(ptr, <{lanes} x i1>, {typ})"
        else:
            self.declarations[name] = f"declare void @{name}({typ}, ptr, <{lanes} x i1>)"
        return name

    def tail_function(self, emitter: _NestEmitter, level: int, budgets: dict[str, int]) -> str:
        relevant = {v for v in (lp.var for lp in emitter.loops[level:])}
        key = (emitter.name, level, tuple(sorted((v, b) for v, b in budgets.items() if v in relevant)))
        if key not in self.tails:
            name = f"tail{len(self.tails)}_{emitter.name}_l{level}"
            self.tails[key] = name
            fn = _Function(f"define internal void @{name}({self.parameters()}) nounwind {{")
            emitter.emit_outer(fn, level, budgets, {t: f"%{t}" for t in emitter.coefs})
            fn.emit("ret void")
            fn.lines.append("}")
            self.functions.append(fn)
        return self.tails[key]

    def text(self) -> str:
        parts = list(self.declarations.values())
        for fn in self.functions:
            parts.append(fn.text())
        return "\n\n".join(parts) + "\n"


def plan(nest: LoopNest, target: Target) -> ComputePlan:
    """The code generator's decisions for ``nest`` (without emitting code)."""
    return _ComputeEmitter(_Module(target), nest, layouts_applied(nest)).plan


# -- data layouts ------------------------------------------------------------------------------
@lru_cache(maxsize=65536)
def _layout_offset(layout: Layout, var: str, elements: int) -> int:
    return layout.offset(var, elements)


def _walks_affinely(loops: tuple[Loop, ...], size: int, var: str, breakpoints: tuple[int, ...]) -> bool:
    """Whether every loop of ``var`` moves through ``g_var`` affinely: for each breakpoint b,
    the loop's step is a multiple of b, or the range the loop covers (its parent's step, or
    the whole extent for the outermost loop) lies inside one block of b elements."""
    parent = None
    for loop in (lp for lp in loops if lp.var == var):
        for point in breakpoints:
            if loop.step % point == 0:
                continue
            if (size > point) if parent is None else (point % parent.step):
                return False
        parent = loop
    return True


def layout_applies(nest: LoopNest, tensor: str) -> bool:
    """Whether the kernel stores ``tensor`` (``in0``, ``in1`` or ``out``, whose layout is the
    accumulator's) in its layout: the loops that address it (compute loops; for ``out`` the
    write-back loops too) must walk the layout affinely. Otherwise the layout is inert: the
    tensor is used row-major, as if it had no layout. Always False for row-major tensors."""
    layouts = dict(nest.layouts)
    if tensor not in layouts:
        return False
    layout = layouts[tensor]
    problem = nest.problem
    nests = (nest.compute, nest.write_back) if tensor == "out" else (nest.compute,)
    return all(
        _walks_affinely(loops, problem.size(var), var, layout.breakpoints(var)) for loops in nests for var in layout.index
    )


def layouts_applied(nest: LoopNest) -> dict[str, Layout]:
    """The layouts the kernel of ``nest`` uses (see :func:`layout_applies`)."""
    return {t: layout for t, layout in nest.layouts if layout_applies(nest, t)}


def conversions(nest: LoopNest) -> dict[str, list[str]]:
    """What a measured figure of ``nest`` includes: ``per_call``, the inputs the timed kernel
    converts to their layouts on every call; ``once``, the constant inputs (declared by the
    problem) converted once when bound, outside the timing; ``output``, ["out"] when the
    accumulator's layout is unpacked by the write-back nest (always timed)."""
    applied = layouts_applied(nest)
    inputs = [t for t in ("in0", "in1") if t in applied]
    return {
        "per_call": [t for t in inputs if t not in nest.problem.constant],
        "once": [t for t in inputs if t in nest.problem.constant],
        "output": ["out"] if "out" in applied else [],
    }


def _round_up(count: int, multiple: int = 16) -> int:  # 16 floats: 64-byte alignment
    return -(-count // multiple) * multiple


def workspace_layout(nest: LoopNest) -> dict[str, tuple[int, int]]:
    """Where the kernel's scratch buffers sit in its workspace: tensor -> (offset, elements)
    for the accumulator ``acc`` and each packed input. Offsets are 64-byte aligned."""
    applied = layouts_applied(nest)
    acc = applied["out"].elements if "out" in applied else math.prod(nest.problem.output_shape)
    result, offset = {"acc": (0, acc)}, _round_up(acc)
    for tensor in ("in0", "in1"):
        if tensor in applied:
            result[tensor] = (offset, applied[tensor].elements)
            offset = _round_up(offset + applied[tensor].elements)
    return result


def workspace_elements(nest: LoopNest) -> int:
    """float32 elements of workspace the kernel needs (the output's size without layouts)."""
    return max(offset + count for offset, count in workspace_layout(nest).values())


PACK_CHUNK = 256  # elements of the innermost dimension copied by one unrolled block


def _runtime_offset(fn: _Function, layout: Layout, var: str, x: str) -> str:
    """IR computing ``g_var(x)`` for a runtime index ``x`` (an i64 SSA value)."""
    total = None
    for atom, stride in zip(layout.atoms, layout.strides):
        if atom.var != var:
            continue
        value = x if atom.step == 1 else fn.value(f"udiv i64 {x}, {atom.step}", "q")
        if not atom.outer:
            value = fn.value(f"urem i64 {value}, {atom.count}", "r")
        if stride != 1:
            value = fn.value(f"mul i64 {value}, {stride}", "w")
        total = value if total is None else fn.value(f"add i64 {total}, {value}", "a")
    return total or "0"


def _emit_pack(module: "_Module", name: str, index: str, sizes: tuple[int, ...], layout: Layout) -> None:
    """``void name(src, dst)``: copy a row-major tensor into ``layout`` (places that hold no
    element are left as they are: no loop ever reads them)."""
    fn = _Function(f"define void @{name}(ptr noalias %src, ptr noalias %dst) nounwind {{")
    module.functions.append(fn)
    row = {}
    stride = 1
    for var, size in zip(reversed(index), reversed(sizes)):
        row[var] = stride
        stride *= size
    src, dst = "%src", "%dst"
    loops = []
    for var, size in zip(index[:-1], sizes[:-1]):
        lp = fn.loop(size)
        lp.__enter__()
        loops.append(lp)
        src = fn.advance(src, lp.iv, row[var])
        dst = fn.value(f"getelementptr inbounds float, ptr {dst}, i64 {_runtime_offset(fn, layout, var, lp.iv)}", "p")
    var, size = index[-1], sizes[-1]
    points = layout.breakpoints(var)
    if points:
        chunk = max(d for d in range(1, min(points[0], PACK_CHUNK) + 1) if points[0] % d == 0)
    else:
        chunk = min(size, PACK_CHUNK)
    step = layout.offset(var, 1) if chunk > 1 else 1  # the dst stride inside a chunk
    width = module.target.vector_width

    def block(src_ptr: str, dst_ptr: str, count: int) -> None:
        if step == 1 and row[var] == 1:
            lanes = _lanes_for(count, width)
            for c in range(0, count, lanes):
                value = _load(module, fn, src_ptr, c, lanes, min(lanes, count - c), 1, cache=False)
                _store(module, fn, dst_ptr, c, lanes, min(lanes, count - c), value)
        else:
            for c in range(count):
                value = _load(module, fn, src_ptr, c * row[var], 1, 1, 0, cache=False)
                _store(module, fn, dst_ptr, c * step, 1, 1, value)

    full, rem = divmod(size, chunk)
    if full:
        with fn.loop(full) as lp:
            start = fn.value(f"mul i64 {lp.iv}, {chunk}", "x")
            chunk_src = fn.advance(src, lp.iv, chunk * row[var])
            chunk_dst = fn.value(f"getelementptr inbounds float, ptr {dst}, i64 {_runtime_offset(fn, layout, var, start)}", "p")
            block(chunk_src, chunk_dst, chunk)
    if rem:
        block(fn.offset(src, full * chunk * row[var]), fn.offset(dst, layout.offset(var, full * chunk)), rem)
    for lp in reversed(loops):
        lp.__exit__(None, None, None)
    fn.emit("ret void")
    fn.lines.append("}")


def bound_kernel_name(tensors) -> str:
    """Entry point of the kernel whose inputs ``tensors`` arrive already packed."""
    return KERNEL_NAME + "_bound_" + "_".join(sorted(tensors))


def pack_function_name(tensor: str) -> str:
    return f"looprl_pack_{tensor}"


def generate_ir(nest: LoopNest, target: Target) -> str:
    """LLVM IR text of ``void looprl_kernel(in0, in1, out, acc, i64 reps)`` (with the
    epilogue's ``bias`` and ``residual`` pointers after ``acc`` when the problem has them:
    :func:`kernel_tensors`; and ``i32 nthreads`` after ``reps`` when the schedule has a parallel
    loop).

    ``acc`` is scratch space (the accumulator, shaped like the output, then the packed inputs:
    :func:`workspace_layout`); ``reps`` >= 1 repeats the whole computation (for timing),
    packing included. When inputs have layouts, the module also defines
    ``looprl_pack_<in0|in1>(src, dst)`` and one ``looprl_kernel_bound_<inputs>`` entry per
    non-empty set of packed inputs, which takes those inputs already packed."""
    module = _Module(target, kernel_tensors(nest.problem), threaded=nest.is_parallel)
    applied = layouts_applied(nest)
    compute = _ComputeEmitter(module, nest, applied)
    write_back = _WriteBackEmitter(module, nest, applied)
    params = ", ".join(f"ptr noalias %{t}" for t in module.tensors)
    threads = ", i32 %nthreads" if module.threaded else ""
    if applied:
        fn = _Function(f"define internal void @looprl_body({module.parameters()}) nounwind {{")
    else:
        fn = _Function(f"define void @{KERNEL_NAME}({params}, i64 %reps{threads}) nounwind {{")
    module.functions.append(fn)
    output_bytes = 4 * workspace_layout(nest)["acc"][1]

    def body() -> None:
        if not compute.plan.zero_init:
            module.declarations["llvm.memset"] = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
            fn.emit(f"call void @llvm.memset.p0.i64(ptr align 4 %acc, i8 0, i64 {output_bytes}, i1 false)")
        compute.emit_outer(fn, 0, dict(compute.entry_budgets(0)), {t: f"%{t}" for t in compute.coefs})
        write_back.emit_outer(fn, 0, dict(write_back.entry_budgets(0)), {t: f"%{t}" for t in write_back.coefs})

    if not applied:
        with fn.loop("%reps"):
            body()
        fn.emit("ret void")
        fn.lines.append("}")
        return module.text()
    body()
    fn.emit("ret void")
    fn.lines.append("}")
    problem = nest.problem
    packed = [t for t in ("in0", "in1") if t in applied]
    places = workspace_layout(nest)
    for tensor in packed:
        index = nest.tensor_index(tensor)
        _emit_pack(module, pack_function_name(tensor), index, problem.shape(index), applied[tensor])
    subsets = [()] + [(t,) for t in packed] + ([tuple(packed)] if len(packed) == 2 else [])
    for bound in subsets:
        name = bound_kernel_name(bound) if bound else KERNEL_NAME
        entry = _Function(f"define void @{name}({params}, i64 %reps{threads}) nounwind {{")
        module.functions.append(entry)
        pointers = {t: f"%{t}" for t in module.tensors}
        for tensor in packed:
            if tensor not in bound:
                pointers[tensor] = entry.offset("%acc", places[tensor][0])
        with entry.loop("%reps"):
            for tensor in packed:
                if tensor not in bound:
                    entry.emit(f"call void @{pack_function_name(tensor)}(ptr %{tensor}, ptr {pointers[tensor]})")
            entry.emit(f"call void @looprl_body({module.arguments(pointers)})")
        entry.emit("ret void")
        entry.lines.append("}")
    return module.text()
