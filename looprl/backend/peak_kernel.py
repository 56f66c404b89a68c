"""The kernels that measure a target's peak: independent register-resident chains of
multiply-adds of the target's vector width (FMA instructions, or a multiply and an add where the
target has none), built with the code generator's text-IR builder.

``void peak(ptr io, i64 reps)`` runs :data:`PEAK_ITERATIONS` x ``reps`` steps of every chain on
the two vectors at ``io`` and stores their sum there (so nothing is optimised away).
``void peak_team(ptr io, i64 reps, i32 nthreads)`` runs ``peak`` on every thread of an OpenMP
team, thread t on its own two vectors at ``io + 2 t`` vectors.

The bfloat16 peak (``dtype="bfloat16"``) of a target with AVX512_BF16 chains ``vdpbf16ps``
(two multiply-adds per lane per step, the two vectors read as pairs of bfloat16); elsewhere a
bfloat16 kernel computes in float32 and its peak is the float32 one."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, Module, emit_team, multiply_add, vector_sum, vector_type
from looprl.ir.dtypes import DEFAULT_DTYPE, as_dtype
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


def flops_per_step(target: Target, dtype=DEFAULT_DTYPE) -> int:
    """Flops one step of one chain of :func:`peak_ir` does: 2 per lane (a multiply-add), 4 with
    ``vdpbf16ps`` (bfloat16 on a target with AVX512_BF16)."""
    return target.vector_width * (4 if pairs_in_peak(target, dtype) else 2)


def pairs_in_peak(target: Target, dtype) -> bool:
    """Whether the ``dtype`` peak of ``target`` chains ``vdpbf16ps`` (:meth:`~looprl.ir.dtypes.DType.pairs_on`)."""
    return as_dtype(dtype).pairs_on(target)


def peak_ir(target: Target, chains: int, team: bool = False, dtype=DEFAULT_DTYPE) -> str:
    """LLVM IR of ``peak`` with ``chains`` chains for ``target`` (and ``peak_team`` when
    ``team``), of ``dtype``'s multiply-adds (see the module docstring)."""
    module = Module()
    lanes = target.vector_width
    typ = vector_type(lanes)
    fn = Function("define void @peak(ptr noalias %io, i64 %reps) nounwind {")
    module.functions.append(fn)
    x = fn.value(f"load {typ}, ptr %io, align 4", "x")
    second = fn.value(f"getelementptr inbounds {typ}, ptr %io, i64 1", "p")
    y = fn.value(f"load {typ}, ptr {second}, align 4", "y")
    trips = fn.value(f"mul i64 %reps, {PEAK_ITERATIONS}", "n")
    pairs = f"<{2 * lanes} x bfloat>"
    if pairs_in_peak(target, dtype):
        xs, ys = (fn.value(f"bitcast {typ} {v} to {pairs}", "h") for v in (x, y))
    with fn.loop(trips, {chain: (typ, x) for chain in range(chains)}) as loop:
        for chain in range(chains):
            if pairs_in_peak(target, dtype):
                loop.values[chain] = fn.value(f"call {typ} @{module.bfloat16_dot(lanes)}({typ} {loop.values[chain]}, {pairs} {ys}, "
                                              f"{pairs} {xs})", "f")
            else:
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
