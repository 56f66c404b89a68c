"""The kernel that measures this host's memory bandwidth: full-width vector loads of a buffer,
added into independent accumulators (so the loads, not the adds, set the pace), built with the
code generator's text-IR builder.

``void stream(ptr data, i64 blocks, i64 reps, ptr out)`` reads ``blocks`` x
:data:`STREAM_ACCUMULATORS` vectors from ``data`` ``reps`` times and stores their sum at
``out`` (so nothing is optimised away). With ``streams`` > 1 the buffer is that many equal
regions read side by side, each front to back (as a dot-product kernel reads the rows of its
panel of weights): on the AMD EPYC Zen 1 of 2026-11-28, one thread, 4 regions read DRAM at
21 GB/s where one sequential stream reads it at 16, and the last-level cache at 53 against 47
(16 regions: 15 and 27), so the measured bound is the best of a few such patterns. ``void stream_team(ptr data, i64 blocks, i64 reps, ptr
out, i32 nthreads)`` runs it on every thread of an OpenMP team, thread t on its own contiguous
``blocks`` at ``data + t x blocks x STREAM_ACCUMULATORS`` vectors, summing into its own vector
at ``out + t``.

With ``prefetch_bytes`` > 0 every cache line an iteration reads is also prefetched that many
bytes ahead (``llvm.prefetch``, one per 64-byte line of each region): more reads in flight than
the hardware prefetchers start on their own, as a library's streaming kernels issue. The
bound is the best of the patterns with and without such prefetches (:data:`PREFETCH_DISTANCES`):
a bound that a kernel reading another way beats is no bound."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, Module, emit_team, vector_sum, vector_type
from looprl.target import Target

STREAM_ACCUMULATORS = 8  # independent vector sums: enough loads in flight for any ISA
STREAM_PATTERNS = (1, 4, 8)  # regions read side by side: one sequential stream, or several (divisors of STREAM_ACCUMULATORS)
PREFETCH_DISTANCES = (0, 1024, 4096)  # bytes ahead of each read that a pattern prefetches (0: none)
LINE_BYTES = 64  # a cache line: what one prefetch brings in


def stream_ir(target: Target, team: bool = False, streams: int = 1, prefetch_bytes: int = 0) -> str:
    """LLVM IR of ``stream`` for ``target`` (and ``stream_team`` when ``team``), reading
    ``streams`` regions side by side (a divisor of :data:`STREAM_ACCUMULATORS`), prefetching
    ``prefetch_bytes`` ahead of every line read (0: no prefetches; else a multiple of
    :data:`LINE_BYTES`)."""
    if streams < 1 or STREAM_ACCUMULATORS % streams:
        raise ValueError(f"streams must divide {STREAM_ACCUMULATORS}, got {streams}")
    if type(prefetch_bytes) is not int or prefetch_bytes < 0 or prefetch_bytes % LINE_BYTES:
        raise ValueError(f"prefetch_bytes must be a non-negative multiple of {LINE_BYTES}, got {prefetch_bytes!r}")
    per_region = STREAM_ACCUMULATORS // streams  # consecutive vectors an iteration reads from each region
    module = Module()
    lanes = target.vector_width
    typ = vector_type(lanes)
    zero = "zeroinitializer"
    prefetch = module.prefetch() if prefetch_bytes else None
    fn = Function("define void @stream(ptr noalias %data, i64 %blocks, i64 %reps, ptr noalias %out) nounwind {")
    module.functions.append(fn)
    with fn.loop("%reps", {a: (typ, zero) for a in range(STREAM_ACCUMULATORS)}) as outer:
        with fn.loop("%blocks", {a: (typ, outer.values[a]) for a in range(STREAM_ACCUMULATORS)}) as inner:
            base = fn.value(f"mul i64 {inner.iv}, {per_region}", "b")
            region = fn.value(f"mul i64 %blocks, {per_region}", "r")  # vectors in a region
            for a in range(STREAM_ACCUMULATORS):
                start = fn.value(f"mul i64 {region}, {a % streams}", "o")
                within = fn.value(f"add i64 {base}, {a // streams}", "w")
                index = fn.value(f"add i64 {start}, {within}", "j")
                place = fn.value(f"getelementptr inbounds {typ}, ptr %data, i64 {index}", "p")
                if prefetch_bytes and a < streams:  # the region's first vector of this iteration: its lines ahead
                    for line in range(0, max(per_region * lanes * 4, LINE_BYTES), LINE_BYTES):
                        ahead = fn.value(f"getelementptr i8, ptr {place}, i64 {prefetch_bytes + line}", "pf")
                        fn.emit(f"call void @{prefetch}(ptr {ahead}, i32 0, i32 3, i32 1)")
                loaded = fn.value(f"load {typ}, ptr {place}, align 64", "v")
                inner.values[a] = fn.value(f"fadd {typ} {inner.values[a]}, {loaded}", "s")
        for a in range(STREAM_ACCUMULATORS):
            outer.values[a] = inner.values[a]
    fn.emit(f"store {typ} {vector_sum(fn, [outer.values[a] for a in range(STREAM_ACCUMULATORS)], typ)}, ptr %out, align 4")
    fn.close()
    if team:
        params = [("ptr", "data"), ("i64", "blocks"), ("i64", "reps"), ("ptr", "out")]
        emit_team(module, "stream_team", "stream", params, lambda body, args, thread: _share(body, args, thread, typ))
    return module.text()


def _share(body: Function, args: dict, thread: str, typ: str) -> list[str]:
    """Thread ``thread`` streams its own contiguous ``blocks`` and sums into its own vector."""
    first = body.value(f"mul i64 {thread}, {args['blocks']}", "first")
    start = body.value(f"mul i64 {first}, {STREAM_ACCUMULATORS}", "start")
    mine = body.value(f"getelementptr inbounds {typ}, ptr {args['data']}, i64 {start}", "mine")
    result = body.value(f"getelementptr inbounds {typ}, ptr {args['out']}, i64 {thread}", "res")
    return [f"ptr {mine}", f"i64 {args['blocks']}", f"i64 {args['reps']}", f"ptr {result}"]
