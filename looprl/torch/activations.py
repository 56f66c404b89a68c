"""The activations looprl fuses after a linear layer, as torch writes them: one table.

:data:`ACTIVATIONS` maps looprl's epilogue activation to torch's function computing it (what
a layer that falls back runs), the module that is it (:func:`activation_of_module`, for
:func:`~looprl.torch.tune_module`) and the functions a captured FX graph calls for it
(:func:`activation_of_call`, for the ``torch.compile`` backend). :func:`not_its_class` is the one
rule of when a module computes what its class computes (a fused activation's module, and a
linear layer :func:`~looprl.torch.tune_module` may replace), with :func:`hooked` and
:func:`global_hooks` (hooks that run around a module's call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as functional
from torch import nn
from torch.nn.modules import module as torch_module


@dataclass(frozen=True)
class Activation:
    """One fused activation: ``function(y)`` computes it, an ``module`` instance is it (for
    ``nn.GELU``, with ``approximate``), and a graph's call of one of ``calls`` is it when the
    call's keyword arguments are among ``keywords`` with those values (a keyword left out has
    torch's default, :data:`CALL_DEFAULTS`)."""

    function: Callable
    module: type
    calls: tuple
    keywords: dict
    approximate: str = "none"


CALL_DEFAULTS = {"inplace": False, "approximate": "none"}  # torch's defaults of the activations' keyword arguments

ACTIVATIONS = {
    "relu": Activation(functional.relu, nn.ReLU, (torch.relu, functional.relu), {}),
    "silu": Activation(functional.silu, nn.SiLU, (functional.silu,), {"inplace": False}),
    "gelu": Activation(lambda y: functional.gelu(y, approximate="none"), nn.GELU, (functional.gelu, torch._C._nn.gelu),
                       {"approximate": "none"}),
    "gelu_tanh": Activation(lambda y: functional.gelu(y, approximate="tanh"), nn.GELU, (functional.gelu, torch._C._nn.gelu),
                            {"approximate": "tanh"}, approximate="tanh"),
}


# What a module's call runs that an instance attribute replaces: nn.Module.__call__ calls
# self._call_impl, which calls self.forward, both looked up on the instance first.
CALL_ATTRIBUTES = ("forward", "_call_impl")
# The per-module hook tables of torch 2.x: a layer with an entry in one is left to torch.
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
          "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
# Hooks registered for every module's call (torch.nn.modules.module.register_module_*_hook).
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks")


def hooked(module: nn.Module) -> bool:
    """Whether ``module`` has an entry in one of its hook tables."""
    return any(getattr(module, name, None) for name in _HOOKS)


def global_hooks() -> bool:
    """Whether any global module hook (one called around every module's call) is registered."""
    return any(getattr(torch_module, name, None) for name in _GLOBAL_HOOKS)


def not_its_class(module: nn.Module, cls: type) -> str | None:
    """Why ``module`` may not compute what ``cls`` computes, or None when it is a ``cls`` itself
    running ``cls``'s own call: a subclass (or another class), or a call replaced on the instance
    (``module.forward = ...``)."""
    if type(module) is not cls:
        return f"a {type(module).__name__}, not an nn.{cls.__name__} itself (its class may compute anything)"
    for name in CALL_ATTRIBUTES:
        if name in vars(module):
            return f"its {name} is replaced on the instance (it may compute anything)"
    return None


def activation_of_module(module: nn.Module) -> str | None:
    """The looprl activation an activation module computes, or None if it is not one we fuse
    (also where it is a subclass, or its call is replaced on the instance: :func:`not_its_class`)."""
    for name, activation in ACTIVATIONS.items():
        if not_its_class(module, activation.module) is None and getattr(module, "approximate", "none") == activation.approximate:
            return name
    return None


def activation_of_call(target, kwargs: dict) -> str | None:
    """The looprl activation a graph's call of ``target`` with ``kwargs`` (on its one tensor)
    computes, or None if it is not one we fuse."""
    for name, activation in ACTIVATIONS.items():
        if (target in activation.calls and set(kwargs) <= set(activation.keywords)
                and all(kwargs.get(key, CALL_DEFAULTS[key]) == value for key, value in activation.keywords.items())):
            return name
    return None
