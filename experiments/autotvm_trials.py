"""Best GFLOPS against measured trials (AutoTVM, Fig. 4): the AutoTVM tuner (rank and
regression objectives) against random, greedy2 and beam4bfs; ``autotvm-policy`` is AutoTVM whose
first batch is the schedules the shipped policy's greedy episode passes through
(``prior=PolicyPrior(policy)``) instead of random ones.

    python experiments/autotvm_trials.py --problems 4 --trials 200 --seeds 3

(about 20-30 minutes on 2 vCPUs; tiny check: ``--problems 2 --trials 48 --seeds 1 --out /tmp/trials``.)

Problems: ``--problems`` matmuls spread evenly over the test split of ``--dataset`` (mm64-256;
mm384-1024 for matmuls beyond L2), or ``--given`` ones (``MxNxK`` or a problem name such as
``"mk,nk->mn:m=128,n=96,k=64"``). Every search
starts from an empty cache (a private ``":memory:"`` evaluator, so a trial is a new
measurement), gets the same ``--trials`` distinct schedules and no time limit; greedy2 and
beam4bfs may finish earlier (their curves then stay flat). The best-so-far curve of each
search (``SearchResult.curve``: seconds, trials, best GFLOPS at every improvement) is kept.

Writes, appending (an interrupted run resumes; finished (problem, method, seed) runs are
skipped), ``<out>.csv``: one row per run with its curve as JSON; then ``<out>.png``: per
problem the mean best GFLOPS against trials, and, over all problems, the best GFLOPS as a
fraction of the best any method found on the problem; and prints the mean fraction reached
after 25%, 50% and 100% of the trials.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from looprl import defaults
from looprl.target import Target
from looprl.workloads.datasets import dataset_problems
from looprl.ir.problem import parse_problems
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.numpy_baseline import numpy_gflops
from looprl.policy.loading import load_policy
from looprl.policy.rollout import PolicyPrior
from looprl.search import run
from looprl.train.validation import spread

from _curves import best_at, load_rows

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("random", "greedy2", "beam4bfs", "autotvm", "autotvm-regression")
# Methods that are an algorithm with options: AutoTVM whose first batch the shipped policy gives.
PRIOR_METHODS = {"autotvm-policy": "autotvm"}
FIELDS = ["problem", "target", "method", "seed", "trials", "initial_gflops", "best_gflops", "seconds", "stopped", "curve"]






def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=4, help="test-split problems, spread evenly")
    parser.add_argument("--dataset", default=defaults.DATASET, help="the benchmark set whose test split gives the problems")
    parser.add_argument("--given", nargs="+", default=None,
                        help="these problems instead, e.g. off-grid sizes: MxNxK (several may be comma-separated) or problem names")
    parser.add_argument("--target", default=None, help="host (default), avx512, avx2 or sse4: the code generated and timed")
    parser.add_argument("--trials", type=int, default=200, help="measured schedules per search")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS + tuple(PRIOR_METHODS))}")
    parser.add_argument("--policy", default="default", help="autotvm-policy: the policy whose greedy episode gives the first batch")
    parser.add_argument("--out", default=str(RESULTS / "autotvm_trials"), help="path prefix of the CSV and PNG")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    table = Path(args.out + ".csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    done = {(r["problem"], r["method"], int(r["seed"])) for r in load_rows(table)
            if int(r["trials"]) == args.trials and r.get("target", target.isa) == target.isa}
    fresh = not table.exists()
    if not fresh and table.read_text(encoding="utf-8").splitlines()[:1] != [",".join(FIELDS)]:
        raise SystemExit(f"{table} has other columns (an older version of this script): give another --out")
    problems = parse_problems(args.given) if args.given else spread(dataset_problems(args.dataset, "test"), args.problems)
    with table.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for index, problem in enumerate(problems):
            for seed in range(args.seeds):
                for method in methods:
                    if (problem.name, method, seed) in done:
                        continue
                    algo, options = PRIOR_METHODS.get(method, method), {}
                    if method in PRIOR_METHODS:
                        options["prior"] = PolicyPrior(load_policy(args.policy, target), target)
                    result = run(problem, algo, budget_s=math.inf, max_evaluations=args.trials, seed=seed,
                                 evaluator=Evaluator(":memory:", target=target), verify_s=None, **options)
                    if result.stopped == "interrupted":
                        print("interrupted; finished rows are kept in", table)
                        return 130
                    curve = [[round(s, 3), int(n), round(g, 3)] for s, n, g in result.curve]
                    writer.writerow({"problem": problem.name, "target": target.isa, "method": method, "seed": seed, "trials": args.trials,
                                     "initial_gflops": f"{result.initial_gflops:.2f}", "best_gflops": f"{result.best_gflops:.2f}",
                                     "seconds": f"{result.elapsed_s:.2f}", "stopped": result.stopped, "curve": json.dumps(curve)})
                    handle.flush()
                    print(f"[{index + 1}/{len(problems)} seed {seed}] {method:>18} {problem.name}: {result.best_gflops:.1f} GFLOPS "
                          f"(untuned {result.initial_gflops:.1f}) after {result.evaluations} trials, {result.elapsed_s:.1f} s", flush=True)
    summarise(table, args.trials, [p.name for p in problems], methods, numpy_gflops(problems), target.isa)
    return 0


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def summarise(table: Path, trials: int, problems: list[str], methods: list[str], numpy: list[float] | None = None,
              target: str | None = None) -> None:
    rows = [r for r in load_rows(table) if int(r["trials"]) == trials and r["problem"] in problems and r["method"] in methods
            and (target is None or r.get("target", target) == target)]
    best = defaultdict(float)  # problem -> best GFLOPS any method found
    for row in rows:
        best[row["problem"]] = max(best[row["problem"]], float(row["best_gflops"]))
    grid = list(range(1, trials + 1))
    fraction = {m: [statistics.fmean(best_at(r["curve"], t) / best[r["problem"]] for r in rows if r["method"] == m) for t in grid]
                for m in methods if any(r["method"] == m for r in rows)}
    checkpoints = [max(1, trials // 4), max(1, trials // 2), trials]
    print(f"{'method':>18} " + " ".join(f"{f'@{t}':>7}" for t in checkpoints) + "   (mean best / best found by any method)")
    for method, curve in fraction.items():
        print(f"{method:>18} " + " ".join(f"{curve[t - 1]:7.3f}" for t in checkpoints))
    # Against numpy (one thread) and against random search, after the same number of trials:
    # geometric means over the problems of each method's mean best.
    if numpy is not None:
        baseline = dict(zip(problems, numpy))

        def mean_best(method: str, problem: str, at: int) -> float:
            runs = [r for r in rows if r["method"] == method and r["problem"] == problem]
            return statistics.fmean(best_at(r["curve"], at) for r in runs) if runs else math.nan

        print(f"{'method':>18} " + " ".join(f"{f'@{t}':>7}" for t in checkpoints) + "   (geomean best / numpy)")
        for method in fraction:
            print(f"{method:>18} " + " ".join(f"{_geomean(mean_best(method, p, t) / baseline[p] for p in problems):7.3f}" for t in checkpoints))
        if "random" in fraction:
            print(f"{'method':>18} " + " ".join(f"{f'@{t}':>7}" for t in checkpoints) + "   (geomean best / random's best)")
            for method in fraction:
                print(f"{method:>18} " + " ".join(
                    f"{_geomean(mean_best(method, p, t) / mean_best('random', p, t) for p in problems):7.3f}" for t in checkpoints))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in problems if any(r["problem"] == p for r in rows)]
    columns = len(shown) + 1
    figure, axes = plt.subplots(1, columns, figsize=(3.2 * columns, 3.2), squeeze=False)
    for i, problem in enumerate(shown):
        axis = axes[0][i]
        for j, method in enumerate(fraction):
            runs = [r for r in rows if r["problem"] == problem and r["method"] == method]
            if runs:
                axis.plot(grid, [statistics.fmean(best_at(r["curve"], t) for r in runs) for t in grid], label=method, color=f"C{j}")
        axis.set_title(problem.split(":")[-1], fontsize=8)
        axis.set_xlabel("trials")
        axis.set_ylabel("best GFLOPS (mean over seeds)")
    axis = axes[0][-1]
    for j, (method, curve) in enumerate(fraction.items()):
        axis.plot(grid, curve, label=method, color=f"C{j}")
    axis.set_title("all problems", fontsize=8)
    axis.set_xlabel("trials")
    axis.set_ylabel("best / best found on the problem")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
