"""What a layer of ``tune_module``'s copy costs per call above the ``nn.Linear`` it replaced
(issue 63: "a routed or tuned call costs at most 5 us more than torch's own call of the same
layer"), in the default path (weights followed) and with ``frozen=True``.

    python experiments/module_calls.py [--layers 64x64,512x512,...] [--rounds 9] [--out PATH]

Each layer (``in x out``, no bias: a decode step's projection) is an ``nn.Linear`` in an
``nn.Sequential``, tuned by ``tune_module`` for one row (the policy's answers alone,
``compare_torch=False``), once followed and once frozen. One row, the weight warm, each module
called from Python as a model calls it (``module(x)``, under ``torch.no_grad()``), interleaved,
best of ``--rounds`` timings of 2000 calls each, microseconds a call:

* ``torch``: the ``nn.Linear`` itself;
* ``default`` and ``frozen``: the tuned layer running looprl's kernel (for a layer this small the
  kernel takes a fraction of a microsecond: the rest is the call's own cost);
* ``default routed`` and ``frozen routed``: the same layer with its one-row calls routed to torch
  (``LinearKernels.route_to_torch``), as the judged routes do where torch timed faster.

Every call's answer is checked against the ``nn.Linear``'s first (float32 tolerance; the routed
ones bit for bit). Writes ``<out>.txt`` (what it prints); default
``experiments/results/module_calls_<llvm cpu>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CALLS = 2000
LAYERS = "64x64,512x512,512x1408,1408x512"  # in x out: a small layer, then the Qwen2-style config's decode projections
MODES = ("torch", "default", "frozen", "default routed", "frozen routed")


def best_us(function, calls: int = CALLS) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - began) / calls * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default=LAYERS, help=f"in x out, comma-separated (default {LAYERS})")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None, help="the result's path without .txt")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        shapes = [tuple(int(size) for size in layer.split("x")) for layer in args.layers.split(",")]
    except ValueError:
        parser.error(f"--layers takes in x out sizes, comma-separated, not {args.layers!r}")
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--layers takes two positive sizes per layer, not {args.layers!r}")
    import torch

    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu
    from looprl.torch import TunedLinear, tune_module

    out = args.out or RESULTS / f"module_calls_{host_cpu()[0]}"
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/module_calls.py --layers {args.layers} --rounds {args.rounds}")
    log(f"{cpu_model_name()} ({host_cpu()[0]}), 1 thread, torch {torch.__version__}; one row, the weight warm, best of {args.rounds} "
        f"interleaved timings of {CALLS} calls, microseconds a call; each tuned layer minus torch's in brackets")
    log(f"{'layer':>10} " + " ".join(f"{mode:>22}" for mode in MODES))
    torch.set_num_threads(1)
    cache = tempfile.mkdtemp(prefix="module_calls_") + "/looprl.sqlite"
    for in_features, out_features in shapes:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).eval()
        x = torch.randn(1, in_features)
        layers = {"torch": model[0]}
        for frozen in (False, True):
            for routed in (False, True):
                tuned = tune_module(model, x, frozen=frozen, measure=False, compare_torch=False, progress=False, cache=cache)
                layer = tuned[0]
                if not isinstance(layer, TunedLinear):
                    raise SystemExit(f"{in_features}x{out_features}: tune_module left the layer to torch")
                if routed:
                    for kernels in layer.all_kernels():
                        kernels.route_to_torch([1])
                layers[("frozen" if frozen else "default") + (" routed" if routed else "")] = layer
        best = {mode: float("inf") for mode in MODES}
        with torch.no_grad():
            expected = layers["torch"](x)
            for mode, layer in layers.items():
                got = layer(x)
                if mode.endswith("routed"):
                    if not torch.equal(got, expected):
                        raise RuntimeError(f"{mode} computed another answer than torch's call")
                else:
                    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            for _ in range(args.rounds):
                for mode in MODES:
                    layer = layers[mode]
                    best[mode] = min(best[mode], best_us(lambda: layer(x)))
        cells = [f"{best['torch']:22.2f}"] + [f"{best[mode]:13.2f} ({best[mode] - best['torch']:+6.2f})" for mode in MODES[1:]]
        log(f"{in_features:>4}x{out_features:<5} " + " ".join(cells))
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
