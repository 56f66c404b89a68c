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
from torch.nn.utils import parametrize
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.weight_norm import WeightNorm

from looprl import checks
from looprl.ir.dtypes import as_dtype
from looprl.measurement.evaluator import open_cache
from looprl.measurement.keys import tuned_problem_name
from looprl.measurement.tuned_records import read_tuned_records
from looprl.tune.results import TuneResult
from looprl.torch.activations import activation_of_module, global_hooks, hooked, not_its_class
from looprl.torch.conv1d import linear_conv1d
from looprl.torch.layers import TunedLinear, layer_shape, tune_layer, weight_bytes
from looprl.torch.records import LEFT_TO_TORCH, kernels_by_shape, route_table, shape_words, tuned_names
from looprl.torch.routes import NEGATIVE_VIEW, LinearKernels, interleaved_best_seconds, interleaved_duels
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


# Why a linear layer is left to torch (``stats()["left_to_torch"]``): replacing it would change
# what the model computes or keeps, now or after a later edit.
PARAMETRIZED = "parametrized (torch.nn.utils.parametrize): its weight is computed on every call"
PRUNED = "pruned (torch.nn.utils.prune): its weight is the mask times weight_orig, recomputed by a forward pre-hook"
WEIGHT_NORM = "weight_norm: its weight is recomputed from weight_g and weight_v by a forward pre-hook"
HOOKED = "has hooks (forward, forward-pre, backward or state-dict) that a replacement would drop"
GLOBAL_HOOKS = "global module hooks are registered (torch.nn.modules.module.register_module_forward_hook and the like)"
NOT_PARAMETERS = "its weight or bias is not a Parameter"
NOT_FLOAT32 = "parameters not float32 or bfloat16 on the CPU (both of one dtype)"
NOT_CALLED = "not called with a CPU input of its parameters' dtype by the examples"
TORCH_EVERYWHERE = "torch timed faster at every row count tuned: the layer is torch's, as it was"
DTYPES = (torch.float32, torch.bfloat16)  # what a tuned layer's parameters and inputs may be


def _left_to_torch(layer: nn.Module) -> str | None:
    """Why the ``nn.Linear`` (or subclass) ``layer`` is left as it is, or None if looprl may tune it."""
    if parametrize.is_parametrized(layer):
        return PARAMETRIZED
    pre_hooks = list(layer._forward_pre_hooks.values())
    if any(isinstance(hook, BasePruningMethod) for hook in pre_hooks):
        return PRUNED
    if any(isinstance(hook, WeightNorm) for hook in pre_hooks):
        return WEIGHT_NORM
    subclassed = not_its_class(layer, nn.Linear)  # a subclass, or its forward replaced on the instance
    if subclassed is not None:
        return subclassed
    if hooked(layer):
        return HOOKED
    if global_hooks():
        return GLOBAL_HOOKS
    weight, bias = layer.weight, layer.bias
    if type(weight) is not nn.Parameter or (bias is not None and type(bias) is not nn.Parameter):
        return NOT_PARAMETERS
    if weight.dtype not in DTYPES or weight.device.type != "cpu" or (bias is not None and (bias.dtype != weight.dtype or bias.device.type != "cpu")):
        return NOT_FLOAT32
    if weight.is_neg() or weight.is_conj() or (bias is not None and (bias.is_neg() or bias.is_conj())):
        return NEGATIVE_VIEW
    return None


def _copy(module: nn.Module, memo: dict | None = None) -> nn.Module:
    """A deep copy of ``module`` (``memo``: objects to keep as they are, by ``id``), also where
    it holds tensors computed from its parameters as plain attributes: ``weight_norm``'s and
    pruning's ``weight``, computed in grad mode, are not graph leaves, which ``copy.deepcopy``
    refuses. Such a tensor is copied as a detached clone and then computed again in the copy,
    from the copy's own parameters, by the forward pre-hook that computes it (pruning's, weight
    norm's), as it will be before every call. The given module is not changed."""
    memo = {} if memo is None else memo
    computed = []  # (the module's position in modules(), the attribute's name)
    for position, sub in enumerate(module.modules()):
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not value.is_leaf and id(value) not in memo:
                memo[id(value)] = value.detach().clone()
                computed.append((position, name))
    copied = copy.deepcopy(module, memo)
    if computed:
        copies = list(copied.modules())
        for position, name in computed:
            sub = copies[position]
            for hook in list(sub._forward_pre_hooks.values()):
                if getattr(hook, "_tensor_name", getattr(hook, "name", None)) == name and isinstance(hook, (BasePruningMethod, WeightNorm)):
                    with torch.enable_grad():
                        hook(sub, ())
    return copied


