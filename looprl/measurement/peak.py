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
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from looprl import checks
from looprl.backend.jit import CompiledModule
from looprl.backend.peak_kernel import PEAK_ITERATIONS, flops_per_step, pairs_in_peak, peak_chain_counts, peak_ir
from looprl.ir.dtypes import FLOAT32
from looprl.backend.placement import placed_team
from looprl.backend.threads import before_parallel_call, check_threads, ensure_openmp_runtime
from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import best_time
from looprl.target import Target


@dataclass(frozen=True, eq=False)
class ChainKernel:
    """A compiled peak kernel with its own buffer: ``run(reps)`` runs :data:`PEAK_ITERATIONS` x
    ``reps`` steps of its chains (on every thread of a team of ``threads``), ``flops`` of work
    per rep (the team's total)."""

    target: Target
    chains: int
    threads: int
    flops: int
    run: Callable[[int], None]
    _keep: tuple  # the compiled module and the buffer, alive as long as ``run`` is


@functools.lru_cache(maxsize=64)
def chain_kernel(target: Target, chains: int, threads: int = 1, dtype: str = FLOAT32) -> ChainKernel:
    """The peak kernel of ``chains`` chains for ``target`` on ``threads`` threads, compiled once
    per process (:func:`~looprl.backend.peak_kernel.peak_ir`)."""
    lanes = target.vector_width
    buffer = (ctypes.c_float * (2 * lanes * threads))(*(([1.0] * lanes + [0.999] * lanes) * threads))
    address = ctypes.addressof(buffer)
    if threads == 1:
        module = CompiledModule(peak_ir(target, chains, dtype=dtype), "peak", target)
        function = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(module.address)
        run = lambda reps: function(address, reps)  # noqa: E731
    else:
        ensure_openmp_runtime()
        module = CompiledModule(peak_ir(target, chains, team=True, dtype=dtype), "peak_team", target)
        team = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)(module.address)
        run = lambda reps: team(address, reps, threads)  # noqa: E731
    flops = flops_per_step(target, dtype) * chains * PEAK_ITERATIONS * threads
    return ChainKernel(target, chains, threads, flops, run, (module, buffer))


def measure_peak_gflops(target: Target, budget_s: float = 0.5, threads: int = 1, dtype: str = FLOAT32) -> float:
    """Best GFLOPS over 8 to 16 independent chains (as many as the register file holds:
    :func:`~looprl.backend.peak_kernel.peak_chain_counts`) of full-width vector multiply-adds
    for ``target``, compiled for that target: one FMA, or one multiply plus one add where the
    target has no FMA, counts 2 flops per lane. Each is timed by the common
    rule (:func:`~looprl.measurement.timing.best_time`) on a share of the budget, in two
    interleaved rounds (the best wins: noise only slows runs down). With ``threads`` > 1 the
    chains run on every thread of a team of that many and the team's total counts. A target
    this host cannot run is a ValueError. ``dtype="bfloat16"``: chains of ``vdpbf16ps`` (4 flops
    per lane) where the target has AVX512_BF16, else the float32 peak
    (:mod:`looprl.backend.peak_kernel`)."""
    budget_s = checks.seconds(budget_s, "budget_s")
    threads = check_threads(threads)
    target.check_runs_on_host()
    kernels = [chain_kernel(target, chains, threads, dtype) for chains in peak_chain_counts(target)]
    before_parallel_call(threads)
    best = 0.0
    with machine_lock(), placed_team(threads):
        for _ in range(2):
            for kernel in kernels:
                timing = best_time(kernel.run, budget_s / 2 / len(kernels), flops=kernel.flops)
                best = max(best, timing.gflops)
    return best


def peak_gflops(target: Target | str | None = None, cache=None, *, refresh: bool = False, threads: int = 1, dtype: str = FLOAT32) -> float:
    """The measured fp32 peak (GFLOPS; one core, or a team of ``threads`` threads) of
    ``target`` (default the host's) on this host, cached per host, target and thread count in
    the measurement cache (the default persistent one unless ``cache`` is given: a
    :class:`~looprl.measurement.cache.MeasurementCache` or a path). A stored value that is not
    a positive, finite number is measured again and replaced. ``dtype="bfloat16"``: the peak of
    bfloat16 kernels (twice as many flops per instruction where the target has AVX512_BF16,
    else the float32 peak itself)."""
    from looprl.measurement.evaluator import open_cache

    threads = check_threads(threads)
    target = Target.resolve(target)
    if not pairs_in_peak(target, dtype):
        dtype = FLOAT32  # the same kernels: the float32 peak
    store = open_cache(cache)
    if not refresh:
        known = store.get_peak(target, threads, dtype)
        if known is not None and math.isfinite(known) and known > 0:
            return known
    value = measure_peak_gflops(target, threads=threads, dtype=dtype)
    store.put_peak(value, target, threads, dtype)
    return value
