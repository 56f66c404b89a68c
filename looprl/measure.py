"""Timing kernels: GFLOPS of a schedule on this host, one thread, aligned buffers."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .buffers import aligned_empty
from .kernel import Kernel, compile
from .nest import LoopNest

DEFAULT_BUDGET_S = 0.015


@dataclass(frozen=True)
class Timing:
    """Result of timing one kernel."""

    gflops: float
    seconds: float  # best time of one execution of the whole computation
    runs: int  # timed runs (each repeats the computation ``reps`` times)
    reps: int


class Workspace:
    """Aligned, randomly initialised buffers for one problem, reusable across kernels."""

    def __init__(self, problem, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.problem = problem
        self.inputs = []
        for shape in problem.input_shapes:
            array = aligned_empty(shape)
            array[...] = rng.uniform(-1.0, 1.0, size=shape)
            self.inputs.append(array)
        self.out = aligned_empty(problem.output_shape)
        self.acc = aligned_empty(problem.output_shape)
        self.pointers = (self.inputs[0].ctypes.data, self.inputs[1].ctypes.data, self.out.ctypes.data, self.acc.ctypes.data)


def time_kernel(kernel: Kernel, budget_s: float = DEFAULT_BUDGET_S, min_runs: int = 3, workspace: Workspace | None = None) -> Timing:
    """Warm up, then time runs of ``reps`` in-kernel repetitions (each run ~1/8 of the budget)
    until the budget, warm-up included, is spent (at least ``min_runs`` runs); report the
    fastest run. A kernel whose first one or two
    executions already take the budget is reported from those (slow schedules stay cheap
    to rank; they are far from the best ones anyway)."""
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    if min_runs < 1:
        raise ValueError(f"min_runs must be >= 1, got {min_runs}")
    ws = workspace if workspace is not None and workspace.problem == kernel.problem else Workspace(kernel.problem)
    call, pointers = kernel.raw_call, ws.pointers
    began = start = time.perf_counter()
    call(pointers, 1)  # warm-up: page faults, caches
    first = max(time.perf_counter() - start, 1e-7)
    if first >= budget_s:
        # A very slow schedule: its one (cold) execution spent the whole budget.
        return Timing(kernel.problem.flops / first / 1e9, first, 1, 1)
    start = time.perf_counter()
    call(pointers, 1)
    single = max(time.perf_counter() - start, 1e-7)
    if first + single >= budget_s:
        # A slow schedule: one execution already spends the budget; keep the faster call.
        best = min(first, single)
        return Timing(kernel.problem.flops / best / 1e9, best, 2, 1)
    reps = max(1, int(budget_s / 8 / single))
    best, runs = float("inf"), 0
    deadline = began + budget_s
    while runs < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        call(pointers, reps)
        best = min(best, (time.perf_counter() - start) / reps)
        runs += 1
    return Timing(kernel.problem.flops / best / 1e9, best, runs, reps)


def measure(target: Kernel | LoopNest, *, budget_s: float = DEFAULT_BUDGET_S, cache=None) -> float:
    """GFLOPS (2 x product of loop extents / seconds) of a kernel or a schedule.

    With a :class:`~looprl.cache.MeasurementCache`, a schedule measured before on this host is
    not measured again, and a new measurement is stored."""
    if isinstance(target, Kernel):
        nest, kernel = target.nest, target
    elif isinstance(target, LoopNest):
        nest, kernel = target, None
    else:
        raise ValueError(f"measure() expects a Kernel or a LoopNest, got {type(target).__name__}")
    if cache is not None:
        hit = cache.get(nest)
        if hit is not None:
            return hit
    timing = time_kernel(kernel or compile(nest), budget_s)
    if cache is not None:
        cache.put(nest, timing.gflops)
    return timing.gflops