def _record_rows(module: nn.Module, examples: list[tuple], layers, fusions: dict) -> list[dict[tuple, set[int]]]:
    """Per example, the row counts of the CPU inputs of its parameters' dtype each of ``layers`` (in ``module``)
    sees, by ``(layer, fused)``: ``fused`` when the call is its sequence's, followed by the
    activation ``fusions`` (layer -> (sequence, the activation's index)) would fuse into it.
    ``module`` is a probe: its sequences are made to say which calls are theirs."""
    per_example: list[dict[tuple, set[int]]] = []
    from_sequence: set = set()  # the layers being called by their sequence right now
    hooks = []

    def hook(layer, args, _output):
        x = args[0] if args else None
        if type(x) is torch.Tensor and x.dtype == layer.weight.dtype and x.device.type == "cpu" and x.dim() >= 1 and x.numel():
            per_example[-1].setdefault((layer, layer in from_sequence), set()).add(math.prod(x.shape[:-1]))

    for layer in layers:
        hooks.append(layer.register_forward_hook(hook))
    for layer, (sequence, _) in fusions.items():
        sequence.__class__ = _ProbeSequential
        sequence.__dict__.setdefault("_looprl_probe", (set(), from_sequence))[0].add(layer)
    try:
        with torch.no_grad():
            for args in examples:
                per_example.append({})
                module(*args)
    finally:
        for handle in hooks:
            handle.remove()
    return per_example


class _ProbeSequential(nn.Sequential):
    """A sequence of the probe copy (:func:`_record_rows`): it runs as ``nn.Sequential`` does,
    and marks the calls of its layers to fuse as its own."""

    def forward(self, input):  # noqa: A002 - nn.Sequential's name
        fused, from_sequence = self.__dict__["_looprl_probe"]
        for module in self:
            if module in fused:
                from_sequence.add(module)
                try:
                    input = module(input)
                finally:
                    from_sequence.discard(module)
            else:
                input = module(input)
        return input


class FusedSequential(nn.Sequential):
    """An ``nn.Sequential`` in which a :class:`TunedLinear` followed by the activation fused into
    its kernels runs as one call (:meth:`TunedLinear.fused`), the activation module still in
    its place: the layer called alone computes the linear layer alone, the sequence computes
    what it did. Checked on every call: where the next module is not that activation any more,
    or either has hooks, or global module hooks are registered, both run as modules, one after
    the other (an ``nn.Sequential``'s own call). ``tune_module`` gives a copied sequence this
    class; its children and ``state_dict`` are the sequence's."""

    def forward(self, input):  # noqa: A002 - nn.Sequential's name
        modules = list(self._modules.values())
        last, index = len(modules) - 1, 0
        while index <= last:
            module = modules[index]
            if (type(module) is TunedLinear and module.activation is not None and index < last
                    and activation_of_module(modules[index + 1]) == module.kernels.activation
                    and not hooked(module) and not hooked(modules[index + 1]) and not global_hooks()):
                input = module.fused(input)
                index += 2
            else:
                input = module(input)
                index += 1
        return input


def _kernels_for(layer: TunedLinear, fused: bool):
    """The kernels of ``layer`` that compute its calls from its sequence (``fused``) or alone."""
    return layer.kernels if fused or layer.activation is None else layer.alone


MODEL_BUDGET_S = 0.05  # seconds to time the model, and the tuned model, on one example in one round
# The tuned model keeps its looprl routes on an example only where it wins rounds against the
# model by this margin, by the routes' rule (looprl.torch.routes.shown_faster): the layers' own
# judgements already asked for ROUTE_MARGIN, so here little more than a tie is asked (a round
# is won where the model took at least 1% longer: an equal time is no win).
MODEL_MARGIN = 0.01
MODEL_ROUNDS = 3  # after routing to torch, interleaved rounds to time both again for the report (each side's best)
MODEL_TOLERANCE = 1.03  # after routing to torch, a tuned model slower than this times the model's is reported (timing noise)


