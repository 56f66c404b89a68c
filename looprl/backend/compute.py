"""The compute nest's register scope, emitted: per register block, the tile is loaded (or
zeroed) once, the scope's loops run with the tile in SSA values (loops over output dimensions
unrolled, since register indices must be static; reduction loops unrolled while the unrolled
body stays under :data:`UNROLL_LIMIT` multiply-adds, else runtime loops whose phis carry the
registers they update), and the tile is stored once. Each leaf is a multiply-add of the target's
width: ``llvm.fma``, or a multiply then an add where the target has no FMA (``llvm.fma`` would
be a libcall). When even one vector of the innermost loop does not fit, it streams vector by
vector through memory. A bfloat16 kernel that pairs (:mod:`looprl.backend.pairs`) walks its
paired reduction loop two indices at a time, each leaf one ``vdpbf16ps`` (or two FMAs of the
pair's halves)."""

from __future__ import annotations

from looprl.backend.abi import EPILOGUE_TENSORS
from looprl.backend.epilogue_ir import emit_epilogue
from looprl.backend.llvm_text import Function, horizontal_sum, int_splat, load, mask, multiply_add, store, vector_type
from looprl.backend.loops import KernelModule, NestEmitter
from looprl.backend.packing import emit_pack
from looprl.backend.kernel_plan import KernelPlan
from looprl.backend.pairs import PAIR
from looprl.backend.register_plan import leaf_count, reduction_chunks, strides, vector_chunks

DOT_LANES = (4, 8, 16)  # vdpbf16ps's widths (128, 256, 512 bits); other leaves split the pairs

# Unroll a reduction loop inside the register scope while the unrolled body has at most this
# many multiply-adds (the reference backend used ~320).
UNROLL_LIMIT = 64


