"""A linear layer's looprl kernels on any row count, and which of looprl and torch runs each.

:class:`LinearKernels` computes ``activation(x @ weight.T + bias)`` by row plans of tuned
kernels bound to the weight and bias as they are now, or by torch where a kernel would not
compute exactly; :meth:`LinearKernels.judge` times its plan against torch's own call at each
tuned row count (:func:`interleaved_duels`) and the :class:`Route` of each says which one
computes those rows.

**The rule of a route** (one rule: :func:`faster` while timing, :func:`shown_faster` at the
end; :func:`~looprl.torch.tune_module` judges the tuned model against the model by it too).
looprl's call and torch's are timed in *rounds*: in a round each is timed once
(:func:`~looprl.measurement.timing.best_time`, best of its repetitions in
:data:`ROUTE_BUDGET_S`), one right after the other, every row count still open in turn, so
that a slow phase of the machine hits both sides of a round alike. looprl *wins* a
round when torch's time is at least ``1 +`` :data:`ROUTE_MARGIN` times its own. Under the
null hypothesis that looprl is not faster by the margin, it wins a round with probability at
most one half, so the chance of ``w`` or more wins in ``n`` rounds is at most the binomial
tail ``P(Binomial(n, 1/2) >= w)`` (a sign test: it assumes nothing of how the times are
distributed, and one outlying round counts once). After each round the row count is closed:

* once that tail is at most ``1 -`` :data:`ROUTE_CONFIDENCE` (looprl won enough rounds);
* once looprl could no longer get there within :data:`ROUTE_MAX_ROUNDS` rounds, even winning
  every round left (so a tie, a near-tie or a loss ends early);
* at the cap, whatever it stands at.

looprl keeps a closed row count only where it won enough rounds *and* its best time over the
rounds is below torch's best by the margin too (:func:`shown_faster`). Timing noise only ever
adds time, and on a busy machine it hits torch's multi-threaded call far harder than a
one-thread kernel (a torch call timed while other work ran took 8x and more its quiet time):
rounds won that way are outvoted by torch's best, the time of its quiet moments. Everything
else, a tie included, is torch's.

With the defaults (5%, 0.95, 15 rounds) looprl needs all of its first 5 rounds, at most 1 loss
in 8 to 10 rounds, 2 in 11 or 12, 3 in 13 to 15: a row count where looprl is faster by well
over the margin is decided in 5 rounds (10 timings of 5 ms), a tie usually in 8, and nothing
takes more than 15. A single round's best time misses the machine's best by up to 4.3% at the
90th percentile (docs/measurement.md, "The env's budget": experiments/timing_budget_noise.py,
avx512 code, Zen 4; 1.3% for AVX2 code): within the margin. Judged as the best of three
rounds, layers that were slower in the model slipped through (issue 60: a Qwen2 model decoded
at 0.90-0.92x eager on an AVX2 Zen 3 with ``measure=False``). A tie goes
to torch because its call is the layer's own (nothing compared, nothing bound) and computes
the layer's answer bit for bit: the deterministic side to fall to when looprl has not shown
it is faster.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as functional
from torch import nn

from looprl import checks
from looprl.backend.buffers import aligned_empty
from looprl.measurement.timing import cold_copy_count
from looprl.tune.results import TuneResult
from looprl.torch.activations import ACTIVATIONS
from looprl.torch.duels import (  # noqa: F401 (the rule's names, as routes gives them)
    ROUTE_CONFIDENCE, ROUTE_MAX_ROUNDS, Duel, best_seconds, binomial_tail, faster, interleaved_best_seconds, interleaved_duels,
    shown_faster)
from looprl.torch.native import attach_module, try_linear
from looprl.torch.rows import InPlaceKernel, any_rows_kernel, foreign_target, rebuilt_result, result_state, row_plan
from looprl.torch.weights import ContentCache, FrozenCache, numpy_view


ROUTE_BUDGET_S = 0.005  # seconds to time looprl's plan, and torch's call, for one row count in one round
ROUTE_MARGIN = 0.05  # looprl wins a round where torch took at least this much longer (a fraction of looprl's time)
TORCH_FASTER = "torch timed faster at this row count"  # the fallback reason of a call routed to torch
NEGATIVE_VIEW = "parameters are negative or conjugate views"  # the fallback reason of a weight or bias with torch's neg (or conj) bit
# The fallback reason of a call under torch.func's transforms (vmap, grad, jvp, jacrev,
# functionalize): their tensors wrap others (a batched tensor has no storage of its own), so
# only torch's call computes what the transform asks of it.
TRANSFORMED = "a tensor under a torch.func transform (vmap, grad, jvp, functionalize)"
AUTOCAST = "autocast to another dtype is on"  # the fallback reason of a call where CPU autocast computes in a dtype not the kernels'
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_autocast_enabled, _autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype


def transformed(*tensors) -> bool:
    """Whether any of ``tensors`` (None: none) is a tensor of a torch.func transform (functorch's
    wrapper: ``type`` says ``torch.Tensor``, but a kernel cannot read its memory)."""
    return any(tensor is not None and _wrapped(tensor) for tensor in tensors)


def autocast_to_other(dtype) -> bool:
    """Whether CPU autocast is on with a dtype other than ``dtype``: torch's call then computes
    the layer in autocast's dtype and returns it (a float32 layer under
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` returns bfloat16), which a kernel of
    ``dtype`` does not."""
    return _autocast_enabled("cpu") and _autocast_dtype("cpu") is not dtype


@dataclass(frozen=True)
class Route:
    """Which of looprl's plan and torch's own call computes a layer's calls on ``rows`` rows:
    both timed on this machine, the same threads, the same epilogue, in interleaved rounds
    (``looprl_s``, ``torch_s``: each side's best of them); looprl's only where it won enough of
    the ``rounds`` rounds (``wins``) and its best was faster too, by the rule of
    :func:`shown_faster` (torch's otherwise: ``decided_by`` "layer"), or torch's because the
    whole model ran slower with looprl's on an
    example that gave the layer these rows (``"model"``, see :func:`tune_module`; a route the
    layer's own timing had already given to torch keeps ``"layer"``). A route given only its
    two times (``rounds`` None: made by hand, or pickled by a looprl before the rounds) is judged
    by them alone: looprl's where its time is below torch's by the margin."""

    rows: int
    looprl_s: float
    torch_s: float
    decided_by: str = "layer"
    wins: int | None = None
    rounds: int | None = None

    @property
    def runs(self) -> str:
        if self.decided_by == "model":
            return "torch"
        return "looprl" if shown_faster(self.looprl_s, self.torch_s, self.wins, self.rounds, ROUTE_MARGIN) else "torch"


class LinearKernels:
    """looprl kernels for one linear layer's shape, ``y = activation(x @ weight.T + bias)``, on
    any number of rows (row plans of the counts in ``results``: row count ->
    :class:`~looprl.tune.results.TuneResult`, 1 among them), with the weight and bias given on
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
        self.dtype = self.results[1].problem.dtype  # float32 or bfloat16 (a DType): the layer's parameters' and inputs'
        self._torch_dtype = getattr(torch, self.dtype.name)
        self._weight_shape, self._bias_shape = (out_features, in_features), (out_features,)
        flops = 2 * in_features * out_features
        self._seconds = {rows: flops * rows / (result.gflops * 1e9) for rows, result in self.results.items()}
        self._kernels = {count: any_rows_kernel(result) or result.kernel for count, result in self.results.items()}
        # Row counts whose kernels read the weight and bias where they lie (nothing converted: a
        # dot-product tile of the layer as given): called on the live tensors, nothing copied or compared.
        self.in_place = frozenset(count for count, kernel in self._kernels.items() if kernel is not None and not kernel.packed_inputs)
        self.runtime_rows = frozenset(count for count, kernel in self._kernels.items() if getattr(kernel, "runtime_rows", False))
        self._plans: dict[int, tuple] = {}  # row count -> its row plan, its kernels' counts, those bound (_plan_of)
        self._row_bytes = (self.dtype.element_bytes * in_features, self.dtype.element_bytes * out_features)  # an input's row, an output's
        self._bound = ContentCache(self._bind)  # the kernels bound to the weight and bias as they are now
        self.frozen = checks.flag(frozen, "frozen")  # bound once per weight tensor: its values promised not to change
        self._frozen = FrozenCache(self._bind)  # the kernels bound once per weight and bias tensor (frozen)
        self._local = threading.local()  # per thread: workspaces and padded buffers by row count
        self._stats_lock = threading.Lock()
        self.calls: dict[str, int] = {}  # "looprl" or a fallback's reason -> calls (see stats())
        self.routes: dict[int, Route] = dict(routes or {})  # judged row counts (see judge()); none: every call is looprl's
        self._torch_rows: dict[int, bool] = {}  # row count -> whether torch computes it, from the routes
        self._native_asked = False  # call() has asked for an entry in the native table (attach_module)

    foreign: str | None = None  # unpickled on a CPU that cannot run the kernels' code: why (every call is torch's)
    # The layer's entry in the native operator's table (looprl.torch.native.NativeLayer): made by the backend for a graph's
    # layer, or by call() for a module's; offered the plans it can run (NativeLayer.offer_plan), dropped when the routes change.
    native = None

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
        """Calls by outcome: ``"looprl"`` (the native operator's included) or a fallback's reason."""
        native, routed = self.native.take_calls() if self.native is not None else (0, 0)
        with self._stats_lock:
            if native:
                self.calls["looprl"] = self.calls.get("looprl", 0) + native
            if routed:
                self.calls[TORCH_FASTER] = self.calls.get(TORCH_FASTER, 0) + routed
            return dict(self.calls)

    def forget_calls(self) -> None:
        """Start counting calls afresh (tune_module's own timing calls are not the user's)."""
        if self.native is not None:
            self.native.take_calls()
        with self._stats_lock:
            self.calls = {}

    def fallback(self, x, weight, bias):
        y = functional.linear(x, weight, bias)
        return ACTIVATIONS[self.activation].function(y) if self.activation is not None else y

    def _bind(self, weight: np.ndarray, bias: np.ndarray | None) -> dict[int, object]:
        """The kernels, by row count, bound to copies of ``weight`` and ``bias`` (those that
        convert the weight: the in-place ones read the live tensors)."""
        constants = {"b": weight} if bias is None else {"b": weight, "bias": bias}
        shared: dict = {}  # one copy of the weight per layout, whatever the row counts that store it alike
        return {rows: kernel.bind(shared=shared, **constants) for rows, kernel in self._kernels.items() if rows not in self.in_place}

    def why_not(self, x, weight, bias) -> str | None:
        """Why a call on ``x`` falls back to torch (a short reason, the key of :func:`stats`'
        ``fallbacks``), or None if looprl kernels compute it."""
        if self.foreign is not None:
            return self.foreign
        dtype = self._torch_dtype  # dtypes are singletons: compared by identity, and is_cpu is cheaper than device.type
        if _autocast_enabled("cpu") and _autocast_dtype("cpu") is not dtype:  # autocast_to_other, inlined: asked on every call
            return AUTOCAST
        if type(x) is not torch.Tensor or x.dtype is not dtype or not x.is_cpu or x.dim() < 1:
            return f"input not a {self.dtype} CPU tensor"
        if _wrapped(x) or (weight is not None and _wrapped(weight)) or (bias is not None and _wrapped(bias)):  # transformed, inlined
            return TRANSFORMED
        if x.shape[-1] != self.in_features:
            return "input's last dimension is not in_features"
        if x.numel() == 0:
            return "empty input"
        kind = type(weight)
        if ((kind is not nn.Parameter and kind is not torch.Tensor) or weight.dtype is not dtype or not weight.is_cpu
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

    def judge(self, weight, bias, counts=None, *, budget_s: float = ROUTE_BUDGET_S, rounds: int = ROUTE_MAX_ROUNDS) -> dict[int, Route]:
        """Time looprl's plan and torch's call (``functional.linear`` and the activation) on
        ``counts`` rows (default: every tuned row count) with this ``weight`` and ``bias``, in
        interleaved rounds (:func:`interleaved_duels`: looprl's and torch's call on a row count
        one after the other, every open count in turn, at most ``rounds`` rounds), under
        ``torch.no_grad()`` and torch's threads as they are set now; the routes (looprl's where
        the rule of :func:`shown_faster` gives it the count, see :class:`Route`) become this layer's
        (:meth:`runs_torch`) and are returned."""
        counts = sorted(self.results if counts is None else {checks.positive_int(c, "row count") for c in counts})
        generator = torch.Generator().manual_seed(0)  # the inputs drawn from our own generator: torch's global one is the user's
        inputs = {count: torch.randn(count, self.in_features, generator=generator).to(self._torch_dtype) for count in counts}
        # The cold row counts are timed on rotating copies of the weight, each with its own bound
        # kernels (and, weights followed, its own kept copy compared on every call), so that every
        # call reads from memory what it reads in the model; the others on the weight itself.
        cold = self._cold_calls(weight, bias)
        pairs = []
        for count in counts:
            if cold is not None and self.results[count].problem.cold:
                pairs.append(((cold[0], (inputs[count],)), (cold[1], (inputs[count],))))
            else:
                pairs.append(((self.compute, (inputs[count], weight, bias)), (self.fallback, (inputs[count], weight, bias))))
        duels = interleaved_duels(pairs, budget_s, ROUTE_MARGIN, rounds)
        routes = {count: Route(count, duel.challenger_s, duel.incumbent_s, wins=duel.wins, rounds=duel.rounds)
                  for count, duel in zip(counts, duels)}
        self.routes = routes
        self._torch_rows = {}
        if self.native is not None:
            self.native.clear()
        return routes

    def _cold_calls(self, weight, bias) -> tuple | None:
        """``(looprl's call, torch's call)`` on ``x`` that read the weight as cold as the layer's
        cold row counts do in its model (their problems' bytes between calls): each call
        takes the next of :func:`~looprl.measurement.timing.cold_copy_count` copies of
        ``weight`` (torch's call a copy of the tensor; looprl's :meth:`compute` on that copy with
        a cache of its own: its own bound kernels, and where the weights are followed its own
        kept copy, compared on each call as in the model), as cold problems are timed when tuned.
        None when no row count was tuned cold. (Judged with the weight warm, torch's one-row GEMV
        had looked faster on GPT-2's 3072->768, where from memory looprl's streams at about twice
        its bandwidth; and with its kept copy and bound kernels warm, the comparison a followed
        weight costs on every call had looked cheaper than it is in a model.)"""
        cold = [count for count, result in self.results.items() if result.problem.cold]
        if not cold:
            return None
        between = max(self.results[count].problem.between for count in cold)
        weights = [weight] + [weight.clone() for _ in range(cold_copy_count(weight.numel() * weight.element_size(), between=between) - 1)]
        caches = [FrozenCache(self._bind) if self.frozen else ContentCache(self._bind) for _ in weights]
        for copy_, cache in zip(weights, caches):
            cache.get(copy_, bias)  # bound before the timing, not in its first round
        turns = {"looprl": 0, "torch": 0}

        def next_copy(side: str) -> int:
            turns[side] += 1
            return turns[side] % len(weights)

        def looprl_call(x):
            turn = next_copy("looprl")
            return self.compute(x, weights[turn], bias, caches[turn])

        return looprl_call, lambda x: self.fallback(x, weights[next_copy("torch")], bias)

    def route_to_torch(self, counts) -> None:
        """Give the row counts ``counts`` to torch, decided by the whole model's timing (a
        count the layer's own timing had already given to torch keeps that first reason)."""
        for count in counts:
            known = self.routes.get(count)
            if known is not None and known.runs == "torch":
                continue
            self.routes[count] = (Route(count, math.nan, math.nan, "model") if known is None
                                  else Route(count, known.looprl_s, known.torch_s, "model", known.wins, known.rounds))
        self._torch_rows = {}
        if self.native is not None:
            self.native.clear()

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
        """``activation(x @ weight.T + bias)``: looprl's kernels, or torch's call for the reason
        counted (:meth:`counted`). A row count routed to torch is looked up first, and is
        torch's whatever else holds (torch's call is the original's: its answer, its errors):
        such a call costs a lookup besides torch's, not every check of :meth:`why_not` (only a
        layer whose kernels cannot run on this CPU keeps that reason first). A decode step calls
        every layer once per token, so the row count is worked out once per call and handed on."""
        rows = None
        if self.foreign is None and type(x) is torch.Tensor and x.dim() >= 1:
            shape = x.shape
            rows = shape[0] if len(shape) == 2 else math.prod(shape[:-1])
            if self.routes:
                routed = self._torch_rows.get(rows)
                if routed or (routed is None and self.runs_torch(rows)):
                    self._count(TORCH_FASTER)
                    native = self.native
                    if native is not None and self.activation is None and rows not in native.offered:
                        native.route_to_torch(rows)  # its next calls: torch's, made by the native operator
                    return self.fallback(x, weight, bias)
        why = self.why_not(x, weight, bias)
        self._count(why)
        if why is not None:
            return self.fallback(x, weight, bias)
        out = self.compute(x, weight, bias, rows=rows)
        native = self.native
        if native is not None and (rows not in native.offered or (rows in native.planned and native.stale(rows, self.bound_now()))):
            native.offer_plan(self, rows, x, weight, bias)
        return out

    def bound_now(self):
        """The kernels bound last (the frozen cache's or the compared one's), or None."""
        if self.frozen:
            return self._frozen.value
        kept = self._bound.kept
        return None if kept is None else kept[1]

    def call(self, x, weight, bias):
        """As calling the kernels (:meth:`__call__`), for a module (:class:`~looprl.torch.
        TunedLinear`): through the native operator (``looprl_native::try_linear``) where it has a
        plan for ``x``'s row count (no Python between there and the kernels); a call it cannot
        run as planned (it answers None) is :meth:`__call__`'s. The layer's entry in the native
        table is made on its first call (so a copy or an unpickled layer makes its own)."""
        native = self.native
        if native is None:
            if self._native_asked:
                return self(x, weight, bias)
            self._native_asked = True
            native = self.native = attach_module(self)
            if native is None:
                return self(x, weight, bias)
        # Dynamo tracing a tuned module (is_compiling): the kernels' Python, as before.
        if native.planned and type(x) is torch.Tensor and x.dim() >= 1 and not torch.compiler.is_compiling():
            shape = x.shape
            if (shape[0] if len(shape) == 2 else math.prod(shape[:-1])) in native.planned:
                out = try_linear(x, weight, bias, native.index)
                if out is not None:
                    return out
        return self(x, weight, bias)

    def compute(self, x, weight, bias, cache=None, rows: int | None = None):
        """The call by looprl's kernels, for arguments :meth:`why_not` accepts (not checked here):
        the row plan's in-place kernels on the live weight and bias (a strided one read through
        a contiguous copy made for the call), the others bound to copies (compared with the
        tensors on every call, or bound once when frozen), looked up only when the plan uses one.
        ``cache``: where the bound kernels are kept (default the layer's own; :meth:`judge`
        gives each copy of a cold weight its own). ``rows``: ``x``'s row count, where the
        caller has it (None: worked out here)."""
        if rows is None:
            rows = math.prod(x.shape[:-1])
        found = self._plans.get(rows)
        plan, counts, bound = found if found is not None else self._plan_of(rows)
        if bound:
            if cache is None:
                cache = self._frozen if self.frozen else self._bound
            kernels = cache.get(weight, bias)  # read, never changed, by the plan's run
            if len(counts) > len(bound):  # some of the plan's kernels read the live tensors
                kernels = {**kernels, **self._in_place_kernels(counts, weight, bias)}
        else:
            kernels = self._in_place_kernels(counts, weight, bias)
        return self._run_plan(x, rows, plan, kernels)

    def _in_place_kernels(self, counts, weight, bias) -> dict[int, "InPlaceKernel"]:
        """The in-place kernels among ``counts`` (row counts), on the live ``weight`` and ``bias``
        (a strided one read through a contiguous copy made for the call)."""
        weight = weight if weight.is_contiguous() else weight.contiguous()
        bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
        return {count: InPlaceKernel(self._kernels[count], weight, bias) for count in counts if count in self.in_place}

    def _plan_of(self, rows: int) -> tuple[list[tuple[int, int, int]], frozenset[int], frozenset[int]]:
        """The row plan of ``rows`` (``(start, length, count)`` per call), the row counts of its
        kernels and those of them that are bound to copies (not in place): worked out once per
        row count (a decode step asks on every call of every layer)."""
        found = self._plans.get(rows)
        if found is None:
            plan = row_plan(rows, self._seconds, self.runtime_rows)
            counts = frozenset(count for _, _, count in plan)
            found = self._plans[rows] = (plan, counts, counts - self.in_place)
        return found

    def _run_plan(self, x, rows: int, plan: list[tuple[int, int, int]], kernels: dict[int, object]):
        """``x``'s ``rows`` rows through their row ``plan`` with ``kernels`` (by row count)."""
        # Its memory read by address (no graph is recorded), as rows of in_features: a contiguous x of any dimensions as it is
        # (x.reshape to two dimensions took as long as the output's allocation, about 1 us of a decode step's call, torch 2.13).
        flat = x
        if flat.is_neg() or flat.is_conj():  # a view whose memory holds the values unnegated (torch._neg_view): the values themselves
            flat = flat.resolve_neg().resolve_conj()
        if not flat.is_contiguous():
            flat = flat.contiguous()
        # Row-major: rows of out_features, x's dtype (the layer's, checked) on the CPU. x.new_empty with the sizes as arguments: torch.empty
        # with a dtype keyword parses its arguments more slowly (about 0.6 us of a decode step's call, torch 2.13).
        out = x.new_empty(rows, self.out_features) if x.dim() == 2 else x.new_empty(*x.shape[:-1], self.out_features)
        # Checked above (the dtype, CPU, contiguous, the shapes): the kernels are called on addresses.
        source, target = flat.data_ptr(), out.data_ptr()
        in_row, out_row = self._row_bytes
        for start, length, count in plan:
            kernel = kernels[count]
            workspace, padded_in, padded_out, _ = self._scratch(count, kernel)
            if length == count:
                kernel.address_call(target + start * out_row, workspace, source + start * in_row)
            elif count in self.runtime_rows:
                kernel.address_call(target + start * out_row, workspace, source + start * in_row, rows=length)
            else:  # padded: the rows into the first rows of a buffer of the kernel's count, and back
                padded_in[:length] = numpy_view(flat.view(rows, self.in_features)[start:start + length])
                kernel.address_call(padded_out.ctypes.data, workspace, padded_in.ctypes.data)
                numpy_view(out.view(rows, self.out_features)[start:start + length])[...] = padded_out[:length]
        return out

    def _scratch(self, count: int, kernel) -> tuple:
        """This thread's workspace for the kernel of ``count`` rows (its address), its padded input
        and output (zeros: the padding rows stay zero), and the workspace's array itself."""
        buffers = self._local.__dict__.setdefault("buffers", {})
        found = buffers.get(count)
        if found is None:
            storage = self.dtype.storage
            workspace = aligned_empty(kernel.kernel.workspace_elements)
            found = buffers[count] = (workspace.ctypes.data, np.zeros((count, self.in_features), storage),
                                      np.zeros((count, self.out_features), storage), workspace)  # the buffer behind the address, last
        return found
