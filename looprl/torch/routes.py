"""A linear layer's looprl kernels on any row count, and which of looprl and torch runs each.

:class:`LinearKernels` computes ``activation(x @ weight.T + bias)`` by row plans of tuned
kernels bound to the weight and bias as they are now, or by torch where a kernel would not
compute exactly; :meth:`LinearKernels.judge` times its plan against torch's own call at each
tuned row count (:func:`interleaved_best_seconds`) and the :class:`Route` of each says which
one computes those rows.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as functional
from torch import nn

from looprl import checks
from looprl.backend.buffers import aligned_empty
from looprl.ir.dtypes import NUMPY_STORAGE
from looprl.measurement.timing import best_time, cold_copy_count
from looprl.policy.tuner import TuneResult
from looprl.torch.activations import ACTIVATIONS
from looprl.torch.rows import any_rows_kernel, foreign_target, rebuilt_result, result_state, row_plan
from looprl.torch.weights import ContentCache, FrozenCache, numpy_view


ROUTE_BUDGET_S = 0.005  # seconds to time looprl's plan, and torch's call, for one row count in one round
ROUTE_ROUNDS = 3  # interleaved rounds (looprl, torch, looprl, torch, ...); each side's best is compared
# looprl keeps a row count only where its best time is at least this much below torch's: a
# near-tie goes to torch. Why 5%: one 4 ms timing falls short of the machine's best by 4.3% at
# the 90th percentile (docs/measurement.md, "The env's budget": experiments/timing_budget_noise.py,
# avx512 code, Zen 4; 1.3% for AVX2 code), so a smaller gap is within what two timings of
# the same code differ by, and best-of interleaved rounds only narrow it. A tie goes to torch
# because torch's call is the layer's own (no copy of the weights compared, nothing bound) and
# computes the layer's answer bit for bit: the deterministic side to fall to when looprl has
# not shown it is faster.
ROUTE_MARGIN = 0.05
TORCH_FASTER = "torch timed faster at this row count"  # the fallback reason of a call routed to torch
NEGATIVE_VIEW = "parameters are negative or conjugate views"  # the fallback reason of a weight or bias with torch's neg (or conj) bit
# The fallback reason of a call under torch.func's transforms (vmap, grad, jvp, jacrev,
# functionalize): their tensors wrap others (a batched tensor has no storage of its own), so
# only torch's call computes what the transform asks of it.
TRANSFORMED = "a tensor under a torch.func transform (vmap, grad, jvp, functionalize)"
AUTOCAST = "autocast to another dtype is on"  # the fallback reason of a call where CPU autocast computes in a dtype not the kernels'
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def transformed(*tensors) -> bool:
    """Whether any of ``tensors`` (None: none) is a tensor of a torch.func transform (functorch's
    wrapper: ``type`` says ``torch.Tensor``, but a kernel cannot read its memory)."""
    return any(tensor is not None and _wrapped(tensor) for tensor in tensors)


def autocast_to_other(dtype) -> bool:
    """Whether CPU autocast is on with a dtype other than ``dtype``: torch's call then computes
    the layer in autocast's dtype and returns it (a float32 layer under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` returns bfloat16), which a kernel of
    ``dtype`` does not."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is not dtype