class ComputeEmitter(NestEmitter):
    """``acc += in0 * in1`` over the compute loops of a kernel plan: runtime loops down to the
    register scope (the plan's :mod:`register plan <looprl.backend.register_plan>`), then the
    scope once per register block."""

    def __init__(self, module: KernelModule, plan: KernelPlan):
        problem = plan.problem
        in0, in1 = problem.operands
        coefs = {"in0": strides(problem, in0), "in1": strides(problem, in1), "acc": strides(problem, problem.output)}
        renamed = {("acc" if t == "out" else t): layout for t, layout in plan.layouts.items()}
        # A scope over the whole reduction and a row-major output (plan.direct): the scope stores
        # each output element straight into the output, its epilogue applied in registers.
        self.direct = plan.direct
        if self.direct:
            coefs["out"] = coefs["acc"]
            epilogue = problem.epilogue
            if epilogue.bias:  # one value per column of the output's last dimension
                coefs[EPILOGUE_TENSORS["bias"]] = {problem.output[-1]: 1}
            if epilogue.residual:
                coefs[EPILOGUE_TENSORS["residual"]] = coefs["acc"]
        for stage in plan.stages.values():
            coefs[stage.pointer] = {}  # the buffer's pointer stays put: loops move the staged tensor's
        super().__init__(module, plan.compute, coefs, "compute", renamed)
        for stage in plan.stages.values():  # outside the stage, the tensor itself, row-major
            self.stage_entries.setdefault(stage.level + 1, []).append(stage)
            self.layouts.pop(stage.tensor, None)
        self.private = plan.private_strides
        for prefetch in plan.prefetches:  # issued on entry to the loop inside theirs
            self.prefetch_entries.setdefault(prefetch.level + 1, []).append(prefetch)
        self.indices = dict(zip(("in0", "in1"), problem.operands))
        self.element_bytes = problem.element_bytes
        self.problem = problem
        self.output_dims = set(problem.output)
        self.scope = plan.registers
        self.plan = self.scope.plan
        self.vector_var = self.plan.vector_var
        self.inner_start = self.plan.scope_start
        self.columns = problem.size(problem.output[-1])  # a row-major output's offset modulo this: the column
        self.pairing = plan.pairing
        self.pair_part: str | None = None  # under the paired loop: "pair" (two indices) or "half" (the last of an odd extent)
        self.dot_pairs = plan.dot_pairs  # partial sums of vdpbf16ps on twice as many bfloat16 values

    def emit_stage_copy(self, fn: Function, stage, budgets: dict, src: str, dst: str) -> None:
        """Call the function that copies the block of ``stage`` of the extents ``budgets``
        give (a tail iteration's are smaller) from ``src`` into its buffer at ``dst``
        (emitted once per extents)."""
        index = stage.block.index
        extents = tuple(budgets[var] for var in index)
        key = ("stage", stage.tensor, extents)
        if key not in self.module.tails:
            name = f"stage_{stage.tensor}_" + "x".join(map(str, extents))
            self.module.tails[key] = name
            emit_pack(self.module, name, index, extents, stage.block, self.problem.dtype.llvm_element,
                      source=self.problem.shape(index), internal=True)
        fn.emit(f"call void @{self.module.tails[key]}(ptr {src}, ptr {dst})")

    # -- the register scope ------------------------------------------------------
    def emit_inner_part(self, fn: Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
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

    def emit_scope(self, fn: Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        """The scope once per register block: load (or zero) the block, run the scope's loops
        updating only its registers, store it."""
        for block in self.scope.blocks(level, budgets):
            tile: dict[int, str] = {}
            types: dict[int, tuple[int, int]] = {}
            for offset, lanes, active in block:
                types[offset] = (lanes, active)
                if self.plan.reduces_vector:  # partial sums along the reduction, the sum so far in lane 0
                    types[offset] = (self.width, self.width)
                    tile[offset] = self.partial_sums(fn, ptrs, offset)
                elif self.plan.zero_init:
                    tile[offset] = "0.0" if lanes == 1 else "zeroinitializer"
                else:
                    tile[offset] = load(self.module, fn, ptrs["acc"], offset, lanes, active, 1, cache=False)
            self.emit_in_scope(fn, level, budgets, ptrs, {t: 0 for t in ptrs}, tile, types, 1)
            for offset, (lanes, active) in types.items():
                if self.plan.reduces_vector:
                    tile[offset], lanes, active = horizontal_sum(fn, tile[offset], self.width), 1, 1
                if self.direct:
                    self.store_output(fn, ptrs, offset, lanes, active, tile[offset])
                else:
                    store(self.module, fn, ptrs["acc"], offset, lanes, active, tile[offset])

    def partial_sums(self, fn: Function, ptrs: dict[str, str], offset: int) -> str:
        """The register of partial sums of output element ``offset`` at the scope's start: zeros,
        or (a reduction loop outside the scope) the sum so far in lane 0."""
        zero = "zeroinitializer"
        if self.plan.zero_init:
            return zero
        so_far = load(self.module, fn, ptrs["acc"], offset, 1, 1, 1, cache=False)
        return fn.value(f"insertelement {vector_type(self.width)} {zero}, float {so_far}, i64 0", "p")

    def store_output(self, fn: Function, ptrs: dict[str, str], offset: int, lanes: int, active: int, value: str) -> None:
        """Store a finished register of the tile (``offset`` in the row-major output, vectors
        along its last dimension) into the output, through the problem's epilogue."""
        epilogue = self.problem.epilogue
        if not epilogue.is_identity:
            places = {"bias": offset % self.columns, "residual": offset}
            inputs = {name: load(self.module, fn, ptrs[EPILOGUE_TENSORS[name]], places[name], lanes, active, 1, cache=False)
                      for name in epilogue.inputs}
            value = emit_epilogue(self.module, fn, epilogue, value, lanes, inputs)
        store(self.module, fn, ptrs["out"], offset, lanes, active, value)

    def emit_in_scope(self, fn, level, budgets, ptrs, consts, tile, types, copies) -> None:
        """Emit the scope body from ``level``, updating the registers in ``tile`` (one register
        block: the tile's other registers are skipped); ``copies`` counts how many times the
        enclosing unrolled loops replicate this code (bounds unrolling of reduction loops)."""
        if level > self.inner_start:  # an iteration of a loop inside the scope starts (its entry: emit_outer's)
            self.emit_prefetches(fn, level, budgets, ptrs, consts)
        if level == self.depth:
            if consts["acc"] in tile:
                self.leaf(fn, ptrs, consts, tile, 1, 1)
            return
        loop = self.loops[level]
        budget = budgets[loop.var]
        if self.pairing is not None and level == self.pairing.level:
            self.emit_pairs(fn, level, budgets, ptrs, consts, tile, types, copies)
            return
        if level == self.depth - 1 and self.vector_var is not None:
            if self.dot_pairs:
                for c, _, active in reduction_chunks(budget, PAIR * self.width):
                    moved = {t: consts[t] + self.delta(t, loop.var, c) for t in consts}
                    if moved["acc"] in tile:
                        self.dot_pair_leaf(fn, ptrs, moved, tile, active)
                return
            chunks = reduction_chunks if self.plan.reduces_vector else vector_chunks
            for c, lanes, active in chunks(budget, self.width):
                moved = {t: consts[t] + self.delta(t, loop.var, c) for t in consts}
                if moved["acc"] in tile:
                    self.leaf(fn, ptrs, moved, tile, lanes, active)
            return
        full, rem = divmod(budget, loop.step)
        child = dict(budgets, **{loop.var: loop.step})
        unroll = (
            loop.var in self.output_dims
            or copies * self.unrolled_ops(level, budgets) <= UNROLL_LIMIT
        )
        if unroll or full == 1:
            for i in range(full):
                moved = {t: consts[t] + self.delta(t, loop.var, i * loop.step) for t in consts}
                if loop.var in self.output_dims and not self.scope.touches(level + 1, child, moved["acc"], tile):
                    continue  # none of this block's registers down there
                self.emit_in_scope(fn, level + 1, child, ptrs, moved, tile, types, copies * (full + (rem > 0)))
        elif full > 1:
            # Carry (as phis) only the registers this loop updates.
            carried = {key: (vector_type(types[key][0]), tile[key]) for key in self.scope.touches(level + 1, child, consts["acc"], tile)}
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
            if loop.var not in self.output_dims or self.scope.touches(level + 1, tail, moved["acc"], tile):
                self.emit_in_scope(fn, level + 1, tail, ptrs, moved, tile, types, copies * (full + 1 if unroll else 2))

    def emit_pairs(self, fn, level, budgets, ptrs, consts, tile, types, copies) -> None:
        """The paired reduction loop (step 1) two indices at a time: its whole pairs unrolled
        or as a runtime loop (as :meth:`emit_in_scope` decides for any reduction loop), then a
        half pair where its budget is odd."""
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], PAIR)
        child = dict(budgets, **{loop.var: 1})
        unroll = copies * self.unrolled_ops(level, budgets) // PAIR <= UNROLL_LIMIT
        self.pair_part = "pair"
        if unroll or full == 1:
            for i in range(full):
                moved = {t: consts[t] + self.delta(t, loop.var, i * PAIR) for t in consts}
                self.emit_in_scope(fn, level + 1, child, ptrs, moved, tile, types, copies * (full + rem))
        elif full > 1:
            carried = {key: (vector_type(types[key][0]), tile[key]) for key in self.scope.touches(level + 1, child, consts["acc"], tile)}
            with fn.loop(full, carried) as lp:
                moved_ptrs = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, PAIR)) for t, p in ptrs.items()}
                inner_tile = dict(lp.values)
                self.emit_in_scope(fn, level + 1, child, moved_ptrs, consts, inner_tile, types, copies * (1 + rem))
                lp.values.update(inner_tile)
            tile.update({key: lp.values[key] for key in carried})
        if rem:
            self.pair_part = "half"
            moved = {t: consts[t] + self.delta(t, loop.var, full * PAIR) for t in consts}
            self.emit_in_scope(fn, level + 1, child, ptrs, moved, tile, types, copies * (full + 1))
        self.pair_part = None

    def unrolled_ops(self, level: int, budgets: dict[str, int]) -> int:
        """Multiply-adds in the scope's body from ``level`` down if every loop were unrolled."""
        every = frozenset(lp.var for lp in self.loops)
        return leaf_count(self.loops, every, self.width, self.vector_var, level, tuple(sorted(budgets.items())))

    def leaf(self, fn, ptrs, consts, tile, lanes, active) -> None:
        if self.pair_part is not None:
            self.pair_leaf(fn, ptrs, consts, tile, lanes, active)
            return
        var = self.vector_var
        a = self.operand(fn, "in0", ptrs, consts, lanes, active, var)
        b = self.operand(fn, "in1", ptrs, consts, lanes, active, var)
        key = consts["acc"]
        tile[key] = multiply_add(self.module, fn, a, b, tile[key], lanes, self.module.target.fma)

    def pair_leaf(self, fn, ptrs, consts, tile, lanes, active) -> None:
        """``acc += in0[r] * in1[r] + in0[r + 1] * in1[r + 1]`` (``r`` even; only the first
        product for a half pair) on ``lanes`` lanes: the first input's pair loaded as one
        32-bit value and broadcast, the second's as ``2 * lanes`` bfloat16 values (pairs
        innermost), then ``vdpbf16ps`` or two FMAs of the halves."""
        module, half = self.module, self.pair_part == "half"
        shape = (lambda e: e) if lanes == 1 else (lambda e: f"<{lanes} x {e}>")
        first = fn.offset(ptrs["in0"], consts["in0"])
        if half:  # the partner is zero
            a = fn.value(f"zext i16 {fn.value(f'load i16, ptr {first}, align 2', 'a')} to i32", "a")
        else:
            a = fn.value(f"load i32, ptr {first}, align 2", "a")
        if lanes > 1:
            one = fn.value(f"insertelement <{lanes} x i32> poison, i32 {a}, i64 0", "a")
            a = fn.value(f"shufflevector <{lanes} x i32> {one}, <{lanes} x i32> poison, <{lanes} x i32> zeroinitializer", "a")
        second = fn.offset(ptrs["in1"], consts["in1"])
        wide = f"<{PAIR * lanes} x i16>"
        if active == lanes:
            bits = fn.value(f"load {wide}, ptr {second}, align 2", "b")
        else:
            bits = fn.value(f"call {wide} @{module.masked('load', PAIR * lanes, 'i16')}(ptr align 2 {second}, "
                            f"{mask(PAIR * lanes, PAIR * active)}, {wide} zeroinitializer)", "b")
        b = fn.value(f"bitcast {wide} {bits} to {shape('i32')}", "b")
        key = consts["acc"]
        if self.pairing.dot and lanes in DOT_LANES:
            if half:  # the second input's partner place holds no element: clear it (0 * NaN would be NaN)
                b = fn.value(f"and {shape('i32')} {b}, {int_splat(0xFFFF, lanes)}", "b")
            pairs = f"<{PAIR * lanes} x bfloat>"
            name = module.bfloat16_dot(lanes)
            a16 = fn.value(f"bitcast {shape('i32')} {a} to {pairs}", "a")
            b16 = fn.value(f"bitcast {shape('i32')} {b} to {pairs}", "b")
            typ = vector_type(lanes)
            tile[key] = fn.value(f"call {typ} @{name}({typ} {tile[key]}, {pairs} {a16}, {pairs} {b16})", "f")
            return
        halves = [(_low_half(fn, a, lanes), _low_half(fn, b, lanes))]
        if not half:
            halves.append((_high_half(fn, a, lanes), _high_half(fn, b, lanes)))
        for x, y in halves:
            tile[key] = multiply_add(module, fn, x, y, tile[key], lanes, module.target.fma)

    def dot_pair_leaf(self, fn, ptrs, consts, tile, active) -> None:
        """Partial sums += ``active`` (up to twice the width) products of consecutive bfloat16
        values of both inputs, pairs per lane, by ``vdpbf16ps`` (the inactive ones read as zeros)."""
        lanes, module = self.width, self.module
        wide, pairs = f"<{PAIR * lanes} x i16>", f"<{PAIR * lanes} x bfloat>"
        values = []
        for tensor in ("in0", "in1"):
            at = fn.offset(ptrs[tensor], consts[tensor])
            if active == PAIR * lanes:
                bits = fn.value(f"load {wide}, ptr {at}, align 2", "d")
            else:
                bits = fn.value(f"call {wide} @{module.masked('load', PAIR * lanes, 'i16')}(ptr align 2 {at}, "
                                f"{mask(PAIR * lanes, active)}, {wide} zeroinitializer)", "d")
            values.append(fn.value(f"bitcast {wide} {bits} to {pairs}", "d"))
        key, typ = consts["acc"], vector_type(lanes)
        tile[key] = fn.value(f"call {typ} @{module.bfloat16_dot(lanes)}({typ} {tile[key]}, {pairs} {values[0]}, {pairs} {values[1]})", "f")

    def operand(self, fn, tensor, ptrs, consts, lanes, active, var) -> str:
        stride = self.delta(tensor, var, 1) if lanes > 1 else 0
        return load(self.module, fn, ptrs[tensor], consts[tensor], lanes, active, stride)




def _low_half(fn: Function, pairs: str, lanes: int) -> str:
    """The float32 values of the first bfloat16 of each 32-bit lane of ``pairs`` (its low half)."""
    typ = "i32" if lanes == 1 else f"<{lanes} x i32>"
    shifted = fn.value(f"shl {typ} {pairs}, {int_splat(16, lanes)}", "lo")
    return fn.value(f"bitcast {typ} {shifted} to {vector_type(lanes)}", "lo")


def _high_half(fn: Function, pairs: str, lanes: int) -> str:
    """The float32 values of the second bfloat16 of each 32-bit lane of ``pairs`` (its high half)."""
    typ = "i32" if lanes == 1 else f"<{lanes} x i32>"
    masked = fn.value(f"and {typ} {pairs}, {int_splat(-65536, lanes)}", "hi")
    return fn.value(f"bitcast {typ} {masked} to {vector_type(lanes)}", "hi")
