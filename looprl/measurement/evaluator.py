"""Measuring many schedules: through the persistent cache, with reusable aligned buffers.

The environment and the search baselines both rank states by :class:`Evaluator`; a failed
compile or run becomes a :class:`Measurement` carrying its error message rather than an
exception (so a long training run is never killed by one bad state) and is never cached.
A cached value is not final: a state looked up again while it has fewer than ``samples``
timings is timed again, and the cache keeps the best of its samples (noise on a shared machine
only ever slows a run down, and its speed is bimodal).
Compiling and timing a new state hold the machine-wide :class:`~looprl.measurement.lock.TimingLock`:
on a 2-vCPU machine whose vCPUs share a physical core, a kernel runs ~1.5x faster while the
other vCPU idles than while another process compiles or times there, so concurrent
evaluations would make rewards depend on what the other process happened to be doing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from looprl import checks, defaults
from looprl.backend.kernel import Kernel, compile
from looprl.backend.threads import check_threads
from looprl.errors import CompileError, KernelError
from looprl.ir.nest import LoopNest
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import schedule_threads
from looprl.measurement.lock import TimingLock, machine_lock
from looprl.target import Target
from looprl.measurement.timing import (
    DEFAULT_BUDGET_S,
    Workspace,
    time_kernel,
)


@dataclass(frozen=True)
class Measurement:
    """GFLOPS of one schedule, where it came from and what it cost."""

    gflops: float  # best of the state's samples; 0.0 when ``error`` is set
    from_cache: bool  # no new timing was made
    compile_s: float = 0.0
    measure_s: float = 0.0
    error: str | None = None
    samples: int = 0  # timings behind ``gflops`` (over all processes that shared the cache)
    sample_gflops: float | None = None  # this call's new timing, if one was made
    waited_s: float = 0.0  # spent waiting for the machine-wide timing lock (another process timing)

    @property
    def ok(self) -> bool:
        return self.error is None


def open_cache(cache: "MeasurementCache | str | None") -> MeasurementCache:
    """A cache from a :class:`MeasurementCache`, a path (``":memory:"`` for a private one) or
    None (the per-user persistent cache)."""
    if isinstance(cache, MeasurementCache):
        return cache
    if cache is None or isinstance(cache, str) or hasattr(cache, "__fspath__"):
        return MeasurementCache(cache)
    raise ValueError(f"cache must be a MeasurementCache, a path or None, got {type(cache).__name__}")


# Kernels an evaluator keeps from its last timings, the one place a kernel is kept for timing again: a schedule timed
# again runs the kernel compiled at its last timing (a search's verification times its contenders in interleaved rounds,
# 100 rounds of one winner at a 1 ms budget), and :meth:`Evaluator.kernel_for` gives a tune's answer the kernel that timed
# it (timed among the last: the policy's episodes time at most POLICY_TIMINGS proposals each; a search's verification
# times its contenders last). Beyond these, a schedule is compiled again (its code shared by the JIT while it lives).
RECENT_KERNELS = 16


def strict_from_environment() -> bool:
    """``LOOPRL_STRICT=1`` (read when an evaluator is created) makes failures raise: the test
    suite sets it, so that a compile failure is never mistaken for a slow schedule."""
    return os.environ.get("LOOPRL_STRICT", "") not in ("", "0")


class Evaluator:
    """``evaluator(nest)`` -> :class:`Measurement`, measured once per host and schedule.

    A schedule that fails to compile or run (:class:`~looprl.errors.CompileError`,
    :class:`~looprl.errors.KernelError`, or no memory for its buffers) gives a failed
    :class:`Measurement`; with ``strict`` (default: ``$LOOPRL_STRICT``) it raises instead.
    Any other exception is a bug and always propagates.

    Code is generated for ``target`` (a :class:`~looprl.target.Target`, a target name
    or None for the host); the cache key includes the target and ``budget_s``. A cached state
    with fewer than ``samples`` timings is timed again when it is looked up (``samples=1``:
    never). Schedules with a parallel loop run on ``threads`` threads (1 to the cores this
    process may use), which is part of their cache key; the others run on one. A cold problem's
    copies (:func:`~looprl.measurement.timing.cold_copy_count`) count the caches of
    ``cold_threads`` threads (default ``threads``; :meth:`with_threads` keeps the larger): a tune
    on two threads times its serial schedules on the copies its teams read, as the two-thread
    tunes of 1 x 512 x 512 and 1 x 1408 x 512 (cold, Zen 4) timed their serial schedules on
    half as many and returned them at 32-37 GB/s against teams at 26-31, from warmer copies."""

    def __init__(
        self,
        cache: "MeasurementCache | str | None" = None,
        budget_s: float = defaults.STATE_BUDGET_S,
        timing_lock: "TimingLock | bool" = True,
        strict: bool | None = None,
        target: "Target | str | None" = None,
        samples: int = defaults.MEASUREMENT_SAMPLES,
        threads: int = 1,
        cold_threads: int | None = None,
    ):
        self.budget_s = checks.seconds(budget_s, "budget_s")
        self.threads = check_threads(threads)
        self.cold_threads = self.threads if cold_threads is None else check_threads(cold_threads)
        self.target = Target.resolve(target)
        self.target.check_runs_on_host()
        self.samples = checks.positive_int(samples, "samples")
        if not (isinstance(timing_lock, bool) or timing_lock is None or hasattr(timing_lock, "__enter__")):
            raise ValueError(f"timing_lock must be True, False or a context manager, got {type(timing_lock).__name__}")
        self.cache = open_cache(cache)
        if timing_lock is True:
            timing_lock = machine_lock()
        self.timing_lock = timing_lock or contextlib.nullcontext()
        self.strict = strict_from_environment() if strict is None else bool(strict)
        self._workspaces: dict[str, Workspace] = {}
        self.compiled = 0  # states compiled and timed by this evaluator
        self.resampled = 0  # of which: cached states timed again
        self.failures = 0
        self.compile_s = 0.0  # total seconds spent compiling / timing new states
        self.measure_s = 0.0
        self._recent: OrderedDict[LoopNest, Kernel] = OrderedDict()  # the last timings' kernels (RECENT_KERNELS)
        self._recent_lock = threading.Lock()

    def with_threads(self, threads: int) -> "Evaluator":
        """An evaluator like this one (cache, budget, lock, target, samples, and the same
        buffers, already paged in) that measures parallel schedules on ``threads`` threads."""
        other = Evaluator(self.cache, self.budget_s, self.timing_lock, self.strict, self.target, self.samples, threads,
                          max(self.cold_threads, threads))
        other._workspaces = self._workspaces
        return other

    def _workspace(self, problem) -> Workspace:
        workspace = self._workspaces.get(problem.name)
        if workspace is None:
            if len(self._workspaces) >= 8:  # a few problems' buffers at most
                self._workspaces.pop(next(iter(self._workspaces)))
            workspace = self._workspaces[problem.name] = Workspace(problem)
        return workspace

    def __call__(self, nest: LoopNest) -> Measurement:
        return self.measure(nest)

    def measure(self, nest: LoopNest, kernel: Kernel | None = None) -> Measurement:
        """The cached value of ``nest`` if it has ``samples`` timings, else compile it (unless
        ``kernel`` is given), time it under the lock and add the timing to the cache."""
        if not isinstance(nest, LoopNest):
            raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
        known = self.cache.lookup(nest, self.target, self.budget_s, self.threads)
        if self._final(known):
            return Measurement(known.gflops, from_cache=True, samples=known.samples)
        return self._time(nest, kernel, resample=known is not None)

    def is_final(self, nest: LoopNest) -> bool:
        """Whether :meth:`measure` would answer ``nest`` from the cache, timing nothing."""
        return self._final(self.cache.lookup(nest, self.target, self.budget_s, self.threads))

    def _final(self, known) -> bool:
        """Whether a cached value (or None) has the timings it needs."""
        return known is not None and known.samples >= self.samples

    def remeasure(self, nest: LoopNest, kernel: Kernel | None = None) -> Measurement:
        """Time ``nest`` again whatever the cache holds, and add the timing to it."""
        if not isinstance(nest, LoopNest):
            raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
        return self._time(nest, kernel, resample=True)

    def kernel_for(self, nest: LoopNest, threads: int = 1) -> Kernel:
        """``nest`` compiled for this evaluator's target, ``threads`` its calls' default thread
        count: the kernel one of this evaluator's last :data:`RECENT_KERNELS` timings compiled
        for it where there is one (the count is not part of the code), else compiled now (the
        code of a nest whose IR is the same, a re-laid start's coordinates, is shared by the JIT).
        A tune's finishing step (:func:`looprl.tune.api.tune`) asks it for the answer its search
        or its policy's episode has just timed, which it generated and compiled again before."""
        with self._recent_lock:
            kernel = self._recent.get(nest)
        return kernel.with_threads(threads) if kernel is not None else compile(nest, target=self.target, threads=threads)

    def _keep_recent(self, nest: LoopNest, kernel: Kernel) -> None:
        with self._recent_lock:
            self._recent[nest] = kernel
            self._recent.move_to_end(nest)
            while len(self._recent) > RECENT_KERNELS:
                self._recent.popitem(last=False)

    def _time(self, nest: LoopNest, kernel: Kernel | None, resample: bool) -> Measurement:
        if kernel is not None and kernel.target != self.target:
            raise ValueError(f"the kernel was compiled for {kernel.target.isa}, this evaluator measures {self.target.isa}")
        threads = schedule_threads(nest, self.threads)
        try:
            asked = time.perf_counter()
            with self.timing_lock:
                started = time.perf_counter()
                kernel = kernel if kernel is not None else self.kernel_for(nest, threads)
                compiled = time.perf_counter()
                workspace = self._workspace(nest.problem)
                timing = time_kernel(kernel, self.budget_s, workspace=workspace, lock=self.timing_lock, threads=threads,
                                     cold_threads=self.cold_threads)
                self._keep_recent(nest, kernel)
        except (CompileError, KernelError, MemoryError) as error:
            if self.strict:
                raise
            self.failures += 1
            return Measurement(0.0, False, 0.0, 0.0, f"{type(error).__name__}: {error}")
        finished = time.perf_counter()
        self.compiled += 1
        self.resampled += resample
        self.compile_s += compiled - started
        self.measure_s += finished - compiled
        stored = self.cache.add_sample(nest, timing.gflops, self.target, self.budget_s, self.threads)
        return Measurement(stored.gflops, False, compiled - started, finished - compiled, samples=stored.samples, sample_gflops=timing.gflops,
                           waited_s=started - asked)


def measure(
    code: Kernel | LoopNest,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    cache=None,
    target: "Target | str | None" = None,
    samples: int = defaults.MEASUREMENT_SAMPLES,
    threads: int | None = None,
) -> float:
    """GFLOPS (2 x product of loop extents / seconds) of a kernel or a schedule (compiled for
    ``target``, default the host's), timed under the machine-wide lock, its parallel loops on
    ``threads`` threads (None: a kernel's own count, 1 for a schedule).

    With a cache (a :class:`~looprl.measurement.cache.MeasurementCache` or a path), a schedule
    is timed until it has ``samples`` timings there (one per call) and the best of them is
    returned; after that the cached value is returned without timing."""
    if isinstance(code, Kernel):
        nest, kernel = code.nest, code
        target = kernel.target if target is None else Target.resolve(target)
        threads = kernel.threads if threads is None else check_threads(threads)
    elif isinstance(code, LoopNest):
        nest, kernel = code, None
        target = Target.resolve(target)
        threads = 1 if threads is None else check_threads(threads)
    else:
        raise ValueError(f"measure() expects a Kernel or a LoopNest, got {type(code).__name__}")
    budget_s = checks.seconds(budget_s, "budget_s")
    if cache is not None:
        return Evaluator(cache, budget_s, strict=True, target=target, samples=samples, threads=threads).measure(nest, kernel).gflops
    target.check_runs_on_host()
    return time_kernel(kernel or compile(nest, target=target, threads=threads), budget_s, threads=threads).gflops
