"""What a linear call that looprl routes to torch costs above torch's own call (issue 63: "a routed
or tuned call costs at most 5 us more than torch's own call of the same layer").

    python experiments/routed_calls.py [--layers 64x64,512x512,512x1408,...] [--rounds 7] [--threads 1] [--out PATH]

Each layer (``in x out``, no bias, no activation: a decode step's projection) is compiled by the
backend (``torch.compile(..., backend="looprl")``, Inductor's freezing, the policy's answers alone)
and its one-row calls are then routed to torch (``LinearKernels.route_to_torch``), as tune_module
routes a row count where torch timed faster. One row, the weight warm, called from Python the
way an Inductor graph calls them (``torch.ops``), interleaved, best of ``--rounds`` timings of
2000 calls each:

* ``native``: ``looprl_native::linear``, which makes torch's call itself (``aten::linear``);
* ``python``: ``looprl::linear``, the Python operator (its lookup, its count, ``functional.linear``):
  what each routed call of the native operator cost before it made torch's call itself (it then
  went on to this operator, after its own table lookup);
* ``torch``: ``aten::linear`` itself;
* ``onednn``: oneDNN's linear on the weight packed once (``torch.ops.mkldnn._reorder_linear_weight``,
  then ``_linear_pointwise``), torch's faster path on AMD: the strongest peer's call of the layer.

Writes ``<out>.txt`` (what it prints); default
``experiments/results/routed_calls_<llvm cpu>[_t<threads>]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CALLS = 2000
LAYERS = "64x64,512x512,512x768,512x2816,1408x512"  # in x out: a small layer, then the Qwen2-style config's decode projections


def best_us(function, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(CALLS):
            function()
        best = min(best, (time.perf_counter() - began) / CALLS)
    return best * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default=LAYERS, help=f"in x out, comma-separated (default {LAYERS})")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="the result's path without .txt")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    try:
        shapes = [tuple(int(size) for size in layer.split("x")) for layer in args.layers.split(",")]
    except ValueError:
        parser.error(f"--layers takes in x out sizes, comma-separated, not {args.layers!r}")
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--layers takes two positive sizes per layer, not {args.layers!r}")
    caches = tempfile.mkdtemp(prefix="routed_calls_")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", caches + "/inductor")
    import torch
    import torch._inductor.config as inductor_config

    from looprl import dynamo
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu
    from looprl.torch import native
    from looprl.torch.routes import TORCH_FASTER

    out = args.out or RESULTS / (f"routed_calls_{host_cpu()[0]}" + ("" if args.threads == 1 else f"_t{args.threads}"))
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/routed_calls.py --layers {args.layers} --rounds {args.rounds}"
        + (f" --threads {args.threads}" if args.threads > 1 else ""))
    log(f"{cpu_model_name()} ({host_cpu()[0]}), {args.threads} thread(s), torch {torch.__version__}; one row, the weight warm, "
        f"best of {args.rounds} timings of {CALLS} calls, microseconds a call")
    if native.library() is None:
        raise SystemExit(f"the native operator is not available: {native.unavailable()}")
    torch.set_num_threads(args.threads)
    options = {"cache": caches + "/looprl.sqlite", "compare_torch": False, "measure": False, "rest": "eager", "max_rows": 2}
    log(f"{'layer':>10} {'native':>8} {'python':>8} {'torch':>8} {'onednn':>8} {'native - torch':>15} {'python - torch':>15}"
        "  calls counted as routed")
    for in_features, out_features in shapes:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).eval()
        before = set(dynamo._layers)
        compiled = torch.compile(module, backend="looprl", dynamic=True, options=options)
        with inductor_config.patch(freezing=True), torch.no_grad():
            compiled(torch.randn(2, in_features))
        index = min(set(dynamo._layers) - before)
        kernels = dynamo._layers[index]
        kernels.route_to_torch([1])
        weight, x = module[0].weight.detach(), torch.randn(1, in_features)
        native_op, python_op, aten = torch.ops.looprl_native.linear.default, torch.ops.looprl.linear.default, torch.ops.aten.linear.default
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        onednn = torch.ops.mkldnn._linear_pointwise
        timed = {"native": lambda: native_op(x, weight, None, index), "python": lambda: python_op(x, weight, None, index),
                 "torch": lambda: aten(x, weight), "onednn": lambda: onednn(x, packed, None, "none", [], "none")}
        best = {name: float("inf") for name in timed}
        with torch.no_grad():
            expected = aten(x, weight)
            torch.testing.assert_close(timed["onednn"](), expected, rtol=1e-4, atol=1e-4)
            for name in ("native", "python"):
                if not torch.equal(timed[name](), expected):
                    raise RuntimeError(f"{name} computed another answer than torch's call")
            counted = kernels.counted().get(TORCH_FASTER, 0)
            for _ in range(args.rounds):
                for name, function in timed.items():
                    best[name] = min(best[name], best_us(function, 1))
        routed = kernels.counted().get(TORCH_FASTER, 0) - counted
        log(f"{in_features:>4}x{out_features:<5} {best['native']:8.2f} {best['python']:8.2f} {best['torch']:8.2f} {best['onednn']:8.2f} "
            f"{best['native'] - best['torch']:+15.2f} {best['python'] - best['torch']:+15.2f}  {routed} of {2 * args.rounds * CALLS}")
        del compiled
        torch._dynamo.reset()
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