@dataclass(frozen=True)
class Route:
    """Which of looprl's plan and torch's own call computes a layer's calls on ``rows`` rows:
    both timed on this machine, the same threads, the same epilogue, best of
    :data:`ROUTE_ROUNDS` interleaved rounds; looprl's only where it was faster by at least
    :data:`ROUTE_MARGIN` (torch's where torch was faster, and on a near-tie: ``decided_by``
    "layer"), or torch's because the whole model ran slower with looprl's on an example that
    gave the layer these rows (``"model"``, see :func:`tune_module`; a route the layer's own
    timing had already given to torch keeps ``"layer"``)."""

    rows: int
    looprl_s: float
    torch_s: float
    decided_by: str = "layer"

    @property
    def runs(self) -> str:
        if self.decided_by == "model":
            return "torch"
        # looprl only when clearly faster; a tie, a near-tie or a NaN (nothing timed) is torch's
        return "looprl" if self.torch_s >= (1.0 + ROUTE_MARGIN) * self.looprl_s else "torch"


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
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        self.results = dict(results)
        self.records = list(records)  # the tuned answers as exported records (save_records)
        self._with_bias = "bias" in self.results[1].problem.epilogue.inputs
        self.dtype = self.results[1].problem.dtype  # "float32" or "bfloat16": the layer's parameters' and inputs'
        self._torch_dtype = getattr(torch, self.dtype)
        self._weight_shape, self._bias_shape = (out_features, in_features), (out_features,)
        flops = 2 * in_features * out_features
        self._seconds = {rows: flops * rows / (result.gflops * 1e9) for rows, result in self.results.items()}
        self._kernels = {count: any_rows_kernel(result) or result.kernel for count, result in self.results.items()}
        # Row counts whose kernels read the weight and bias where they lie (nothing converted: a
        # dot-product tile of the layer as given): called on the live tensors, nothing copied or compared.
        self.in_place = frozenset(count for count, kernel in self._kernels.items() if kernel is not None and not kernel.packed_inputs)
        self.runtime_rows = frozenset(count for count, kernel in self._kernels.items() if getattr(kernel, "runtime_rows", False))
        self._plans: dict[int, list[tuple[int, int, int]]] = {}  # row count -> its row plan
        self._bound = ContentCache(self._bind)  # the kernels bound to the weight and bias as they are now
        self.frozen = checks.flag(frozen, "frozen")  # bound once per weight tensor: its values promised not to change
        self._frozen = FrozenCache(self._bind)  # the kernels bound once per weight and bias tensor (frozen)
        self._local = threading.local()  # per thread: workspaces and padded buffers by row count
        self._stats_lock = threading.Lock()
        self.calls: dict[str, int] = {}  # "looprl" or a fallback's reason -> calls (see stats())
        self.routes: dict[int, Route] = dict(routes or {})  # judged row counts (see judge()); none: every call is looprl's
        self._torch_rows: dict[int, bool] = {}  # row count -> whether torch computes it, from the routes

    foreign: str | None = None  # unpickled on a CPU that cannot run the kernels' code: why (every call is torch's)

    def __getstate__(self) -> dict:
        """What a pickle (``torch.save`` of a model) keeps: the schedules tuned, not their
        compiled code (:func:`~looprl.torch.rows.result_state`), the records, routes and calls."""
        return {"version": 1, "in_features": self.in_features, "out_features": self.out_features, "activation": self.activation,
                "results": {rows: result_state(result) for rows, result in self.results.items()}, "records": self.records,
                "routes": self.routes, "frozen": self.frozen, "calls": self.counted()}

    def __setstate__(self, state: dict) -> None:
        """Unpickled: the schedules compiled again (compile only, nothing measured or tuned);
        on a CPU that lacks their target's features nothing is compiled and every call is
        torch's, for the reason :attr:`foreign` (tune the model again there for kernels)."""
        if state.get("version") != 1:
            raise ValueError(f"cannot unpickle looprl kernels of state version {state.get('version')!r} (this looprl reads version 1)")
        foreign = foreign_target(state["results"].values())
        results = {rows: (TuneResult(saved["problem"], answer=saved["answer"], tuned_as=saved["tuned_as"]) if foreign else rebuilt_result(saved))
                   for rows, saved in state["results"].items()}
        self.__init__(state["in_features"], state["out_features"], state["activation"], results, state["records"], state["routes"],
                      state["frozen"])
        self.calls, self.foreign = dict(state["calls"]), foreign

    def __deepcopy__(self, memo) -> "LinearKernels":
        """A copy sharing the compiled kernels (read-only, callable from several threads), with
        its own bound weights, buffers and counts."""
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__init__(self.in_features, self.out_features, self.activation, self.results, copy.deepcopy(self.records, memo),
                       dict(self.routes), self.frozen)
        clone.calls, clone.foreign = self.counted(), self.foreign
        return clone

    def counted(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self.calls)

    def forget_calls(self) -> None:
        """Start counting calls afresh (tune_module's own timing calls are not the user's)."""
        with self._stats_lock:
            self.calls = {}

    def fallback(self, x, weight, bias):
        y = functional.linear(x, weight, bias)
        return ACTIVATIONS[self.activation].function(y) if self.activation is not None else y

    def _bind(self, weight: np.ndarray, bias: np.ndarray | None) -> dict[int, object]:
        """The kernels, by row count, bound to copies of ``weight`` and ``bias`` (those that
        convert the weight: the in-place ones read the live tensors)."""
        constants = {"b": weight} if bias is None else {"b": weight, "bias": bias}
        return {rows: kernel.bind(**constants) for rows, kernel in self._kernels.items() if rows not in self.in_place}

    def why_not(self, x, weight, bias) -> str | None:
        """Why a call on ``x`` falls back to torch (a short reason, the key of :func:`stats`'
        ``fallbacks``), or None if looprl kernels compute it."""
        if self.foreign is not None:
            return self.foreign
        dtype = self._torch_dtype  # dtypes are singletons: compared by identity, and is_cpu is cheaper than device.type
        if autocast_to_other(dtype):
            return AUTOCAST
        if type(x) is not torch.Tensor or x.dtype is not dtype or not x.is_cpu or x.dim() < 1:
            return f"input not a {self.dtype} CPU tensor"
        if transformed(x, weight, bias):
            return TRANSFORMED
        if x.shape[-1] != self.in_features:
            return "input's last dimension is not in_features"
        if x.numel() == 0:
            return "empty input"
        if (type(weight) not in (torch.Tensor, nn.Parameter) or weight.dtype is not dtype or not weight.is_cpu
                or weight.shape != self._weight_shape
                or (bias is not None and (bias.dtype is not dtype or not bias.is_cpu or bias.shape != self._bias_shape))):
            return f"parameters not {self.dtype} on the CPU"
        if weight.is_neg() or weight.is_conj() or (bias is not None and (bias.is_neg() or bias.is_conj())):
            return NEGATIVE_VIEW  # their memory holds the values unnegated: the kernels would read them so
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
        interleaved (looprl's and torch's call on a row count one after the other, every count
        in turn, :data:`ROUTE_ROUNDS` times; each side's best kept), under ``torch.no_grad()``
        and torch's threads as they are set now; the routes (looprl's where it was at least
        :data:`ROUTE_MARGIN` faster, see :class:`Route`) become this layer's
        (:meth:`runs_torch`) and are returned."""
        counts = sorted(self.results if counts is None else {checks.positive_int(c, "row count") for c in counts})
        generator = torch.Generator().manual_seed(0)  # the inputs drawn from our own generator: torch's global one is the user's
        inputs = {count: torch.randn(count, self.in_features, generator=generator).to(self._torch_dtype) for count in counts}
        # Timed on rotating copies of the weight where the call reads nothing else (frozen, or the
        # cold row counts' kernels all in place): else the default path's comparison of its copies
        # is part of the call, timed as it runs.
        cold_counts = {count for count, result in self.results.items() if result.problem.cold}
        cold = self._cold_calls(weight, bias) if self.frozen or cold_counts <= self.in_place else None
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
        """``(looprl's call, torch's call)`` on ``x`` that read the weight as cold as the layer's
        cold row counts do in its model (their problems' bytes between calls): each call
        takes the next of :func:`~looprl.measurement.timing.cold_copy_count` copies of
        ``weight`` (torch's call a copy of the tensor, looprl's the kernels bound to it), as
        cold problems are timed when tuned. None when no row count was tuned cold. (Judged with
        the weight warm, torch's one-row GEMV had looked faster on GPT-2's 3072->768, where from
        memory looprl's streams at about twice its bandwidth.)"""
        cold = [count for count, result in self.results.items() if result.problem.cold]
        if not cold:
            return None
        between = max(self.results[count].problem.between for count in cold)
        weights = [weight] + [weight.clone() for _ in range(cold_copy_count(weight.numel() * weight.element_size(), between=between) - 1)]
        bias_array = None if bias is None else numpy_view(bias)
        kernel_sets = []
        for copy in weights:
            constants = {"b": numpy_view(copy)} if bias is None else {"b": numpy_view(copy), "bias": bias_array}
            kernel_sets.append({count: self._kernels[count].bind(**constants) for count in cold})
        turns = {"looprl": 0, "torch": 0}

        def next_copy(side: str) -> int:
            turns[side] += 1
            return turns[side] % len(weights)

        return (lambda x: self._run_plan(x, kernel_sets[next_copy("looprl")]),
                lambda x: self.fallback(x, weights[next_copy("torch")], bias))

    def route_to_torch(self, counts) -> None:
        """Give the row counts ``counts`` to torch, decided by the whole model's timing (a
        count the layer's own timing had already given to torch keeps that first reason)."""
        for count in counts:
            known = self.routes.get(count)
            if known is not None and known.runs == "torch":
                continue
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
        """The call by looprl's kernels, for arguments :meth:`why_not` accepts (not checked here):
        the row plan's in-place kernels on the live weight and bias (a strided one read through
        a contiguous copy made for the call), the others bound to copies (compared with the
        tensors on every call, or bound once when frozen), looked up only when the plan uses one."""
        plan = self._plan_of(math.prod(x.shape[:-1]))
        counts = {count for _, _, count in plan}
        kernels = {}
        if not counts <= self.in_place:
            kernels.update(self._frozen.get(weight, bias) if self.frozen else self._bound.get(weight, bias))
        if counts & self.in_place:
            weight = weight if weight.is_contiguous() else weight.contiguous()
            bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
            kernels.update({count: InPlaceKernel(self._kernels[count], weight, bias) for count in counts & self.in_place})
        return self._run_plan(x, kernels)

    def _plan_of(self, rows: int) -> list[tuple[int, int, int]]:
        plan = self._plans.get(rows)
        if plan is None:
            plan = self._plans[rows] = row_plan(rows, self._seconds, self.runtime_rows)
        return plan

    def _run_plan(self, x, kernels: dict[int, object]):
        """``x``'s rows through the row plan of its row count with ``kernels`` (by row count)."""
        rows = math.prod(x.shape[:-1])
        plan = self._plan_of(rows)
        flat = x.detach().reshape(rows, self.in_features)
        if flat.is_neg() or flat.is_conj():  # a view whose memory holds the values unnegated (torch._neg_view): the values themselves
            flat = flat.resolve_neg().resolve_conj()
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = torch.empty((rows, self.out_features), dtype=self._torch_dtype)
        # Checked above (the dtype, CPU, contiguous, the shapes): the kernels are called on addresses.
        source, target = flat.data_ptr(), out.data_ptr()
        in_row, out_row = out.element_size() * self.in_features, out.element_size() * self.out_features
        runtime = self.runtime_rows
        for start, length, count in plan:
            kernel = kernels[count]
            workspace, padded_in, padded_out = self._scratch(count, kernel)
            if length == count:
                kernel.address_call(target + start * out_row, workspace.ctypes.data, source + start * in_row)
            elif count in runtime:
                kernel.address_call(target + start * out_row, workspace.ctypes.data, source + start * in_row, rows=length)
            else:  # padded: the rows into the first rows of a buffer of the kernel's count, and back
                padded_in[:length] = numpy_view(flat[start:start + length])
                kernel.address_call(padded_out.ctypes.data, workspace.ctypes.data, padded_in.ctypes.data)
                numpy_view(out[start:start + length])[...] = padded_out[:length]
        return out.reshape(*x.shape[:-1], self.out_features)

    def _scratch(self, count: int, kernel) -> tuple:
        """This thread's workspace for the kernel of ``count`` rows, and its padded input and
        output (zeros: the padding rows stay zero)."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        found = buffers.get(count)
        if found is None:
            storage = NUMPY_STORAGE[self.dtype]
            found = buffers[count] = (aligned_empty(kernel.kernel.workspace_elements),
                                      np.zeros((count, self.in_features), storage), np.zeros((count, self.out_features), storage))
        return found



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
