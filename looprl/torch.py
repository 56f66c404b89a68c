"""Tuned looprl kernels inside a PyTorch model: :func:`tune_module`.

This module imports torch (nothing else of looprl does, outside :mod:`looprl.train`); importing
``looprl`` does not import it.

``tune_module(module, example_inputs)`` runs the module once per example under
``torch.no_grad()``, recording with forward hooks the input shape every ``torch.nn.Linear``
sees; then each float32 CPU ``nn.Linear`` that saw float32 CPU inputs gets looprl kernels
tuned (:func:`looprl.tune` of :func:`looprl.linear`) for a set of row counts (the leading
dimensions of its input flattened: a ``(batch, seq, features)`` input is ``batch * seq`` rows),
with its weight and bias bound as constants. A module that is itself such a layer is replaced
whole; a module in which no layer was tuned is returned as a copy, with a warning.

**Any row count.** The row counts tuned are every power of two up to ``max_rows`` (default:
the largest row count the examples gave the layer) and the examples' own counts: a schedule
tuned for 1 row (a decode step streams the weights) is not the schedule for 64 or 4096 rows
(register tiles, cache blocks). Each tuned schedule is compiled a second time as a kernel of
*runtime rows* (``looprl.compile(..., runtime_rows=True)``: the row count is an argument, the
remainder rows run specialised copies of the register tile), so one call of the kernel tuned
for ``c`` rows serves any count up to ``c``. A call on ``r`` rows runs on consecutive row
blocks (:func:`row_plan`): whole blocks of the largest count, then usually one call of the
smallest tuned count that covers the rest (100 rows: one call of the 128-row kernel; 5 rows:
one of the 8-row kernel, reading the weights once), the plan of least time by the kernels'
measured times. A schedule that cannot take its rows at run time (one that converts the
input to a layout) pads a shorter block into a buffer of its count instead. The cost is
tuning: one tune per power of two, ``log2(max_rows) + 1`` per
distinct layer shape. In an ``nn.Sequential``, an ``nn.ReLU``,
``nn.GELU`` (either approximation) or ``nn.SiLU`` right after such a linear layer is fused into
its kernel's epilogue (the activation module is replaced by ``nn.Identity``, the linear layer
applies it). Everything else stays as it was. The module returned is a copy (the given one is
not changed); its tuned layers are :class:`TunedLinear` modules (see :func:`tuned_layers`).

A tuned layer runs its kernel only when that gives exactly the layer's function on this input;
otherwise it falls back to the original ``nn.Linear`` (and activation), so a call never gives
a wrong answer:

* an input that is not float32, not on the CPU, or whose last dimension is not
  ``in_features`` (the original layer then raises what it raises);
* autograd: grad mode on and the input or a parameter requiring grad (the kernels have no
  backward), e.g. training;
* a tensor subclass, a zero-size input.

**Never slower than torch.** Once a layer shape is tuned, its looprl plan and torch's own call
(``functional.linear`` and the activation: what the original layer runs) are timed against each
other at every tuned row count, interleaved, with the layer's weight, under the threads torch
is set to (:meth:`LinearKernels.judge`); a row count where torch was faster, and any row count
next to one, is computed by torch's call (:meth:`LinearKernels.runs_torch`). ``tune_module``
prints a line per layer shape as it is tuned and a table of these timings at the end
(:func:`route_table`). Then the tuned model is timed against the model on each example, and
where it is slower, the row counts that example gave each layer go to torch too (a layer
judged alone has its weights warm in the cache; in a model the other layers compete for it).
``compare_torch=False`` keeps every call looprl's.

:func:`stats` counts, per layer and in all, the calls a looprl kernel served and the calls that
fell back, by reason (a call routed to torch: :data:`TORCH_FASTER`), and each layer's routes. Non-contiguous inputs are copied into a contiguous tensor first. Every
call computes with the weight and bias the layer holds at that moment: the call compares them,
element by element, with the values the kernels were bound to, and binds them again if they
differ, however they were changed (``.data`` edits, ``load_state_dict``, an optimiser step, a
replaced Parameter, numpy writes; see :class:`ContentCache`, and its cost). A module may be
called from several threads at once.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import math
import sys
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as functional
from torch import nn

from looprl import checks
from looprl.backend.buffers import aligned_empty
from looprl.backend.kernel import Kernel
from looprl.backend.kernel import compile as looprl_compile
from looprl.backend.loops import RuntimeRowsUnsupported
from looprl.backend.host import cache_sizes
from looprl.ir.layers import linear
from looprl.measurement.evaluator import open_cache
from looprl.measurement.keys import tuned_problem_name
from looprl.measurement.timing import best_time, cold_copy_count
from looprl.measurement.tuned_records import read_tuned_records, write_tuned_records
from looprl.policy.tuner import TuneResult, tune

__all__ = ["LinearKernels", "Route", "TunedLinear", "route_table", "row_plan", "save_records", "stats", "tune_module", "tuned_layers"]


GELU_NAMES = {"none": "gelu", "tanh": "gelu_tanh"}  # torch's GELU approximation -> looprl's activation


def _activation_of(module: nn.Module) -> str | None:
    """The looprl activation an activation module computes, or None if it is not one we fuse."""
    if type(module) is nn.ReLU:
        return "relu"
    if type(module) is nn.SiLU:
        return "silu"
    if type(module) is nn.GELU:
        return GELU_NAMES.get(module.approximate)
    return None


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
    that converts its first input, too many specialised copies)."""
    kernel = result.kernel
    if not isinstance(kernel, Kernel) or kernel.problem.row_dim is None:
        return None
    try:
        return looprl_compile(kernel.nest, kernel.target, kernel.threads, runtime_rows=True)
    except RuntimeRowsUnsupported:
        return None


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


class ContentCache:
    """A value derived from the contents of some CPU tensors (kernels bound to a layer's weight
    and bias: their copies, re-laid or packed), derived again whenever :meth:`get` is given
    tensors whose contents are not, bit for bit, those it was derived from. The one place where
    looprl keeps something computed from a tensor across calls: a cache of anything derived
    from a weight uses it, so nothing derived outlives the data it was derived from.

    ``derive(*arrays)`` computes the value from C-contiguous numpy copies of the tensors (None
    for a tensor given as None); the copies are kept, and on every :meth:`get` each tensor's
    current elements are compared with them (all of them, byte for byte: a NaN equals itself,
    -0.0 differs from 0.0; with the C library's ``memcmp`` where the tensor is contiguous).

    Why contents and not what torch tracks (checked on torch 2.13): a call compares the values
    the tensor holds now with the values the cached result was computed from, so it sees a
    change however it was made: ``.data.mul_()`` and other in-place edits through ``.data``,
    ``.data = new`` (also a strided tensor of the same shape), ``copy_``, ``load_state_dict``
    (in place, or ``assign=True``: a new Parameter), ``zero_``/``fill_``/any in-place op under
    ``no_grad`` or ``inference_mode``, a replaced Parameter, ``torch.utils.swap_tensors``,
    writes through ``tensor.numpy()`` or through another tensor sharing the storage, an
    optimiser step. What torch tracks misses several of these: ``.data`` is a new tensor with
    its own version counter, so ``p.data.mul_(2)`` leaves ``p``'s ``_version``, ``data_ptr``
    and storage unchanged, and so do numpy writes and edits through a kept ``.data`` alias;
    ``swap_tensors`` keeps ``id(p)`` and gave ``p`` a storage at the address of one freed
    earlier; a new Parameter can take the ``id`` of a freed one, with a version counter
    starting again at 0. A key of identity, pointer, storage and version is therefore no proof
    that the contents are unchanged, and a checksum of a few sampled elements misses edits of
    the others; so no such shortcut is taken.

    The cost, per call: reading the tensors and their copies (which take as much memory again).
    Measured on the project's 2-vCPU AMD EPYC (Zen 5), one thread, one row (a decode step): a
    3072x768 layer's call took 450 us, of which the comparison 200 us, where its bound kernel
    alone, weights resident in the cache, took 91 us and ``F.linear`` 125 us (the comparison
    and the copy push the kernel's packed weights out of the cache); a 1024x1024 layer's 131 us
    (comparison 93, kernel alone 43, ``F.linear`` 57). So on few rows the call usually loses to
    torch's, and the layer's routes (:meth:`LinearKernels.judge`) give those rows to torch.
    Binding again instead of comparing would cost more (0.8 ms for 1024x1024, the weight
    re-laid element by element). Safe to use from several threads: the copies and the
    value are replaced together, under a lock."""

    def __init__(self, derive):
        self._derive = derive
        self._entry: tuple[tuple, object] | None = None  # ((dtype, copy) per tensor derived from, the value), replaced whole
        self._lock = threading.Lock()

    def get(self, *tensors):
        """The value derived from the tensors' contents as they are now."""
        entry = self._entry
        if entry is None or not _same_contents(entry[0], tensors):
            with self._lock:
                entry = self._entry
                if entry is None or not _same_contents(entry[0], tensors):
                    kept = tuple(None if tensor is None else (tensor.dtype, tensor.detach().numpy().copy()) for tensor in tensors)
                    entry = self._entry = (kept, self._derive(*(None if pair is None else pair[1] for pair in kept)))
        return entry[1]


def _same_contents(kept: tuple, tensors: tuple) -> bool:
    """Whether each tensor (or None) holds, bit for bit, the elements of its kept copy (``(dtype,
    array)``, or None too)."""
    if len(kept) != len(tensors):
        return False
    for pair, tensor in zip(kept, tensors):
        if pair is None or tensor is None:
            if pair is not tensor:
                return False
            continue
        dtype, array = pair
        if tensor.dtype != dtype or tuple(tensor.shape) != array.shape:
            return False
        if _memcmp is not None and tensor.is_contiguous():  # the bytes compared as they lie: no temporary, stops at a difference
            if _memcmp(tensor.data_ptr(), array.ctypes.data, array.nbytes) != 0:
                return False
            continue
        bits = np.dtype(f"u{array.itemsize}")
        if not np.array_equal(tensor.detach().numpy().view(bits), array.view(bits)):
            return False
    return True


def _load_memcmp():
    """The C library's ``memcmp`` (1.4-1.7x faster than ``np.array_equal`` on a weight, which
    writes a temporary of booleans first), or None where it cannot be found."""
    try:
        name = ctypes.util.find_library("c")
        function = ctypes.CDLL(name).memcmp
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


_memcmp = _load_memcmp()


_ACTIVATIONS = {
    "relu": functional.relu,
    "silu": functional.silu,
    "gelu": lambda y: functional.gelu(y, approximate="none"),
    "gelu_tanh": lambda y: functional.gelu(y, approximate="tanh"),
}


