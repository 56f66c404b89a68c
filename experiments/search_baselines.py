"""Run LoopTune's search baselines on test problems and summarise them.

    python experiments/search_baselines.py --limit 5 --budget 20

Runs ``python -m looprl.search --cold`` (every search starts from an empty cache, so times
are comparable) over the first ``--limit`` problems of the test split, appending to
``experiments/results/search_baselines_<limit>x<budget>s.csv`` (an interrupted run resumes), then
prints the mean per algorithm and plots the best GFLOPS per problem (as re-measured after the search) next to the untuned nest.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from looprl.search import PAPER_ALGORITHMS

RESULTS = Path(__file__).resolve().parent / "results"


def summarise(path: Path) -> list[dict]:
    rows = [r for r in csv.DictReader(path.open(encoding="utf-8")) if r["stopped"] != "interrupted"]
    by_algo = defaultdict(list)
    for row in rows:
        by_algo[row["algorithm"]].append(row)
    summary = []
    for algo, group in by_algo.items():
        summary.append({
            "algorithm": algo,
            "problems": len(group),
            "initial_gflops": statistics.fmean(float(r["initial_gflops"]) for r in group),
            "best_gflops": statistics.fmean(float(r["best_gflops"]) for r in group),
            "verified_gflops": statistics.fmean(float(r["verified_gflops"] or 0) for r in group),
            "speedup_geomean": statistics.geometric_mean(float(r["speedup"]) for r in group),
            "seconds": statistics.fmean(float(r["elapsed_s"]) for r in group),
            "states": statistics.fmean(int(r["evaluations"]) for r in group),
        })
    return summary


def plot(path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in csv.DictReader(path.open(encoding="utf-8")) if r["stopped"] != "interrupted"]
    problems = list(dict.fromkeys(f"{r['m']}x{r['n']}x{r['k']}" for r in rows))
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    value = {(f"{r['m']}x{r['n']}x{r['k']}", r["algorithm"]): float(r["verified_gflops"] or 0) for r in rows}
    initial = {f"{r['m']}x{r['n']}x{r['k']}": float(r["initial_gflops"]) for r in rows}
    figure, axes = plt.subplots(figsize=(max(6, 1.2 * len(problems)), 4))
    width = 0.8 / (len(algorithms) + 1)
    for i, problem in enumerate(problems):
        axes.bar(i, initial[problem], width, color="lightgray", label="untuned" if i == 0 else None)
        for j, algo in enumerate(algorithms):
            axes.bar(i + (j + 1) * width, value.get((problem, algo), 0.0), width, color=f"C{j}", label=algo if i == 0 else None)
    axes.set_xticks([i + 0.4 for i in range(len(problems))], problems, rotation=30, ha="right")
    axes.set_ylabel("GFLOPS (best found, re-measured)")
    axes.legend(fontsize=7, ncols=2)
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--algo", default=",".join(PAPER_ALGORITHMS))
    args = parser.parse_args(argv)
    path = RESULTS / f"search_baselines_{args.limit}x{args.budget:g}s.csv"
    command = [sys.executable, "-m", "looprl.search", "--split", "test", "--limit", str(args.limit), "--budget", str(args.budget),
               "--algo", args.algo, "--cold", "--quiet", "--csv", str(path)]
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        return code
    print(f"{'algorithm':>10} {'n':>3} {'untuned':>8} {'best':>8} {'verified':>8} {'speedup':>8} {'seconds':>8} {'states':>7}")
    for row in summarise(path):
        print(f"{row['algorithm']:>10} {row['problems']:3d} {row['initial_gflops']:8.1f} {row['best_gflops']:8.1f} {row['verified_gflops']:8.1f} "
              f"{row['speedup_geomean']:8.2f} {row['seconds']:8.1f} {row['states']:7.0f}")
    plot(path, path.with_suffix(".png"))
    print("wrote", path, "and", path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
