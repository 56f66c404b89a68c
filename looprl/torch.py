"""Tuned looprl kernels inside a PyTorch model: :func:`tune_module`.

This module imports torch (nothing else of looprl does, outside :mod:`looprl.train`); importing
``looprl`` does not import it.

``tune_module(module, example_inputs)`` runs the module once per example under
``torch.no_grad()``, recording with forward hooks the input shape every ``torch.nn.Linear``
sees; then each float32 CPU ``nn.Linear`` that saw float32 CPU inputs gets a looprl kernel
tuned (:func:`looprl.tune` of :func:`looprl.linear`) for each batch size it saw (the leading
dimensions of its input flattened: a ``(batch, seq, features)`` input is ``batch * seq`` rows),
with its weight and bias bound once as constants. In an ``nn.Sequential``, an ``nn.ReLU``,
``nn.GELU`` (either approximation) or ``nn.SiLU`` right after such a linear layer is fused into
its kernel's epilogue (the activation module is replaced by ``nn.Identity``, the linear layer
applies it). Everything else stays as it was. The module returned is a copy (the given one is
not changed); its tuned layers are :class:`TunedLinear` modules (see :func:`tuned_layers`).

A tuned layer runs its kernel only when that gives exactly the layer's function on this input;
otherwise it falls back to the original ``nn.Linear`` (and activation), so a call never gives
a wrong answer:

* an input whose row count was not seen at tuning time (nothing is tuned on first use);
* an input that is not float32, not on the CPU, or whose last dimension is not
  ``in_features`` (the original layer then raises what it raises);
* autograd: grad mode on and the input or a parameter requiring grad (the kernels have no
  backward), e.g. training;
* a tensor subclass, a zero-size input.

:func:`stats` counts, per layer and in all, the calls a looprl kernel served and the calls that
fell back, by reason. Non-contiguous inputs are copied into a contiguous tensor first. When the layer's weight or
bias changes (in place, e.g. ``load_state_dict`` or an optimiser step, or replaced), the kernels
bind the new values on the next call. A module may be called from several threads at once.
"""

from __future__ import annotations

import copy
import math
import threading

import numpy as np
import torch
import torch.nn.functional as functional
from torch import nn

from looprl.backend.buffers import aligned_empty
from looprl.ir.layers import linear
from looprl.policy.tuner import TuneResult, tune

__all__ = ["TunedLinear", "stats", "tune_module", "tuned_layers"]


def _activation_of(module: nn.Module) -> str | None:
    """The looprl activation an activation module computes, or None if it is not one we fuse."""
    if type(module) is nn.ReLU:
        return "relu"
    if type(module) is nn.SiLU:
        return "silu"
    if type(module) is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


class TunedLinear(nn.Module):
    """An ``nn.Linear`` (and the activation fused after it) that runs looprl kernels for the
    row counts it was tuned for and is the original layer for anything else (see the module
    docstring). It holds the original's ``weight`` and ``bias`` parameters themselves, so its
    ``state_dict`` has the original's keys. ``results`` maps a row count to its
    :class:`~looprl.policy.tuner.TuneResult`."""

    def __init__(self, original: nn.Linear, activation: nn.Module | None, results: dict[int, TuneResult]):
        super().__init__()
        self.in_features, self.out_features = original.in_features, original.out_features
        self.weight = original.weight
        self.bias = original.bias  # None registers no parameter, as in nn.Linear(bias=False)
        self.activation = activation  # the fused activation module (for the fallback), or None
        self.results = dict(results)
        self._bound: dict[int, object] = {}
        self._bound_to: tuple | None = None
        self._bind_lock = threading.Lock()
        self._local = threading.local()  # per thread: workspaces by row count
        self._stats_lock = threading.Lock()
        self.calls: dict[str, int] = {}  # "looprl" or a fallback's reason -> calls (see stats())

    def extra_repr(self) -> str:
        fused = f", activation={_activation_of(self.activation)}" if self.activation is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{fused}, rows={sorted(self.results)}"

    def _fallback(self, x):
        y = functional.linear(x, self.weight, self.bias)
        return self.activation(y) if self.activation is not None else y

    def _parameters_state(self) -> tuple:
        weight, bias = self.weight, self.bias
        return (id(weight), weight._version, None if bias is None else id(bias), None if bias is None else bias._version)

    def _kernels(self) -> dict[int, object]:
        """The bound kernels, bound again if the weight or the bias changed since."""
        state = self._parameters_state()
        if state != self._bound_to:
            with self._bind_lock:
                if state != self._bound_to:
                    with torch.no_grad():
                        weight = self.weight.detach().contiguous().numpy()
                        bias = self.bias
                        constants = {"b": weight}
                        if bias is not None:
                            constants["bias"] = bias.detach().contiguous().numpy()
                    self._bound = {rows: result.kernel.bind(**constants) for rows, result in self.results.items()}
                    self._bound_to = state
        return self._bound

    def why_not(self, x) -> str | None:
        """Why a call on ``x`` falls back to the original layer (a short reason, the key of
        :func:`stats`' ``fallbacks``), or None if a looprl kernel computes it."""
        weight, bias = self.weight, self.bias
        if type(x) is not torch.Tensor or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() < 1:
            return "input not a float32 CPU tensor"
        if x.shape[-1] != self.in_features:
            return "input's last dimension is not in_features"
        if x.numel() == 0:
            return "empty input"
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or (bias is not None and (bias.dtype != torch.float32 or bias.device.type != "cpu")):
            return "parameters not float32 on the CPU"
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
            return "autograd"
        if math.prod(x.shape[:-1]) not in self.results:
            return "row count not tuned"
        return None

    def _count(self, why: str | None) -> None:
        with self._stats_lock:
            self.calls[why or "looprl"] = self.calls.get(why or "looprl", 0) + 1

    def forward(self, x):
        why = self.why_not(x)
        self._count(why)
        if why is not None:
            return self._fallback(x)
        rows = math.prod(x.shape[:-1])
        kernel = self._kernels()[rows]
        flat = x.reshape(rows, self.in_features)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = torch.empty((rows, self.out_features), dtype=torch.float32)
        workspaces = self._local.__dict__.setdefault("workspaces", {})
        workspace = workspaces.get(rows)
        if workspace is None:
            workspace = workspaces[rows] = aligned_empty(kernel.kernel.workspace_elements)
        with torch.no_grad():
            kernel.run(flat.detach().numpy(), out=out.numpy(), workspace=workspace)
        return out.reshape(*x.shape[:-1], self.out_features)


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


