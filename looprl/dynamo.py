"""``torch.compile(model, backend="looprl")``: linear layers as tuned looprl kernels, the rest compiled by torch.

The backend is registered with torch under the name ``looprl`` (the ``torch_dynamo_backends``
entry point of this package), so ``torch.compile(model, backend="looprl")`` works without
importing looprl first. Dynamo hands it each captured FX graph. In it, every ``linear`` call
(``torch._C._nn.linear`` / ``functional.linear``: ``nn.Linear`` and code that calls
``F.linear``) on float32 or bfloat16 CPU tensors (input, weight and bias of one dtype) whose weight is a graph input (a parameter), when the graph
is compiled with grad mode off, is replaced by the custom operator ``looprl_native::linear``
(:mod:`looprl.torch.native`: the row counts whose plan it can run without Python, the others
handed to ``looprl::linear``, the Python operator; ``looprl::linear`` itself where the native
operator is off or cannot be built); a ReLU,
GELU (either approximation) or SiLU that is the linear call's only user is fused into it. The
operator runs :class:`looprl.torch.LinearKernels`: kernels tuned (:func:`looprl.tune` of
:func:`looprl.linear`) for every power of two up to ``max_rows`` (default: the most rows the
example gave the layer, at least 1) and the example's row count, serving any row count by row
plans, so ``dynamic=True`` (a symbolic row count) needs no recompilation; any call a kernel would
not compute exactly (another dtype, autograd, ...) falls back to torch, so no call gives a wrong
answer. Each call computes with the values the weight and bias hold at that moment, however
they were changed since (:class:`looprl.torch.ContentCache`), except under Inductor's
``torch._inductor.config.freezing``, which promises that the module's parameters and buffers
keep their values: a weight and bias that are such (``get_attr`` nodes of the graph, as Dynamo
hands them over under freezing) are bound once per tensor, as Inductor itself does
(``tune_module(frozen=True)``); a weight or bias that is an input of the graph (an argument of
the compiled function) is not covered by the promise and is still compared on every call. The rest of the graph, with the
operators in it, goes to ``inductor`` (torch's default backend; ``options={"rest": "eager"}``
runs it as captured instead).

Options (``torch.compile(..., options={...})``): ``max_rows``, ``policy``, ``target``,
``budget_s``, ``cache``, ``threads``, ``compare_torch``, ``measure`` (as :func:`looprl.torch.tune_module`;
``measure=False``: the fast path, every layer scheduled by the policy alone;
threads 1 by default; with ``compare_torch``, the default, each linear layer's looprl plan is
timed against torch's call at every tuned row count, with the graph's own weight, and the row
counts where torch was faster stay torch's), ``rest`` (``"inductor"`` or ``"eager"``), ``bmm`` (``"faster"``: batched products
replaced where the tuned kernel timed clearly faster than torch's; ``"always"``; ``"never"``),
``merge`` (default True: under Inductor's ``freezing``, linear calls that read one input with
constant weights, as attention's q, k and v projections and a gated MLP's gate and up, become
one call over their weights concatenated, :mod:`looprl.torch.siblings`; False leaves them apart).

Under Inductor's freezing, ``torch.addmm(bias, x, weight)`` over a constant weight stored ``[in,
out]`` and a constant bias (transformers' ``Conv1D``: GPT-2's projections) is first made a linear
call over the weight transposed once (:mod:`looprl.torch.transposed`), and then taken as above.

Grad mode on at compile time leaves every linear call to torch (the kernels have no backward;
Dynamo guards on grad mode, so a model compiled for inference and later called with grad mode on
is compiled again, untouched). :func:`stats` counts the calls the operators served and the
fallbacks, as :func:`looprl.torch.stats` does for a module.

The compiled graph owns its operators (their kernels and weight copies): they are freed with
it (``torch._dynamo.reset()``, or the model and its compiled code freed); the registry the
operators find them in by index holds them weakly.

**Batched products** (``matmul``, ``bmm``, ``@`` on two float32 CPU tensors of three or more
dimensions with the same batch dimensions, as attention's ``q @ k.transpose(-2, -1)`` and
``p @ v``) of fixed shapes (not symbolic: ``dynamic=False``, or a fixed sequence length) become
``looprl::matmul``: the contraction is tuned (``bmk,bnk->bmn`` when the right operand is the
transpose of a contiguous tensor, else ``bmk,bkn->bmn``), then the kernel and ``torch.matmul``
are timed on operands of those shapes and layouts, called from Python as the graph calls them,
and the product is replaced only where the kernel took at most :data:`PAYS_MARGIN` of torch's
time (option ``bmm``). A call on other shapes or layouts is ``torch.matmul``'s.
``scaled_dot_product_attention`` is one operator: its products are not seen.
"""

