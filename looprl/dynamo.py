"""``torch.compile(model, backend="looprl")``: linear layers as tuned looprl kernels, the rest compiled by torch.

The backend is registered with torch under the name ``looprl`` (the ``torch_dynamo_backends``
entry point of this package), so ``torch.compile(model, backend="looprl")`` works without
importing looprl first. Dynamo hands it each captured FX graph. In it, every ``linear`` call
(``torch._C._nn.linear`` / ``functional.linear``: ``nn.Linear`` and code that calls
``F.linear``) on float32 CPU tensors whose weight is a graph input (a parameter), when the graph
is compiled with grad mode off, is replaced by the custom operator ``looprl::linear``; a ReLU,
GELU (either approximation) or SiLU that is the linear call's only user is fused into it. The
operator runs :class:`looprl.torch.LinearKernels`: kernels tuned (:func:`looprl.tune` of
:func:`looprl.linear`) for every power of two up to ``max_rows`` (default: the most rows the
example gave the layer, at least 1) and the example's row count, serving any row count by row
plans, so ``dynamic=True`` (a symbolic row count) needs no recompilation; any call a kernel would
not compute exactly (another dtype, autograd, ...) falls back to torch, so no call gives a wrong
answer. The rest of the graph, with the operators in it, goes to ``inductor`` (torch's default
backend; ``options={"rest": "eager"}`` runs it as captured instead).

Options (``torch.compile(..., options={...})``): ``max_rows``, ``policy``, ``target``,
``budget_s``, ``cache``, ``threads`` (as :func:`looprl.torch.tune_module`; threads 1 by
default), ``rest`` (``"inductor"`` or ``"eager"``).

Grad mode on at compile time leaves every linear call to torch (the kernels have no backward;
Dynamo guards on grad mode, so a model compiled for inference and later called with grad mode on
is compiled again, untouched). :func:`stats` counts the calls the operators served and the
fallbacks, as :func:`looprl.torch.stats` does for a module. Attention's batched products
(``bmm``, ``matmul``) are left to torch here.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as functional

from looprl.ir.layers import linear
from looprl.measurement.evaluator import open_cache
from looprl.policy.tuner import tune
from looprl.torch import LinearKernels, tuned_row_counts

__all__ = ["looprl_backend", "stats"]

OPTIONS = ("max_rows", "policy", "target", "budget_s", "cache", "threads", "rest")
LINEAR_TARGETS = (torch._C._nn.linear, functional.linear)
RELU = (torch.relu, functional.relu)
SILU = (functional.silu,)
GELU = (functional.gelu, torch._C._nn.gelu)


def _activation_name(node) -> str | None:
    """The activation a graph node computes on its one argument, if it is one we fuse."""
    if node.op != "call_function" or len(node.args) != 1:
        return None
    target, kwargs = node.target, node.kwargs
    if target in RELU and not kwargs:
        return "relu"
    if target in SILU and not kwargs.get("inplace", False):
        return "silu"
    if target in GELU and set(kwargs) <= {"approximate"}:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(kwargs.get("approximate", "none"))
    return None


_layers: list[LinearKernels] = []  # the operators' kernels, by the index the graph passes
_layers_lock = threading.Lock()


@torch.library.custom_op("looprl::linear", mutates_args=())
def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: int) -> torch.Tensor:
    return _layers[layer](x, weight, bias)


@_linear.register_fake
def _(x, weight, bias, layer):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def stats() -> dict:
    """Calls served by looprl kernels and fallbacks (by reason) of every layer compiled by the
    backend in this process: ``{"looprl_calls", "fallback_calls", "fallbacks", "layers"}``."""
    with _layers_lock:
        layers = list(_layers)
    per_layer, total = [], {}
    for kernels in layers:
        calls = kernels.counted()
        fallbacks = {why: n for why, n in calls.items() if why != "looprl"}
        per_layer.append({"looprl_calls": calls.get("looprl", 0), "fallback_calls": sum(fallbacks.values()), "fallbacks": fallbacks})
        for why, n in fallbacks.items():
            total[why] = total.get(why, 0) + n
    return {"looprl_calls": sum(e["looprl_calls"] for e in per_layer), "fallback_calls": sum(total.values()), "fallbacks": total,
            "layers": per_layer}


def _hint(size) -> int:
    """A size as an int: a SymInt's example value."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        return int(hint) if hint is not None else 1
    return int(size)


def looprl_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_ignored):
    """The ``torch.compile`` backend (see the module docstring)."""
    options = dict(options or {})
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown looprl backend option(s) {sorted(unknown)}; known: {', '.join(OPTIONS)}")
    rest = options.pop("rest", "inductor")
    if rest not in ("inductor", "eager"):
        raise ValueError(f"option rest must be 'inductor' or 'eager', got {rest!r}")
    if not torch.is_grad_enabled():
        _replace_linear_calls(gm, example_inputs, options)
    if rest == "eager":
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _replace_linear_calls(gm: torch.fx.GraphModule, example_inputs, options: dict) -> int:
    """Replace the graph's eligible linear calls by ``looprl::linear``; how many."""
    max_rows = options.get("max_rows")
    tune_options = {"policy": options.get("policy", "default"), "target": options.get("target"), "budget_s": options.get("budget_s"),
                    "threads": options.get("threads", 1)}
    cache = open_cache(options.get("cache"))
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    values = {node: value for node, value in zip(placeholders, example_inputs)}
    results: dict[str, object] = {}
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in LINEAR_TARGETS:
            continue
        args = list(node.args) + [None] * (3 - len(node.args))
        x, weight, bias = args[0], args[1], node.kwargs.get("bias", args[2])
        weight_value = values.get(weight)
        bias_value = values.get(bias) if bias is not None else None
        x_value = x.meta.get("example_value") if hasattr(x, "meta") else None
        if not (isinstance(weight_value, torch.Tensor) and weight_value.dim() == 2 and weight_value.dtype == torch.float32
                and weight_value.device.type == "cpu" and isinstance(x_value, torch.Tensor) and x_value.dtype == torch.float32
                and x_value.device.type == "cpu" and x_value.dim() >= 1):
            continue
        if bias is not None and not (isinstance(bias_value, torch.Tensor) and bias_value.dtype == torch.float32 and bias_value.dim() == 1):
            continue
        out_features, in_features = weight_value.shape
        users = list(node.users)
        activation = _activation_name(users[0]) if len(users) == 1 else None
        rows = max(1, math.prod(_hint(size) for size in x_value.shape[:-1]))
        per_rows = {}
        for count in tuned_row_counts({rows}, max_rows):
            problem = linear(count, in_features, out_features, bias=bias is not None, activation=activation)
            if problem.name not in results:
                results[problem.name] = tune(problem, cache=cache, **tune_options)
            per_rows[count] = results[problem.name]
        with _layers_lock:
            _layers.append(LinearKernels(in_features, out_features, activation, per_rows))
            index = len(_layers) - 1
        end = users[0] if activation is not None else node
        with gm.graph.inserting_after(end):
            call = gm.graph.call_function(torch.ops.looprl.linear.default, (x, weight, bias, index))
        call.meta.update(end.meta)
        end.replace_all_uses_with(call)
        gm.graph.erase_node(end)
        if end is not node:
            gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced
