"""The roofline: this host's memory bandwidth, measured as the peak is, and the bound that
applies to a problem.

A kernel cannot beat the FMA peak, nor move its data faster than the memory it comes from
allows. :func:`memory_bandwidth` measures, with the code generator's streaming kernel
(:mod:`looprl.backend.stream_kernel`: full-width vector loads into independent sums, the same
timing rule as everything else), the read bandwidth from the L2 (a buffer of half of it), the
last-level cache (four times the L2) and DRAM (eight times the last-level cache, at least
256 MB), cached per host, target and thread count like the peak. :meth:`Roofline.bound` takes a
problem's compulsory traffic (its inputs, the epilogue's inputs and the output, each once, in
float32): the bandwidth of the level its working set fits in (L2, last-level cache, DRAM)
times the arithmetic intensity (flops per byte), or the peak where that is lower. Decode-step GEMMs (m = 1..16: a weight matrix read
for m/2 flops per byte) are the bandwidth-bound case."""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from looprl import checks
from looprl.backend.buffers import aligned_zeros
from looprl.backend.host import cache_sizes
from looprl.backend.jit import CompiledModule
from looprl.backend.stream_kernel import PREFETCH_DISTANCES, STREAM_ACCUMULATORS, STREAM_PATTERNS, stream_ir
from looprl.backend.placement import placed_team
from looprl.backend.threads import before_parallel_call, check_threads, ensure_openmp_runtime
from looprl.ir.dtypes import FLOAT32
from looprl.ir.problem import Problem
from looprl.measurement.timing import best_time
from looprl.target import Target

LEVELS = ("l2", "llc", "dram")
MIN_DRAM_BUFFER_BYTES = 256 * 2**20


