"""The kernels that measure a target's peak: independent register-resident chains of
multiply-adds of the target's vector width (FMA instructions, or a multiply and an add where the
target has none), built with the code generator's text-IR builder.

``void peak(ptr io, i64 reps)`` runs :data:`PEAK_ITERATIONS` x ``reps`` steps of every chain on
the two vectors at ``io`` and stores their sum there (so nothing is optimised away).
``void peak_team(ptr io, i64 reps, i32 nthreads)`` runs ``peak`` on every thread of an OpenMP
team, thread t on its own two vectors at ``io + 2 t`` vectors."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, Module, emit_team, multiply_add, vector_sum, vector_type
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
    fn.emit(f"store {typ} {vector_sum(fn, [loop.values[c] for c in range(chains)], typ)}, ptr %io, align 4")
    fn.close()
    if team:
        emit_team(module, "peak_team", "peak", [("ptr", "io"), ("i64", "reps")], lambda body, args, thread: _share(body, args, thread, typ))
    return module.text()


def _share(body: Function, args: dict, thread: str, typ: str) -> list[str]:
    """Thread ``thread`` runs the chains on its own two vectors, at ``io + 2 thread``."""
    slot = body.value(f"mul i64 {thread}, 2", "slot")
    mine = body.value(f"getelementptr inbounds {typ}, ptr {args['io']}, i64 {slot}", "mine")
    return [f"ptr {mine}", f"i64 {args['reps']}"]
