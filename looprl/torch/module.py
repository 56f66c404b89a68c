"""``tune_module``: a copy of a PyTorch model whose linear layers run tuned looprl kernels.

Runs the model on the examples to see each ``nn.Linear``'s row counts, finds the activations
to fuse (:func:`_fusions`), tunes each layer (:func:`~looprl.torch.layers.tune_layer`), puts
:class:`~looprl.torch.layers.TunedLinear` modules in their places, judges each layer shape
against torch and then the whole tuned model against the model (see :mod:`looprl.torch`).
"""

from __future__ import annotations

import copy
import math
import sys
import time
import warnings

import torch
from torch import nn

from looprl import checks
from looprl.measurement.evaluator import open_cache
from looprl.measurement.keys import tuned_problem_name
from looprl.measurement.tuned_records import read_tuned_records
from looprl.policy.tuner import TuneResult
from looprl.torch.activations import activation_of_module
from looprl.torch.layers import TunedLinear, layer_shape, tune_layer, weights_outgrow_cache
from looprl.torch.records import kernels_by_shape, route_table, shape_words, tuned_names
from looprl.torch.routes import Route, interleaved_best_seconds
from looprl.torch.rows import check_max_rows


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


def _record_rows(module: nn.Module, examples: list[tuple]) -> list[dict[nn.Linear, set[int]]]:
    """Per example, the row counts of the float32 CPU inputs every tunable linear layer sees."""
    per_example: list[dict[nn.Linear, set[int]]] = []
    hooks = []

    def hook(layer, args, _output):
        x = args[0] if args else None
        if type(x) is torch.Tensor and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1 and x.numel():
            per_example[-1].setdefault(layer, set()).add(math.prod(x.shape[:-1]))

    for layer in module.modules():
        if _tunable(layer):
            hooks.append(layer.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for args in examples:
                per_example.append({})
                module(*args)
    finally:
        for handle in hooks:
            handle.remove()
    return per_example


MODEL_BUDGET_S = 0.05  # seconds to time the model, and the tuned model, on one example in one round
MODEL_ROUNDS = 3  # interleaved rounds; each side's best is compared
MODEL_TOLERANCE = 1.03  # after routing to torch, a tuned model slower than this times the model's is reported (timing noise)


def _check_against_the_model(module: nn.Module, tuned: nn.Module, examples: list[tuple], per_example: list[dict],
                             replacements: dict, progress: bool) -> None:
    """Time ``tuned`` against ``module`` on each example; where the tuned model is slower, give
    the row counts that example gave each layer to torch (:meth:`LinearKernels.route_to_torch`)
    and time again. A layer judged alone runs with its weights warm in the cache; in a model,
    the other layers' weights (and looprl's copies and packed forms of them) compete for it,
    which the judgement cannot see. Still slower after that: a ``RuntimeWarning``."""
    for number, (args, seen) in enumerate(zip(examples, per_example), start=1):
        seen = {layer: rows for layer, rows in seen.items() if layer in replacements}
        if not seen:
            continue
        original_s, tuned_s = interleaved_best_seconds([(module, args), (tuned, args)], MODEL_BUDGET_S, MODEL_ROUNDS)
        if tuned_s <= original_s:
            if progress:
                print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, the model {1e3 * original_s:.3f} ms",
                      file=sys.stderr, flush=True)
            continue
        for layer, rows in seen.items():
            replacements[layer].kernels.route_to_torch(rows)
        original_s, routed_s = interleaved_best_seconds([(module, args), (tuned, args)], MODEL_BUDGET_S, MODEL_ROUNDS)
        if progress:
            print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, slower than the model's; its rows routed to torch "
                  f"in {len(seen)} layer(s): now {1e3 * routed_s:.3f} ms against {1e3 * original_s:.3f} ms", file=sys.stderr, flush=True)
        if routed_s > MODEL_TOLERANCE * original_s:
            warnings.warn(f"tune_module: on example {number} the tuned model took {1e3 * routed_s:.3f} ms against the model's "
                          f"{1e3 * original_s:.3f} ms, its layers routed to torch (the calls' own cost, or timing noise)",
                          RuntimeWarning, stacklevel=3)


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
            if _tunable(layer) and activation_of_module(following) is not None and registered[layer] == 1:
                found[layer] = (parent, i + 1)
    return found


