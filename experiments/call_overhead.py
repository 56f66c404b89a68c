"""What a tuned layer's call costs beyond the arithmetic: a ``TunedLinear`` routed to torch, one
running looprl's kernel (weights followed, and frozen), against torch's own call of the layer.

    python experiments/call_overhead.py [--shapes 64x64,896x896,896x4864] [--rows 1] [--rounds 15] [--calls 200]

Per shape (``IN x OUT``: in_features by out_features, float32, with a bias, ``--rows`` rows),
each way of computing the layer is called ``--calls`` times in a row, under ``torch.no_grad()``
(as ``generate`` calls a model) and on one thread; the ways take turns, ``--rounds`` rounds,
each round starting at the next way in turn (a slow phase of the machine hits each alike), and
the best round's microseconds per call are printed:

* ``F.linear``: ``torch.nn.functional.linear(x, weight, bias)``;
* ``oneDNN packed``: oneDNN's linear on the weight packed once beforehand
  (``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``, as
  :mod:`looprl.bench.torch_baseline` times it): torch's faster path on AMD;
* ``nn.Linear``: the layer's own module call (what a model calls: ``nn.Module.__call__`` and
  then ``F.linear``), the reference of issue 63's target (a routed or tuned call at most 5 us more);
* ``routed``: the ``TunedLinear`` from ``tune_module(layer, x, measure=False, compare_torch=False)``
  with its row count routed to torch (``LinearKernels.route_to_torch``): torch computes, looprl decides;
* ``kernel``: the frozen layer's kernel (bound, or reading the weight in place) called on
  addresses, its output allocated once: the arithmetic without any of the module's Python;
* ``frozen``: the same ``TunedLinear`` with ``frozen=True`` (bound once, nothing compared);
* ``followed``: the same with the weights followed (its default: the weight compared with its
  kept copy on every call, which is a read of the weight, not call overhead).

Then the routed call minus ``nn.Linear`` and the frozen call minus ``kernel``: the routing's and
the tuned call's own cost. At 64x64 the arithmetic is almost nothing and these differences
are the Python of each call; at Qwen2-0.5B's 896x896 and 896x4864 (the weight in the last-level
cache, or not) the ways' times also move with what else reads memory. Prints only (no result file): the figures are a development check,
and they vary with the host and what else runs on it.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as functional
from torch import nn

from looprl.torch import tune_module
from looprl.torch.rows import InPlaceKernel


def per_call_us(call, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return 1e6 * (time.perf_counter() - started) / calls


def ways(in_features: int, out_features: int, rows: int) -> dict:
    """The calls compared, by name, each a function of no arguments."""
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features).eval()
    x = torch.randn(rows, in_features)
    options = {"measure": False, "compare_torch": False, "progress": False, "cache": ":memory:"}
    followed = tune_module(layer, x, **options)
    frozen = tune_module(layer, x, frozen=True, **options)
    routed = tune_module(layer, x, **options)
    routed.kernels.route_to_torch([rows])
    weight, bias = layer.weight, layer.bias
    plan, _, _ = frozen.kernels._plan_of(rows)
    (start, length, count), = plan
    kernels = frozen.kernels
    kernel = (InPlaceKernel(kernels._kernels[count], weight, bias) if count in kernels.in_place  # reads the weight where it lies
              else kernels._frozen.get(weight, bias)[count])
    workspace = frozen.kernels._scratch(count, kernel)[0]
    out = torch.empty(rows, out_features)
    with torch.no_grad():
        expected = layer(x)
        for name, module in (("routed", routed), ("frozen", frozen), ("followed", followed)):
            got = module(x)
            same = torch.equal(got, expected) if name == "routed" else torch.allclose(got, expected, rtol=1e-4, atol=1e-4)
            if not same:
                raise SystemExit(f"{name} computed another answer than the layer")
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
    return {"F.linear": lambda: functional.linear(x, weight, bias),
            "oneDNN packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias.detach(), "none", [], "none"),
            "nn.Linear": lambda: layer(x), "routed": lambda: routed(x),
            "kernel": lambda: kernel.address_call(out.data_ptr(), workspace, x.data_ptr()), "frozen": lambda: frozen(x),
            "followed": lambda: followed(x)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="64x64,896x896,896x4864", help="IN x OUT per layer, comma-separated")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.calls < 1:
        parser.error("--rows, --rounds and --calls must be at least 1")
    torch.set_num_threads(1)
    print(f"one thread, {args.rows} row(s), best of {args.rounds} interleaved rounds of {args.calls} calls; us per call")
    for shape in args.shapes.split(","):
        in_features, out_features = (int(side) for side in shape.split("x"))
        calls = ways(in_features, out_features, args.rows)
        names = list(calls)
        best = {name: float("inf") for name in names}
        with torch.no_grad():
            for name in names:  # warm: the first calls bind, allocate and page in
                per_call_us(calls[name], 10)
            for round_ in range(args.rounds):
                turn = round_ % len(names)
                for name in names[turn:] + names[:turn]:
                    best[name] = min(best[name], per_call_us(calls[name], args.calls))
        figures = "  ".join(f"{name} {best[name]:7.2f}" for name in names)
        print(f"{args.rows}x{in_features}->{out_features}: {figures}  |  routed - nn.Linear {best['routed'] - best['nn.Linear']:+.2f}, "
              f"frozen - kernel {best['frozen'] - best['kernel']:+.2f}, frozen - nn.Linear {best['frozen'] - best['nn.Linear']:+.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
