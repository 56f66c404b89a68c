"""Measuring many schedules: through the persistent cache, with reusable aligned buffers.

The environment and the search baselines both rank states by :class:`Evaluator`; a failed
compile or run becomes a :class:`Measurement` carrying its error message rather than an
exception (so a long training run is never killed by one bad state) and is never cached.
Compiling and timing a new state hold the machine-wide :class:`~looprl.timing_lock.TimingLock`:
on a 2-vCPU machine whose vCPUs share a physical core, a kernel runs ~1.5x faster while the
other vCPU idles than while another process compiles or times there, so concurrent
evaluations would make rewards depend on what the other process happened to be doing.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from .cache import MeasurementCache
from .kernel import compile
from .measure import Workspace, time_kernel
from .nest import LoopNest
from .timing_lock import TimingLock

DEFAULT_STATE_BUDGET_S = 0.008  # timing budget per new state (compile excluded)


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


class Evaluator:
    """``evaluator(nest)`` -> :class:`Measurement`, measured once per host and schedule."""

    def __init__(
        self,
        cache: "MeasurementCache | str | None" = None,
        budget_s: float = DEFAULT_STATE_BUDGET_S,
        timing_lock: "TimingLock | bool" = True,
    ):
        if not budget_s > 0:
            raise ValueError(f"budget_s must be positive, got {budget_s}")
        self.cache = open_cache(cache)
        if timing_lock is True:
            timing_lock = TimingLock()
        self.timing_lock = timing_lock or contextlib.nullcontext()
        self.budget_s = float(budget_s)
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
        if not isinstance(nest, LoopNest):
            raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
        known = self.cache.get(nest)
        if known is not None:
            return Measurement(known, from_cache=True)
        workspace = self._workspace(nest.problem)
        try:
            with self.timing_lock:
                started = time.perf_counter()
                kernel = compile(nest)
                compiled = time.perf_counter()
                timing = time_kernel(kernel, self.budget_s, workspace=workspace)
        except Exception as error:  # noqa: BLE001 - reported in the Measurement, never cached
            self.failures += 1
            return Measurement(0.0, False, 0.0, 0.0, f"{type(error).__name__}: {error}")
        finished = time.perf_counter()
        self.compiled += 1
        self.compile_s += compiled - started
        self.measure_s += finished - compiled
        self.cache.put(nest, timing.gflops)
        return Measurement(timing.gflops, False, compiled - started, finished - compiled)
