"""AutoTVM with and without transfer learning (AutoTVM, section 4 and Fig. 8): trials to reach
95% of the best schedule found, on test problems outside the transfer source.

    python experiments/autotvm_transfer.py --source-problems 6 --source-trials 150 --problems 4 --trials 200 --seeds 2

(about 25-35 minutes on 2 vCPUs; tiny check: ``--source-problems 2 --source-trials 48
--problems 2 --trials 48 --seeds 1 --source /tmp/transfer_source.sqlite --out /tmp/transfer``.)

1. The *source*: a measurement cache (``--source``, default
   ``experiments/results/autotvm_transfer_source.sqlite``) filled with ``random`` and
   ``autotvm`` searches of ``--source-trials`` trials each on ``--source-problems`` matmuls
   spread over the *training* split of ``--dataset`` (default mm64-256; resumable: finished searches are listed in
   ``<source>.done.json``).
2. The *targets*: ``--problems`` matmuls spread over the *test* split, each tuned by
   ``autotvm`` for ``--trials`` trials with ``transfer=False`` and ``transfer=True``, every run
   on a fresh copy of the source cache (so a target problem is never measured before its run,
   and the transfer run's global model sees only the source problems).

Writes, appending (finished runs are skipped on a rerun), ``<out>.csv``: one row per run with
its best-so-far curve as JSON; then ``<out>.png`` (best GFLOPS against trials per problem)
and prints, per problem, the trials each setting needed to reach 95% of the best GFLOPS any
run found on it (mean over seeds; a run that never gets there counts as ``--trials``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

from looprl import defaults
from looprl.workloads.datasets import dataset_problems
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.search import run
from looprl.train.validation import spread

from _curves import copy_cache, fill_source, load_rows

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["problem", "transfer", "seed", "trials", "source_records", "initial_gflops", "best_gflops", "seconds", "curve"]
LEVEL = 0.95








def trials_to(curve, level: float) -> int | None:
    """The first trial count at which a (seconds, trials, best) curve reaches ``level``."""
    for _, count, gflops in curve:
        if gflops >= level:
            return int(count)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=defaults.DATASET, help="the benchmark set: source from its training split, targets from its test split")
    parser.add_argument("--source-problems", type=int, default=6, help="training-split problems measured for the source")
    parser.add_argument("--source-trials", type=int, default=150, help="trials of each source search")
    parser.add_argument("--problems", type=int, default=4, help="test-split problems tuned")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--source", default=str(RESULTS / "autotvm_transfer_source.sqlite"), help="the source cache")
    parser.add_argument("--out", default=str(RESULTS / "autotvm_transfer"), help="path prefix of the CSV and PNG")
    args = parser.parse_args(argv)
    source = Path(args.source)
    source.parent.mkdir(parents=True, exist_ok=True)
    try:
        records = fill_source(source, spread(dataset_problems(args.dataset, "train"), args.source_problems), args.source_trials)
    except KeyboardInterrupt:
        print("interrupted while filling the source; finished searches are kept in", source)
        return 130
    print(f"source: {records} measurements of {args.source_problems} training problems in {source}")
    table = Path(args.out + ".csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["problem"], r["transfer"], int(r["seed"])) for r in load_rows(table) if int(r["trials"]) == args.trials}
    fresh = not table.exists()
    problems = spread(dataset_problems(args.dataset, "test"), args.problems)
    with table.open("a", newline="", encoding="utf-8") as handle, tempfile.TemporaryDirectory() as scratch:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for index, problem in enumerate(problems):
            for seed in range(args.seeds):
                for transfer in (False, True):
                    if (problem.name, str(transfer), seed) in done:
                        continue
                    copy = Path(scratch) / f"run{index}_{seed}_{transfer}.sqlite"
                    copy_cache(source, copy)
                    with MeasurementCache(copy) as cache:
                        result = run(problem, "autotvm", budget_s=math.inf, max_evaluations=args.trials, seed=seed,
                                     evaluator=Evaluator(cache), verify_s=None, transfer=transfer)
                    copy.unlink()
                    if result.stopped == "interrupted":
                        print("interrupted; finished rows are kept in", table)
                        return 130
                    curve = [[round(s, 3), int(n), round(g, 3)] for s, n, g in result.curve]
                    writer.writerow({"problem": problem.name, "transfer": str(transfer), "seed": seed, "trials": args.trials,
                                     "source_records": records, "initial_gflops": f"{result.initial_gflops:.2f}",
                                     "best_gflops": f"{result.best_gflops:.2f}", "seconds": f"{result.elapsed_s:.2f}",
                                     "curve": json.dumps(curve)})
                    handle.flush()
                    print(f"[{index + 1}/{len(problems)} seed {seed}] transfer={transfer!s:>5} {problem.name}: "
                          f"{result.best_gflops:.1f} GFLOPS (untuned {result.initial_gflops:.1f}), {result.elapsed_s:.1f} s", flush=True)
    summarise(table, args.trials, [p.name for p in problems])
    return 0


def summarise(table: Path, trials: int, problems: list[str]) -> None:
    rows = [r for r in load_rows(table) if int(r["trials"]) == trials and r["problem"] in problems]
    shown = [p for p in problems if any(r["problem"] == p for r in rows)]
    print(f"trials to reach {LEVEL:.0%} of the best found (mean over seeds; never reached counts as {trials})")
    print(f"{'problem':>32} {'best':>7} {'without':>8} {'with':>8} {'ratio':>6}")
    ratios = []
    for problem in shown:
        runs = [r for r in rows if r["problem"] == problem]
        best = max(float(r["best_gflops"]) for r in runs)
        means = {}
        for flag in ("False", "True"):
            counts = [trials_to(r["curve"], LEVEL * best) or trials for r in runs if r["transfer"] == flag]
            means[flag] = statistics.fmean(counts) if counts else math.nan
        ratio = means["False"] / means["True"] if means["True"] > 0 else math.nan
        if math.isfinite(ratio):
            ratios.append(ratio)
        print(f"{problem:>32} {best:7.1f} {means['False']:8.1f} {means['True']:8.1f} {ratio:6.2f}")
    if ratios:
        print(f"transfer needs {statistics.geometric_mean(ratios):.2f}x fewer trials (geometric mean over {len(ratios)} problems)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, max(len(shown), 1), figsize=(3.2 * max(len(shown), 1), 3.2), squeeze=False)
    grid = list(range(1, trials + 1))
    for i, problem in enumerate(shown):
        axis = axes[0][i]
        for j, flag in enumerate(("False", "True")):
            for k, r in enumerate(r for r in rows if r["problem"] == problem and r["transfer"] == flag):
                values, best = [], 0.0
                points = iter(r["curve"])
                point = next(points, None)
                for t in grid:
                    while point is not None and point[1] <= t:
                        best = max(best, point[2])
                        point = next(points, None)
                    values.append(best)
                axis.plot(grid, values, color=f"C{j}", alpha=0.8, label=("transfer" if flag == "True" else "no transfer") if k == 0 else None)
        axis.set_title(problem.split(":")[-1], fontsize=8)
        axis.set_xlabel("trials")
        axis.set_ylabel("best GFLOPS")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