def level_buffer_bytes(level: str) -> int:
    """The buffer that measures ``level``: half the L2; four times the L2 (past it, in the
    last-level cache; at most half that cache); or eight times the last-level cache (at least
    :data:`MIN_DRAM_BUFFER_BYTES`) for DRAM. A bound must not be beaten: the last-level cache is
    read fastest just past the L2 (on a Zen 4 VM: 99 GB/s at 2-8 MB, 81 at 16 MB, 67 at 24)."""
    level = checks.one_of(level, "memory level", LEVELS)
    l2, llc = cache_sizes()
    if level == "l2":
        return max(l2 // 2, 64 * 2**10)
    if level == "llc":
        return max(min(4 * l2, llc // 2), 2**20)
    return max(8 * llc, MIN_DRAM_BUFFER_BYTES)


def measure_bandwidth_gbs(target: Target, buffer_bytes: int, threads: int = 1, budget_s: float = 0.9) -> float:
    """Best read bandwidth (GB/s) of ``threads`` threads streaming a buffer of about
    ``buffer_bytes`` (each thread its own contiguous share) with ``target``'s vector loads, in
    each of the read patterns of :data:`~looprl.backend.stream_kernel.STREAM_PATTERNS` (one
    sequential stream, or several regions side by side), each without and with software
    prefetches (:data:`~looprl.backend.stream_kernel.PREFETCH_DISTANCES`), each timed by the
    common rule in two rounds: the best of them (a bound that a kernel reading another way beat
    would be no bound)."""
    budget_s = checks.seconds(budget_s, "budget_s")
    threads = check_threads(threads)
    target.check_runs_on_host()
    step = target.vector_width * STREAM_ACCUMULATORS * threads  # floats per block of every thread
    blocks = max(1, buffer_bytes // FLOAT32.element_bytes // step)
    data = aligned_zeros(blocks * step)
    data[:] = 1.0
    out = aligned_zeros(target.vector_width * threads)
    best = 0.0
    patterns = [(streams, ahead) for streams in STREAM_PATTERNS for ahead in PREFETCH_DISTANCES]
    for streams, ahead in patterns:
        if threads == 1:
            module = CompiledModule(stream_ir(target, streams=streams, prefetch_bytes=ahead), "stream", target)
            kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(module.address)
            call = lambda reps: kernel(data.ctypes.data, blocks, reps, out.ctypes.data)  # noqa: E731
        else:
            ensure_openmp_runtime()
            module = CompiledModule(stream_ir(target, team=True, streams=streams, prefetch_bytes=ahead), "stream_team", target)
            team = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32)(module.address)
            call = lambda reps: team(data.ctypes.data, blocks, reps, out.ctypes.data, threads)  # noqa: E731
            before_parallel_call(threads)
        with placed_team(threads):
            best = max([best] + [best_time(call, budget_s / (2 * len(patterns)), flops=data.nbytes).gflops for _ in range(2)])  # GB/s
        del module
    return best


def memory_bandwidth(target: Target | str | None = None, cache=None, *, threads: int = 1, refresh: bool = False) -> dict[str, float]:
    """``{"l2": GB/s, "llc": GB/s, "dram": GB/s}`` of this host for ``target`` (default the host's) on
    ``threads`` threads, measured once and cached (the default persistent cache unless
    ``cache`` is given)."""
    from looprl.measurement.evaluator import open_cache

    threads = check_threads(threads)
    target = Target.resolve(target)
    store = open_cache(cache)
    found = {}
    for level in LEVELS:
        known = None if refresh else store.get_bandwidth(level, target, threads)
        if known is None or not (math.isfinite(known) and known > 0):
            known = measure_bandwidth_gbs(target, level_buffer_bytes(level), threads)
            store.put_bandwidth(known, level, target, threads)
        found[level] = known
    return found


def problem_bytes(problem: Problem) -> int:
    """Compulsory traffic of ``problem``: its inputs, the epilogue's inputs and the output,
    each once, in the problem's dtype."""
    shapes = [*problem.input_shapes, problem.output_shape, *(shape for _, shape in problem.epilogue_shapes)]
    return problem.element_bytes * sum(math.prod(shape) for shape in shapes)


@dataclass(frozen=True)
class Bound:
    gflops: float
    limit: str  # "peak", "L2 bandwidth", "LLC bandwidth" or "DRAM bandwidth"

    @property
    def letter(self) -> str:
        """The limit in one letter, as the benchmarks' tables print it: P, 2 (L2), L (LLC) or D."""
        return {"peak": "P", "L2 bandwidth": "2", "LLC bandwidth": "L", "DRAM bandwidth": "D"}[self.limit]


@dataclass(frozen=True)
class Roofline:
    """This host's ceilings: the FMA peak and the bandwidths, with the cache sizes that say
    which applies."""

    peak_gflops: float
    llc_gbs: float
    dram_gbs: float
    l2_bytes: int
    llc_bytes: int
    l2_gbs: float = math.inf  # not measured: the L2 bounds nothing below the peak

    def bound(self, problem: Problem) -> Bound:
        """The roofline bound of ``problem`` on this host (see the module's text)."""
        traffic = problem_bytes(problem)
        if traffic <= self.l2_bytes:
            name, gbs = "L2", self.l2_gbs
        else:
            name, gbs = ("LLC", self.llc_gbs) if traffic <= self.llc_bytes else ("DRAM", self.dram_gbs)
        memory = gbs * problem.flops / traffic
        return Bound(memory, f"{name} bandwidth") if memory < self.peak_gflops else Bound(self.peak_gflops, "peak")

    def gbs(self, problem: Problem, gflops: float) -> float:
        """The compulsory traffic's rate (GB/s) of a kernel of ``problem`` at ``gflops``."""
        return gflops * problem_bytes(problem) / problem.flops

    def describe(self) -> str:
        l2 = f"L2 {self.l2_gbs:.0f} GB/s ({self.l2_bytes // 2**10} KB)" if math.isfinite(self.l2_gbs) else f"L2 {self.l2_bytes // 2**10} KB"
        return (f"roofline: peak {self.peak_gflops:.1f} GFLOPS, {l2}, last-level cache {self.llc_gbs:.0f} GB/s "
                f"({self.llc_bytes // 2**20} MB), DRAM {self.dram_gbs:.1f} GB/s")


def roofline(peak_gflops: float, target: Target | str | None = None, cache=None, *, threads: int = 1, fresh: bool = False) -> Roofline:
    """The roofline of this host for ``target`` on ``threads`` threads, with ``peak_gflops``
    (measured by the caller: :func:`~looprl.measurement.peak.peak_gflops`); the bandwidths
    from the cache, or measured now with ``fresh`` (what a benchmark reports: ceilings and
    kernels timed in one run)."""
    bandwidth = memory_bandwidth(target, cache, threads=threads, refresh=fresh)
    l2, llc = cache_sizes()
    return Roofline(peak_gflops, bandwidth["llc"], bandwidth["dram"], l2, llc, bandwidth["l2"])
