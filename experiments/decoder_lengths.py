"""A decoder block tuned once, run at every sequence length: looprl against torch eager, one thread.

    python experiments/decoder_lengths.py [--target avx2] [--tokens 1,5,64,100,333,512] [--example 64]
        [--max-rows 512] [--rounds 5] [--threads 1] [--frozen] [--no-measure] [--policy DIR] [--compile] [--records FILE] [--out experiments/results/decoder_lengths]

The block is a pre-norm transformer decoder block built from ``torch.nn`` (random weights,
nothing downloaded): width 640, 10 heads, causal self-attention
(``F.scaled_dot_product_attention(is_causal=True)``) between a qkv ``Linear(640, 1920)`` and an
output ``Linear(640, 640)``, then an MLP ``Linear(640, 2560) -> GELU -> Linear(2560, 640)``, each
with its residual. It is tuned once (``looprl.torch.tune_module``) with one example of
``--example`` tokens and ``max_rows=--max-rows``, so that every row count is served in row
blocks of the powers of two tuned (see ``looprl.torch``); then, at each length of
``--tokens``, the original and the tuned block are checked equal (float32 tolerance) and timed
in interleaved rounds (``torch.set_num_threads(--threads)``, ``torch.inference_mode()``,
looprl's timing rule, best of the rounds) with the block whose linear layers run oneDNN's linear
on weights packed once for that length (``onednn_packed_ms``: what Inductor's freezing runs for
them, the rest of the block eager). ``looprl.torch.stats`` must show no call that fell
back for a reason other than torch timing faster (the layer's routes, printed as a table).
With ``--compile``, ``torch.compile(block, dynamic=True)`` (inductor),
``torch.compile(block, mode="max-autotune")`` with ``torch._inductor.config.freezing = True``
(Inductor's GEMM template and prepacked weights compete only with freezing; compiled for each
length, autotuned there) and ``torch.compile(block, backend="looprl", dynamic=True)`` (the same
tuning options) are timed too; freezing is on for every compilation of the run.
Writes ``<out>.csv`` and prints a table with the geometric mean over the lengths. With
``--records FILE`` the tuned records are saved there, or, if the file exists, loaded instead
of tuning (``tune_module(records=)``; the time printed is then the load and compile time).
``--no-measure``: the fast path (``tune_module(measure=False)``: the policy's answers alone).
``--dtype bfloat16``: the block and its inputs in bfloat16 (looprl's bfloat16 kernels); the
check's tolerance is then 3e-2 (a few bfloat16 roundings: each layer's output is rounded, and
two correct implementations may round a value differently) instead of 1e-4.

torch's own kernels follow the host (AVX-512 where it has it). To compare AVX2 code with torch
on AVX2 on such a host, restrict torch too (its ATen kernels, MKL and oneDNN read these when
torch loads)::

    ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
        python experiments/decoder_lengths.py --target avx2 --out experiments/results/decoder_lengths_avx2code

The CSV's ``torch_isa`` column is what torch reports it uses (``torch.backends.cpu.get_cpu_capability()``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _decoder_block import DecoderBlock
from _torch_timing import onednn_packed, seconds, write_csv

from looprl.backend.host import cpu_model_name
from looprl.target import TARGET_CHOICES, Target
from looprl.torch import TORCH_FASTER, route_table, save_records, stats, tune_module, tuned_layers, kernels_by_shape

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["tokens", "target", "torch_isa", "cpu", "threads", "torch_ms", "looprl_ms", "speedup", "max_abs_diff", "allclose",
          "onednn_packed_ms", "vs_onednn_packed",
          "inductor_ms", "max_autotune_ms", "vs_max_autotune", "compiled_looprl_ms", "compiled_looprl_speedup", "compiled_allclose"]


def lengths(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise SystemExit(f"--tokens: expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--tokens: expected comma-separated positive integers, got {text!r}")
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--tokens", default="1,5,64,100,333,512")
    parser.add_argument("--example", type=int, default=64, help="tokens of the one example the block is tuned with (default 64)")
    parser.add_argument("--max-rows", type=int, default=512, help="tune_module's max_rows (default 512)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads and tune_module's (default 1)")
    parser.add_argument("--frozen", action="store_true", help="tune_module(frozen=True): the weights bound once, compared on no call")
    parser.add_argument("--no-measure", action="store_true",
                        help="tune_module(measure=False): the fast path, every layer scheduled by the policy alone")
    parser.add_argument("--policy", default="default", help="tune_module's policy folder (default: the shipped one)")
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per timing (default 0.1)")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile(block, dynamic=True) with inductor and with backend='looprl' (same tuning options)")
    parser.add_argument("--records", type=Path, default=None,
                        help="tuned records: load them if the file exists (no tuning on the same CPU kind), else save them there")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the block's dtype (default float32)")
    parser.add_argument("--out", type=Path, default=RESULTS / "decoder_lengths")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = Target.resolve(args.target)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    tolerance = 1e-4 if args.dtype == "float32" else 3e-2
    block = DecoderBlock().eval().to(dtype)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        load = args.records if args.records is not None and args.records.exists() else None
        tuned = tune_module(block, torch.randn(1, args.example, 640).to(dtype), target=target, max_rows=args.max_rows,
                            cache=str(Path(folder) / "decoder.sqlite"), records=load, threads=args.threads,
                            frozen=args.frozen, measure=not args.no_measure, policy=args.policy)
        tune_s = time.perf_counter() - started
    modes = sorted({result.mode for _, layer in tuned_layers(tuned) for result in layer.results.values()})
    if args.records is not None and load is None:
        print(f"saved {save_records(tuned, args.records)} tuned records to {args.records}")
    counts = sorted(next(iter(tuned_layers(tuned)))[1].results)
    print(f"CPU {cpu_model_name()}; target {target.isa}; torch's kernels {torch.backends.cpu.get_cpu_capability()}; tuned with {args.example} tokens, max_rows {args.max_rows}: "
          f"{len(tuned_layers(tuned))} layers, row counts {counts}, {tune_s:.1f} s ({', '.join(modes)})")
    compiled = {}
    if args.compile:
        from looprl import dynamo

        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # for every compilation below: max-autotune's GEMM template runs only with it
        # The three compiled blocks share the block's forward code, and max-autotune compiles it once per length:
        # past Dynamo's default limit of 8 compilations of one code object, later ones would silently run eager.
        torch._dynamo.config.recompile_limit = 64
        compiled["inductor"] = torch.compile(block, dynamic=True)
        compiled["max_autotune"] = torch.compile(block, mode="max-autotune", dynamic=False)
        compiled["compiled_looprl"] = torch.compile(block, backend="looprl", dynamic=True,
                                           options={"target": target, "max_rows": args.max_rows, "cache": ":memory:", "threads": args.threads})
        started = time.perf_counter()
        with torch.inference_mode():  # as they are timed: a compilation under no_grad would be compiled again under inference_mode
            for name, fn in compiled.items():
                for tokens in (lengths(args.tokens) if name == "max_autotune" else [args.example]):
                    fn(torch.randn(1, tokens, 640).to(dtype))
        print(f"torch.compile (inductor, max-autotune at every length, backend='looprl' with its tuning): {time.perf_counter() - started:.1f} s")
    rows = []
    for tokens in lengths(args.tokens):
        x = torch.randn(1, tokens, 640).to(dtype)
        with torch.no_grad():
            expected, got = block(x), tuned(x)
        packed = onednn_packed(block, tokens)  # oneDNN's linear on weights packed once, for this length
        peers = {"onednn_packed": packed} if packed is not None else {}
        best = {"torch": math.inf, "looprl": math.inf, **{name: math.inf for name in compiled}, **{name: math.inf for name in peers}}
        runs = {"torch": block, "looprl": tuned, **compiled, **peers}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                best[name] = min(best[name], seconds(fn, x, args.budget))
        rows.append({
            "tokens": tokens, "target": target.isa, "torch_isa": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model_name(),
            "threads": args.threads,
            "torch_ms": round(1e3 * best["torch"], 4), "looprl_ms": round(1e3 * best["looprl"], 4),
            "speedup": round(best["torch"] / best["looprl"], 3),
            "max_abs_diff": float((expected - got).abs().max()), "allclose": bool(torch.allclose(expected, got, rtol=tolerance, atol=tolerance)),
        })
        row = rows[-1]
        if peers:
            row.update(onednn_packed_ms=round(1e3 * best["onednn_packed"], 4), vs_onednn_packed=round(best["onednn_packed"] / best["looprl"], 3))
        if compiled:
            with torch.inference_mode():
                compiled_out = compiled["compiled_looprl"](x)
            row.update(inductor_ms=round(1e3 * best["inductor"], 4), max_autotune_ms=round(1e3 * best["max_autotune"], 4),
                       vs_max_autotune=round(best["max_autotune"] / best["looprl"], 3),
                       compiled_looprl_ms=round(1e3 * best["compiled_looprl"], 4),
                       compiled_looprl_speedup=round(best["torch"] / best["compiled_looprl"], 3),
                       compiled_allclose=bool(torch.allclose(expected, compiled_out, rtol=tolerance, atol=tolerance)))
        print(f"{tokens:5d} tokens: torch {row['torch_ms']:.3f} ms, looprl {row['looprl_ms']:.3f} ms, {row['speedup']:.2f}x; "
              + (f"oneDNN packed {row['onednn_packed_ms']:.3f} ms (looprl {row['vs_onednn_packed']:.2f}x it); " if peers else "") +
              f"max |diff| {row['max_abs_diff']:.2e} ({'allclose' if row['allclose'] else 'NOT allclose'})"
              + (f"; inductor {row['inductor_ms']:.3f} ms, max-autotune {row['max_autotune_ms']:.3f} ms "
                 f"(looprl {row['vs_max_autotune']:.2f}x it), backend='looprl' {row['compiled_looprl_ms']:.3f} ms "
                 f"({row['compiled_looprl_speedup']:.2f}x eager, {'allclose' if row['compiled_allclose'] else 'NOT allclose'})" if compiled else ""),
              flush=True)
    served = stats(tuned)
    geomean = statistics.geometric_mean(row["speedup"] for row in rows)
    if compiled:
        print(f"torch.compile(backend='looprl'): geomean {statistics.geometric_mean(row['compiled_looprl_speedup'] for row in rows):.3f}x eager, "
              f"{statistics.geometric_mean(row['inductor_ms'] / row['compiled_looprl_ms'] for row in rows):.3f}x inductor; "
              f"tune_module {statistics.geometric_mean(row['vs_max_autotune'] for row in rows):.3f}x max-autotune with freezing "
              f"(worst {min(row['vs_max_autotune'] for row in rows):.3f}x); "
              f"operator calls {dynamo.stats()['looprl_calls']}, fallbacks {dynamo.stats()['fallback_calls']}")
    print(f"geomean {geomean:.3f}x torch eager, worst {min(row['speedup'] for row in rows):.3f}x; "
          f"looprl calls {served['looprl_calls']}, fallbacks {served['fallback_calls']} {served['fallbacks']}; tune {tune_s:.1f} s")
    write_csv(args.out, FIELDS, rows)
    print(route_table(kernels_by_shape(layer for _, layer in tuned_layers(tuned))))
    unexpected = {why: count for why, count in served["fallbacks"].items() if why != TORCH_FASTER}
    return 0 if all(row["allclose"] and row.get("compiled_allclose", True) for row in rows) and not unexpected else 1


if __name__ == "__main__":
    sys.exit(main())
