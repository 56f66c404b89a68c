"""Empirical fp32 peak of a target on this host: independent register-resident chains of
multiply-adds of the target's vector width (FMA instructions, or a multiply and an add where
the target has none), compiled for that target.

The peak on N threads is measured, not assumed to be N times one core's: every thread of an
OpenMP team (the runtime parallel kernels use, :mod:`looprl.backend.threads`) runs the same
chains on its own registers, and the team's flops over the wall time are the peak. On a VM
whose vCPUs share physical cores, or under a clock that drops with more active cores, it is
less than N times one thread's."""

from __future__ import annotations

import ctypes
import math

from looprl.backend.jit import CompiledModule
from looprl.target import Target
from looprl.backend.threads import before_parallel_call, check_threads, ensure_openmp_runtime
from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import best_time, check_budget

_ITERATIONS = 4096  # loop trips per call; each does ``chains`` vector FMAs


def _peak_ir(lanes: int, chains: int, fma: bool = True) -> str:
    vec = f"<{lanes} x float>"
    lines = [
        f"declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})" if fma else "",
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
        if fma:
            lines.append(f"  %b{c} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{c}, {vec} %y, {vec} %x)")
        else:  # what the code generator emits without FMA: a multiply, then an add
            lines.append(f"  %m{c} = fmul {vec} %a{c}, %y")
            lines.append(f"  %b{c} = fadd {vec} %m{c}, %x")
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


def _team_ir(lanes: int, chains: int, fma: bool = True) -> str:
    """``peak_team(io, reps, threads)``: ``peak`` on every thread of an OpenMP team, thread t
    on its own two vectors at ``io + 2 t`` vectors."""
    vec = f"<{lanes} x float>"
    return _peak_ir(lanes, chains, fma) + "\n".join([
        "declare void @GOMP_parallel(ptr, ptr, i32, i32)",
        "declare i32 @omp_get_thread_num() nounwind",
        "define internal void @peak_body(ptr %ctx) nounwind {",
        "entry:",
        "  %io = load ptr, ptr %ctx, align 8",
        "  %rp = getelementptr inbounds ptr, ptr %ctx, i64 1",
        "  %reps = load i64, ptr %rp, align 8",
        "  %tid = call i32 @omp_get_thread_num()",
        "  %t = zext i32 %tid to i64",
        "  %slot = mul i64 %t, 2",
        f"  %mine = getelementptr inbounds {vec}, ptr %io, i64 %slot",
        "  call void @peak(ptr %mine, i64 %reps)",
        "  ret void",
        "}",
        "define void @peak_team(ptr %io, i64 %reps, i32 %nthreads) nounwind {",
        "entry:",
        "  %ctx = alloca [2 x i64], align 8",
        "  store ptr %io, ptr %ctx, align 8",
        "  %rp = getelementptr inbounds ptr, ptr %ctx, i64 1",
        "  store i64 %reps, ptr %rp, align 8",
        "  call void @GOMP_parallel(ptr @peak_body, ptr %ctx, i32 %nthreads, i32 0)",
        "  ret void",
        "}",
    ]) + "\n"


def measure_peak_gflops(target: Target | str | None = None, budget_s: float = 0.5, threads: int = 1) -> float:
    """Best GFLOPS over 8 to 16 independent chains (as many as the register file holds) of
    full-width vector multiply-adds for ``target`` (a :class:`~looprl.target.Target`,
    a target name, None for the host), compiled for that target: one FMA, or one multiply plus
    one add where the target has no FMA, counts 2 flops per lane. Each is timed by the common
    rule (:func:`~looprl.measurement.timing.best_time`) on a share of the budget, in two
    interleaved rounds (the best wins: noise only slows runs down). With ``threads`` > 1 the
    chains run on every thread of a team of that many and the team's total counts. A target
    this host cannot run is a ValueError."""
    budget_s = check_budget(budget_s)
    threads = check_threads(threads)
    target = Target.resolve(target)
    target.check_runs_on_host()
    lanes = target.vector_width
    buffer = (ctypes.c_float * (2 * lanes * threads))(*(([1.0] * lanes + [0.999] * lanes) * threads))
    address = ctypes.addressof(buffer)
    if threads > 1:
        ensure_openmp_runtime()
    kernels = []
    # Chains plus the two operands must stay in registers. Without FMA a step is a multiply
    # then an add (twice the latency): it needs more chains.
    most = target.registers - 2
    chain_counts = [c for c in (8, 10, 12, 14, 16) if c <= most] if target.fma else list(range(min(10, most), min(most, 16) + 1))
    for chains in chain_counts:
        if threads == 1:
            module = CompiledModule(_peak_ir(lanes, chains, target.fma), "peak", target)
            function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(module.address)
        else:
            module = CompiledModule(_team_ir(lanes, chains, target.fma), "peak_team", target)
            team = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)(module.address)
            function = lambda io, reps, team=team: team(io, reps, threads)  # noqa: E731
        kernels.append((2 * lanes * chains * _ITERATIONS * threads, function, module))
    before_parallel_call(threads)
    best = 0.0
    with machine_lock():
        for _ in range(2):
            for flops, function, _module in kernels:
                timing = best_time(lambda reps, f=function: f(address, reps), budget_s / 2 / len(kernels), flops=flops)
                best = max(best, timing.gflops)
    return best


def peak_gflops(target: Target | str | None = None, cache=None, *, refresh: bool = False, threads: int = 1) -> float:
    """The measured fp32 peak (GFLOPS; one core, or a team of ``threads`` threads) of
    ``target`` (default the host's) on this host, cached per host, target and thread count in
    the measurement cache (the default persistent one unless ``cache`` is given: a
    :class:`~looprl.measurement.cache.MeasurementCache` or a path). A stored value that is not
    a positive, finite number is measured again and replaced."""
    from looprl.measurement.evaluator import open_cache

    threads = check_threads(threads)
    target = Target.resolve(target)
    store = open_cache(cache)
    if not refresh:
        known = store.get_peak(target, threads)
        if known is not None and math.isfinite(known) and known > 0:
            return known
    value = measure_peak_gflops(target, threads=threads)
    store.put_peak(value, target, threads)
    return value
