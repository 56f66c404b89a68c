"""The write-back nest: ``out = epilogue(acc)`` (scale, bias, activation, residual:
:mod:`looprl.backend.epilogue_ir`; a copy when the epilogue is the identity), vectorised like
the copy along the output's last dimension, the copy of a long innermost loop unrolled by
groups of vectors."""

from __future__ import annotations

from looprl.backend.abi import EPILOGUE_TENSORS
from looprl.backend.epilogue_ir import emit_epilogue
from looprl.backend.kernel_plan import KernelPlan
from looprl.backend.llvm_text import Function, load, store
from looprl.backend.loops import KernelModule, NestEmitter
from looprl.backend.register_plan import strides, vector_chunks

# Write-back: unroll the copy of the innermost loop up to this many vectors.
COPY_UNROLL = 8


class WriteBackEmitter(NestEmitter):
    """``out = epilogue(acc)`` over the write-back loops of a kernel plan (a copy when the epilogue is the
    identity); the innermost loop is vectorised when it walks the output's last dimension
    (unit stride in the output, the accumulator, the bias and the residual)."""

    def __init__(self, module: KernelModule, plan: KernelPlan):
        problem = plan.problem
        out_strides = strides(problem, problem.output)
        layouts = {"acc": plan.layouts["out"]} if "out" in plan.layouts else {}
        coefs = {"acc": out_strides, "out": out_strides}
        epilogue = problem.epilogue
        if epilogue.bias:  # one value per output column: stride 1 along the last dimension only
            coefs[EPILOGUE_TENSORS["bias"]] = {problem.output[-1]: 1}
        if epilogue.residual:
            coefs[EPILOGUE_TENSORS["residual"]] = out_strides
        super().__init__(module, plan.write_back, coefs, "write_back", layouts)
        self.epilogue = None
        if not epilogue.is_identity:
            self.epilogue = epilogue
        var = self.loops[-1].var
        self.vectorised = var == problem.output[-1] and self.delta("acc", var, 1) == 1 and not self.loops[-1].parallel
        self.inner_start = self.depth - 1 if self.vectorised else self.depth

    def emit_inner_part(self, fn: Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
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
        for c, lanes, active in vector_chunks(budget - done, width):
            self.copy(fn, ptrs, done + c, lanes, active)

    def copy(self, fn: Function, ptrs: dict[str, str], offset: int, lanes: int, active: int) -> None:
        """Store the output's ``lanes`` (``active`` of them) elements at ``offset`` along the
        innermost loop (vector lanes when vectorised, else one scalar)."""
        var = self.loops[-1].var
        value = load(self.module, fn, ptrs["acc"], self.delta("acc", var, offset) if offset else 0, lanes, active, 1, cache=False)
        if self.epilogue is not None:
            inputs = {name: load(self.module, fn, ptrs[EPILOGUE_TENSORS[name]], self.delta(EPILOGUE_TENSORS[name], var, offset), lanes, active, 1,
                                 cache=False) for name in self.epilogue.inputs}
            value = emit_epilogue(self.module, fn, self.epilogue, value, lanes, inputs)
        store(self.module, fn, ptrs["out"], offset, lanes, active, value)