def _record_rows(module: nn.Module, examples: list[tuple]) -> dict[nn.Linear, set[int]]:
    """Row counts of the float32 CPU inputs every tunable linear layer sees on the examples."""
    seen: dict[nn.Linear, set[int]] = {}
    hooks = []

    def hook(layer, args, _output):
        x = args[0] if args else None
        if type(x) is torch.Tensor and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1 and x.numel():
            seen.setdefault(layer, set()).add(math.prod(x.shape[:-1]))

    for layer in module.modules():
        if _tunable(layer):
            hooks.append(layer.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for args in examples:
                module(*args)
    finally:
        for handle in hooks:
            handle.remove()
    return seen


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


def tune_module(module: nn.Module, example_inputs, *, policy="default", target=None, budget_s=None, cache=None,
                fuse: bool = True, threads: int = 1) -> nn.Module:
    """A copy of ``module`` whose float32 CPU ``nn.Linear`` layers run looprl kernels tuned for
    the shapes ``example_inputs`` give them (see the module docstring).

    ``example_inputs``: a tensor, a tuple of one call's positional arguments, or a list of
    either to tune for several shapes. ``policy``, ``target``, ``budget_s``, ``cache``: as in
    :func:`looprl.tune` (one tune per distinct layer shape; tuning again is a lookup in the
    measurement cache). ``fuse``: fuse ReLU/GELU/SiLU following a linear layer in an
    ``nn.Sequential`` into its kernel. ``threads``: as in :func:`looprl.tune`, but 1 by
    default (torch runs its own threads around the layers)."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"tune_module() expects a torch.nn.Module, got {type(module).__name__}")
    examples = _as_examples(example_inputs)
    tuned = copy.deepcopy(module)
    rows_seen = _record_rows(tuned, examples)
    fusions = _fusions(tuned) if fuse else {}
    results: dict[str, TuneResult] = {}  # by problem name: layers of one shape share a kernel
    replacements: dict[nn.Linear, TunedLinear] = {}
    for layer, rows in rows_seen.items():
        activation_module = fusions[layer][0][fusions[layer][1]] if layer in fusions else None
        activation = _activation_of(activation_module) if activation_module is not None else None
        per_rows = {}
        for count in sorted(rows):
            problem = linear(count, layer.in_features, layer.out_features, bias=layer.bias is not None, activation=activation)
            if problem.name not in results:
                results[problem.name] = tune(problem, policy, cache=cache, budget_s=budget_s, target=target, threads=threads)
            per_rows[count] = results[problem.name]
        replacements[layer] = TunedLinear(layer, activation_module, per_rows)
    for parent in list(tuned.modules()):
        for name, child in list(parent._modules.items()):  # every registration, a shared layer's too
            if child is not None and child in replacements:
                setattr(parent, name, replacements[child])
    for layer, (parent, index) in fusions.items():
        if layer in replacements:
            parent[index] = nn.Identity()
    return tuned


def tuned_layers(module: nn.Module) -> list[tuple[str, TunedLinear]]:
    """The :class:`TunedLinear` layers of ``module``, with their names."""
    return [(name, layer) for name, layer in module.named_modules() if isinstance(layer, TunedLinear)]


def stats(module: nn.Module) -> dict:
    """How the tuned layers of ``module`` served their calls so far: ``looprl_calls`` (a looprl
    kernel computed the call), ``fallback_calls`` (the original layer did) and ``fallbacks``
    (why: ``{reason: calls}``, the reasons of :meth:`TunedLinear.why_not`), in all and per
    layer (``layers``: name -> the same three)."""
    layers = {}
    for name, layer in tuned_layers(module):
        with layer._stats_lock:
            calls = dict(layer.calls)
        fallbacks = {why: count for why, count in calls.items() if why != "looprl"}
        layers[name] = {"looprl_calls": calls.get("looprl", 0), "fallback_calls": sum(fallbacks.values()), "fallbacks": fallbacks}
    total: dict[str, int] = {}
    for entry in layers.values():
        for why, count in entry["fallbacks"].items():
            total[why] = total.get(why, 0) + count
    return {"looprl_calls": sum(e["looprl_calls"] for e in layers.values()), "fallback_calls": sum(total.values()),
            "fallbacks": total, "layers": layers}
