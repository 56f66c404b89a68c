"""The host's empirical fp32 peak: independent register-resident FMA chains."""

from __future__ import annotations

import ctypes
import math

from looprl.backend.jit import CompiledModule
from looprl.backend.target import host_target
from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import best_time, check_budget

_ITERATIONS = 4096  # loop trips per call; each does ``chains`` vector FMAs


def _peak_ir(lanes: int, chains: int) -> str:
    vec = f"<{lanes} x float>"
    lines = [
        f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})",
        "",
        "define void @peak(ptr noalias %io, i64 %reps) nounwind {",
        "entry:",
        f"  %x = load {vec}, ptr %io, align 4",
        f"  %yp = getelementptr inbounds {vec}, ptr %io, i64 1",
        f"  %y = load {vec}, ptr %yp, align 4",
        f"  %n = mul i64 %reps, {_ITERATIONS}",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%inext, %loop]",
    ]
    for c in range(chains):
        lines.append(f"  %a{c} = phi {vec} [%x, %entry], [%b{c}, %loop]")
    for c in range(chains):
        lines.append(f"  %b{c} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{c}, {vec} %y, {vec} %x)")
    lines += [
        "  %inext = add nuw i64 %i, 1",
        "  %more = icmp ult i64 %inext, %n",
        "  br i1 %more, label %loop, label %done",
        "done:",
    ]
    total = "%b0"
    for c in range(1, chains):
        lines.append(f"  %s{c} = fadd {vec} {total}, %b{c}")
        total = f"%s{c}"
    lines += [f"  store {vec} {total}, ptr %io, align 4", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def measure_peak_gflops(budget_s: float = 0.5) -> float:
    """Best GFLOPS over 8..16 independent chains of full-width vector FMAs, each timed by
    the common rule (:func:`~looprl.measurement.timing.best_time`) on a share of the budget,
    in two interleaved rounds (the best wins: noise only slows runs down)."""
    budget_s = check_budget(budget_s)
    lanes = host_target().vector_width
    buffer = (ctypes.c_float * (2 * lanes))(*([1.0] * lanes + [0.999] * lanes))
    address = ctypes.addressof(buffer)
    kernels = []
    for chains in (8, 10, 12, 14, 16):
        module = CompiledModule(_peak_ir(lanes, chains), "peak")
        function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(module.address)
        kernels.append((2 * lanes * chains * _ITERATIONS, function, module))
    best = 0.0
    with machine_lock():
        for _ in range(2):
            for flops, function, _module in kernels:
                timing = best_time(lambda reps, f=function: f(address, reps), budget_s / 2 / len(kernels), flops=flops)
                best = max(best, timing.gflops)
    return best


def peak_gflops(cache=None, *, refresh: bool = False) -> float:
    """The host's measured fp32 peak (GFLOPS, one core), cached per host fingerprint in the
    measurement cache (the default persistent one unless ``cache`` is given: a
    :class:`~looprl.measurement.cache.MeasurementCache` or a path). A stored value that is not
    a positive, finite number is measured again and replaced."""
    from looprl.measurement.evaluator import open_cache

    store = open_cache(cache)
    if not refresh:
        known = store.get_peak()
        if known is not None and math.isfinite(known) and known > 0:
            return known
    value = measure_peak_gflops()
    store.put_peak(value)
    return value