def _check_against_the_model(module: nn.Module, tuned: nn.Module, examples: list[tuple], per_example: list[dict],
                             replacements: dict, progress: bool) -> None:
    """Time ``tuned`` against ``module`` on each example in interleaved rounds, by the routes'
    rule (:func:`~looprl.torch.routes.shown_faster`, :data:`MODEL_MARGIN`); where the tuned model is
    not shown faster, give the row counts that example gave each layer to torch
    (:meth:`LinearKernels.route_to_torch`) and time again. A layer judged alone runs with its weights warm in the cache; in a model,
    the other layers' weights (and looprl's copies and packed forms of them) compete for it,
    which the judgement cannot see. Still slower after that: a ``RuntimeWarning``.

    Both are timed as copies, in the modes they are in (a model in train mode is timed in train
    mode): a call may change a module's state (BatchNorm's running statistics advance in train
    mode), and neither the given model nor the tuned one returned may keep what thousands of
    timing calls did to it. The tuned copy shares its tuned layers with ``tuned`` (they hold no
    state a call changes), so routes given to torch here are the returned model's."""
    module = _copy(module)
    tuned = _copy(tuned, {id(layer): layer for layer in replacements.values()})
    for number, (args, seen) in enumerate(zip(examples, per_example), start=1):
        seen = {key: rows for key, rows in seen.items() if key[0] in replacements}
        if all(_kernels_for(replacements[layer], fused).runs_torch(count) for (layer, fused), rows in seen.items() for count in rows):
            continue  # nothing of looprl's runs on this example (nothing seen, or all torch's already)
        duel, = interleaved_duels([((tuned, args), (module, args))], MODEL_BUDGET_S, MODEL_MARGIN)
        tuned_s = duel.challenger_s
        if duel.shown_faster(MODEL_MARGIN):
            if progress:
                print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, the model {1e3 * duel.incumbent_s:.3f} ms "
                      f"(faster in {duel.wins} of {duel.rounds} rounds)", file=sys.stderr, flush=True)
            continue
        for (layer, fused), rows in seen.items():
            _kernels_for(replacements[layer], fused).route_to_torch(rows)
        original_s, routed_s = interleaved_best_seconds([(module, args), (tuned, args)], MODEL_BUDGET_S, MODEL_ROUNDS)
        if progress:
            print(f"looprl: example {number}: the tuned model {1e3 * tuned_s:.3f} ms, not shown faster than the model's "
                  f"{1e3 * duel.incumbent_s:.3f} ms (faster in {duel.wins} of {duel.rounds} rounds); its rows routed to torch "
                  f"in {len({layer for layer, _ in seen})} layer(s): now {1e3 * routed_s:.3f} ms against {1e3 * original_s:.3f} ms", file=sys.stderr, flush=True)
        if routed_s > MODEL_TOLERANCE * original_s:
            warnings.warn(f"tune_module: on example {number} the tuned model took {1e3 * routed_s:.3f} ms against the model's "
                          f"{1e3 * original_s:.3f} ms, its layers routed to torch (the calls' own cost, or timing noise)",
                          RuntimeWarning, stacklevel=4)


def _put_back_where_torch_runs_everything(tuned: nn.Module, answer: nn.Module, replacements: dict, names: dict, left: dict) -> nn.Module:
    """Put each linear layer that its routes give to torch at every row count tuned (and that is
    not fused with an activation) back in ``tuned`` as it was: a :class:`TunedLinear` that only
    passes its calls on to torch costs a route lookup and a count per call (about 2 us: on a
    one-token decode step of a model of a hundred linear layers, the difference between 1.0x
    and 0.98x). It is named in ``left`` with :data:`TORCH_EVERYWHERE`. Returns the answer (the
    layer itself, where the whole module was one)."""
    for layer, replacement in list(replacements.items()):
        kernels = replacement.all_kernels()
        if replacement.activation is not None or not all(k.routes and all(k.runs_torch(rows) for rows in k.routes) for k in kernels):
            continue
        for parent in list(tuned.modules()):
            for name, child in list(parent._modules.items()):
                if child is replacement:
                    setattr(parent, name, layer)
        left[names[layer]] = TORCH_EVERYWHERE
        del replacements[layer]
        if answer is replacement:
            answer = layer
    return answer


def _fusions(module: nn.Module, tunable) -> dict[nn.Linear, tuple[nn.Sequential, int]]:
    """Layers of ``tunable`` followed, in an ``nn.Sequential``, by an activation we fuse (one
    without hooks): layer -> (the sequential, the activation's index)."""
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
            if layer in tunable and activation_of_module(following) is not None and not hooked(following) and registered[layer] == 1:
                found[layer] = (parent, i + 1)
    return found


