"""``python -m looprl.bench codegen``: code quality, compile time and memory of the backend.

For each matmul it reports, measured in this run: the host's peak, numpy single-thread
(``OPENBLAS_CORETYPE`` unset, one BLAS thread, in a child process), the untuned initial
nest and the best expert schedule (register-blocked, expressed with split/swap).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time

from looprl.backend.kernel import compile
from looprl.backend.target import host_target
from looprl.bench.compile_stats import compile_stats
from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem, matmul
from looprl.ir.schedules import expert_candidates
from looprl.measurement.numpy_baseline import numpy_gflops
from looprl.measurement.peak import measure_peak_gflops
from looprl.measurement.timing import time_kernel

DEFAULT_SHAPES = [(64, 64, 64), (128, 128, 128), (192, 192, 192), (256, 256, 256), (128, 256, 64), (256, 64, 192), (100, 72, 200)]


def _best_gflops(nest, budget_s: float, rounds: int) -> float:
    kernel = compile(nest)
    return max(time_kernel(kernel, budget_s / rounds).gflops for _ in range(rounds))


def run(shapes: list[tuple[int, int, int]], budget_s: float, compiles: int, out=sys.stdout) -> dict:
    problems: list[Problem] = [matmul(*s) for s in shapes]
    started = time.perf_counter()
    peak = measure_peak_gflops()
    numpy = numpy_gflops(problems, budget_s)
    rows = []
    for problem, numpy_gf in zip(problems, numpy):
        untuned = _best_gflops(initial_nest(problem), budget_s, 3)
        candidates = expert_candidates(problem, host_target().vector_width)
        # Screen every candidate briefly, then time the best three properly.
        screened = sorted(candidates, key=lambda n: -_best_gflops(n, budget_s / 5, 3))
        expert_scores = [(_best_gflops(n, budget_s, 3), n) for n in screened[:3]]
        expert, expert_nest = max(expert_scores, key=lambda t: t[0])
        rows.append(
            {
                "problem": f"{problem.size('m')}x{problem.size('n')}x{problem.size('k')}",
                "numpy_gflops": numpy_gf,
                "untuned_gflops": untuned,
                "expert_gflops": expert,
                "expert_schedule": expert_nest.key,
                "expert_vs_numpy": expert / numpy_gf,
            }
        )
    stats = compile_stats(compiles) if compiles else None
    peak = max(peak, measure_peak_gflops())  # again at the end: noise only lowers a measurement
    for r in rows:
        r["expert_vs_peak"] = r["expert_gflops"] / peak
        r["untuned_vs_peak"] = r["untuned_gflops"] / peak
    report = {
        "peak_gflops": peak,
        "rows": rows,
        "expert_vs_numpy_mean": statistics.fmean(r["expert_vs_numpy"] for r in rows),
        "expert_vs_numpy_geomean": math.exp(statistics.fmean(math.log(r["expert_vs_numpy"]) for r in rows)),
        "compile": stats,
        "seconds": time.perf_counter() - started,
    }
    _print(report, out)
    return report


def _print(report: dict, out) -> None:
    peak = report["peak_gflops"]
    print(f"measured peak: {peak:.1f} GFLOPS (fp32, one core)", file=out)
    header = f"{'m x n x k':>13} {'numpy':>7} {'untuned':>8} {'expert':>7} {'exp/numpy':>10} {'exp/peak':>9} {'untuned/peak':>13}  expert schedule"
    print(header, file=out)
    for r in report["rows"]:
        print(
            f"{r['problem']:>13} {r['numpy_gflops']:7.1f} {r['untuned_gflops']:8.1f} {r['expert_gflops']:7.1f}"
            f" {r['expert_vs_numpy']:10.2f} {r['expert_vs_peak']:9.2f} {r['untuned_vs_peak']:13.2f}  {r['expert_schedule']}",
            file=out,
        )
    print(
        f"expert / numpy: mean {report['expert_vs_numpy_mean']:.3f}, geometric mean {report['expert_vs_numpy_geomean']:.3f}",
        file=out,
    )
    stats = report["compile"]
    if stats:
        print(
            f"compile time over {stats['count']} random schedules: median {stats['median_ms']:.2f} ms,"
            f" p95 {stats['p95_ms']:.2f} ms; memory growth {stats['rss_growth_mb']:.1f} MB",
            file=out,
        )
    print(f"(benchmark took {report['seconds']:.0f} s)", file=out)


def add_arguments(parser) -> None:
    parser.add_argument("--shapes", default=None, help="comma-separated MxNxK list (default: 64^3..256^3 and rectangular)")
    parser.add_argument("--budget", type=float, default=0.5, help="timing budget per kernel in seconds (default 0.5)")
    parser.add_argument("--compiles", type=int, default=5000, help="random schedules compiled for compile time/memory (default 5000)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the report as JSON to this path")


def main(args) -> dict:
    if args.shapes:
        shapes = []
        for text in args.shapes.split(","):
            parts = text.lower().split("x")
            if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"bad shape {text!r}: expected MxNxK with positive integers")
            shapes.append(tuple(int(p) for p in parts))
    else:
        shapes = DEFAULT_SHAPES
    if args.budget <= 0:
        raise ValueError("--budget must be positive")
    if args.compiles < 0:
        raise ValueError("--compiles must be >= 0")
    report = run(shapes, args.budget, args.compiles)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return report
