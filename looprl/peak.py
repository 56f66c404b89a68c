"""The host's empirical fp32 peak: independent register-resident FMA chains."""

from __future__ import annotations

import ctypes
import time

from .jit import CompiledModule
from .kernel import host_target

_ITERATIONS = 4096  # loop trips per call; each does ``chains`` vector FMAs


def _peak_ir(lanes: int, chains: int) -> str:
    vec = f"<{lanes} x float>"
    lines = [
        f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})",
        "",
        f"define void @peak(ptr noalias %io, i64 %reps) nounwind {{",
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


def measure_peak_gflops(budget_s: float = 0.5, rounds: int = 5) -> float:
    """Best GFLOPS over 8..16 independent chains of full-width vector FMAs, each timed in
    several rounds spread over the budget (the best round wins: noise only slows runs down)."""
    lanes = host_target().vector_width
    buffer = (ctypes.c_float * (2 * lanes))(*([1.0] * lanes + [0.999] * lanes))
    kernels = []
    for chains in (8, 10, 12, 14, 16):
        module = CompiledModule(_peak_ir(lanes, chains), "peak")
        function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(module.address)
        function(ctypes.addressof(buffer), 1)
        start = time.perf_counter()
        function(ctypes.addressof(buffer), 1)
        reps = max(1, int(budget_s / rounds / 5 / max(time.perf_counter() - start, 1e-7)))
        kernels.append((chains, function, reps, module))
    best = 0.0
    for _ in range(rounds):
        for chains, function, reps, _module in kernels:
            start = time.perf_counter()
            function(ctypes.addressof(buffer), reps)
            elapsed = time.perf_counter() - start
            best = max(best, 2.0 * lanes * chains * _ITERATIONS * reps / elapsed / 1e9)
    return best


def peak_gflops(cache=None, *, refresh: bool = False) -> float:
    """The host's measured fp32 peak (GFLOPS, one core), cached per host fingerprint in the
    measurement cache (the default persistent one unless ``cache`` is given)."""
    from .cache import MeasurementCache

    store = cache if cache is not None else MeasurementCache()
    if not refresh:
        known = store.get_peak()
        if known is not None:
            return known
    value = measure_peak_gflops()
    store.put_peak(value)
    return value
