"""What the tuned layers of a model did and hold: their calls, routes and tuned records.

:func:`stats` counts the calls each tuned layer's kernels served and the fallbacks, by reason;
:func:`route_table` prints the layers' routes (looprl's time, torch's, which one runs);
:func:`save_records` writes the tuned answers so that another process compiles them again
instead of tuning.
"""

from __future__ import annotations

from torch import nn

from looprl.ir.rewrites import plan_rewrites
from looprl.tune.store import remembered_names
from looprl.measurement.tuned_records import write_tuned_records
from looprl.torch.layers import TunedLinear, layer_shape
from looprl.torch.routes import LinearKernels


LEFT_TO_TORCH = "_looprl_left_to_torch"  # tune_module's answer holds, under this attribute, its linear layers left to torch: name -> why


def shape_words(in_features: int, out_features: int, activation: str | None) -> str:
    return f"linear {in_features}->{out_features}" + (f" +{activation}" if activation else "")


def kernels_by_shape(layers) -> list[LinearKernels]:
    """The kernels of ``layers`` (TunedLinear modules: fused, and alone), one per layer shape, in order."""
    seen, found = set(), []
    for layer in layers:
        for kernels in layer.all_kernels():
            shape = layer_shape(kernels.results)
            if shape not in seen:
                seen.add(shape)
                found.append(kernels)
    return found


def route_table(kernels: list[LinearKernels]) -> str:
    """A table, one line per layer shape and judged row count: looprl's time, torch's time and
    which one runs (see :meth:`LinearKernels.judge`). ``kernels``: e.g.
    ``kernels_by_shape(layer for _, layer in tuned_layers(model))``."""
    lines = [f"{'layer shape':>28} {'rows':>6} {'looprl ms':>10} {'torch ms':>10} {'looprl/torch':>12} {'won':>6} "
             f"{'schedule from':>13}  runs"]
    for layer in kernels:
        words = shape_words(layer.in_features, layer.out_features, layer.activation)
        if not layer.routes:
            sources = "/".join(sorted({SOURCES[result.mode] for result in layer.results.values()}))
            lines.append(f"{words:>28} {'all':>6} {'-':>10} {'-':>10} {'-':>12} {'-':>6} {sources:>13}  looprl (not compared)")
        for rows, route in sorted(layer.routes.items()):
            source = SOURCES[layer.results[rows].mode] if rows in layer.results else "-"
            lines.append(f"{words:>28} {rows:>6} {1e3 * route.looprl_s:>10.4f} {1e3 * route.torch_s:>10.4f} "
                         f"{route.torch_s / route.looprl_s:>11.2f}x {won(route):>6} {source:>13}  {route.runs}"
                         + (" (by the model's timing)" if route.decided_by == "model" else ""))
    return "\n".join(lines)


def won(route) -> str:
    """The rounds looprl won of those timed, as ``"wins/rounds"`` (``"-"``: a route given only its times)."""
    return "-" if route.rounds is None else f"{route.wins}/{route.rounds}"


# Where a tuned row count's schedule came from, by TuneResult.mode: a measured search, the
# cache (an earlier measured search) or the policy alone (measure=False).
SOURCES = {"measured": "search", "remembered": "cache", "policy": "policy alone"}


def tuned_names(results) -> set[str]:
    """The problems tune remembered answers under for ``results``: a linear layer's from its
    weight's re-laid start and, with few rows, as stored as well (both remembered, so that a
    tune from the records makes the same choice between them; :func:`looprl.tune.store.
    remembered_names`), through its fused view if it has one."""
    names = set()
    for result in results:
        names.update((result.problem.name, *remembered_names(plan_rewrites(result.problem).searched)))
    return names