ROUTE_BUDGET_S = 0.005  # seconds to time looprl's plan, and torch's call, for one row count in one round
ROUTE_ROUNDS = 2  # interleaved rounds (looprl, torch, looprl, torch); each side's best is compared
TORCH_FASTER = "torch timed faster at this row count"  # the fallback reason of a call routed to torch


@dataclass(frozen=True)
class Route:
    """Which of looprl's plan and torch's own call computes a layer's calls on ``rows`` rows:
    both timed on this machine, the same threads, the same epilogue, best of
    :data:`ROUTE_ROUNDS` interleaved rounds; torch's where it was faster (``decided_by``
    "layer"), or torch's because the whole model ran slower with looprl's on an example that
    gave the layer these rows (``"model"``, see :func:`tune_module`)."""

    rows: int
    looprl_s: float
    torch_s: float
    decided_by: str = "layer"

    @property
    def runs(self) -> str:
        return "torch" if self.decided_by == "model" or self.torch_s < self.looprl_s else "looprl"


class LinearKernels:
    """looprl kernels for one linear layer's shape, ``y = activation(x @ weight.T + bias)``, on
    any number of rows (row plans of the counts in ``results``: row count ->
    :class:`~looprl.policy.tuner.TuneResult`, 1 among them), with the weight and bias given on
    each call and bound to the kernels again whenever their values change
    (:class:`ContentCache`). A call a kernel would not compute exactly (see :meth:`why_not`) is
    computed by torch (``functional.linear``, then the activation). Used by :class:`TunedLinear` and by the ``torch.compile`` backend
    (:mod:`looprl.dynamo`); safe to call from several threads at once."""

    def __init__(self, in_features: int, out_features: int, activation: str | None, results: dict[int, TuneResult], records=(),
                 routes: dict[int, Route] | None = None, frozen: bool = False):
        if 1 not in results:
            raise ValueError(f"a tuned linear layer needs a kernel for 1 row (so that any row count is covered), got rows {sorted(results)}")
        if activation is not None and activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)} or None, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.results = dict(results)
        self.records = list(records)  # the tuned answers as exported records (save_records)
        self._with_bias = "bias" in self.results[1].problem.epilogue.inputs
        self._weight_shape, self._bias_shape = (out_features, in_features), (out_features,)
        flops = 2 * in_features * out_features
        self._seconds = {rows: flops * rows / (result.gflops * 1e9) for rows, result in self.results.items()}
        self._kernels = {count: any_rows_kernel(result) or result.kernel for count, result in self.results.items()}
        self.runtime_rows = frozenset(count for count, kernel in self._kernels.items() if getattr(kernel, "runtime_rows", False))
        self._plans: dict[int, list[tuple[int, int, int]]] = {}  # row count -> its row plan
        self._bound = ContentCache(self._bind)  # the kernels bound to the weight and bias as they are now
        self.frozen = checks.flag(frozen, "frozen")  # bound once per weight tensor: its values promised not to change
        self._frozen_entry: tuple[tuple, dict] | None = None  # ((weight's address, bias's address), kernels), replaced whole
        self._local = threading.local()  # per thread: workspaces and padded buffers by row count
        self._stats_lock = threading.Lock()
        self.calls: dict[str, int] = {}  # "looprl" or a fallback's reason -> calls (see stats())
        self.routes: dict[int, Route] = dict(routes or {})  # judged row counts (see judge()); none: every call is looprl's
        self._torch_rows: dict[int, bool] = {}  # row count -> whether torch computes it, from the routes

    def counted(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self.calls)

    def forget_calls(self) -> None:
        """Start counting calls afresh (tune_module's own timing calls are not the user's)."""
        with self._stats_lock:
            self.calls = {}

    def fallback(self, x, weight, bias):
        y = functional.linear(x, weight, bias)
        return _ACTIVATIONS[self.activation](y) if self.activation is not None else y

    def _frozen_kernels(self, weight, bias) -> dict[int, object]:
        """The kernels bound to ``weight`` and ``bias`` once per pair of tensors (their addresses
        and shapes): what :func:`tune_module`'s ``frozen=True`` promises is that their values do not
        change, as ``torch.compile`` with Inductor's ``freezing`` does. A new tensor (``.data =
        new``, ``load_state_dict(assign=True)``) is bound again; an in-place edit is not seen."""
        key = (weight.data_ptr(), tuple(weight.stride()), None if bias is None else bias.data_ptr())
        entry = self._frozen_entry
        if entry is None or entry[0] != key:
            copies = (weight.detach().numpy().copy(), None if bias is None else bias.detach().numpy().copy())
            entry = self._frozen_entry = (key, self._bind(*copies))
        return entry[1]

    def _bind(self, weight: np.ndarray, bias: np.ndarray | None) -> dict[int, object]:
        """The kernels, by row count, bound to copies of ``weight`` and ``bias``."""
        constants = {"b": weight} if bias is None else {"b": weight, "bias": bias}
        return {rows: kernel.bind(**constants) for rows, kernel in self._kernels.items()}

    def why_not(self, x, weight, bias) -> str | None:
        """Why a call on ``x`` falls back to torch (a short reason, the key of :func:`stats`'
        ``fallbacks``), or None if looprl kernels compute it."""
        float32 = torch.float32  # dtypes are singletons: compared by identity, and is_cpu is cheaper than device.type
        if type(x) is not torch.Tensor or x.dtype is not float32 or not x.is_cpu or x.dim() < 1:
            return "input not a float32 CPU tensor"
        if x.shape[-1] != self.in_features:
            return "input's last dimension is not in_features"
        if x.numel() == 0:
            return "empty input"
        if (type(weight) not in (torch.Tensor, nn.Parameter) or weight.dtype is not float32 or not weight.is_cpu
                or weight.shape != self._weight_shape
                or (bias is not None and (bias.dtype is not float32 or not bias.is_cpu or bias.shape != self._bias_shape))):
            return "parameters not float32 on the CPU"
        if (bias is None) == self._with_bias:
            return "bias given or not as tuned"
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
            return "autograd"
        return None

    def _count(self, why: str | None) -> None:
        with self._stats_lock:
            self.calls[why or "looprl"] = self.calls.get(why or "looprl", 0) + 1

    def judge(self, weight, bias, counts=None, *, budget_s: float = ROUTE_BUDGET_S, rounds: int = ROUTE_ROUNDS) -> dict[int, Route]:
        """Time looprl's plan and torch's call (``functional.linear`` and the activation) on
        ``counts`` rows (default: every tuned row count) with this ``weight`` and ``bias``,
        interleaved, under ``torch.no_grad()`` and torch's threads as they are set now; the
        routes become this layer's (:meth:`runs_torch`) and are returned."""
        counts = sorted(self.results if counts is None else {checks.positive_int(c, "row count") for c in counts})
        inputs = {count: torch.randn(count, self.in_features) for count in counts}
        cold = self._cold_calls(weight, bias) if self.frozen else None
        calls = []
        for count in counts:
            if cold is not None and self.results[count].problem.cold:
                calls += [(cold[0], (inputs[count],)), (cold[1], (inputs[count],))]
            else:
                calls += [(self.compute, (inputs[count], weight, bias)), (self.fallback, (inputs[count], weight, bias))]
        seconds = interleaved_best_seconds(calls, budget_s, rounds)
        routes = {count: Route(count, seconds[2 * i], seconds[2 * i + 1]) for i, count in enumerate(counts)}
        self.routes = routes
        self._torch_rows = {}
        return routes

    def _cold_calls(self, weight, bias) -> tuple | None:
        """``(looprl's call, torch's call)`` on ``x`` that read the weight from memory, as a
        frozen layer's cold row counts do in a model whose weights outgrow the cache: each call
        takes the next of :func:`~looprl.measurement.timing.cold_copy_count` copies of
        ``weight`` (torch's call a copy of the tensor, looprl's the kernels bound to it), as
        cold problems are timed when tuned. None when no row count was tuned cold. (Judged with
        the weight warm, torch's one-row GEMV had looked faster on GPT-2's 3072->768, where from
        memory looprl's streams at about twice its bandwidth.)"""
        cold = [count for count, result in self.results.items() if result.problem.cold]
        if not cold:
            return None
        weights = [weight] + [weight.clone() for _ in range(cold_copy_count(weight.numel() * weight.element_size()) - 1)]
        bias_array = None if bias is None else bias.detach().numpy()
        kernel_sets = []
        for copy in weights:
            constants = {"b": copy.detach().numpy()} if bias is None else {"b": copy.detach().numpy(), "bias": bias_array}
            kernel_sets.append({count: self._kernels[count].bind(**constants) for count in cold})
        turns = {"looprl": 0, "torch": 0}

        def next_copy(side: str) -> int:
            turns[side] += 1
            return turns[side] % len(weights)

        return (lambda x: self._run_plan(x, kernel_sets[next_copy("looprl")]),
                lambda x: self.fallback(x, weights[next_copy("torch")], bias))

    def route_to_torch(self, counts) -> None:
        """Give the row counts ``counts`` to torch, decided by the whole model's timing."""
        for count in counts:
            known = self.routes.get(count)
            self.routes[count] = Route(count, math.nan if known is None else known.looprl_s, math.nan if known is None else known.torch_s, "model")
        self._torch_rows = {}

    def runs_torch(self, rows: int) -> bool:
        """Whether a call on ``rows`` rows is routed to torch: a judged row count by its own
        route, any other by the judged counts on either side of it (torch if either ran torch:
        looprl's plan for 100 rows is made of its plans for 64 and below)."""
        if not self.routes:
            return False
        found = self._torch_rows.get(rows)
        if found is None:
            counts = sorted(self.routes)
            below = [count for count in counts if count <= rows]
            above = [count for count in counts if count >= rows]
            near = below[-1:] + above[:1]
            found = self._torch_rows[rows] = any(self.routes[count].runs == "torch" for count in near)
        return found

    def __call__(self, x, weight, bias):
        why = self.why_not(x, weight, bias)
        if why is None and self.runs_torch(math.prod(x.shape[:-1])):
            why = TORCH_FASTER
        self._count(why)
        if why is not None:
            return self.fallback(x, weight, bias)
        return self.compute(x, weight, bias)

    def compute(self, x, weight, bias):
        """The call by looprl's kernels, for arguments :meth:`why_not` accepts (not checked here)."""
        kernels = self._frozen_kernels(weight, bias) if self.frozen else self._bound.get(weight, bias)
        return self._run_plan(x, kernels)

    def _run_plan(self, x, kernels: dict[int, object]):
        """``x``'s rows through the row plan of its row count with ``kernels`` (by row count)."""
        rows = math.prod(x.shape[:-1])
        plan = self._plans.get(rows)
        if plan is None:
            plan = self._plans[rows] = row_plan(rows, self._seconds, self.runtime_rows)
        flat = x.detach().reshape(rows, self.in_features)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = torch.empty((rows, self.out_features), dtype=torch.float32)
        # Checked above (float32, CPU, contiguous, the shapes): the kernels are called on addresses.
        source, target = flat.data_ptr(), out.data_ptr()
        in_row, out_row = 4 * self.in_features, 4 * self.out_features
        runtime = self.runtime_rows
        for start, length, count in plan:
            kernel = kernels[count]
            workspace, padded_in, padded_out = self._scratch(count, kernel)
            if length == count:
                kernel.address_call(target + start * out_row, workspace.ctypes.data, source + start * in_row)
            elif count in runtime:
                kernel.address_call(target + start * out_row, workspace.ctypes.data, source + start * in_row, rows=length)
            else:  # padded: the rows into the first rows of a buffer of the kernel's count, and back
                padded_in[:length] = flat[start:start + length].numpy()
                kernel.address_call(padded_out.ctypes.data, workspace.ctypes.data, padded_in.ctypes.data)
                out[start:start + length].numpy()[...] = padded_out[:length]
        return out.reshape(*x.shape[:-1], self.out_features)

    def _scratch(self, count: int, kernel) -> tuple:
        """This thread's workspace for the kernel of ``count`` rows, and its padded input and
        output (zeros: the padding rows stay zero)."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        found = buffers.get(count)
        if found is None:
            found = buffers[count] = (aligned_empty(kernel.kernel.workspace_elements),
                                      np.zeros((count, self.in_features), np.float32), np.zeros((count, self.out_features), np.float32))
        return found


class TunedLinear(nn.Module):
    """An ``nn.Linear`` (and the activation fused after it) that runs looprl kernels on any
    number of rows (:class:`LinearKernels`) and is the original layer where a kernel would not
    compute the layer's function (see the module docstring). It holds the original's
    ``weight`` and ``bias`` parameters themselves, so its ``state_dict`` has the original's
    keys. ``results`` maps a row count to its :class:`~looprl.policy.tuner.TuneResult` (1 must
    be one of them); ``records``, their answers as the cache exported them (:func:`save_records`)."""

    def __init__(self, original: nn.Linear, activation: nn.Module | None, results: dict[int, TuneResult], records=(),
                 routes: dict[int, Route] | None = None, frozen: bool = False):
        super().__init__()
        self.in_features, self.out_features = original.in_features, original.out_features
        self.weight = original.weight
        self.bias = original.bias  # None registers no parameter, as in nn.Linear(bias=False)
        self.activation = activation  # the fused activation module, or None
        self.kernels = LinearKernels(self.in_features, self.out_features, None if activation is None else _activation_of(activation),
                                     results, records, routes, frozen)

    @property
    def results(self) -> dict[int, TuneResult]:
        return self.kernels.results

    @property
    def records(self) -> list[dict]:
        return self.kernels.records

    def extra_repr(self) -> str:
        fused = f", activation={_activation_of(self.activation)}" if self.activation is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{fused}, rows={sorted(self.results)}"

    def why_not(self, x) -> str | None:
        """Why a call on ``x`` falls back to the original layer (a short reason, the key of
        :func:`stats`' ``fallbacks``), or None if a looprl kernel computes it."""
        return self.kernels.why_not(x, self.weight, self.bias)

    def forward(self, x):
        return self.kernels(x, self.weight, self.bias)


def _as_examples(example_inputs) -> list[tuple]:
    """One call's positional arguments per example: a tensor, a tuple of arguments, or a list
    of either (several calls)."""
    if isinstance(example_inputs, torch.Tensor):
        return [(example_inputs,)]
    if isinstance(example_inputs, tuple):
        return [example_inputs]
    if isinstance(example_inputs, list) and example_inputs:
        return [e if isinstance(e, tuple) else (e,) for e in example_inputs]
    raise ValueError("example_inputs must be a tensor, a tuple of a call's arguments, or a non-empty list of them")


def _tunable(layer: nn.Module) -> bool:
    if type(layer) is not nn.Linear:  # subclasses (e.g. attention's out_proj) may be used through their weights
        return False
    weight, bias = layer.weight, layer.bias
    return weight.dtype == torch.float32 and weight.device.type == "cpu" and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"))


def _record_rows(module: nn.Module, examples: list[tuple]) -> list[dict[nn.Linear, set[int]]]:
    """Per example, the row counts of the float32 CPU inputs every tunable linear layer sees."""
    per_example: list[dict[nn.Linear, set[int]]] = []
    hooks = []

    def hook(layer, args, _output):
        x = args[0] if args else None
        if type(x) is torch.Tensor and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1 and x.numel():
            per_example[-1].setdefault(layer, set()).add(math.prod(x.shape[:-1]))

    for layer in module.modules():
        if _tunable(layer):
            hooks.append(layer.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for args in examples:
                per_example.append({})
                module(*args)
    finally:
        for handle in hooks:
            handle.remove()
    return per_example


MODEL_BUDGET_S = 0.05  # seconds to time the model, and the tuned model, on one example in one round
MODEL_ROUNDS = 3  # interleaved rounds; each side's best is compared
MODEL_TOLERANCE = 1.03  # after routing to torch, a tuned model slower than this times the model's is reported (timing noise)


def interleaved_best_seconds(calls: list[tuple], budget_s: float, rounds: int) -> list[float]:
    """Best seconds of one ``function(*args)`` for each ``(function, args)`` of ``calls``, under
    ``torch.no_grad()``, by looprl's timing rule (``budget_s`` each), in ``rounds`` rounds that
    time them in turn (a slow phase of the machine hits every call alike)."""
    best = [math.inf] * len(calls)
    with torch.no_grad():
        for _ in range(rounds):
            for index, (function, args) in enumerate(calls):

                def repeat(reps: int, function=function, args=args) -> None:
                    for _ in range(reps):
                        function(*args)

                best[index] = min(best[index], best_time(repeat, budget_s).seconds)
    return best


def _check_against_the_model(module: nn.Module, tuned: nn.Module, examples: list[tuple], per_example: list[dict],
                             replacements: dict, progress: bool) -> None:
    """Time ``tuned`` against ``module`` on each example; where the tuned model is slower, give
    the row counts that example gave each layer to torch (:meth:`LinearKernels.route_to_torch`)
    and time again. A layer judged alone runs with its weights warm in the cache; in a model,
    the other layers' weights (and looprl's copies and packed forms of them) compete for it,
    which the judgement cannot see. Still slower after that: a ``RuntimeWarning``."""
    for number, (args, seen) in enumerate(zip(examples, per_example), start=1):
        seen = {layer: rows for layer, rows in seen.items() if layer in replacements}
        if not seen:
            continue
        original_s, tuned_s = interleaved_best_seconds([(module, args), (tuned, args)], MODEL_BUDGET_S, MODEL_ROUNDS)
        if tuned_s <= original_s:
            if progress:
                print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, the model {1e3 * original_s:.3f} ms",
                      file=sys.stderr, flush=True)
            continue
        for layer, rows in seen.items():
            replacements[layer].kernels.route_to_torch(rows)
        original_s, routed_s = interleaved_best_seconds([(module, args), (tuned, args)], MODEL_BUDGET_S, MODEL_ROUNDS)
        if progress:
            print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, slower than the model's; its rows routed to torch "
                  f"in {len(seen)} layer(s): now {1e3 * routed_s:.3f} ms against {1e3 * original_s:.3f} ms", file=sys.stderr, flush=True)
        if routed_s > MODEL_TOLERANCE * original_s:
            warnings.warn(f"tune_module: on example {number} the tuned model took {1e3 * routed_s:.3f} ms against the model's "
                          f"{1e3 * original_s:.3f} ms, its layers routed to torch (the calls' own cost, or timing noise)",
                          RuntimeWarning, stacklevel=3)


