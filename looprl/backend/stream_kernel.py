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

from looprl.backend.llvm_text import Function, Module, vector_type
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
    total = outer.values[0]
    for a in range(1, STREAM_ACCUMULATORS):
        total = fn.value(f"fadd {typ} {total}, {outer.values[a]}", "t")
    fn.emit(f"store {typ} {total}, ptr %out, align 4")
    fn.close()
    if team:
        _emit_team(module, typ)
    return module.text()


def _emit_team(module: Module, typ: str) -> None:
    module.declare_openmp()
    body = Function("define internal void @stream_body(ptr %ctx) nounwind {")
    module.functions.append(body)
    fields = {}
    for slot, (name, kind) in enumerate((("data", "ptr"), ("blocks", "i64"), ("reps", "i64"), ("out", "ptr"))):
        place = body.value(f"getelementptr inbounds i64, ptr %ctx, i64 {slot}", "f")
        fields[name] = body.value(f"load {kind}, ptr {place}, align 8", name)
    thread = body.value("call i32 @omp_get_thread_num()", "tid")
    wide = body.value(f"zext i32 {thread} to i64", "t")
    first = body.value(f"mul i64 {wide}, {fields['blocks']}", "first")
    start = body.value(f"mul i64 {first}, {STREAM_ACCUMULATORS}", "start")
    mine = body.value(f"getelementptr inbounds {typ}, ptr {fields['data']}, i64 {start}", "mine")
    result = body.value(f"getelementptr inbounds {typ}, ptr {fields['out']}, i64 {wide}", "res")
    body.emit(f"call void @stream(ptr {mine}, i64 {fields['blocks']}, i64 {fields['reps']}, ptr {result})")
    body.close()
    entry = Function("define void @stream_team(ptr %data, i64 %blocks, i64 %reps, ptr %out, i32 %nthreads) nounwind {")
    module.functions.append(entry)
    context = entry.alloca("[4 x i64]")
    for slot, (value, kind) in enumerate((("%data", "ptr"), ("%blocks", "i64"), ("%reps", "i64"), ("%out", "ptr"))):
        place = entry.value(f"getelementptr inbounds i64, ptr {context}, i64 {slot}", "f")
        entry.emit(f"store {kind} {value}, ptr {place}, align 8")
    entry.emit(f"call void @GOMP_parallel(ptr @stream_body, ptr {context}, i32 %nthreads, i32 0)")
    entry.close()
