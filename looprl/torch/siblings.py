"""Sibling linear calls merged: linear calls that read the same input, made one call over their
weights concatenated (an FX graph pass of the ``torch.compile`` backend, :mod:`looprl.dynamo`).

A transformer's attention projects one input three times (q, k and v) and its gated MLP twice
(gate and up); each call of a one-row decode step reads its weight and pays a call's own cost.
:func:`merge_siblings` finds, in a graph Dynamo captured, the ``linear`` calls whose input is one
node and whose weights and biases are constants (``get_attr`` nodes: Inductor's ``freezing``
promises that the module's parameters keep their values), and puts in their place one ``linear``
call over ``torch.cat`` of their weights along the output features (and of their biases, where
every one has one), each original call's value being its columns of the merged output
(``narrow(...).contiguous()``: a contiguous tensor, as a linear call returns, so that every view
the graph takes of it holds). Inductor's freezing folds each concatenation of constants into one
constant when it compiles the graph, so it is computed once, not on every call (a graph run
without Inductor would concatenate on every call: the backend merges only for Inductor). Each
output column is computed from its own weight row, its bias and the input as before, so the
values differ from the separate calls' only by the summation order of the kernel that computes
the merged call (float32 rounding), as any tuned kernel's do.

Not merged: weights or biases that are graph inputs (not promised constant), calls of different
dtypes, input widths or bias presence, and tensors not on the CPU. The concatenated weights are a
copy, held by the compiled graph (the separate ones are the model's; their bound kernels may hold
another, as any layer's do).
"""

from __future__ import annotations

import torch

def linear_arguments(node) -> tuple:
    """``(input, weight, bias)`` nodes of a ``linear`` call (bias None where it has none)."""
    args = list(node.args) + [None] * (3 - len(node.args))
    return args[0], args[1], node.kwargs.get("bias", args[2])


def merge_siblings(gm: torch.fx.GraphModule, targets: tuple, dtypes: tuple) -> int:
    """Merge, in ``gm``, the groups of sibling ``linear`` calls (``call_function`` nodes whose
    target is one of ``targets``) on one input node, of one dtype of ``dtypes``, with constant
    weights and biases (see the module docstring); how many calls were merged away."""
    groups: dict[tuple, list] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in targets or len(node.args) < 2:
            continue
        key = _sibling_key(gm, node, dtypes)
        if key is not None:
            groups.setdefault(key, []).append(node)
    merged = 0
    for nodes in groups.values():
        if len(nodes) > 1:
            _merge(gm, nodes)
            merged += len(nodes) - 1
    if merged:
        gm.graph.lint()
        gm.recompile()
    return merged


def constant_of(gm: torch.fx.GraphModule, node):
    """The tensor a ``get_attr`` node of ``gm`` stands for, or None for any other node."""
    if getattr(node, "op", None) != "get_attr":
        return None
    value = gm
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _sibling_key(gm: torch.fx.GraphModule, node, dtypes: tuple) -> tuple | None:
    """What a mergeable linear call shares with its siblings (its input node, dtype, input width,
    whether it has a bias), or None where the call is not one to merge."""
    x, weight_node, bias_node = linear_arguments(node)
    weight = constant_of(gm, weight_node)
    if weight is None or weight.dim() != 2 or weight.dtype not in dtypes or weight.device.type != "cpu":
        return None
    if bias_node is not None:
        bias = constant_of(gm, bias_node)
        if bias is None or bias.dim() != 1 or bias.dtype != weight.dtype or bias.device.type != "cpu" or bias.shape[0] != weight.shape[0]:
            return None
    x_value = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    if not (isinstance(x_value, torch.Tensor) and x_value.dtype == weight.dtype and x_value.device.type == "cpu" and x_value.dim() >= 1
            and x_value.shape[-1] == weight.shape[1]):
        return None
    return x, weight.dtype, weight.shape[1], bias_node is not None


def _merge(gm: torch.fx.GraphModule, nodes: list) -> None:
    """Put one linear call over the concatenated weights (and biases) of ``nodes`` before the
    first of them, and each node's columns of it in its place."""
    x, _, first_bias = linear_arguments(nodes[0])
    old = {linear_arguments(node)[i] for node in nodes for i in (1, 2)} - {None}
    graph = gm.graph
    with graph.inserting_before(nodes[0]):  # the constants read again here (Dynamo puts each get_attr just before its use)
        weights = [graph.get_attr(linear_arguments(node)[1].target) for node in nodes]
        biases = [graph.get_attr(linear_arguments(node)[2].target) for node in nodes] if first_bias is not None else None
        weight = graph.call_function(torch.cat, (tuple(weights), 0))
        bias = graph.call_function(torch.cat, (tuple(biases), 0)) if biases is not None else None
        call = graph.call_function(nodes[0].target, (x, weight, bias))
    start, inserted = 0, call
    for node, piece in zip(nodes, weights):
        width = constant_of(gm, piece).shape[0]
        with graph.inserting_after(inserted):
            columns = graph.call_function(torch.narrow, (call, -1, start, width))
        with graph.inserting_after(columns):
            inserted = graph.call_method("contiguous", (columns,))
        inserted.meta.update(node.meta)
        node.replace_all_uses_with(inserted)
        graph.erase_node(node)
        start += width
    for constant in old:  # the separate weights' and biases' get_attr nodes, where nothing else reads them
        if not constant.users:
            graph.erase_node(constant)


def constant_value(gm: torch.fx.GraphModule, node):
    """The tensor a node of ``gm`` that reads only constants stands for: a ``get_attr`` node's
    tensor, a concatenation :func:`merge_siblings` made of them, or a contiguous transpose
    :func:`looprl.torch.transposed.addmm_as_linear` made of one (computed here); None for any
    other node."""
    inner = transposed_of(node)
    if inner is not None:
        weight = constant_of(gm, inner)
        if weight is None:
            return None
        with torch.no_grad():
            return weight.detach().t().contiguous()
    if getattr(node, "op", None) == "call_function" and node.target is torch.cat and not node.kwargs:
        parts = [constant_of(gm, part) for part in node.args[0]]
        if all(part is not None for part in parts):
            with torch.no_grad():
                return torch.cat([part.detach() for part in parts], node.args[1])
        return None
    return constant_of(gm, node)


def transposed_of(node):
    """The node whose contiguous transpose ``node`` is (``torch.t(n).contiguous()``), else None."""
    if getattr(node, "op", None) == "call_method" and node.target == "contiguous" and len(node.args) == 1:
        inner = node.args[0]
        if getattr(inner, "op", None) == "call_function" and inner.target is torch.t:
            return inner.args[0]
    return None


def reads_constants(node) -> bool:
    """Whether ``node`` is a ``get_attr`` node, a concatenation of them or the contiguous
    transpose of one (see :func:`constant_value`)."""
    inner = transposed_of(node)
    if inner is not None:
        return getattr(inner, "op", None) == "get_attr"
    if getattr(node, "op", None) == "call_function" and node.target is torch.cat:
        return all(getattr(part, "op", None) == "get_attr" for part in node.args[0])
    return getattr(node, "op", None) == "get_attr"
