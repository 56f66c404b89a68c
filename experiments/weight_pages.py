"""What huge pages for the weights looprl packs are worth: kernel by kernel, and per decode token
of transformers' model.

    python experiments/weight_pages.py [--config qwen2] [--rounds 5] [--threads 1] [--skip-model] [--out PATH]

**Kernels.** Each linear layer of one decode step of the config (one row; the projections that
the recommended recipe merges, q with k and v and gate with up, as one layer) is tuned once by
``looprl.tune`` (cold, ``--threads`` threads, its own cache), then its answer is bound to as many copies of
its weight as put eight times the last-level cache (once per thread) between two uses of one (twice, the tuner's
rotation, left some schedules partly warm on the AMD EPYC Zen 4 of 2026-11-30), and called on
each in turn: the copies on huge pages (``looprl.backend.weight_memory``, the default), then on
the memory looprl used before (``LOOPRL_HUGE_PAGES=0``: numpy's allocation), ``--rounds``
rounds interleaved, the best of each. GB/s of the weight read, against the DRAM bound measured
in the same run (``looprl.measurement.roofline.memory_bandwidth``, on as many threads).

**Model** (unless ``--skip-model``): the config's transformers model (random weights, as
``experiments/hf_generate.py`` builds it), the recommended recipe (``torch.compile(model.forward,
backend="looprl", fullgraph=True)``, a static cache, Inductor's freezing) prepared twice from one
cache, its weights packed on huge pages and then without (the second preparation's answers are
the first's, remembered: the same kernels), and max-autotune with freezing as the peer; a
64-token greedy generation after a 32-token prompt by each in turn, ``--rounds`` rounds, every
generation checked against eager's tokens. Decode tokens/s, medians.

Writes ``<out>.txt`` (what it prints) and ``<out>.json``; default
``experiments/results/weight_pages_<llvm cpu>_<config>[_t<threads>]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COLD_CACHES = 8  # last-level caches of other copies between two uses of one
MAX_COPIES = 1024
NEW_TOKENS = 64
PROMPT = 32


def decode_layers(config: str) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of one decode step's linear layers, merged as the recipe merges them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _hf_modes import CONFIGS

    shape = CONFIGS[config]
    hidden, mlp = shape["hidden"], shape["mlp"]
    head = hidden // shape["heads"]
    qkv = hidden + 2 * shape["kv_heads"] * head
    return [("qkv", hidden, qkv), ("o", hidden, hidden), ("gate+up", hidden, 2 * mlp), ("down", mlp, hidden),
            ("lm head", hidden, shape["vocab"])]


def kernel_rates(layers, rounds: int, threads: int, log) -> list[dict]:
    """Each layer's tuned kernel read cold from copies on huge pages and from the memory used before, interleaved."""
    import numpy as np

    import looprl
    from looprl.backend import weight_memory
    from looprl.backend.buffers import aligned_empty
    from looprl.measurement.timing import cache_sizes

    llc = cache_sizes()[1]
    rows = []
    for name, k, n in layers:
        problem = looprl.linear(1, k, n, bias=False).with_cold(True)
        result = looprl.tune(problem, cache=":memory:", threads=threads)
        kernel = result.kernel
        rng = np.random.default_rng(0)
        weight = rng.standard_normal((n, k), dtype=np.float32)
        x = aligned_empty((1, k))
        x[...] = rng.standard_normal((1, k), dtype=np.float32)
        out = aligned_empty((1, n))
        workspace = aligned_empty(max(kernel.workspace_elements, 1))
        copies = min(MAX_COPIES, 1 + math.ceil(COLD_CACHES * threads * llc / weight.nbytes))  # each thread may read through a cache of its own
        bound = {}
        for pages in ("huge", "before"):
            weight_memory.HUGE_PAGES = "1" if pages == "huge" else "0"
            bound[pages] = [kernel.bind(in1=weight) for _ in range(copies)]
        weight_memory.HUGE_PAGES = "1"
        best = {pages: math.inf for pages in bound}
        for _ in range(rounds):
            for pages, kernels in bound.items():
                for each in kernels[: max(1, copies // 4)]:  # bring the rotation to a steady state
                    each.address_call(out.ctypes.data, workspace.ctypes.data, x.ctypes.data)
                began = time.perf_counter()
                for each in kernels:
                    each.address_call(out.ctypes.data, workspace.ctypes.data, x.ctypes.data)
                best[pages] = min(best[pages], (time.perf_counter() - began) / copies)
        np.testing.assert_allclose(out, x @ weight.T, rtol=1e-3, atol=1e-3)
        row = {"layer": name, "threads": kernel.threads, "in_features": k, "out_features": n, "weight_mb": weight.nbytes / 1e6, "copies": copies,
               "schedule": str(kernel.nest.key),
               **{f"{pages}_us": best[pages] * 1e6 for pages in best},
               **{f"{pages}_gbs": weight.nbytes / best[pages] / 1e9 for pages in best}}
        rows.append(row)
        row["team"] = bool(kernel.nest.is_parallel and kernel.threads > 1)
        log(f"{name:>8} {k:>5}->{n:<6} {row['weight_mb']:6.2f} MB x{copies:<4} {'team  ' if row['team'] else 'serial'}  huge pages {row['huge_gbs']:5.1f} GB/s "
            f"({row['huge_us']:7.1f} us)  before {row['before_gbs']:5.1f} GB/s ({row['before_us']:7.1f} us)  "
            f"huge/before {row['before_us'] / row['huge_us']:.2f}")
        del bound
    return rows


def model_rates(config: str, rounds: int, threads: int, log) -> dict:
    """Decode tokens/s of the recipe with and without huge pages (the same kernels) and of max-autotune."""
    import torch

    import _hf_modes as modes
    from looprl.backend import weight_memory

    torch.set_num_threads(threads)
    model = modes.build(config)
    prompt = modes.make_prompt(model, PROMPT)
    caches = Path(tempfile.mkdtemp(prefix="weight_pages_"))
    runners = {}
    for name, pages in (("recipe, huge pages", "1"), ("recipe, before", "0"), ("max-autotune", "1")):
        weight_memory.HUGE_PAGES = pages
        began = time.perf_counter()
        mode = "max-autotune" if name == "max-autotune" else "looprl-compiled"
        runners[name] = modes.prepared(mode, model, prompt, threads, None, caches / "looprl")
        runners[name](prompt, NEW_TOKENS)  # compiled (and its weights packed) now, with this memory
        log(f"prepared {name} in {time.perf_counter() - began:.1f} s")
    weight_memory.HUGE_PAGES = "1"
    expected = modes.Runner(model)(prompt, NEW_TOKENS)[0]
    decode = {name: [] for name in runners}
    for round_ in range(rounds):
        for name, runner in runners.items():
            tokens, _, rate = runner(prompt, NEW_TOKENS)
            if tokens != expected:
                raise RuntimeError(f"{name} generated other tokens than eager")
            decode[name].append(rate)
        log(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:.1f}" for name, values in decode.items()))
    medians = {name: statistics.median(values) for name, values in decode.items()}
    log("decode tokens/s, medians: " + ", ".join(f"{name} {value:.2f}" for name, value in medians.items()))
    log(f"recipe huge pages / before {medians['recipe, huge pages'] / medians['recipe, before']:.3f}; "
        f"recipe huge pages / max-autotune {medians['recipe, huge pages'] / medians['max-autotune']:.3f}")
    return {"decode_tokens_per_s": decode, "medians": medians}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen2", choices=("qwen2", "gpt2", "llama"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-model", action="store_true", help="the kernels only")
    parser.add_argument("--out", type=Path, default=None, help="the results' path without .txt/.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    caches = tempfile.mkdtemp(prefix="weight_pages_")
    os.environ.setdefault("LOOPRL_CACHE_DIR", caches + "/looprl")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", caches + "/inductor")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from looprl.backend.host import cpu_model_name
    from looprl.measurement.roofline import memory_bandwidth
    from looprl.target import host_cpu

    out = args.out or RESULTS / (f"weight_pages_{host_cpu()[0]}_{args.config}" + (f"_t{args.threads}" if args.threads > 1 else ""))
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/weight_pages.py --config {args.config} --rounds {args.rounds}" + (f" --threads {args.threads}" if args.threads > 1 else "")
        + (" --skip-model" if args.skip_model else ""))
    dram = memory_bandwidth(cache=":memory:", threads=args.threads)["dram"]
    log(f"{cpu_model_name()} ({host_cpu()[0]}), {args.threads} thread(s); DRAM bound {dram:.1f} GB/s")
    results = {"cpu": cpu_model_name(), "llvm_cpu": host_cpu()[0], "config": args.config, "dram_gbs": dram,
               "threads": args.threads, "kernels": kernel_rates(decode_layers(args.config), args.rounds, args.threads, log)}
    if not args.skip_model:
        results["model"] = model_rates(args.config, args.rounds, args.threads, log)
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