def _fusions(module: nn.Module) -> dict[nn.Linear, tuple[nn.Sequential, int]]:
    """Linear layers followed, in an ``nn.Sequential``, by an activation we fuse: layer ->
    (the sequential, the activation's index)."""
    registered: dict[nn.Module, int] = {}  # how often each module is some module's child
    for parent in module.modules():
        for child in parent._modules.values():
            if child is not None:
                registered[child] = registered.get(child, 0) + 1
    found = {}
    for parent in module.modules():
        if type(parent) is not nn.Sequential:
            continue
        children = list(parent)
        for i, (layer, following) in enumerate(zip(children, children[1:])):
            # a layer used in several places must stay what it is everywhere: not fused
            if _tunable(layer) and _activation_of(following) is not None and registered[layer] == 1:
                found[layer] = (parent, i + 1)
    return found


# Row counts up to this are tuned cold (looprl.ir.problem.Problem.cold: the weight timed as read
# from memory) when the model's weights together outgrow the last-level cache: in a decode step
# each layer's weight has been evicted by the others' since its last call, and the schedule that
# is fastest with the weight in the cache (GPT-2 small's 768->3072 on a Zen 4: 44 GFLOPS warm) is
# not the one that streams it fastest from memory (12 against 14.5 GFLOPS for packed panels).
COLD_ROWS = 16


