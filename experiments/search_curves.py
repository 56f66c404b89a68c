"""Best GFLOPS against measurements, as the AutoTVM paper draws them (its Fig. 4 and 8): random
search, beam4bfs, AutoTVM cold, AutoTVM with transfer and the policy-guided ``looprl.tune``,
on the models test split and the mm64-256 test split, for one target.

    python experiments/search_curves.py --target host --models 16 --mm 8 --trials 64 --seeds 2
    python experiments/search_curves.py --target avx2 --models 16 --mm 8 --trials 64 --seeds 2

(about 25 minutes per target on 2 vCPUs; tiny check: ``--models 1 --mm 1 --trials 16 --seeds 1
--source-problems 1 --out /tmp/curves``.)

1. The transfer *source*: a measurement cache (``<out>_source.sqlite``, kept out of git) filled by
   random search and AutoTVM, ``--trials`` measurements each, on ``--source-problems`` problems
   spread over the *training* splits of both datasets (resumable: finished searches are listed
   in ``<source>.done.json``).
2. Every search of a test problem starts from a cache that does not know the problem: a private
   in-memory one, or for ``autotvm-transfer`` a fresh copy of the source (whose global model
   then sees only the training problems). Each gets ``--trials`` distinct schedules (the untuned
   nest included) and no time limit; beam4bfs and tune may stop earlier (their curves stay flat).
   ``tune`` is ``looprl.tune`` with its own scaled budget (policy rollout, register tiles,
   guided search); its curve is read from its cache in measurement order. beam4bfs and tune
   run once (seed 0): they draw nothing at random.

Writes, appending (finished (problem, method, seed) runs are skipped on a rerun),
``<out>.csv``: one row per run with its best-so-far curve as JSON; then ``<out>.png`` (per
dataset, the mean of best / best any method found, against measurements) and prints:

* the geometric mean, per dataset and per problem class, of AutoTVM's mean best over random
  search's after 16, 32 and ``--trials`` measurements (the class's worst problem too);
* transfer: for every (problem, seed), the measurements the cold AutoTVM run needed to reach its
  final best and those the transfer run needed to reach the same value (``--trials`` + 1 if it
  never did), and the geometric mean of their ratio;
* every method's geometric mean best against numpy (one thread) after ``--trials``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import looprl
from looprl.backend.host import cpu_model_name
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.numpy_baseline import numpy_gflops
from looprl.search import run
from looprl.target import Target
from looprl.train.validation import spread
from looprl.workloads.datasets import dataset_problems

from _curves import best_at, copy_cache, fill_source, load_rows

RESULTS = Path(__file__).resolve().parent / "results" / "search_curves"
DATASETS = ("models", "mm64-256")
METHODS = ("random", "beam4bfs", "autotvm", "autotvm-transfer", "tune")
DETERMINISTIC = ("beam4bfs", "tune")  # run for seed 0 only
FIELDS = ["problem", "dataset", "class", "target", "host", "method", "seed", "trials", "best_gflops", "numpy_gflops", "seconds", "curve"]


def problem_class(problem, dataset: str) -> str:
    """The kind of GEMM a problem is, for the per-class figures."""
    if dataset != "models":
        return dataset
    sizes = dict(problem.sizes)
    if "b" in sizes:
        return "batched"
    if sizes.get("m", 0) <= 16:
        return "decode"
    if min(sizes.get("n", 0), sizes.get("k", 0)) <= 64:
        return "narrow"
    return "gemm"




def reached_at(curve, level: float, missing: int) -> int:
    """Measurements a curve needed to reach ``level`` (``missing`` if it never did)."""
    for _, count, gflops in curve:
        if gflops >= level:
            return count
    return missing






def tune_curve(problem, target: Target, trials: int) -> list[list]:
    """looprl.tune's best-so-far curve against its measurements, from a fresh cache."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "tune.sqlite"
        looprl.tune(problem, cache=path, target=target, remember=False, threads=1)
        with MeasurementCache(path) as cache:
            records = [g for p, _, g in cache.records(target) if p == problem.name]
    curve, best = [], 0.0
    for count, gflops in enumerate(records[:trials], start=1):
        if gflops > best:
            best = gflops
            curve.append([0.0, count, round(gflops, 3)])
    return curve


