"""Row plans: a call on any number of rows computed by kernels tuned for a few row counts.

Each tuned schedule is also compiled as a kernel of *runtime rows* (:func:`any_rows_kernel`),
so the kernel tuned for ``c`` rows serves any count up to ``c``; :func:`row_plan` cuts a call's
rows into blocks of the tuned counts by the kernels' measured times. :func:`tuned_row_counts`
says which row counts a layer is tuned for; :class:`InPlaceKernel` is a block's kernel called on
the live weight and bias. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import math

from looprl import checks
from looprl.backend.kernel import Kernel, ReshapedKernel
from looprl.backend.kernel import compile as looprl_compile
from looprl.backend.loops import RuntimeRowsUnsupported
from looprl.tune.results import TuneResult

# Runtime-rows kernels kept compiled (by schedule, target and threads): a GPT-2-sized model has 5 layer
# shapes x 8 row counts; each of its 49 layers compiled its own before (~400 compiles, most of tune_module's time).
RUNTIME_ROWS_KERNELS = 512


CALL_S = 4e-6  # what one more block costs besides its kernel: address_call took 3.4 us for a 1x8x8 kernel (Zen 4)


def block_seconds(length: int, count: int, seconds: dict[int, float], runtime: frozenset = frozenset()) -> float:
    """Estimated seconds of computing ``length`` rows with the kernel for ``count`` rows
    (``length <= count``), a call's overhead included: its measured time when padded (``count``
    not in ``runtime``); with runtime rows, its time scaled to the rows, but never less than
    the measured time of the largest tuned count up to ``length`` (the weights are read
    however few the rows)."""
    if length >= count or count not in runtime:
        return CALL_S + seconds[count]
    floor = max(c for c in seconds if c <= length)
    return CALL_S + max(seconds[count] * length / count, seconds[floor])


def row_plan(rows: int, seconds: dict[int, float], runtime=frozenset()) -> list[tuple[int, int, int]]:
    """How to compute ``rows`` rows with kernels for the row counts of ``seconds`` (count ->
    measured seconds per call; 1 must be one), of which those in ``runtime`` take their row
    count at run time: ``(start, length, count)`` blocks that cover the rows in order, each
    computed by the kernel for ``count`` rows, ``count >= length`` (more: a runtime-rows kernel
    is called on ``length`` rows, another is padded to its count). The plan of least total
    time (:func:`block_seconds` added up): a decode-sized remainder is usually one call (the
    weights are read once) rather than several small ones (read again by each)."""
    runtime = frozenset(runtime)
    counts = sorted(seconds)
    if not counts or counts[0] != 1:
        raise ValueError(f"row counts must include 1, got {counts}")
    largest = counts[-1]
    blocks, start = [], 0
    while rows - start > 2 * largest:  # whole blocks of the largest count, then the best plan for the rest
        blocks.append((start, largest, largest))
        start += largest
    left = rows - start
    best = [0.0] + [math.inf] * left  # best[r]: least time for r rows; choice[r]: the block that ends it
    choice = [0] * (left + 1)
    for r in range(1, left + 1):
        for count in counts:
            cost = block_seconds(min(count, r), count, seconds, runtime) + (best[r - count] if count <= r else 0.0)
            if cost < best[r]:
                best[r], choice[r] = cost, count
            if count >= r:
                break  # a larger count pads more for the same one call
    tail = []
    r = left
    while r > 0:
        count = choice[r]
        length = min(count, r)
        tail.append((length, count))
        r -= length
    for length, count in reversed(tail):
        blocks.append((start, length, count))
        start += length
    return blocks


def any_rows_kernel(result: TuneResult):
    """The schedule of ``result`` compiled as a kernel of runtime rows (for its target and
    threads), or None where it cannot take its rows at run time (a fused view, a schedule
    that converts its first input, too many specialised copies). Compiled once per schedule,
    target and threads (:func:`_runtime_rows_kernel`): the layers of one shape in a model
    share it (a kernel is read-only, safe to call from several threads)."""
    kernel = result.kernel
    if not isinstance(kernel, Kernel) or kernel.problem.row_dim is None:
        return None
    return _runtime_rows_kernel(kernel.nest, kernel.target, kernel.threads)


@functools.lru_cache(maxsize=RUNTIME_ROWS_KERNELS)
def _runtime_rows_kernel(nest, target, threads: int):
    try:
        return looprl_compile(nest, target, threads, runtime_rows=True)
    except RuntimeRowsUnsupported:
        return None





def result_state(result: TuneResult) -> dict:
    """What a pickle or copy of a tuned layer keeps of ``result``: its problem, answer (the
    schedule record: nest, GFLOPS, target, threads) and the problem it was tuned as, not its
    compiled kernel (native code, which cannot be pickled); :func:`rebuilt_result` compiles it
    again."""
    return {"problem": result.problem, "answer": result.answer, "tuned_as": result.tuned_as, "seconds": result.seconds,
            "reshaped": isinstance(result.kernel, ReshapedKernel)}


def foreign_target(states) -> str | None:
    """Why the schedules of ``states`` (:func:`result_state`'s) cannot run here (a target whose
    features this CPU lacks), or None."""
    for state in states:
        target = state["answer"].record.target
        missing = target.missing_on_host()
        if missing:
            return f"tuned for a CPU with {', '.join(missing)}, which this one lacks"
    return None


def rebuilt_result(state: dict) -> TuneResult:
    """The :class:`TuneResult` of :func:`result_state`'s ``state``, its schedule compiled again
    for its target and threads (compile only: nothing is measured or tuned). The target must
    run on this CPU (:func:`foreign_target`)."""
    record = state["answer"].record
    kernel = looprl_compile(record.nest, record.target, record.threads)
    if state["reshaped"]:
        kernel = ReshapedKernel(kernel, state["problem"])
    return TuneResult(state["problem"], kernel=kernel, seconds=state["seconds"], tuned_as=state["tuned_as"], answer=state["answer"])


def check_max_rows(max_rows) -> None:
    """Refuse a ``max_rows`` that is not a positive integer or None."""
    if max_rows is not None:
        checks.positive_int(max_rows, "max_rows")


def tuned_row_counts(seen: set[int], max_rows: int | None) -> list[int]:
    """The row counts to tune a layer for: powers of two up to ``max_rows`` (default: the
    largest seen) and the counts seen."""
    top = max(seen) if max_rows is None else max_rows
    powers, size = [], 1
    while size <= top:
        powers.append(size)
        size *= 2
    return sorted(set(powers) | set(seen))


class InPlaceKernel:
    """A kernel that converts nothing, called on a live weight and bias (CPU tensors of its dtype,
    contiguous, checked by the caller): what a bound kernel is to :meth:`LinearKernels.
    _run_plan`, the tensors' own memory in place of copies. Holds the tensors for the call."""

    __slots__ = ("kernel", "weight", "bias", "_weight", "_bias")

    def __init__(self, kernel, weight, bias):
        self.kernel, self.weight, self.bias = kernel, weight, bias
        self._weight, self._bias = weight.data_ptr(), (() if bias is None else (bias.data_ptr(),))

    def address_call(self, out: int, workspace: int, x: int, rows: int | None = None) -> None:
        self.kernel.raw_call((x, self._weight, out, workspace, *self._bias), 1, rows=rows)
