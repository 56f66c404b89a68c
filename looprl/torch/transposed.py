"""Products with a constant weight stored ``[in, out]`` made linear calls: an FX graph pass of the
``torch.compile`` backend (:mod:`looprl.dynamo`), under Inductor's ``freezing``.

transformers' GPT-2 computes its projections with ``Conv1D``: ``torch.addmm(bias, x, weight)``
with the weight stored ``[in_features, out_features]``, the transpose of ``nn.Linear``'s. The
backend tunes ``linear`` calls; an ``addmm`` it left to Inductor, so on GPT-2 looprl computed
the LM head alone (issue 63: the recommended recipe decoded at 0.70x max-autotune on GPT-2 small,
one thread, Zen 4, ``experiments/results/hf_generate_znver4_gpt2_t1.csv``).
:func:`addmm_as_linear` finds the ``addmm`` calls whose weight and bias are constants
(``get_attr`` nodes: freezing promises that the module's parameters keep their values), 2-D
input, ``beta`` and ``alpha`` 1, and puts in their place ``functional.linear(x, weight_t, bias)``,
``weight_t`` the nodes ``torch.t(weight).contiguous()``: computed from constants alone, which
Inductor's freezing folds into one constant when it compiles the graph (as it folds
:mod:`looprl.torch.siblings`' concatenations), and which the backend reads as the weight's
transpose (:func:`looprl.torch.siblings.constant_value`). The values are the same products and
sums (the order of the sum is the kernel's, as for any tuned call).

The transposed weight is a copy the compiled graph holds beside the model's own weight. Without
freezing the weight may change between calls, and a copy would go stale: the pass is not run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as functional

from looprl.torch.siblings import constant_of

def addmm_as_linear(gm: torch.fx.GraphModule, dtypes: tuple) -> int:
    """Rewrite, in ``gm``, each ``torch.addmm(bias, x, weight)`` over a constant weight ``[in,
    out]`` of a dtype of ``dtypes`` and a constant bias ``[out]`` as a ``linear`` call over the
    weight's contiguous transpose (see the module docstring); how many calls were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        found = _eligible(gm, node, dtypes)
        if found is None:
            continue
        x, weight_node, bias_node = found
        with gm.graph.inserting_before(node):
            transposed = gm.graph.call_method("contiguous", (gm.graph.call_function(torch.t, (weight_node,)),))
            call = gm.graph.call_function(functional.linear, (x, transposed, bias_node))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _eligible(gm: torch.fx.GraphModule, node, dtypes: tuple):
    """``(x, weight, bias)`` nodes of an ``addmm`` call to rewrite, else None."""
    if node.op != "call_function" or node.target not in (torch.addmm, torch.ops.aten.addmm.default) or len(node.args) != 3:
        return None
    if any(node.kwargs.get(name, 1) != 1 for name in ("beta", "alpha")) or set(node.kwargs) - {"beta", "alpha"}:
        return None
    bias_node, x, weight_node = node.args
    weight, bias = constant_of(gm, weight_node), constant_of(gm, bias_node)
    if weight is None or bias is None or weight.dim() != 2 or bias.dim() != 1 or weight.dtype not in dtypes:
        return None
    if bias.dtype != weight.dtype or bias.shape[0] != weight.shape[1] or weight.device.type != "cpu" or bias.device.type != "cpu":
        return None
    x_value = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    if not (isinstance(x_value, torch.Tensor) and x_value.dim() == 2 and x_value.dtype == weight.dtype and x_value.device.type == "cpu"
            and x_value.shape[1] == weight.shape[0]):
        return None
    return x, weight_node, bias_node