def search_curve(problem, method: str, seed: int, trials: int, target: Target, source: Path) -> tuple[list, float]:
    if method == "tune":
        return tune_curve(problem, target, trials), 0.0
    options = {}
    algo = method
    with tempfile.TemporaryDirectory() as folder:
        if method == "autotvm-transfer":
            algo, options = "autotvm", {"transfer": True}
            path = Path(folder) / "source.sqlite"
            copy_cache(source, path)
            cache = MeasurementCache(path)
        else:
            cache = ":memory:"
        result = run(problem, algo, budget_s=math.inf, max_evaluations=trials, seed=seed, evaluator=Evaluator(cache, target=target),
                     verify_s=None, **options)
        if not isinstance(cache, str):
            cache.close()
    if result.stopped == "interrupted":
        raise KeyboardInterrupt
    return [[round(s, 3), int(n), round(g, 3)] for s, n, g in result.curve], result.elapsed_s




def geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def summarise(table: Path, trials: int, target: str) -> None:
    rows = [r for r in load_rows(table) if int(r["trials"]) == trials and r["target"] == target]
    if not rows:
        return
    print(f"\nhost: {rows[0]['host']}, target {target}, {trials} measurements per search")
    runs = defaultdict(list)  # (problem, method) -> rows
    for row in rows:
        runs[row["problem"], row["method"]].append(row)
    problems = {r["problem"]: (r["dataset"], r["class"], float(r["numpy_gflops"])) for r in rows}

    def mean_best(problem, method, at):
        found = runs.get((problem, method))
        return statistics.fmean(best_at(r["curve"], at) for r in found) if found else math.nan

    checkpoints = [16, 32, trials]
    print(f"{'autotvm / random':<28}" + "".join(f"{f'@{t}':>8}" for t in checkpoints) + "   worst problem @" + str(trials))
    groups = defaultdict(list)
    for problem, (dataset, kind, _) in problems.items():
        groups[f"dataset {dataset}"].append(problem)
        groups[f"  class {kind}"].append(problem)
        groups["all"].append(problem)
    for name in sorted(groups, key=lambda g: (g == "all", g.strip())):
        members = groups[name]
        ratios = {t: [mean_best(p, "autotvm", t) / mean_best(p, "random", t) for p in members] for t in checkpoints}
        worst = min(ratios[trials]) if ratios[trials] else math.nan
        print(f"{name + f' ({len(members)})':<28}" + "".join(f"{geomean(ratios[t]):8.3f}" for t in checkpoints) + f"   {worst:.3f}")
    # Transfer: measurements to reach the cold run's final best.
    pairs = []
    for (problem, method), found in runs.items():
        if method != "autotvm":
            continue
        for cold in found:
            warm = [r for r in runs.get((problem, "autotvm-transfer"), []) if r["seed"] == cold["seed"]]
            if not warm:
                continue
            level = best_at(cold["curve"], trials)
            pairs.append((problem, reached_at(cold["curve"], level, trials), reached_at(warm[0]["curve"], level, trials + 1)))
    if pairs:
        print(f"transfer: measurements to reach the cold run's final best, {len(pairs)} runs: cold geomean "
              f"{geomean([c for _, c, _ in pairs]):.1f}, transfer {geomean([w for _, _, w in pairs]):.1f}, ratio "
              f"{geomean([w / c for _, c, w in pairs]):.3f} (transfer never reached it in {sum(w > trials for _, _, w in pairs)})")
    timed = [p for p in problems if problems[p][2] > 0]  # numpy's figure can fail (0): left out of this table
    print(f"{'method / numpy':<28}" + "".join(f"{f'@{t}':>8}" for t in checkpoints) + f"   ({len(timed)} problems numpy timed)")
    for method in METHODS:
        if any(m == method for _, m in runs):
            print(f"{method:<28}" + "".join(
                f"{geomean([mean_best(p, method, t) / problems[p][2] for p in timed if (p, method) in runs]):8.3f}" for t in checkpoints))
    plot(table, rows, trials)