def tune_module(module: nn.Module, example_inputs, *, policy="default", target=None, budget_s=None, cache=None,
                fuse: bool = True, threads: int = 1, max_rows: int | None = None, records=None,
                compare_torch: bool = True, progress: bool = True, frozen: bool = False, measure: bool = True) -> nn.Module:
    """A copy of ``module`` whose float32 or bfloat16 CPU ``nn.Linear`` layers run looprl
    kernels tuned for the shapes ``example_inputs`` give them (see :mod:`looprl.torch`); a
    bfloat16 layer (parameters and inputs) gets bfloat16 kernels (:mod:`looprl.ir.dtypes`).

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
    :class:`ContentCache`), which costs a read of the weights per call. With ``frozen``,
    transformers' ``Conv1D`` layers (GPT-2's projections) are tuned too, each as an
    ``nn.Linear`` over its weight transposed once (:mod:`looprl.torch.conv1d`); without it they
    stay torch's, named in ``stats()["left_to_torch"]``.
    Row counts up to :data:`COLD_ROWS` are tuned with the bytes the other layers' weights hold
    read between two calls (:attr:`~looprl.ir.problem.Problem.between`: a decode step reads
    every other layer's weight before it calls a layer again; named cold where that reaches
    twice the last-level cache).
    ``measure``: as in :func:`looprl.tune`; False is the fast path: each layer shape's row
    counts are scheduled by the policy alone (its greedy episode, the answer timed once),
    nothing searched, so a whole model is prepared in seconds; the routes to torch are judged
    as with measured tuning, and the progress lines and routes' table say which answers came
    from the policy alone. ``records`` (measured answers) cannot be given with it.
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
    fuse = checks.flag(fuse, "fuse")
    measure = checks.flag(measure, "measure")
    if records is not None and not measure:
        raise ValueError("records (measured answers to reuse) and measure=False (the policy's answers alone) exclude each other: "
                         "pass one or the other")
    examples = _as_examples(example_inputs)
    cache = open_cache(cache)  # one cache for every layer (a ":memory:" one included)
    if records is not None:
        cache.import_tuned(read_tuned_records(records))
    with torch.random.fork_rng(devices=[]):  # the examples' runs (Dropout) and the timing draw from it: the user's state restored
        return _tune(module, examples, cache, fuse, max_rows, compare_torch, progress, frozen,
                     {"policy": policy, "cache": cache, "budget_s": budget_s, "target": target, "threads": threads,
                      "weights_change": not frozen, "measure": measure})  # followed weights: a re-laid copy is compared on every call


def _tune(module: nn.Module, examples: list[tuple], cache, fuse: bool, max_rows, compare_torch: bool, progress: bool, frozen: bool,
          tuning: dict) -> nn.Module:
    """:func:`tune_module` past its arguments' checks (``tuning``: :func:`looprl.tune`'s keyword arguments)."""
    # What is returned: never called here, so its state is the given module's. With frozen, transformers' Conv1D layers
    # become nn.Linear layers over their weights transposed once (looprl.torch.conv1d); else they are named in left.
    tuned, left = linear_conv1d(_copy(module), frozen)  # left: the linear layers left to torch, name -> why
    tunable = []
    for name, layer in tuned.named_modules():
        if isinstance(layer, nn.Linear):
            why = _left_to_torch(layer)
            if why is None:
                tunable.append(layer)
            else:
                left[name] = why
    # What the examples run (a call may change a module's state: BatchNorm's statistics in train mode): a copy of tuned
    # before any call, so the same modules in the same order, its Conv1D layers already linear.
    probe = _copy(tuned)
    to_tuned = dict(zip(probe.modules(), tuned.modules()))
    to_probe = {t: p for p, t in to_tuned.items()}
    fusions = _fusions(tuned, set(tunable)) if fuse else {}
    probe_fusions = {to_probe[layer]: (to_probe[sequence], index) for layer, (sequence, index) in fusions.items()}
    per_example = [{(to_tuned[layer], fused): rows for (layer, fused), rows in seen.items()}
                   for seen in _record_rows(probe, examples, [to_probe[layer] for layer in tunable], probe_fusions)]
    del probe, to_tuned, to_probe
    rows_seen: dict[tuple, set[int]] = {}  # (layer, fused) -> rows: a fused layer's calls from its sequence, and alone
    for seen in per_example:
        for key, rows in seen.items():
            rows_seen.setdefault(key, set()).update(rows)
    names = {layer: name for name, layer in tuned.named_modules()}
    called = {layer for layer, _ in rows_seen}
    for layer in tunable:
        if layer not in called:
            left[names[layer]] = NOT_CALLED
    results: dict[str, TuneResult] = {}  # by problem name: layers of one shape share a kernel
    planned = {}  # (layer, fused) -> (its fused activation module or None, row count -> TuneResult, its layer shape)
    shapes = set()  # the layer shapes tuned so far
    started = time.perf_counter()
    model_bytes = weight_bytes(layer.weight for layer in called)
    for (layer, fused), rows in rows_seen.items():
        activation_module = fusions[layer][0][fusions[layer][1]] if fused else None
        activation = activation_of_module(activation_module) if activation_module is not None else None
        shape_started = time.perf_counter()
        per_rows = tune_layer(layer.in_features, layer.out_features, layer.bias is not None, activation, rows, max_rows, model_bytes,
                              results, tuning, dtype=as_dtype(layer.weight.dtype))
        shape = layer_shape(per_rows)
        if progress and shape not in shapes:
            how = " (the policy alone)" if not tuning["measure"] else ""
            print(f"looprl: tuned {shape_words(layer.in_features, layer.out_features, activation)} for rows "
                  f"{', '.join(map(str, sorted(per_rows)))} in {time.perf_counter() - shape_started:.1f} s{how}", file=sys.stderr, flush=True)
        shapes.add(shape)
        planned[layer, fused] = (activation_module, per_rows, shape)
    exported = cache.export_tuned(tuned_names(results.values()))  # one read of the cache for every layer's records
    judged: dict[tuple, dict] = {}  # a layer shape's routes: judged once, shared by its layers

    def records_of(per_rows):
        problem_names = tuned_names(per_rows.values())
        return [record for record in exported if tuned_problem_name(record["problem"]) in problem_names]

    replacements: dict[nn.Linear, TunedLinear] = {}
    for layer in dict.fromkeys(layer for layer, _ in planned):  # each layer once, in order
        fused, alone = planned.get((layer, True)), planned.get((layer, False))
        if fused is not None:
            activation_module, per_rows, shape = fused
            if alone is not None:  # a fused layer also called alone: its own kernels for that
                alone = LinearKernels(layer.in_features, layer.out_features, None, alone[1], records_of(alone[1]), judged.get(alone[2]),
                                      frozen)
        else:
            (activation_module, per_rows, shape), alone = alone, None
        replacement = replacements[layer] = TunedLinear(layer, activation_module, per_rows, records_of(per_rows), judged.get(shape), frozen,
                                                        alone)
        if compare_torch:
            for kernels in replacement.all_kernels():
                shape = layer_shape(kernels.results)
                if shape not in judged:
                    judged[shape] = kernels.judge(layer.weight.detach(), None if layer.bias is None else layer.bias.detach())
    for parent in list(tuned.modules()):
        for name, child in list(parent._modules.items()):  # every registration, a shared layer's too
            if child is not None and child in replacements:
                setattr(parent, name, replacements[child])
    for layer, (sequence, _) in fusions.items():
        if layer in replacements and replacements[layer].activation is not None:
            sequence.__class__ = FusedSequential  # the activation stays in its place; the sequence runs the pair as one call
    answer = replacements.get(tuned, tuned)  # a module that is itself a tuned layer is replaced whole
    judged_layers = list(replacements.values())  # for the route table, those put back below included
    if compare_torch and replacements:
        _check_against_the_model(module, answer, examples, per_example, replacements, progress)
        for replacement in replacements.values():
            for kernels in replacement.all_kernels():
                kernels.forget_calls()
        answer = _put_back_where_torch_runs_everything(tuned, answer, replacements, names, left)
    if left:
        answer.__dict__[LEFT_TO_TORCH] = left  # a plain attribute (stats() reads it), not a registered one
    if progress and judged_layers:
        print(route_table(kernels_by_shape(judged_layers)), file=sys.stderr, flush=True)
        print(f"looprl: {len(shapes)} layer shape(s), {len(replacements)} layer(s) in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    if not replacements:
        reasons = "; ".join(f"{name or 'the module'}: {why}" for name, why in left.items())
        warnings.warn("tune_module tuned no layer: no float32 or bfloat16 CPU torch.nn.Linear in the module was called with a CPU input of its dtype "
                      "by the examples and free to be replaced" + (f" (left to torch: {reasons})" if reasons else "")
                      + "; the copy returned runs as the module does", RuntimeWarning, stacklevel=3)
    return answer
