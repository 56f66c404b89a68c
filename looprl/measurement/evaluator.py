"""Measuring many schedules: through the persistent cache, with reusable aligned buffers.

The environment and the search baselines both rank states by :class:`Evaluator`; a failed
compile or run becomes a :class:`Measurement` carrying its error message rather than an
exception (so a long training run is never killed by one bad state) and is never cached.
Compiling and timing a new state hold the machine-wide :class:`~looprl.measurement.lock.TimingLock`:
on a 2-vCPU machine whose vCPUs share a physical core, a kernel runs ~1.5x faster while the
other vCPU idles than while another process compiles or times there, so concurrent
evaluations would make rewards depend on what the other process happened to be doing.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from looprl import defaults
from looprl.backend.kernel import Kernel, compile
from looprl.errors import CompileError, KernelError
from looprl.ir.nest import LoopNest
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.lock import TimingLock, machine_lock
from looprl.measurement.timing import (
    DEFAULT_BUDGET_S,
    Workspace,
    check_budget,
    time_kernel,
)


@dataclass(frozen=True)
class Measurement:
    """GFLOPS of one schedule, where it came from and what it cost."""

    gflops: float  # 0.0 when ``error`` is set
    from_cache: bool
    compile_s: float = 0.0
    measure_s: float = 0.0
    error: str | None = None

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


def strict_from_environment() -> bool:
    """``LOOPRL_STRICT=1`` (read when an evaluator is created) makes failures raise: the test
    suite sets it, so that a compile failure is never mistaken for a slow schedule."""
    return os.environ.get("LOOPRL_STRICT", "") not in ("", "0")


class Evaluator:
    """``evaluator(nest)`` -> :class:`Measurement`, measured once per host and schedule.

    A schedule that fails to compile or run (:class:`~looprl.errors.CompileError`,
    :class:`~looprl.errors.KernelError`, or no memory for its buffers) gives a failed
    :class:`Measurement`; with ``strict`` (default: ``$LOOPRL_STRICT``) it raises instead.
    Any other exception is a bug and always propagates."""

    def __init__(
        self,
        cache: "MeasurementCache | str | None" = None,
        budget_s: float = defaults.STATE_BUDGET_S,
        timing_lock: "TimingLock | bool" = True,
        strict: bool | None = None,
    ):
        self.budget_s = check_budget(budget_s)
        if not (isinstance(timing_lock, bool) or timing_lock is None or hasattr(timing_lock, "__enter__")):
            raise ValueError(f"timing_lock must be True, False or a context manager, got {type(timing_lock).__name__}")
        self.cache = open_cache(cache)
        if timing_lock is True:
            timing_lock = machine_lock()
        self.timing_lock = timing_lock or contextlib.nullcontext()
        self.strict = strict_from_environment() if strict is None else bool(strict)
        self._workspaces: dict[str, Workspace] = {}
        self.compiled = 0  # states compiled and timed by this evaluator
        self.failures = 0
        self.compile_s = 0.0  # total seconds spent compiling / timing new states
        self.measure_s = 0.0

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
        """The cached value of ``nest``, else compile it (unless ``kernel`` is given), time
        it under the lock and store the result."""
        if not isinstance(nest, LoopNest):
            raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
        known = self.cache.get(nest)
        if known is not None:
            return Measurement(known, from_cache=True)
        try:
            with self.timing_lock:
                started = time.perf_counter()
                kernel = kernel if kernel is not None else compile(nest)
                compiled = time.perf_counter()
                workspace = self._workspace(nest.problem)
                timing = time_kernel(kernel, self.budget_s, workspace=workspace, lock=self.timing_lock)
        except (CompileError, KernelError, MemoryError) as error:
            if self.strict:
                raise
            self.failures += 1
            return Measurement(0.0, False, 0.0, 0.0, f"{type(error).__name__}: {error}")
        finished = time.perf_counter()
        self.compiled += 1
        self.compile_s += compiled - started
        self.measure_s += finished - compiled
        self.cache.put(nest, timing.gflops)
        return Measurement(timing.gflops, False, compiled - started, finished - compiled)


def measure(target: Kernel | LoopNest, *, budget_s: float = DEFAULT_BUDGET_S, cache=None) -> float:
    """GFLOPS (2 x product of loop extents / seconds) of a kernel or a schedule, timed under
    the machine-wide lock.

    With a cache (a :class:`~looprl.measurement.cache.MeasurementCache` or a path), a schedule
    measured before on this host is not measured again, and a new measurement is stored."""
    if isinstance(target, Kernel):
        nest, kernel = target.nest, target
    elif isinstance(target, LoopNest):
        nest, kernel = target, None
    else:
        raise ValueError(f"measure() expects a Kernel or a LoopNest, got {type(target).__name__}")
    budget_s = check_budget(budget_s)
    if cache is not None:
        return Evaluator(cache, budget_s, strict=True).measure(nest, kernel).gflops
    return time_kernel(kernel or compile(nest), budget_s).gflops
