"""The decoder block tuned with its few-row calls timed on rotated copies of the weight (about
the block's own weights read between two calls of a layer), against the block tuned with the
weights warm, and eager: which kernels each picks, and how fast the block then runs.

    python experiments/block_rotated_tuning.py [--tokens 1,2,5,8,16] [--rotate-mb 16] [--rounds 5]
        [--budget 0.2] [--threads 1] [--quick] [--out experiments/results]

The block is ``experiments/decoder_lengths.py``'s (width 640, MLP 2560, random weights; 19.7 MB
of float32 weights). It is tuned twice by ``tune_module`` (one example of the largest of
``--tokens``, ``max_rows`` that count, each in its own private measurement cache, since a cold
problem's cache key does not say how much is read between two calls):

- *warm*: as if the last-level cache held any model (every problem warm);
- *rotated*: as if the last-level cache were ``--rotate-mb`` / 2 MB. The block's weights then
  outgrow it, so rows up to ``looprl.torch.COLD_ROWS`` are tuned and judged as cold problems,
  and a cold problem is timed on copies of its weight in turn, as many as make
  ``--rotate-mb`` MB read between two uses of one (``cold_copy_count``). Only what decides
  the cold rows and their copies sees the smaller size (``cache_sizes`` as read by
  ``looprl.measurement.timing`` and ``looprl.torch``); the code generator's cache blocks are
  the host's.

Then, at each token count, eager, the warm and the rotated block are checked equal (float32
tolerance) and timed in ``--rounds`` interleaved rounds (``torch.inference_mode()``, looprl's
timing rule with ``--budget`` seconds each, best kept). Prints a table and writes
``<out>/block_rotated_tuning_<cpu>.json`` (the CPU as ``looprl.backend.host.cpu_model_name()``
reports it, in lower case, runs of other characters as ``_``). ``--quick``: tokens 1 and 2,
0.05 s a tuned problem, one round of 0.01 s: checks that the script runs, measures nothing
worth keeping.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def last_level_cache(llc_bytes: int):
    """``cache_sizes()`` reporting a last-level cache of ``llc_bytes`` to what decides cold rows
    and their copies (``looprl.measurement.timing`` and the loaded ``looprl.torch`` modules),
    the host's L2 kept; restored on exit."""
    from looprl.backend import host

    original = host.cache_sizes

    def sizes() -> tuple[int, int]:
        return original()[0], llc_bytes

    patched = []
    for name, module in list(sys.modules.items()):
        if (name == "looprl.measurement.timing" or name == "looprl.torch" or name.startswith("looprl.torch.")) \
                and getattr(module, "cache_sizes", None) is original:
            module.cache_sizes = sizes
            patched.append(module)
    if not patched:
        raise RuntimeError("no looprl module reads cache_sizes where this experiment expects it: update last_level_cache")
    try:
        yield
    finally:
        for module in patched:
            module.cache_sizes = original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,2,5,8,16", help="token counts the blocks are timed at, comma-separated")
    parser.add_argument("--rotate-mb", type=float, default=16.0, help="MB read between two calls of one weight copy when tuning")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds, best kept")
    parser.add_argument("--budget", type=float, default=0.2, help="seconds of timing per block, token count and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small tunes and one short round: the script runs, nothing worth keeping")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the JSON file")
    args = parser.parse_args(argv)
    tokens = [int(part) for part in args.tokens.split(",") if part.strip()]
    if args.quick:
        tokens, args.rounds, args.budget = [t for t in tokens if t <= 2] or [1], 1, 0.01

    import torch

    from _torch_timing import seconds
    from _decoder_block import DecoderBlock

    import looprl.measurement.timing  # noqa: F401 - loaded before last_level_cache looks for it
    from looprl.backend.host import cpu_model_name
    from looprl.torch import tune_module

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    block = DecoderBlock().eval()
    example = torch.randn(1, max(tokens), 640)
    rotate_bytes = int(args.rotate_mb * 2**20)
    blocks, tune_s = {"eager": block}, {}
    with tempfile.TemporaryDirectory() as folder:
        for name, llc in (("warm", 2**50), ("rotated", rotate_bytes // 2)):
            started = time.perf_counter()
            with last_level_cache(llc):
                blocks[name] = tune_module(block, example, max_rows=max(tokens), cache=str(Path(folder) / f"{name}.sqlite"),
                                           threads=args.threads, budget_s=0.05 if args.quick else None, progress=False)
            tune_s[name] = round(time.perf_counter() - started, 1)
            print(f"tuned {name} in {tune_s[name]:.1f} s")

    results: dict[str, dict] = {}
    with torch.inference_mode():
        for count in tokens:
            x = torch.randn(1, count, 640)
            expected = block(x)
            same = {name: bool(torch.allclose(module(x), expected, rtol=1e-4, atol=1e-4)) for name, module in blocks.items()}
            best = {name: float("inf") for name in blocks}
            for _ in range(args.rounds):
                for name, module in blocks.items():
                    best[name] = min(best[name], seconds(module, x, args.budget))
            results[str(count)] = {**{f"{name}_ms": round(best[name] * 1e3, 3) for name in blocks},
                                   "rotated_speedup_over_warm": round(best["warm"] / best["rotated"], 3),
                                   "allclose": same}

    cpu = cpu_model_name()
    print(f"\n{cpu}, {args.threads} thread(s), rows up to {max(tokens)} tuned rotated over {args.rotate_mb:g} MB: block ms")
    print(f"{'tokens':>6} {'eager':>8} {'warm':>8} {'rotated':>8} {'warm/rotated':>12}")
    for count, figures in results.items():
        print(f"{count:>6} {figures['eager_ms']:>8.3f} {figures['warm_ms']:>8.3f} {figures['rotated_ms']:>8.3f} "
              f"{figures['rotated_speedup_over_warm']:>12.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    from _names import cpu_slug  # the experiments' folder
    path = args.out / f"block_rotated_tuning_{cpu_slug(cpu)}.json"
    path.write_text(json.dumps({
        "command": " ".join(["python", "experiments/block_rotated_tuning.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu, "threads": args.threads, "quick": args.quick, "torch": torch.__version__, "rotate_mb": args.rotate_mb,
        "rounds": args.rounds, "budget_s": args.budget, "tune_s": tune_s, "tokens": results,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
