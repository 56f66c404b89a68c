"""What comparing the weights costs a tuned layer's call (``looprl.torch.ContentCache``), one row
at a time (a decode step).

    python experiments/content_cache_cost.py [--shapes 768x3072,1024x1024] [--rows 1] [--rounds 5]
        [--budget 0.2] [--threads 1] [--quick] [--out experiments/results]

For each ``IN``x``OUT`` of ``--shapes``, an ``nn.Linear(IN, OUT)`` (random weights, bias) is
tuned for ``--rows`` rows by ``tune_module`` twice, in one private measurement cache (the
second tune is a lookup): as given (every call compares the weight and bias with the copies its
kernels were bound from) and with ``frozen=True`` (bound once, nothing compared); both with
``compare_torch=False``, so that every call runs looprl's kernel. Then, in ``--rounds``
interleaved rounds, each timed by looprl's rule for ``--budget`` seconds (best kept, one
``--rows``-row input, ``torch.inference_mode()``):

- ``call``: the tuned layer's call (comparison, kernel);
- ``comparison``: ``ContentCache.get(weight, bias)`` of a cache already derived from them
  (what a call adds to compare, and nothing else);
- ``frozen_call``: the ``frozen=True`` layer's call (the kernel with nothing compared);
- ``f_linear``: ``torch.nn.functional.linear``, what the original layer runs;
- ``onednn_packed``: oneDNN's linear on the weight packed once outside the timed call
  (``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``: what Inductor's
  freezing runs for ``nn.Linear``), the faster torch path on AMD hosts.

Prints a table and writes ``<out>/content_cache_cost_<cpu>.json`` (``_rows<N>_<cpu>`` for
``--rows`` other than 1; the CPU as
``looprl.backend.host.cpu_model_name()`` reports it, in lower case, runs of other characters
as ``_``). ``--quick``: a 64x128 layer, 0.05 s a tuned problem, one round of 0.01 s: checks
that the script runs, measures nothing worth keeping.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def shape_pairs(text: str) -> list[tuple[int, int]]:
    """``"768x3072,1024x1024"`` as ``[(768, 3072), (1024, 1024)]`` (in features, out features)."""
    pairs = []
    for part in text.split(","):
        fan_in, fan_out = part.lower().split("x")
        pairs.append((int(fan_in), int(fan_out)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="768x3072,1024x1024", help="IN x OUT of each layer, comma-separated")
    parser.add_argument("--rows", type=int, default=1, help="rows of each call")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds, best kept")
    parser.add_argument("--budget", type=float, default=0.2, help="seconds of timing per figure and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a small layer, short timings: the script runs, nothing worth keeping")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the JSON file")
    args = parser.parse_args(argv)
    shapes = shape_pairs(args.shapes)
    if args.quick:
        shapes, args.rounds, args.budget = [(64, 128)], 1, 0.01

    import torch
    import torch.nn.functional as functional
    from torch import nn

    from _torch_timing import seconds

    from looprl.backend.host import cpu_model_name
    from looprl.torch import ContentCache, tune_module

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for fan_in, fan_out in shapes:
            layer = nn.Sequential(nn.Linear(fan_in, fan_out)).eval()
            x = torch.randn(args.rows, fan_in)
            options = dict(max_rows=args.rows, cache=str(Path(folder) / "layers.sqlite"), threads=args.threads, compare_torch=False,
                           budget_s=0.05 if args.quick else None, progress=False)
            started = time.perf_counter()
            compared = tune_module(layer, x, **options)
            frozen = tune_module(layer, x, frozen=True, **options)
            tune_s = time.perf_counter() - started
            weight, bias = layer[0].weight, layer[0].bias
            cache = ContentCache(lambda *arrays: None)
            cache.get(weight, bias)  # derived once; every later get only compares

            with torch.no_grad():
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), args.rows)
            calls = {
                "call": lambda: compared(x),
                "comparison": lambda: cache.get(weight, bias),
                "frozen_call": lambda: frozen(x),
                "f_linear": lambda: functional.linear(x, weight, bias),
                "onednn_packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""),
            }

            class Call:  # what _torch_timing.seconds times: module(x)
                def __init__(self, function):
                    self.function = function

                def __call__(self, _):
                    return self.function()

            best = {name: float("inf") for name in calls}
            for _ in range(args.rounds):
                for name, function in calls.items():
                    best[name] = min(best[name], seconds(Call(function), x, args.budget))
            with torch.inference_mode():
                same = bool(torch.allclose(compared(x), layer(x), rtol=1e-4, atol=1e-4)
                            and torch.allclose(frozen(x), layer(x), rtol=1e-4, atol=1e-4)
                            and torch.allclose(calls["onednn_packed"](), layer(x), rtol=1e-4, atol=1e-4))
            results[f"{fan_in}x{fan_out}"] = {**{f"{name}_us": round(value * 1e6, 1) for name, value in best.items()},
                                              "allclose": same, "tune_s": round(tune_s, 1)}

    cpu = cpu_model_name()
    print(f"\n{cpu}, {args.threads} thread(s), {args.rows} row(s): µs per call")
    print(f"{'layer':>11} {'call':>8} {'compare':>8} {'frozen':>8} {'F.linear':>8} {'oneDNN':>8}")
    for shape, figures in results.items():
        print(f"{shape:>11} {figures['call_us']:>8.1f} {figures['comparison_us']:>8.1f} {figures['frozen_call_us']:>8.1f} "
              f"{figures['f_linear_us']:>8.1f} {figures['onednn_packed_us']:>8.1f}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = "" if args.rows == 1 else f"_rows{args.rows}"
    from _names import cpu_slug  # the experiments' folder
    path = args.out / f"content_cache_cost{rows}_{cpu_slug(cpu)}.json"
    path.write_text(json.dumps({
        "command": " ".join(["python", "experiments/content_cache_cost.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu, "threads": args.threads, "rows": args.rows, "quick": args.quick, "torch": torch.__version__,
        "rounds": args.rounds, "budget_s": args.budget, "layers": results,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