def tune_module(module: nn.Module, example_inputs, *, policy="default", target=None, budget_s=None, cache=None,
                fuse: bool = True, threads: int = 1, max_rows: int | None = None, records=None,
                compare_torch: bool = True, progress: bool = True, frozen: bool = False) -> nn.Module:
    """A copy of ``module`` whose float32 CPU ``nn.Linear`` layers run looprl kernels tuned for
    the shapes ``example_inputs`` give them (see :mod:`looprl.torch`).

    ``example_inputs``: a tensor, a tuple of one call's positional arguments, or a list of
    either to tune for several shapes. ``policy``, ``target``, ``budget_s``, ``cache``: as in
    :func:`looprl.tune` (one tune per distinct layer shape; tuning again is a lookup in the
    measurement cache). ``fuse``: fuse ReLU/GELU/SiLU following a linear layer in an
    ``nn.Sequential`` into its kernel. ``threads``: as in :func:`looprl.tune`, but 1 by
    default (torch runs its own threads around the layers). ``max_rows``: kernels are tuned for
    every power of two up to it (default: the largest row count a layer saw) and for the row
    counts seen; any row count is served in blocks of these (see :mod:`looprl.torch`).
    ``records``: a file :func:`save_records` wrote; its answers are imported into ``cache``
    first, so on a CPU of the kind they were tuned on nothing is tuned again (each kernel is
    compiled from its remembered schedule), and elsewhere the layers are tuned as usual.
    ``frozen``: the caller promises that the layers' weights and biases keep their values (as
    with ``torch.compile`` and Inductor's ``freezing``): they are bound to the kernels once,
    and a call compares nothing (a weight replaced by another tensor is bound again; an
    in-place edit is not seen). Default False: every call compares the values (see
    :class:`ContentCache`), which costs a read of the weights per call.
    When the layers' weights together outgrow this host's last-level cache, row counts up to
    :data:`COLD_ROWS` are tuned with their weights read from memory (cold problems: decode
    steps stream every weight from memory).
    ``compare_torch``: time each layer shape's looprl plan against torch's own call at every
    tuned row count (same threads, same epilogue; :meth:`LinearKernels.judge`) and route the
    row counts where torch was faster to torch, so that the tuned model is never slower than
    the model given by a layer looprl lost (:func:`stats` and :func:`route_table` say which
    rows went where). ``progress``: a line per layer shape on stderr as it is tuned, and the
    routes' table at the end.

    A ``module`` that is itself an ``nn.Linear`` comes back as a :class:`TunedLinear`; one in
    which no layer was tuned comes back as a copy, with a ``RuntimeWarning``."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"tune_module() expects a torch.nn.Module, got {type(module).__name__}")
    check_max_rows(max_rows)
    compare_torch = checks.flag(compare_torch, "compare_torch")
    progress = checks.flag(progress, "progress")
    frozen = checks.flag(frozen, "frozen")
    examples = _as_examples(example_inputs)
    cache = open_cache(cache)  # one cache for every layer (a ":memory:" one included)
    if records is not None:
        cache.import_tuned(read_tuned_records(records))
    tuned = copy.deepcopy(module)
    per_example = _record_rows(tuned, examples)
    rows_seen: dict[nn.Linear, set[int]] = {}
    for seen in per_example:
        for layer, rows in seen.items():
            rows_seen.setdefault(layer, set()).update(rows)
    fusions = _fusions(tuned) if fuse else {}
    results: dict[str, TuneResult] = {}  # by problem name: layers of one shape share a kernel
    planned = []  # (layer, its fused activation module, row count -> TuneResult, its layer shape)
    shapes = set()  # the layer shapes tuned so far
    started = time.perf_counter()
    cold_weights = weights_outgrow_cache(layer.weight for layer in rows_seen)
    tuning = {"policy": policy, "cache": cache, "budget_s": budget_s, "target": target, "threads": threads}  # looprl.tune's
    for layer, rows in rows_seen.items():
        activation_module = fusions[layer][0][fusions[layer][1]] if layer in fusions else None
        activation = activation_of_module(activation_module) if activation_module is not None else None
        shape_started = time.perf_counter()
        per_rows = tune_layer(layer.in_features, layer.out_features, layer.bias is not None, activation, rows, max_rows, cold_weights,
                              results, tuning)
        shape = layer_shape(per_rows)
        if progress and shape not in shapes:
            print(f"looprl: tuned {shape_words(layer.in_features, layer.out_features, activation)} for rows "
                  f"{', '.join(map(str, sorted(per_rows)))} in {time.perf_counter() - shape_started:.1f} s", file=sys.stderr, flush=True)
        shapes.add(shape)
        planned.append((layer, activation_module, per_rows, shape))
    exported = cache.export_tuned(tuned_names(results.values()))  # one read of the cache for every layer's records
    replacements: dict[nn.Linear, TunedLinear] = {}
    judged: dict[tuple, dict[int, Route]] = {}  # a layer shape's routes: judged once, shared by its layers
    for layer, activation_module, per_rows, shape in planned:
        names = tuned_names(per_rows.values())
        records = [record for record in exported if tuned_problem_name(record["problem"]) in names]
        replacement = replacements[layer] = TunedLinear(layer, activation_module, per_rows, records, judged.get(shape), frozen)
        if compare_torch and shape not in judged:
            judged[shape] = replacement.kernels.judge(layer.weight.detach(), None if layer.bias is None else layer.bias.detach())
    for parent in list(tuned.modules()):
        for name, child in list(parent._modules.items()):  # every registration, a shared layer's too
            if child is not None and child in replacements:
                setattr(parent, name, replacements[child])
    for layer, (parent, index) in fusions.items():
        if layer in replacements:
            parent[index] = nn.Identity()
    answer = replacements.get(tuned, tuned)  # a module that is itself a tuned layer is replaced whole
    if compare_torch and replacements:
        _check_against_the_model(module, answer, examples, per_example, replacements, progress)
        for replacement in replacements.values():
            replacement.kernels.forget_calls()
    if progress and replacements:
        print(route_table(kernels_by_shape(replacements.values())), file=sys.stderr, flush=True)
        print(f"looprl: {len(shapes)} layer shape(s), {len(replacements)} layer(s) in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    if not replacements:
        warnings.warn("tune_module tuned no layer: no float32 CPU torch.nn.Linear in the module was called with a float32 CPU input "
                      "by the examples; the copy returned runs as the module does", RuntimeWarning, stacklevel=2)
    return answer
