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

from looprl import checks
from looprl.backend.buffers import aligned_empty
from looprl.backend.weight_memory import for_timing, weight_empty
from looprl.backend.abi import kernel_tensors, pack_function_name
from looprl.backend.host import cache_sizes
from looprl.backend.kernel import Kernel, ReshapedKernel
from looprl.backend.threads import check_threads
from looprl.ir.dtypes import DEFAULT_DTYPE, DType, to_bfloat16
from looprl.ir.problem import COLD
from looprl.measurement.lock import machine_lock

# Part of the measurement cache key: bump when the rule below changes what it reports (4: packed
# weights, and their cold copies, on huge pages: looprl.backend.weight_memory).
TIMING_PROTOCOL_VERSION = 4
DEFAULT_BUDGET_S = 0.015
# A problem's constant inputs, when other work reads bytes between its calls (Problem.between), are
# timed from this many copies at most, used in turn: as many as put those bytes (at most twice the
# last-level cache: beyond that everything comes from memory) between two uses of one copy; 256
# reach that for a 256 KB weight on a 32 MB cache (64 left it a 16 MB rotation, warm).
MAX_COLD_COPIES = 256
COLD_LAYOUTS_KEPT = 2  # packed forms of the copies kept per workspace (one per layout: the latest)


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


def best_time(call: Callable[[int], None], budget_s: float, *, flops: int = 0, min_runs: int = 3, lock=None) -> Timing:
    """Time ``call(reps)`` (which runs the computation ``reps`` times) by the rule above.

    ``lock``: a context manager held while timing; None means the machine-wide lock (pass
    ``contextlib.nullcontext()`` where a parent process already holds it)."""
    budget_s = checks.seconds(budget_s, "budget_s")
    min_runs = checks.positive_int(min_runs, "min_runs")
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
            self.inputs.append(_uniform(rng, shape, problem.dtype))
        self.epilogue: dict[str, np.ndarray] = {}
        for name, shape in problem.epilogue_shapes:
            self.epilogue[name] = _uniform(rng, shape, problem.dtype)
        self.out = aligned_empty(problem.output_shape, problem.dtype.storage)
        self.acc = aligned_empty(problem.output_shape)
        self._cold_sources: dict[str, list[np.ndarray]] = {}  # a cold problem's constant inputs: copies, row-major
        self._cold_packed: dict[tuple[str, str], list[np.ndarray]] = {}  # and in a layout, by (tensor, layout key)
        self._point()

    def _point(self) -> None:
        arrays = {"in0": self.inputs[0], "in1": self.inputs[1], "out": self.out, "acc": self.acc, **self.epilogue}
        self.pointers = tuple(arrays[t].ctypes.data for t in kernel_tensors(self.problem))

    def input(self, tensor: str) -> np.ndarray:
        """The operand ``tensor`` (``"in0"`` or ``"in1"``)."""
        return self.inputs[0 if tensor == "in0" else 1]

    def cold_copies(self, tensor: str, layout=None, packer=None, threads: int = 1) -> list[np.ndarray]:
        """The copies of constant input ``tensor`` that a problem with bytes between calls is
        timed on besides :attr:`inputs`' own (:func:`cold_copy_count` in all, for ``threads``
        threads), row-major, or converted into
        ``layout`` by ``packer`` (a kernel's packing function: ``packer(src, dst)``); the
        latest :data:`COLD_LAYOUTS_KEPT` layouts' are kept."""
        source = self.input(tensor)
        wanted = cold_copy_count(source.nbytes, between=self.problem.between, threads=threads) - 1
        sources = self._cold_sources.get(tensor)
        if sources is None or len(sources) != wanted:
            sources = []
            for _ in range(wanted):
                copy = aligned_empty(source.shape, source.dtype)
                copy[...] = source  # the values do not matter, only that each copy is its own memory
                sources.append(copy)
            self._cold_sources[tensor] = sources
            self._cold_packed = {key: packed for key, packed in self._cold_packed.items() if key[0] != tensor}
        if layout is None:
            return sources
        key = (tensor, layout.key)
        packed = self._cold_packed.pop(key, None)
        if packed is None:
            while len(self._cold_packed) >= COLD_LAYOUTS_KEPT:
                self._cold_packed.pop(next(iter(self._cold_packed)))
            packed = []
            for source in sources:
                target = weight_empty(layout.elements, source.dtype)  # where a bound kernel packs it
                packer(source.ctypes.data, target.ctypes.data)
                packed.append(target)
        self._cold_packed[key] = packed  # now the latest
        return packed

    def ensure(self, elements: int) -> None:
        """Grow the accumulator (the kernel's workspace) to at least ``elements`` floats."""
        if self.acc.size < elements:
            self.acc = aligned_empty(elements)
            self._point()


def _uniform(rng, shape, dtype: DType = DEFAULT_DTYPE) -> np.ndarray:
    """An aligned array of ``shape``, uniform in [-1, 1), drawn in float32 in place (a 154 MB
    weight: 0.15 s, where drawing doubles and converting took 0.9 s); for bfloat16, those
    values rounded, as bits (:func:`looprl.ir.dtypes.to_bfloat16`)."""
    array = aligned_empty(shape)
    rng.random(dtype=np.float32, out=array)
    array *= 2.0
    array -= 1.0
    if array.dtype == dtype.storage:  # float32: stored as drawn
        return array
    bits = aligned_empty(shape, dtype.storage)
    bits[...] = to_bfloat16(array)
    return bits


def time_kernel(
    kernel: Kernel | ReshapedKernel, budget_s: float = DEFAULT_BUDGET_S, min_runs: int = 3, workspace: Workspace | None = None,
    lock=None, threads: int | None = None, cold_threads: int | None = None,
) -> Timing:
    """Time ``kernel`` on aligned buffers (``workspace``, or new ones) by :func:`best_time`,
    its parallel loops on ``threads`` threads (None: the kernel's own count). A cold problem's
    copies (:func:`cold_copy_count`) count the caches of ``cold_threads`` threads (None:
    ``threads``): a tune on two threads times its serial schedules and its teams on the same
    copies, or the serial ones would read theirs warmer."""
    if not isinstance(kernel, (Kernel, ReshapedKernel)):
        raise ValueError(f"time_kernel() expects a Kernel, got {type(kernel).__name__}")
    threads = kernel.threads if threads is None else check_threads(threads)
    ws = workspace if workspace is not None and workspace.problem == kernel.problem else Workspace(kernel.problem)
    ws.ensure(kernel.workspace_elements)  # packed inputs live there: their conversion is timed
    cold_threads = threads if cold_threads is None else check_threads(cold_threads)
    if cold_copy_count(kernel.problem.constant_bytes, between=kernel.problem.between, threads=cold_threads) > 1:
        return best_time(_cold_call(kernel, ws, threads, cold_threads), budget_s, flops=kernel.problem.flops, min_runs=min_runs, lock=lock)
    call, pointers = kernel.raw_call, ws.pointers
    constant = [t for t in kernel.problem.constant if t in kernel.packed_inputs]
    if constant:  # weights are converted once, when bound, as in use: not timed
        with for_timing():
            bound = kernel.bind(**{t: ws.input(t) for t in constant})
        arrays = {t: bound._buffers.get(t, ws.inputs[i]) for i, t in enumerate(("in0", "in1"))}
        pointers = (arrays["in0"].ctypes.data, arrays["in1"].ctypes.data) + ws.pointers[2:]
        call = bound.raw_call
    return best_time(lambda reps: call(pointers, reps, threads), budget_s, flops=kernel.problem.flops, min_runs=min_runs, lock=lock)


def cold_copy_count(nbytes: int, llc_bytes: int | None = None, between: int = COLD, threads: int = 1) -> int:
    """Copies of a constant input of ``nbytes`` that a problem with ``between`` bytes read by
    other work between two calls is timed on, each call taking the next: as many that the
    other copies put about ``between`` bytes between two uses of one copy (at least twice the
    last-level cache, ``llc_bytes``, default this host's, where ``between`` reaches that: from
    memory); one where that is less than half an input, or where the input alone is twice the
    cache; at most
    :data:`MAX_COLD_COPIES`. On ``threads`` threads the cache counts once per thread: each may
    sit under a last-level cache of its own (a VM's two vCPUs on two core complexes, where the
    OS reports one cache), and a team reading its shares of one weight through two caches
    read 1x4096x4096 bfloat16 at 2.9x the DRAM bound from three copies sized for one."""
    llc = (cache_sizes()[1] if llc_bytes is None else llc_bytes) * checks.positive_int(threads, "threads")
    nbytes = max(nbytes, 1)
    if nbytes >= 2 * llc or between <= 0:
        return 1
    if between >= 2 * llc:  # from memory: at least twice the cache between two uses
        return min(MAX_COLD_COPIES, 1 + math.ceil(2 * llc / nbytes))
    return min(MAX_COLD_COPIES, 1 + round(between / nbytes))


def _cold_call(kernel, ws: Workspace, threads: int, cold_threads: int):
    """``call(reps)`` for :func:`best_time` that runs ``kernel`` on ``threads`` threads once per
    copy of the cold problem's constant inputs in turn (:meth:`Workspace.cold_copies`, counted
    for ``cold_threads``; packed ones as bound kernels take them), so every call reads its
    weights from memory."""
    constant = list(kernel.problem.constant)
    packed = [t for t in constant if t in kernel.packed_inputs]
    copies = {}
    with for_timing():
        function = kernel.bind(**{t: ws.input(t) for t in packed}) if packed else kernel
        for t in constant:
            if t in packed:
                copies[t] = [function._buffers[t]] + ws.cold_copies(t, kernel.layouts[t], kernel._packers[pack_function_name(t)], cold_threads)
            else:
                copies[t] = [ws.input(t)] + ws.cold_copies(t, threads=cold_threads)
    count = min(len(c) for c in copies.values())
    slots = {t: kernel.tensors.index(t) for t in constant}
    sets = []
    for i in range(count):
        pointers = list(ws.pointers)
        for t, slot in slots.items():
            pointers[slot] = copies[t][i].ctypes.data
        sets.append(tuple(pointers))
    turn = [0]

    def call(reps: int) -> None:
        for _ in range(reps):
            function.raw_call(sets[turn[0] % count], 1, threads)
            turn[0] += 1

    return call
