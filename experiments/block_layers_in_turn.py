"""The decoder block's tuned layers, each called alone and called in the block's order: how much
slower a layer runs once the other layers' weights have been read since its last call.

    python experiments/block_layers_in_turn.py [--rows 1,5] [--calls 1000] [--passes 3] [--frozen]
        [--threads 1] [--example 64] [--max-rows 512] [--quick] [--out experiments/results]

The block is ``experiments/decoder_lengths.py``'s (width 640, MLP 2560, random weights, 19.7 MB
of float32 weights in its four linear layers), tuned as that experiment tunes it
(``tune_module`` with one example of ``--example`` tokens, ``max_rows=--max-rows``, a private
measurement cache; ``--frozen``: ``frozen=True``). Then, at each row count of ``--rows``, each
tuned layer (qkv, proj, mlp.0, mlp.2, as the block calls them) is called with a random input
of that many rows:

- *alone*: ``--calls`` calls of the same layer in a row, each call timed
  (``time.perf_counter_ns``): its weights stay in the cache between calls;
- *in turn*: ``--calls`` rounds calling the four layers in the block's order, each call timed:
  the other three layers' weights are read between two calls of one.

A layer's figure is the median of its timed calls, the lowest over ``--passes`` passes (each
pass times in turn, then alone). Prints a table and writes
``<out>/block_layers_in_turn[_frozen]_<cpu>.json`` (the CPU as
``looprl.backend.host.cpu_model_name()`` reports it, in lower case, runs of other characters
as ``_``). ``--quick``: a small tune (example 8 tokens, rows up to 8, 0.05 s a problem), 50
calls, one pass: checks that the script runs, measures nothing worth keeping.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def timed_calls_us(call, count: int) -> list[float]:
    """Microseconds of each of ``count`` calls of ``call()``."""
    out = []
    for _ in range(count):
        started = time.perf_counter_ns()
        call()
        out.append((time.perf_counter_ns() - started) / 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,5", help="row counts (tokens) to call the layers with, comma-separated")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per layer (alone) and rounds (in turn), per pass")
    parser.add_argument("--passes", type=int, default=3, help="passes of in turn then alone; the lowest median is kept")
    parser.add_argument("--frozen", action="store_true", help="tune_module(frozen=True): weights bound once, no call compares them")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--example", type=int, default=64, help="tokens of the one example the block is tuned with")
    parser.add_argument("--max-rows", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="a small tune and few calls: the script runs, nothing worth keeping")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the JSON file")
    args = parser.parse_args(argv)
    rows = [int(part) for part in args.rows.split(",") if part.strip()]
    if args.quick:
        args.example, args.max_rows, args.calls, args.passes = 8, 8, 50, 1
        rows = [r for r in rows if r <= args.max_rows] or [1]

    import torch

    from _decoder_block import DecoderBlock

    from looprl.backend.host import cpu_model_name
    from looprl.torch import tune_module, tuned_layers

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    block = DecoderBlock().eval()
    originals = dict(block.named_modules())
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        tuned = tune_module(block, torch.randn(1, args.example, 640), max_rows=args.max_rows, cache=str(Path(folder) / "block.sqlite"),
                            threads=args.threads, frozen=args.frozen, budget_s=0.05 if args.quick else None, progress=False)
        tune_s = time.perf_counter() - started
    layers = tuned_layers(tuned)
    print(f"tuned {len(layers)} layers in {tune_s:.1f} s: {', '.join(name for name, _ in layers)}")

    results: dict[str, dict] = {}
    with torch.inference_mode():
        for count in rows:
            inputs = {name: torch.randn(1, count, originals[name].in_features) for name, _ in layers}
            alone = {name: float("inf") for name, _ in layers}
            in_turn = {name: float("inf") for name, _ in layers}
            for _ in range(args.passes):
                for name, layer in layers:  # warm every kernel first
                    layer(inputs[name])
                times: dict[str, list[float]] = {name: [] for name, _ in layers}
                for _ in range(args.calls):
                    for name, layer in layers:
                        x = inputs[name]
                        times[name] += timed_calls_us(lambda: layer(x), 1)
                for name in times:
                    in_turn[name] = min(in_turn[name], statistics.median(times[name]))
                for name, layer in layers:
                    x = inputs[name]
                    alone[name] = min(alone[name], statistics.median(timed_calls_us(lambda: layer(x), args.calls)))
            results[str(count)] = {name: {"alone_us": round(alone[name], 1), "in_turn_us": round(in_turn[name], 1),
                                          "in_turn_over_alone": round(in_turn[name] / alone[name], 2)} for name, _ in layers}

    cpu = cpu_model_name()
    print(f"\n{cpu}, {args.threads} thread(s), frozen={args.frozen}: median µs per call")
    print(f"{'rows':>5} {'layer':>8} {'alone':>9} {'in turn':>9} {'ratio':>6}")
    for count, by_layer in results.items():
        for name, figures in by_layer.items():
            print(f"{count:>5} {name:>8} {figures['alone_us']:>9.1f} {figures['in_turn_us']:>9.1f} {figures['in_turn_over_alone']:>6.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    from _names import cpu_slug  # the experiments' folder
    path = args.out / f"block_layers_in_turn{'_frozen' if args.frozen else ''}_{cpu_slug(cpu)}.json"
    path.write_text(json.dumps({
        "command": " ".join(["python", "experiments/block_layers_in_turn.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu, "threads": args.threads, "frozen": args.frozen, "quick": args.quick, "torch": torch.__version__,
        "example_tokens": args.example, "max_rows": args.max_rows, "calls": args.calls, "passes": args.passes,
        "tune_s": round(tune_s, 1), "rows": results,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
