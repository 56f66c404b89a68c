"""The partial accumulators of a split reduction (:attr:`KernelPlan.ksplit
<looprl.backend.kernel_plan.KernelPlan.ksplit>`), emitted: before the compute nest the calling
thread zeroes one per thread of the largest team the split loop forms, and after it (every team
joined: ``GOMP_parallel`` returns once its threads are done) adds them into the accumulator,
thread 0's first, then thread 1's, and so on (a fixed order, so a kernel on a given number of
threads always gives the same bits). The write-back nest then applies the epilogue to the sum.

The calling thread does both, not the team: a split reduction is proposed only where the output
is a few register tiles per thread (:mod:`looprl.search.ksplit`), so the sum is a few thousand
additions, less than a second team's start and barrier would cost. Both cover every partial
whole (with runtime rows too: the rows not computed hold zeros, and the write-back copies only
the rows computed).

How many partials: ``min(threads, iterations of the split loop in its full context)``, the
largest team any region of the loop forms (a region in a tail context has fewer iterations, so
a smaller team); a smaller team libgomp forms leaves its partials zero, which add nothing."""

from __future__ import annotations

from looprl.backend.kernel_plan import KernelPlan
from looprl.backend.llvm_text import Function, Module, add_into


def partial_count(fn: Function, plan: KernelPlan) -> str:
    """The i64 SSA value of the number of partial accumulators a call uses (the module
    docstring), from the kernel's ``i32 %nthreads``."""
    more = fn.value(f"icmp ugt i32 %nthreads, {plan.stage_team}", "parts")
    team = fn.value(f"select i1 {more}, i32 {plan.stage_team}, i32 %nthreads", "parts")
    return fn.value(f"zext i32 {team} to i64", "parts")


def zero_partials(module: Module, fn: Function, plan: KernelPlan, count: str) -> str:
    """Zero ``count`` partial accumulators (an i64 SSA value, at least 1); returns the pointer
    to thread 0's, which the compute nest addresses as its accumulator (thread ``t``'s lies
    ``t * thread_stride`` floats further on)."""
    offset, floats = plan.workspace["partial"]
    first = fn.offset("%acc", offset)
    module.declarations["llvm.memset"] = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
    with fn.loop(count) as lp:
        partial = fn.advance(first, lp.iv, plan.thread_stride)
        fn.emit(f"call void @llvm.memset.p0.i64(ptr align 4 {partial}, i8 0, i64 {4 * floats}, i1 false)")
    return first


def sum_partials(module: Module, fn: Function, plan: KernelPlan, first: str, count: str) -> None:
    """``acc = partial 0 + partial 1 + ...`` over the ``count`` partial accumulators (thread 0's
    at ``first``), added in thread order, vector by vector."""
    floats = plan.workspace["partial"][1]
    module.declarations["llvm.memcpy"] = "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"
    fn.emit(f"call void @llvm.memcpy.p0.p0.i64(ptr align 4 %acc, ptr align 4 {first}, i64 {4 * floats}, i1 false)")
    with fn.when(f"icmp ugt i64 {count}, 1"):
        others = fn.value(f"sub nuw nsw i64 {count}, 1", "parts")
        with fn.loop(others) as lp:
            partial = fn.advance(fn.offset(first, plan.thread_stride), lp.iv, plan.thread_stride)
            add_into(module, fn, "%acc", partial, floats, plan.target.vector_width)
