"""The kernels that measure a target's peak: independent register-resident chains of
multiply-adds of the target's vector width (FMA instructions, or a multiply and an add where the
target has none), built with the code generator's text-IR builder.

``void peak(ptr io, i64 reps)`` runs :data:`PEAK_ITERATIONS` x ``reps`` steps of every chain on
the two vectors at ``io`` and stores their sum there (so nothing is optimised away).
``void peak_team(ptr io, i64 reps, i32 nthreads)`` runs ``peak`` on every thread of an OpenMP
team, thread t on its own two vectors at ``io + 2 t`` vectors."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, Module, multiply_add, vector_type
from looprl.target import Target

PEAK_ITERATIONS = 4096  # loop trips per rep; each runs one multiply-add per chain


def peak_chain_counts(target: Target) -> list[int]:
    """The chain counts worth trying on ``target``: 8 to 16 with FMA, as many as fit the
    register file with the two operands (:meth:`Target.holds`); without FMA a step is a multiply
    then an add (twice the latency), so from 10 up."""
    most = max(chains for chains in range(1, target.registers + 1) if target.holds(chains))
    if target.fma:
        return [chains for chains in (8, 10, 12, 14, 16) if chains <= most]
    return list(range(min(10, most), min(most, 16) + 1))


def peak_ir(target: Target, chains: int, team: bool = False) -> str:
    """LLVM IR of ``peak`` with ``chains`` chains for ``target`` (and ``peak_team`` when ``team``)."""
    module = Module()
    lanes = target.vector_width
    typ = vector_type(lanes)
    fn = Function("define void @peak(ptr noalias %io, i64 %reps) nounwind {")
    module.functions.append(fn)
    x = fn.value(f"load {typ}, ptr %io, align 4", "x")
    second = fn.value(f"getelementptr inbounds {typ}, ptr %io, i64 1", "p")
    y = fn.value(f"load {typ}, ptr {second}, align 4", "y")
    trips = fn.value(f"mul i64 %reps, {PEAK_ITERATIONS}", "n")
    with fn.loop(trips, {chain: (typ, x) for chain in range(chains)}) as loop:
        for chain in range(chains):
            loop.values[chain] = multiply_add(module, fn, loop.values[chain], y, x, lanes, target.fma)
    total = loop.values[0]
    for chain in range(1, chains):
        total = fn.value(f"fadd {typ} {total}, {loop.values[chain]}", "s")
    fn.emit(f"store {typ} {total}, ptr %io, align 4")
    fn.close()
    if team:
        _emit_team(module, typ)
    return module.text()


def _emit_team(module: Module, typ: str) -> None:
    module.declare_openmp()
    body = Function("define internal void @peak_body(ptr %ctx) nounwind {")
    module.functions.append(body)
    io = body.value("load ptr, ptr %ctx, align 8", "io")
    place = body.value("getelementptr inbounds ptr, ptr %ctx, i64 1", "p")
    reps = body.value(f"load i64, ptr {place}, align 8", "reps")
    thread = body.value("call i32 @omp_get_thread_num()", "tid")
    wide = body.value(f"zext i32 {thread} to i64", "t")
    slot = body.value(f"mul i64 {wide}, 2", "slot")
    mine = body.value(f"getelementptr inbounds {typ}, ptr {io}, i64 {slot}", "mine")
    body.emit(f"call void @peak(ptr {mine}, i64 {reps})")
    body.close()
    entry = Function("define void @peak_team(ptr %io, i64 %reps, i32 %nthreads) nounwind {")
    module.functions.append(entry)
    context = entry.alloca("[2 x i64]")
    entry.emit(f"store ptr %io, ptr {context}, align 8")
    place = entry.value(f"getelementptr inbounds ptr, ptr {context}, i64 1", "p")
    entry.emit(f"store i64 %reps, ptr {place}, align 8")
    entry.emit(f"call void @GOMP_parallel(ptr @peak_body, ptr {context}, i32 %nthreads, i32 0)")
    entry.close()