def plot(table: Path, rows: list[dict], trials: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = list(range(1, trials + 1))
    best_any = defaultdict(float)
    for row in rows:
        best_any[row["problem"]] = max(best_any[row["problem"]], best_at(row["curve"], trials))
    datasets = sorted({r["dataset"] for r in rows})
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for axis, dataset in zip(axes[0], datasets):
        for j, method in enumerate(METHODS):
            chosen = [r for r in rows if r["dataset"] == dataset and r["method"] == method]
            if not chosen:
                continue
            per_problem = defaultdict(list)
            for r in chosen:
                per_problem[r["problem"]].append(r)
            curve = [statistics.fmean(statistics.fmean(best_at(r["curve"], t) for r in rs) / best_any[p] for p, rs in per_problem.items())
                     for t in grid]
            axis.plot(grid, curve, label=method, color=f"C{j}")
        axis.set_title(f"{dataset} test ({len({r['problem'] for r in rows if r['dataset'] == dataset})} problems), {rows[0]['target']}", fontsize=9)
        axis.set_xlabel("measurements")
        axis.set_ylabel("best / best any method found")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="host (default), avx512, avx2 or sse4: the code generated and timed")
    parser.add_argument("--models", type=int, default=16, help="problems spread over the models test split")
    parser.add_argument("--mm", type=int, default=8, help="problems spread over the mm64-256 test split")
    parser.add_argument("--trials", type=int, default=64, help="measurements per search")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--source-problems", type=int, default=8, help="training problems per dataset in the transfer source")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--summarise", action="store_true", help="only print the summary of the CSV and draw the plot")
    parser.add_argument("--out", default=None, help="path prefix of the CSV and PNG (default experiments/results/search_curves/<target>)")
    args = parser.parse_args(argv)
    if min(args.models, args.mm, args.source_problems) < 0 or args.trials < 2 or args.seeds < 1:
        raise SystemExit("--models, --mm and --source-problems must be >= 0, --trials >= 2 and --seeds >= 1")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    out = Path(args.out) if args.out else RESULTS / target.isa
    table = out.with_suffix(".csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    source = out.with_name(out.name + "_source.sqlite")
    if args.summarise:
        summarise(table, args.trials, target.isa)
        return 0
    tests = [(d, p) for d, count in zip(DATASETS, (args.models, args.mm)) if count for p in spread(dataset_problems(d, "test"), count)]
    if "autotvm-transfer" in methods:
        training = [p for d in DATASETS for p in spread(dataset_problems(d, "train"), args.source_problems)]
        print(f"transfer source: {fill_source(source, training, args.trials, target)} records of {len(training)} training problems")
    done = {(r["problem"], r["method"], int(r["seed"])) for r in load_rows(table) if int(r["trials"]) == args.trials and r["target"] == target.isa}
    numpy = dict(zip((p.name for _, p in tests), numpy_gflops([p for _, p in tests], isa=target.isa)))
    fresh = not table.exists()
    host = cpu_model_name()
    with table.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for index, (dataset, problem) in enumerate(tests):
            for seed in range(args.seeds):
                for method in methods:
                    if (problem.name, method, seed) in done or (seed > 0 and method in DETERMINISTIC):
                        continue
                    try:
                        curve, seconds = search_curve(problem, method, seed, args.trials, target, source)
                    except KeyboardInterrupt:
                        print("interrupted; finished rows are kept in", table)
                        return 130
                    writer.writerow({"problem": problem.name, "dataset": dataset, "class": problem_class(problem, dataset),
                                     "target": target.isa, "host": host, "method": method, "seed": seed, "trials": args.trials,
                                     "best_gflops": f"{best_at(curve, args.trials):.2f}", "numpy_gflops": f"{numpy[problem.name]:.2f}",
                                     "seconds": f"{seconds:.2f}", "curve": json.dumps(curve)})
                    handle.flush()
                    print(f"[{index + 1}/{len(tests)} seed {seed}] {method:>16} {problem.name}: {best_at(curve, args.trials):.1f} GFLOPS "
                          f"(numpy {numpy[problem.name]:.1f})", flush=True)
    summarise(table, args.trials, target.isa)
    return 0


if __name__ == "__main__":
    sys.exit(main())
