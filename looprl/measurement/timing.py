"""The one timing rule, used for kernels, the peak, numpy's baseline and the benchmarks.

:func:`best_time` warms up, then times runs of ``reps`` repetitions (each run about 1/8 of
the budget) until the budget, warm-up included, is spent and at least ``min_runs`` runs
are done, and keeps the fastest run: noise on a shared machine only ever slows a run down.
A computation whose first one or two executions already take the budget is reported from
those (slow schedules stay cheap to rank; they are far from the best ones anyway).

Timing holds the machine-wide :func:`~looprl.measurement.lock.machine_lock` unless told
otherwise, so no two looprl processes of this user time at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from looprl.backend.buffers import aligned_empty
from looprl.backend.abi import kernel_tensors
from looprl.backend.kernel import Kernel, ReshapedKernel
from looprl.backend.threads import check_threads
from looprl.measurement.lock import machine_lock

# Part of the measurement cache key: bump when the rule below changes what it reports.
TIMING_PROTOCOL_VERSION = 2
DEFAULT_BUDGET_S = 0.015


@dataclass(frozen=True)
class Timing:
    """Result of timing one computation."""

    seconds: float  # best time of one execution of the whole computation
    runs: int  # timed runs (each repeats the computation ``reps`` times)
    reps: int
    flops: int = 0

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9


def check_budget(budget_s, what: str = "budget_s", unit: str = "seconds", *, zero: bool = False) -> float:
    """A finite, positive number (of seconds, or of ``unit``; 0 too where ``zero``, which
    means "none" to the caller), or a ValueError naming ``what``.

    Python and numpy numbers are accepted; bools, strings and None are not."""
    kind = "finite number >= 0" if zero else "positive, finite number"
    if isinstance(budget_s, (bool, np.bool_)) or not isinstance(budget_s, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a {kind} of {unit}, got {budget_s!r}")
    if not (math.isfinite(budget_s) and (budget_s > 0 or (zero and budget_s == 0))):
        raise ValueError(f"{what} must be a {kind} of {unit}, got {budget_s!r}")
    return float(budget_s)


def best_time(call: Callable[[int], None], budget_s: float, *, flops: int = 0, min_runs: int = 3, lock=None) -> Timing:
    """Time ``call(reps)`` (which runs the computation ``reps`` times) by the rule above.

    ``lock``: a context manager held while timing; None means the machine-wide lock (pass
    ``contextlib.nullcontext()`` where a parent process already holds it)."""
    budget_s = check_budget(budget_s)
    if isinstance(min_runs, bool) or not isinstance(min_runs, (int, np.integer)) or min_runs < 1:
        raise ValueError(f"min_runs must be a positive integer, got {min_runs!r}")
    min_runs = int(min_runs)
    with lock if lock is not None else machine_lock():
        began = start = time.perf_counter()
        call(1)  # warm-up: page faults, caches
        first = max(time.perf_counter() - start, 1e-9)
        if first >= budget_s:
            return Timing(first, 1, 1, flops)
        start = time.perf_counter()
        call(1)
        single = max(time.perf_counter() - start, 1e-9)
        if first + single >= budget_s:
            return Timing(min(first, single), 2, 1, flops)
        reps = max(1, int(budget_s / 8 / single))
        best, runs = math.inf, 0
        deadline = began + budget_s
        while runs < min_runs or time.perf_counter() < deadline:
            start = time.perf_counter()
            call(reps)
            best = min(best, (time.perf_counter() - start) / reps)
            runs += 1
        return Timing(max(best, 1e-9), runs, reps, flops)


class Workspace:
    """Aligned, randomly initialised buffers for one problem (its operands, the epilogue's
    inputs, the output and the accumulator), reusable across kernels. :attr:`pointers` are
    their addresses in the order a kernel's entry point takes them
    (:func:`~looprl.backend.abi.kernel_tensors`)."""

    def __init__(self, problem, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.problem = problem
        self.inputs = []
        for shape in problem.input_shapes:
            array = aligned_empty(shape)
            array[...] = rng.uniform(-1.0, 1.0, size=shape)
            self.inputs.append(array)
        self.epilogue: dict[str, np.ndarray] = {}
        for name, shape in problem.epilogue_shapes:
            array = aligned_empty(shape)
            array[...] = rng.uniform(-1.0, 1.0, size=shape)
            self.epilogue[name] = array
        self.out = aligned_empty(problem.output_shape)
        self.acc = aligned_empty(problem.output_shape)
        self._point()

    def _point(self) -> None:
        arrays = {"in0": self.inputs[0], "in1": self.inputs[1], "out": self.out, "acc": self.acc, **self.epilogue}
        self.pointers = tuple(arrays[t].ctypes.data for t in kernel_tensors(self.problem))

    def ensure(self, elements: int) -> None:
        """Grow the accumulator (the kernel's workspace) to at least ``elements`` floats."""
        if self.acc.size < elements:
            self.acc = aligned_empty(elements)
            self._point()


def time_kernel(
    kernel: Kernel | ReshapedKernel, budget_s: float = DEFAULT_BUDGET_S, min_runs: int = 3, workspace: Workspace | None = None,
    lock=None, threads: int | None = None,
) -> Timing:
    """Time ``kernel`` on aligned buffers (``workspace``, or new ones) by :func:`best_time`,
    its parallel loops on ``threads`` threads (None: the kernel's own count)."""
    if not isinstance(kernel, (Kernel, ReshapedKernel)):
        raise ValueError(f"time_kernel() expects a Kernel, got {type(kernel).__name__}")
    threads = kernel.threads if threads is None else check_threads(threads)
    ws = workspace if workspace is not None and workspace.problem == kernel.problem else Workspace(kernel.problem)
    ws.ensure(kernel.workspace_elements)  # packed inputs live there: their conversion is timed
    call, pointers = kernel.raw_call, ws.pointers
    constant = [t for t in kernel.problem.constant if t in kernel.packed_inputs]
    if constant:  # weights are converted once, when bound, as in use: not timed
        bound = kernel.bind(**{t: ws.inputs[0 if t == "in0" else 1] for t in constant})
        arrays = {t: bound._buffers.get(t, ws.inputs[i]) for i, t in enumerate(("in0", "in1"))}
        pointers = (arrays["in0"].ctypes.data, arrays["in1"].ctypes.data) + ws.pointers[2:]
        call = bound.raw_call
    return best_time(lambda reps: call(pointers, reps, threads), budget_s, flops=kernel.problem.flops, min_runs=min_runs, lock=lock)
