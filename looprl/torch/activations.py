"""The activations looprl fuses after a linear layer, as torch writes them: one table.

:data:`ACTIVATIONS` maps looprl's epilogue activation to torch's function computing it (what
a layer that falls back runs), the module that is it (:func:`activation_of_module`, for
:func:`~looprl.torch.tune_module`) and the functions a captured FX graph calls for it
(:func:`activation_of_call`, for the ``torch.compile`` backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as functional
from torch import nn


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


def activation_of_module(module: nn.Module) -> str | None:
    """The looprl activation an activation module computes, or None if it is not one we fuse."""
    for name, activation in ACTIVATIONS.items():
        if type(module) is activation.module and getattr(module, "approximate", "none") == activation.approximate:
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
