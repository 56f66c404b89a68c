"""transformers' ``Conv1D`` layers made ``nn.Linear`` layers in ``tune_module(..., frozen=True)``.

GPT-2's attention and MLP projections are transformers' ``Conv1D``
(``transformers.pytorch_utils``): ``torch.addmm(bias, x, weight)`` over a weight stored
``[in_features, out_features]``, the transpose of ``nn.Linear``'s, for 68% of GPT-2 small's
parameters. ``tune_module`` tunes ``nn.Linear`` layers, so it left them to torch and tuned the LM
head alone. With ``frozen=True`` (the weights promised to keep their values, as under Inductor's
freezing) :func:`linear_conv1d` puts in each one's place an ``nn.Linear`` over the weight
transposed once (a copy, held by the tuned model beside the model's own weight) and the same
bias, which ``tune_module`` then tunes as any other: the same products and sums (summed in the
kernel's order, as for any tuned call), ``nn.Linear`` taking inputs of any number of leading
dimensions as ``Conv1D`` does. The compile path does the same in its graph
(:mod:`looprl.torch.transposed`).

Without ``frozen`` a weight may change between calls and the copy would go stale: the layers are
left to torch, each named in ``stats()["left_to_torch"]`` with that reason. A ``Conv1D`` whose
call may compute something else (a subclass, a call replaced on the instance, hooks,
parametrizations) is left as it is, named with its reason too.

transformers is never imported here: a layer is recognised by its class's module and name.
"""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize

from looprl.torch.activations import CALL_ATTRIBUTES, global_hooks, hooked

CONV1D_MODULE, CONV1D_NAME = "transformers.pytorch_utils", "Conv1D"
NOT_FROZEN = ("a transformers Conv1D (its weight stored [in, out]): tuned only with frozen=True, which transposes the weight once; "
              "without it the copy would go stale when the weight changes")


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers ``Conv1D`` (of that class itself, not a subclass)."""
    cls = type(module)
    return cls.__module__ == CONV1D_MODULE and cls.__name__ == CONV1D_NAME


def why_kept(layer: nn.Module) -> str | None:
    """Why the ``Conv1D`` ``layer`` may compute something other than ``x @ weight + bias`` over
    its own parameters (then it is left as it is), or None."""
    if any(name in vars(layer) for name in CALL_ATTRIBUTES):
        return "a transformers Conv1D whose call is replaced on the instance (it may compute anything)"
    if parametrize.is_parametrized(layer) or hooked(layer):
        return "a transformers Conv1D with hooks or parametrizations (its call may compute something else)"
    if global_hooks():
        return "a transformers Conv1D, with global module hooks registered (they would see another module)"
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    if (type(weight) is not nn.Parameter or type(bias) is not nn.Parameter or weight.dim() != 2 or bias.dim() != 1
            or bias.shape[0] != weight.shape[1] or getattr(layer, "nf", None) != weight.shape[1]):
        return "a transformers Conv1D without a 2-D weight [in, out] and a bias [out] as parameters"
    return None


def as_linear(layer: nn.Module) -> nn.Linear:
    """An ``nn.Linear`` computing what the ``Conv1D`` ``layer`` computes: its weight transposed
    once into a contiguous copy, its bias the layer's own."""
    weight = layer.weight
    linear = nn.Linear(weight.shape[0], weight.shape[1], bias=True, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().t().contiguous(), requires_grad=weight.requires_grad)
    linear.bias = layer.bias
    linear.train(layer.training)
    return linear


def linear_conv1d(root: nn.Module, frozen: bool) -> tuple[nn.Module, dict[str, str]]:
    """With ``frozen``, replace in ``root`` (changed in place) each ``Conv1D`` free to be
    replaced by :func:`as_linear` (a layer registered in several places gets one replacement).
    Returns the root (its replacement, where it is such a layer itself) and the ``Conv1D``
    layers left as they are, by name, with why (all of them without ``frozen``)."""
    left: dict[str, str] = {}
    replaced: dict[nn.Module, nn.Linear] = {}
    for name, module in root.named_modules():
        if not is_conv1d(module):
            continue
        why = NOT_FROZEN if not frozen else why_kept(module)
        if why is not None:
            left[name] = why
        else:
            replaced[module] = as_linear(module)
    for parent in list(root.modules()):
        for child_name, child in list(parent._modules.items()):  # every registration, a shared layer's too
            if child is not None and child in replaced:
                setattr(parent, child_name, replaced[child])
    return replaced.get(root, root), left