def weights_outgrow_cache(weights, llc_bytes: int | None = None) -> bool:
    """Whether the tensors ``weights`` (each counted once) hold more bytes than the
    last-level cache (``llc_bytes``, default this host's)."""
    sizes = {w.data_ptr(): w.numel() * w.element_size() for w in weights}
    return sum(sizes.values()) > (cache_sizes()[1] if llc_bytes is None else llc_bytes)


def layer_problem(count: int, in_features: int, out_features: int, bias: bool, activation: str | None, cold_weights: bool):
    """The problem tuned for ``count`` rows of a linear layer: cold when the model's weights
    outgrow the cache (``cold_weights``) and the rows are few (:data:`COLD_ROWS`)."""
    problem = linear(count, in_features, out_features, bias=bias, activation=activation)
    return problem.with_cold() if cold_weights and count <= COLD_ROWS else problem


def tune_module(module: nn.Module, example_inputs, *, policy="default", target=None, budget_s=None, cache=None,
                fuse: bool = True, threads: int = 1, max_rows: int | None = None, records=None,
                compare_torch: bool = True, progress: bool = True, frozen: bool = False) -> nn.Module:
    """A copy of ``module`` whose float32 CPU ``nn.Linear`` layers run looprl kernels tuned for
    the shapes ``example_inputs`` give them (see the module docstring).

    ``example_inputs``: a tensor, a tuple of one call's positional arguments, or a list of
    either to tune for several shapes. ``policy``, ``target``, ``budget_s``, ``cache``: as in
    :func:`looprl.tune` (one tune per distinct layer shape; tuning again is a lookup in the
    measurement cache). ``fuse``: fuse ReLU/GELU/SiLU following a linear layer in an
    ``nn.Sequential`` into its kernel. ``threads``: as in :func:`looprl.tune`, but 1 by
    default (torch runs its own threads around the layers). ``max_rows``: kernels are tuned for
    every power of two up to it (default: the largest row count a layer saw) and for the row
    counts seen; any row count is served in blocks of these (see the module docstring).
    ``records``: a file :func:`save_records` wrote; its answers are imported into ``cache``
    first, so on a CPU of the kind they were tuned on nothing is tuned again (each kernel is
    compiled from its remembered schedule), and elsewhere the layers are tuned as usual.
    ``frozen``: the caller promises that the layers' weights and biases keep their values (as
    with ``torch.compile`` and Inductor's ``freezing``): they are bound to the kernels once,
    and a call compares nothing (a weight replaced by another tensor is bound again; an
    in-place edit is not seen). Default False: every call compares the values (see
    :class:`ContentCache`), which costs a read of the weights per call.
    When the layers' weights together outgrow this host's last-level cache, row counts up to
    :data:`COLD_ROWS` are tuned with their weights read from memory (cold problems: decode
    steps stream every weight from memory).
    ``compare_torch``: time each layer shape's looprl plan against torch's own call at every
    tuned row count (same threads, same epilogue; :meth:`LinearKernels.judge`) and route the
    row counts where torch was faster to torch, so that the tuned model is never slower than
    the model given by a layer looprl lost (:func:`stats` and :func:`route_table` say which
    rows went where). ``progress``: a line per layer shape on stderr as it is tuned, and the
    routes' table at the end.

    A ``module`` that is itself an ``nn.Linear`` comes back as a :class:`TunedLinear`; one in
    which no layer was tuned comes back as a copy, with a ``RuntimeWarning``."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"tune_module() expects a torch.nn.Module, got {type(module).__name__}")
    check_max_rows(max_rows)
    compare_torch = checks.flag(compare_torch, "compare_torch")
    progress = checks.flag(progress, "progress")
    frozen = checks.flag(frozen, "frozen")
    examples = _as_examples(example_inputs)
    cache = open_cache(cache)  # one cache for every layer (a ":memory:" one included)
    if records is not None:
        cache.import_tuned(read_tuned_records(records))
    tuned = copy.deepcopy(module)
    per_example = _record_rows(tuned, examples)
    rows_seen: dict[nn.Linear, set[int]] = {}
    for seen in per_example:
        for layer, rows in seen.items():
            rows_seen.setdefault(layer, set()).update(rows)
    fusions = _fusions(tuned) if fuse else {}
    results: dict[str, TuneResult] = {}  # by problem name: layers of one shape share a kernel
    planned = []  # (layer, its fused activation module, row count -> TuneResult, its layer shape)
    shapes = set()  # the layer shapes tuned so far
    started = time.perf_counter()
    cold_weights = weights_outgrow_cache(layer.weight for layer in rows_seen)
    for layer, rows in rows_seen.items():
        activation_module = fusions[layer][0][fusions[layer][1]] if layer in fusions else None
        activation = _activation_of(activation_module) if activation_module is not None else None
        per_rows = {}
        shape_started = time.perf_counter()
        for count in tuned_row_counts(rows, max_rows):
            problem = layer_problem(count, layer.in_features, layer.out_features, layer.bias is not None, activation, cold_weights)
            if problem.name not in results:
                results[problem.name] = tune(problem, policy, cache=cache, budget_s=budget_s, target=target, threads=threads)
            per_rows[count] = results[problem.name]
        shape = layer_shape(per_rows)
        if progress and shape not in shapes:
            print(f"looprl: tuned {_shape_words(layer.in_features, layer.out_features, activation)} for rows "
                  f"{', '.join(map(str, sorted(per_rows)))} in {time.perf_counter() - shape_started:.1f} s", file=sys.stderr, flush=True)
        shapes.add(shape)
        planned.append((layer, activation_module, per_rows, shape))
    exported = cache.export_tuned(_tuned_names(results.values()))  # one read of the cache for every layer's records
    replacements: dict[nn.Linear, TunedLinear] = {}
    judged: dict[tuple, dict[int, Route]] = {}  # a layer shape's routes: judged once, shared by its layers
    for layer, activation_module, per_rows, shape in planned:
        names = _tuned_names(per_rows.values())
        records = [record for record in exported if tuned_problem_name(record["problem"]) in names]
        replacement = replacements[layer] = TunedLinear(layer, activation_module, per_rows, records, judged.get(shape), frozen)
        if compare_torch and shape not in judged:
            judged[shape] = replacement.kernels.judge(layer.weight.detach(), None if layer.bias is None else layer.bias.detach())
    for parent in list(tuned.modules()):
        for name, child in list(parent._modules.items()):  # every registration, a shared layer's too
            if child is not None and child in replacements:
                setattr(parent, name, replacements[child])
    for layer, (parent, index) in fusions.items():
        if layer in replacements:
            parent[index] = nn.Identity()
    answer = replacements.get(tuned, tuned)  # a module that is itself a tuned layer is replaced whole
    if compare_torch and replacements:
        _check_against_the_model(module, answer, examples, per_example, replacements, progress)
        for replacement in replacements.values():
            replacement.kernels.forget_calls()
    if progress and replacements:
        print(route_table(kernels_by_shape(replacements.values())), file=sys.stderr, flush=True)
        print(f"looprl: {len(shapes)} layer shape(s), {len(replacements)} layer(s) in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    if not replacements:
        warnings.warn("tune_module tuned no layer: no float32 CPU torch.nn.Linear in the module was called with a float32 CPU input "
                      "by the examples; the copy returned runs as the module does", RuntimeWarning, stacklevel=2)
    return answer


def layer_shape(per_rows: dict[int, TuneResult]) -> tuple:
    """What makes two tuned layers one shape: the problems tuned for them, by row count."""
    return tuple(sorted((count, result.problem.name) for count, result in per_rows.items()))


def _shape_words(in_features: int, out_features: int, activation: str | None) -> str:
    return f"linear {in_features}->{out_features}" + (f" +{activation}" if activation else "")


def kernels_by_shape(layers) -> list[LinearKernels]:
    """The kernels of ``layers`` (TunedLinear modules), one per layer shape, in order."""
    seen, found = set(), []
    for layer in layers:
        shape = layer_shape(layer.kernels.results)
        if shape not in seen:
            seen.add(shape)
            found.append(layer.kernels)
    return found


def route_table(kernels: list[LinearKernels]) -> str:
    """A table, one line per layer shape and judged row count: looprl's time, torch's time and
    which one runs (see :meth:`LinearKernels.judge`). ``kernels``: e.g.
    ``kernels_by_shape(layer for _, layer in tuned_layers(model))``."""
    lines = [f"{'layer shape':>28} {'rows':>6} {'looprl ms':>10} {'torch ms':>10} {'looprl/torch':>12}  runs"]
    for layer in kernels:
        words = _shape_words(layer.in_features, layer.out_features, layer.activation)
        if not layer.routes:
            lines.append(f"{words:>28} {'all':>6} {'-':>10} {'-':>10} {'-':>12}  looprl (not compared)")
        for rows, route in sorted(layer.routes.items()):
            lines.append(f"{words:>28} {rows:>6} {1e3 * route.looprl_s:>10.4f} {1e3 * route.torch_s:>10.4f} "
                         f"{route.torch_s / route.looprl_s:>11.2f}x  {route.runs}" + (" (by the model's timing)" if route.decided_by == "model" else ""))
    return "\n".join(lines)


def _tuned_names(results) -> set[str]:
    """The problems tune remembered answers under for ``results`` (a linear layer's is tuned
    as its transposed twin)."""
    names = set()
    for result in results:
        names.add(result.problem.name)
        if result.tuned_as is not None:
            names.add(result.tuned_as.name)
    return names


def save_records(module: nn.Module, path) -> int:
    """Write what was tuned for ``module``'s tuned layers (the answers :func:`tune_module`
    found or remembered, as its cache held them) to ``path``, a JSON file of
    :mod:`looprl.measurement.tuned_records`; how many records. Load it with
    ``tune_module(model, example, records=path)``, in another process or on another machine."""
    unique = {}
    for _, layer in tuned_layers(module):
        for record in layer.records:
            unique[(record["host"], record["problem"])] = record
    write_tuned_records(path, list(unique.values()))
    return len(unique)


def tuned_layers(module: nn.Module) -> list[tuple[str, TunedLinear]]:
    """The :class:`TunedLinear` layers of ``module``, with their names."""
    return [(name, layer) for name, layer in module.named_modules() if isinstance(layer, TunedLinear)]


def stats(module: nn.Module) -> dict:
    """How the tuned layers of ``module`` served their calls so far: ``looprl_calls`` (a looprl
    kernel computed the call), ``fallback_calls`` (the original layer did) and ``fallbacks``
    (why: ``{reason: calls}``, the reasons of :meth:`TunedLinear.why_not`), in all and per
    layer (``layers``: name -> the same three and ``routes``: judged row count ->
    ``{"looprl_ms", "torch_ms", "runs"}``, see :meth:`LinearKernels.judge`). Calls routed to
    torch are fallbacks for the reason :data:`TORCH_FASTER`."""
    layers = tuned_layers(module)
    summary = summarise_calls({name: layer.kernels.counted() for name, layer in layers})
    for name, layer in layers:
        summary["layers"][name]["routes"] = route_summary(layer.kernels)
    return summary


def route_summary(kernels: LinearKernels) -> dict[int, dict]:
    """A layer's routes as plain values: row count -> ``{"looprl_ms", "torch_ms", "runs"}``."""
    return {rows: {"looprl_ms": 1e3 * route.looprl_s, "torch_ms": 1e3 * route.torch_s, "runs": route.runs, "decided_by": route.decided_by}
            for rows, route in sorted(kernels.routes.items())}


def summarise_calls(counted: dict) -> dict:
    """``{"looprl_calls", "fallback_calls", "fallbacks", "layers"}`` from each layer's calls by
    outcome (``"looprl"`` or a fallback's reason -> calls), keyed as ``counted`` is."""
    layers = {}
    for key, calls in counted.items():
        fallbacks = {why: count for why, count in calls.items() if why != "looprl"}
        layers[key] = {"looprl_calls": calls.get("looprl", 0), "fallback_calls": sum(fallbacks.values()), "fallbacks": fallbacks}
    total: dict[str, int] = {}
    for entry in layers.values():
        for why, count in entry["fallbacks"].items():
            total[why] = total.get(why, 0) + count
    return {"looprl_calls": sum(e["looprl_calls"] for e in layers.values()), "fallback_calls": sum(total.values()),
            "fallbacks": total, "layers": layers}