def save_records(module: nn.Module, path) -> int:
    """Write what was tuned for ``module``'s tuned layers (the answers :func:`tune_module`
    found or remembered, as its cache held them) to ``path``, a JSON file of
    :mod:`looprl.measurement.tuned_records`; how many records. Load it with
    ``tune_module(model, example, records=path)``, in another process or on another machine."""
    unique = {}
    for _, layer in tuned_layers(module):
        for record in layer.records:
            unique[(record["host"], record["problem"])] = record
    write_tuned_records(path, list(unique.values()))
    return len(unique)


def tuned_layers(module: nn.Module) -> list[tuple[str, TunedLinear]]:
    """The :class:`TunedLinear` layers of ``module``, with their names."""
    return [(name, layer) for name, layer in module.named_modules() if isinstance(layer, TunedLinear)]


def stats(module: nn.Module) -> dict:
    """How the tuned layers of ``module`` served their calls so far: ``looprl_calls`` (a looprl
    kernel computed the call), ``fallback_calls`` (the original layer did) and ``fallbacks``
    (why: ``{reason: calls}``, the reasons of :meth:`TunedLinear.why_not`), in all and per
    layer (``layers``: name -> the same three and ``routes``: judged row count ->
    ``{"looprl_ms", "torch_ms", "runs", "decided_by", "wins", "rounds"}``, see :meth:`LinearKernels.judge`; and
    ``routes_alone``, those of a fused layer's kernels without its activation, where it was
    also called alone). Calls routed to
    torch are fallbacks for the reason :data:`TORCH_FASTER`. ``left_to_torch``: the linear
    layers :func:`tune_module` did not replace, name -> why (hooks, parametrizations, pruning,
    weight norm, a layer the examples never called, ...)."""
    layers = tuned_layers(module)
    summary = summarise_calls({name: layer.counted() for name, layer in layers})
    for name, layer in layers:
        summary["layers"][name]["routes"] = route_summary(layer.kernels)
        if layer.alone is not None:  # a fused layer also called alone: the routes of its kernels without the activation
            summary["layers"][name]["routes_alone"] = route_summary(layer.alone)
    summary["left_to_torch"] = left_to_torch(module)
    return summary


def left_to_torch(module: nn.Module) -> dict[str, str]:
    """The linear layers that :func:`tune_module` left to torch in ``module`` (or in a tuned
    model inside it), by name, with the reason."""
    found = {}
    for prefix, sub in module.named_modules():
        for name, why in sub.__dict__.get(LEFT_TO_TORCH, {}).items():
            found[".".join(part for part in (prefix, name) if part)] = why
    return found


def route_summary(kernels: LinearKernels) -> dict[int, dict]:
    """A layer's routes as plain values: row count -> ``{"looprl_ms", "torch_ms", "runs",
    "decided_by", "wins", "rounds"}`` (the rounds looprl won of those timed; None for a route
    given only its times)."""
    return {rows: {"looprl_ms": 1e3 * route.looprl_s, "torch_ms": 1e3 * route.torch_s, "runs": route.runs, "decided_by": route.decided_by,
                   "wins": route.wins, "rounds": route.rounds}
            for rows, route in sorted(kernels.routes.items())}


def summarise_calls(counted: dict) -> dict:
    """``{"looprl_calls", "fallback_calls", "fallbacks", "layers"}`` from each layer's calls by
    outcome (``"looprl"`` or a fallback's reason -> calls), keyed as ``counted`` is."""
    layers = {}
    for key, calls in counted.items():
        fallbacks = {why: count for why, count in calls.items() if why != "looprl"}
        layers[key] = {"looprl_calls": calls.get("looprl", 0), "fallback_calls": sum(fallbacks.values()), "fallbacks": fallbacks}
    total: dict[str, int] = {}
    for entry in layers.values():
        for why, count in entry["fallbacks"].items():
            total[why] = total.get(why, 0) + count
    return {"looprl_calls": sum(e["looprl_calls"] for e in layers.values()), "fallback_calls": sum(total.values()),
            "fallbacks": total, "layers": layers}