from __future__ import annotations

import itertools
import math
import operator
import threading
import weakref

import torch
import torch.nn.functional as functional

from looprl.backend.buffers import aligned_empty
from looprl.ir.dtypes import as_dtype
from looprl.ir.problem import contraction
from looprl.measurement.evaluator import open_cache
from looprl.measurement.timing import best_time
from looprl.tune.api import tune
from looprl import checks
from looprl.torch import native
from looprl.torch.activations import activation_of_call
from looprl.torch.layers import layer_shape, tune_layer, weight_bytes
from looprl.torch.records import route_summary, summarise_calls
from looprl.torch.routes import AUTOCAST, TORCH_FASTER, TRANSFORMED, LinearKernels, autocast_to_other, transformed
from looprl.torch.rows import check_max_rows
from looprl.torch.siblings import constant_value, linear_arguments, merge_siblings, reads_constants
from looprl.torch.transposed import addmm_as_linear

__all__ = ["looprl_backend", "stats"]

OPTIONS = ("max_rows", "policy", "target", "budget_s", "cache", "threads", "rest", "bmm", "compare_torch", "measure", "merge")
BMM_CHOICES = ("faster", "always", "never")
LINEAR_TARGETS = (torch._C._nn.linear, functional.linear)
LINEAR_DTYPES = (torch.float32, torch.bfloat16)  # linear calls replaced on these (input, weight and bias of one)
MATMUL_TARGETS = (operator.matmul, torch.matmul, torch.bmm)
PAYS_BUDGET_S = 0.02  # seconds to time the kernel, and torch, on a batched product before choosing
PAYS_MARGIN = 0.9  # replaced only when the kernel took at most this fraction of torch's time (timing noise)


def _activation_name(node) -> str | None:
    """The activation a graph node computes on its one argument, if it is one we fuse
    (:data:`looprl.torch.activations.ACTIVATIONS`)."""
    if node.op != "call_function" or len(node.args) != 1:
        return None
    return activation_of_call(node.target, node.kwargs)


# The operators' kernels by the index the graph passes them, held weakly: the compiled graph owns
# its operators (see _owned), so they and their copies of the weights are freed with it (a graph
# dropped by torch._dynamo.reset() or by its model being freed). An index is never used twice.
_layers: weakref.WeakValueDictionary[int, LinearKernels] = weakref.WeakValueDictionary()
_layers_lock = threading.Lock()
_indices = itertools.count()
_retired: dict[str, int] = {}  # the calls of the operators freed so far, by outcome ("looprl" or a fallback's reason)


def _operator(registry, index: int, what: str):
    found = registry.get(index)
    if found is None:
        raise RuntimeError(f"looprl::{what} operator {index} was freed with the graph it was compiled into; this graph "
                           "no longer owns it (compile the model again)")
    return found


