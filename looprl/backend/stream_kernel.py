"""The kernel that measures this host's memory bandwidth: full-width vector loads of a buffer,
added into independent accumulators (so the loads, not the adds, set the pace), built with the
code generator's text-IR builder.

``void stream(ptr data, i64 blocks, i64 reps, ptr out)`` reads ``blocks`` x
:data:`STREAM_ACCUMULATORS` vectors from ``data`` ``reps`` times and stores their sum at
``out`` (so nothing is optimised away). ``void stream_team(ptr data, i64 blocks, i64 reps, ptr
out, i32 nthreads)`` runs it on every thread of an OpenMP team, thread t on its own contiguous
``blocks`` at ``data + t x blocks x STREAM_ACCUMULATORS`` vectors, summing into its own vector
at ``out + t``."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, Module, emit_team, vector_sum, vector_type
from looprl.target import Target

STREAM_ACCUMULATORS = 8  # independent vector sums: enough loads in flight for any ISA


def stream_ir(target: Target, team: bool = False) -> str:
    """LLVM IR of ``stream`` for ``target`` (and ``stream_team`` when ``team``)."""
    module = Module()
    lanes = target.vector_width
    typ = vector_type(lanes)
    zero = "zeroinitializer"
    fn = Function("define void @stream(ptr noalias %data, i64 %blocks, i64 %reps, ptr noalias %out) nounwind {")
    module.functions.append(fn)
    with fn.loop("%reps", {a: (typ, zero) for a in range(STREAM_ACCUMULATORS)}) as outer:
        with fn.loop("%blocks", {a: (typ, outer.values[a]) for a in range(STREAM_ACCUMULATORS)}) as inner:
            base = fn.value(f"mul i64 {inner.iv}, {STREAM_ACCUMULATORS}", "b")
            for a in range(STREAM_ACCUMULATORS):
                index = fn.value(f"add i64 {base}, {a}", "j")
                place = fn.value(f"getelementptr inbounds {typ}, ptr %data, i64 {index}", "p")
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