# The operators, registered with torch's dispatcher directly: one Python function per call, on the
# CPU's key. (torch.library.custom_op wraps a function in an autograd layer, a dynamo-disabled
# wrapper and an aliasing check, all Python: 23 us a call against 14 at one row of a 64->64 layer,
# torch 2.13, Zen 4; on a decode step that is about 1 ms of a Qwen2-style model's 113 calls.) No
# autograd kernel: the backend puts them only in graphs compiled with grad mode off, and Dynamo
# compiles a graph again, without them, when grad mode is on.
_library = torch.library.Library("looprl", "DEF")
_library.define("linear(Tensor x, Tensor weight, Tensor? bias, int layer) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))
_library.define("matmul(Tensor a, Tensor b, int product) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layer: int) -> torch.Tensor:
    return _operator(_layers, layer, "linear")(x, weight, bias)


_library.impl("linear", _linear, "CPU")
torch.library.register_fake("looprl::linear", native.linear_fake, lib=_library)


class BatchedProduct:
    """A tuned kernel for one batched product of fixed shapes, ``a @ b`` with ``a`` of shape
    ``(*batch, m, k)`` and ``b`` of ``(*batch, k, n)``, stored as given or (``transposed``) as
    the transpose of a contiguous ``(*batch, n, k)`` (attention's ``q @ k.transpose(-2, -1)``).
    A call on other shapes, layouts or dtypes, or under autograd, is ``torch.matmul``'s."""

    def __init__(self, batch: tuple[int, ...], m: int, k: int, n: int, transposed: bool, result):
        self.batch, self.m, self.k, self.n, self.transposed = batch, m, k, n, transposed
        self.count = math.prod(batch)
        self.kernel = result.kernel
        self.result = result
        self._local = threading.local()
        self._stats_lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def counted(self) -> dict[str, int]:
        with self._stats_lock:
            return dict(self.calls)

    def why_not(self, a, b) -> str | None:
        if autocast_to_other(torch.float32):
            return AUTOCAST
        if transformed(a, b):
            return TRANSFORMED
        for x in (a, b):
            if type(x) is not torch.Tensor or x.dtype != torch.float32 or x.device.type != "cpu":
                return "input not a float32 CPU tensor"
        if tuple(a.shape) != (*self.batch, self.m, self.k) or tuple(b.shape) != (*self.batch, self.k, self.n):
            return "shapes not as tuned"
        if not (b.transpose(-2, -1) if self.transposed else b).is_contiguous():
            return "right operand's layout not as tuned"
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return "autograd"
        return None

    def __call__(self, a, b):
        why = self.why_not(a, b)
        with self._stats_lock:
            self.calls[why or "looprl"] = self.calls.get(why or "looprl", 0) + 1
        return torch.matmul(a, b) if why is not None else self.compute(a, b)

    def compute(self, a, b):
        """The product by the kernel, for operands :meth:`why_not` accepts (not checked here)."""
        left = a.detach().contiguous()
        right = b.detach().transpose(-2, -1) if self.transposed else b.detach()  # contiguous, as checked
        out = torch.empty((*self.batch, self.m, self.n), dtype=torch.float32)
        workspace = self._local.__dict__.get("workspace")
        if workspace is None:
            workspace = self._local.workspace = aligned_empty(self.kernel.workspace_elements)
        places = {"in0": left.data_ptr(), "in1": right.data_ptr(), "out": out.data_ptr(), "acc": workspace.ctypes.data}
        self.kernel.raw_call(tuple(places[t] for t in self.kernel.tensors), 1)
        return out


_products: weakref.WeakValueDictionary[int, BatchedProduct] = weakref.WeakValueDictionary()  # as _layers


def _matmul(a: torch.Tensor, b: torch.Tensor, product: int) -> torch.Tensor:
    return _operator(_products, product, "matmul")(a, b)


def _matmul_fake(a, b, product):
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


_library.impl("matmul", _matmul, "CPU")
torch.library.register_fake("looprl::matmul", _matmul_fake, lib=_library)


def stats() -> dict:
    """Calls served by looprl kernels and fallbacks (by reason) of every linear layer and batched
    product the backend replaced in this process: ``{"looprl_calls", "fallback_calls",
    "fallbacks", "layers"}``. The totals count every operator's calls, those freed with their
    graphs included; ``layers`` lists the operators alive (their graphs not freed): the linear
    layers, then the batched products, each in the order compiled."""
    with _layers_lock:
        layers = [_layers[i] for i in sorted(_layers.keys())] + [_products[i] for i in sorted(_products.keys())]
        retired = dict(_retired)
    summary = summarise_calls({index: kernels.counted() for index, kernels in enumerate(layers)} | {"retired": retired})
    del summary["layers"]["retired"]
    for index, kernels in enumerate(layers):
        if isinstance(kernels, LinearKernels):
            summary["layers"][index]["routes"] = route_summary(kernels)
    return dict(summary, layers=list(summary["layers"].values()))


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
    bmm = options.get("bmm", "faster")
    if bmm not in BMM_CHOICES:
        raise ValueError(f"option bmm must be one of {', '.join(BMM_CHOICES)}, got {bmm!r}")
    check_max_rows(options.get("max_rows"))
    compare_torch = checks.flag(options.get("compare_torch", True), "option compare_torch")
    measure = checks.flag(options.get("measure", True), "option measure")
    merge = checks.flag(options.get("merge", True), "option merge")
    owned: list = []  # the operators put in this graph: what is returned owns them
    if not torch.is_grad_enabled():
        if rest == "inductor" and _freezing():  # the weights promised constant: Inductor's freezing folds what is made of them once
            addmm_as_linear(gm, LINEAR_DTYPES)  # a weight stored [in, out] transposed (GPT-2's Conv1D)
            if merge:
                merge_siblings(gm, LINEAR_TARGETS, LINEAR_DTYPES)  # sibling weights concatenated
        tuning = {"policy": options.get("policy", "default"), "target": options.get("target"), "budget_s": options.get("budget_s"),
                  "threads": options.get("threads", 1), "cache": open_cache(options.get("cache")),  # one cache for the graph
                  "weights_change": not _freezing(),  # without freezing the weights are compared on every call
                  "measure": measure}
        _replace_linear_calls(gm, example_inputs, options.get("max_rows"), tuning, compare_torch, owned)
        if bmm != "never":
            _replace_batched_products(gm, bmm == "faster", tuning, owned)
    if rest == "eager":
        gm._looprl_operators = owned  # the graph module runs, and owns them
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    return _owning(compile_fx(gm, example_inputs), owned)


def _owning(function, owned: list):
    """``function`` (what Inductor compiled, which does not keep the graph module alive) in a
    wrapper that holds the operators ``owned``, for as long as Dynamo holds it. A wrapper, not
    an attribute: Dynamo unwraps a function that is itself a ``torch._dynamo.disable`` wrapper,
    as Inductor's is, and keeps only the function inside (the attribute went with the outer
    one); and not the graph module given to Inductor, which pickles it for its cache key."""
    if not owned:
        return function

    def call(*args, **kwargs):
        return function(*args, **kwargs)

    if hasattr(function, "_boxed_call"):
        call._boxed_call = function._boxed_call  # its calling convention: one list of arguments
    call._looprl_operators = owned
    return call


def _replace_linear_calls(gm: torch.fx.GraphModule, example_inputs, max_rows: int | None, tuning: dict, compare_torch: bool,
                          owned: list) -> int:
    """Replace the graph's eligible linear calls by ``looprl::linear`` (kernels tuned with
    ``tuning``: :func:`looprl.tune`'s keyword arguments; with ``compare_torch``, routed to
    torch at the row counts where torch's call timed faster; each added to ``owned``); how many."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    values = {node: value for node, value in zip(placeholders, example_inputs)}
    results: dict[str, object] = {}
    judged: dict[tuple, dict] = {}  # a layer shape's routes, judged once per graph
    replaced = 0
    weights = [_example_value(gm, node.args[1], values) for node in gm.graph.nodes
               if node.op == "call_function" and node.target in LINEAR_TARGETS and len(node.args) > 1]
    model_bytes = weight_bytes(w for w in weights if isinstance(w, torch.Tensor))
    freezing = _freezing()
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in LINEAR_TARGETS:
            continue
        x, weight, bias = linear_arguments(node)
        weight_value = _example_value(gm, weight, values)
        bias_value = _example_value(gm, bias, values) if bias is not None else None
        x_value = x.meta.get("example_value") if hasattr(x, "meta") else None
        if not (isinstance(weight_value, torch.Tensor) and weight_value.dim() == 2 and weight_value.dtype in LINEAR_DTYPES
                and weight_value.device.type == "cpu" and isinstance(x_value, torch.Tensor) and x_value.dtype == weight_value.dtype
                and x_value.device.type == "cpu" and x_value.dim() >= 1):
            continue
        if bias is not None and not (isinstance(bias_value, torch.Tensor) and bias_value.dtype == weight_value.dtype and bias_value.dim() == 1):
            continue
        out_features, in_features = weight_value.shape
        users = list(node.users)
        activation = _activation_name(users[0]) if len(users) == 1 else None
        rows = max(1, math.prod(_hint(size) for size in x_value.shape[:-1]))
        per_rows = tune_layer(in_features, out_features, bias is not None, activation, {rows}, max_rows, model_bytes, results, tuning,
                              dtype=as_dtype(weight_value.dtype))
        shape = layer_shape(per_rows)
        # Under Inductor's freezing the caller has promised that the parameters and buffers (get_attr nodes) keep their
        # values: bound once, as Inductor does. A weight or bias that is a graph input carries no such promise: compared.
        frozen = freezing and all(node is None or reads_constants(node) for node in (weight, bias))
        kernels = LinearKernels(in_features, out_features, activation, per_rows, routes=judged.get(shape), frozen=frozen)
        if compare_torch and shape not in judged:
            judged[shape] = kernels.judge(weight_value.detach(), None if bias_value is None else bias_value.detach())
        index = _register(_layers, kernels, owned)
        end = users[0] if activation is not None else node
        _replace_node(gm, end, _linear_operator(kernels, index), (x, weight, bias, index))
        if end is not node:
            gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


def _linear_operator(kernels: LinearKernels, index: int):
    """The operator a graph calls for the layer ``kernels`` registered as ``index``: the native
    one (:mod:`looprl.torch.native`: no Python on the path of the calls it can run, the others
    handed to ``looprl::linear``), the layer given its entry in the native table; else, where it
    is off or cannot be built, ``looprl::linear``."""
    kernels.native = native.layer_entry(kernels, index, on_forget=_retire_native)
    return torch.ops.looprl.linear.default if kernels.native is None else torch.ops.looprl_native.linear.default


def _retire_native(calls: int, routed: int) -> None:
    """Add the calls a freed layer's native entry computed (not yet counted) to the totals:
    ``calls`` with looprl's kernels, ``routed`` with torch's call (rows routed to torch)."""
    _retire({outcome: count for outcome, count in (("looprl", calls), (TORCH_FASTER, routed)) if count})


def _freezing() -> bool:
    """Whether Inductor's ``freezing`` is on (the model's parameters and buffers promised
    constant; not the graph's inputs)."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.freezing)


def _example_value(gm: torch.fx.GraphModule, node, values: dict):
    """The tensor a graph node stands for: a graph input's example, the graph module's own
    attribute for a ``get_attr`` node (with Inductor's ``freezing`` on, Dynamo hands parameters
    over as attributes of the graph, not as inputs) or the concatenation of such attributes that
    merged siblings read (:func:`looprl.torch.siblings.constant_value`); None for anything else.
    Kept in ``values`` (the pass's own dict): a merged weight is concatenated once per pass."""
    if node not in values:
        values[node] = constant_value(gm, node)
    return values[node]


def _register(registry: weakref.WeakValueDictionary, item, owned: list) -> int:
    """Add ``item`` to an operator's registry (weakly: ``owned``, the graph's list, holds it);
    the index the graph passes the operator. Its calls go to the totals when it is freed."""
    with _layers_lock:
        index = next(_indices)
        registry[index] = item
    owned.append(item)
    weakref.finalize(item, _retire, item.calls)
    return index


def _retire(calls: dict[str, int]) -> None:
    """Add a freed operator's calls (its ``calls``, by outcome) to :func:`stats`' totals."""
    with _layers_lock:
        for outcome, count in calls.items():
            _retired[outcome] = _retired.get(outcome, 0) + count


def _replace_node(gm: torch.fx.GraphModule, node, operator_overload, args: tuple) -> None:
    """Put a call of ``operator_overload(*args)`` where ``node`` was (its users, its metadata)."""
    with gm.graph.inserting_after(node):
        call = gm.graph.call_function(operator_overload, args)
    call.meta.update(node.meta)
    node.replace_all_uses_with(call)
    gm.graph.erase_node(node)


def _static(shape) -> tuple[int, ...] | None:
    """``shape`` as ints, or None if any size is symbolic."""
    return None if any(isinstance(size, torch.SymInt) for size in shape) else tuple(int(size) for size in shape)


def _seconds(product, a, b) -> float:
    """Best seconds of one ``product(a, b)`` called from Python, by looprl's timing rule."""

    def repeat(reps: int) -> None:
        for _ in range(reps):
            product(a, b)

    with torch.inference_mode():
        return best_time(repeat, PAYS_BUDGET_S).seconds


def _replace_batched_products(gm: torch.fx.GraphModule, when_faster: bool, tuning: dict, owned: list) -> int:
    """Replace the graph's batched products of fixed shapes (``matmul``, ``bmm``, ``@`` on two
    float32 CPU tensors of at least three dimensions, the same batch dimensions) by
    ``looprl::matmul`` (kernels tuned with ``tuning``), all of them or (``when_faster``) those
    whose kernel, timed against ``torch.matmul`` on operands of the same shapes and layouts,
    took at most :data:`PAYS_MARGIN` of its time; each added to ``owned``; how many."""
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in MATMUL_TARGETS or len(node.args) != 2 or node.kwargs:
            continue
        a_value, b_value = (getattr(arg, "meta", {}).get("example_value") for arg in node.args)
        if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.device.type == "cpu" for v in (a_value, b_value)):
            continue
        a_shape, b_shape = _static(a_value.shape), _static(b_value.shape)
        if a_shape is None or b_shape is None or len(a_shape) < 3 or len(a_shape) != len(b_shape) or a_shape[:-2] != b_shape[:-2]:
            continue
        (m, k), (k2, n), batch = a_shape[-2:], b_shape[-2:], a_shape[:-2]
        if k != k2 or min(m, k, n, *batch) < 1:
            continue
        if b_value.transpose(-2, -1).is_contiguous() and not b_value.is_contiguous():
            transposed, spec = True, "bmk,bnk->bmn"
        elif b_value.is_contiguous():
            transposed, spec = False, "bmk,bkn->bmn"
        else:
            continue
        problem = contraction(spec, b=math.prod(batch), m=m, k=k, n=n)
        product = BatchedProduct(batch, m, k, n, transposed, tune(problem, **tuning))
        a = torch.randn(a_shape)
        b = torch.randn((*batch, n, k)).transpose(-2, -1) if transposed else torch.randn(b_shape)
        ours = _seconds(product.compute, a, b)  # called as the graph will call it, Python's part included
        if when_faster and ours > PAYS_MARGIN * _seconds(torch.matmul, a, b):
            continue  # not clearly faster than torch's: left to torch
        _replace_node(gm, node, torch.ops.looprl.matmul.default, (node.args[0], node.args[1], _register(_products, product, owned)))
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced
