"""The shipped policy against every search baseline on the same test problems (LoopTune,
Figs. 8-10).

    python experiments/policy_vs_search.py --problems 25 --budget 60

Problems: ``--problems`` matmuls spread evenly over the test split of mm64-256. Every method
starts from an empty cache; ``policy`` runs ``looprl.tune`` (measured mode: the policy's
rollout and its measured search, well under a second), ``policy-alone`` one greedy episode of
the policy (``tune(measure=False)``: nothing measured but the state it ends in); each search
gets ``--budget`` seconds. Once every method has answered a problem, the schedules they
returned are re-timed together: ``--rounds`` rounds, each timing every distinct schedule for
33 ms in turn, best round kept. Those re-measured GFLOPS are what the methods are compared on;
two methods that return the same schedule get the same figure, and a slow phase of the machine
hits all of them alike. Writes (appending, so an interrupted run resumes at the first problem
it had not finished) ``experiments/results/policy_vs_search.csv`` with one row per problem and
method, ``..._steps.csv`` with the GFLOPS after each action of the returned sequence, and two
plots: GFLOPS against time spent, and best GFLOPS per step.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from looprl import defaults
from looprl.backend.kernel import compile
from looprl.target import TARGET_CHOICES, Target
from looprl.workloads.datasets import dataset_problems
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.timing import time_kernel
from looprl.policy.loading import load_policy
from looprl.policy.rollout import measured_path
from looprl.tune.api import tune
from looprl.search import PAPER_ALGORITHMS, run

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["problem", "m", "n", "k", "method", "seconds", "initial_gflops", "found_gflops", "gflops", "actions"]


def spread(count: int):
    test = dataset_problems(defaults.DATASET, "test")
    step = len(test) / count
    return [test[int(i * step)] for i in range(count)]


def retime_together(nests, target, rounds: int) -> dict[str, float]:
    """Best GFLOPS of each distinct schedule over ``rounds`` interleaved rounds, by key."""
    kernels = {nest.key: compile(nest, target=target) for nest in nests}
    best = dict.fromkeys(kernels, 0.0)
    for _ in range(rounds):
        for key, kernel in kernels.items():
            best[key] = max(best[key], time_kernel(kernel, 0.033).gflops)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=25)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per search (the paper: 60)")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--methods", default=",".join(("policy-alone", "policy") + PAPER_ALGORITHMS),
                        help="policy-alone, policy and/or search algorithms")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES, help="generate code for this target (default: the host's)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-timing rounds per problem (default 5)")
    parser.add_argument("--out", default=str(RESULTS / "policy_vs_search"),
                        help="path prefix of the CSVs and plots (<out>.csv, <out>_steps.csv, <out>_time.png, <out>_steps.png)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    target = Target.resolve(args.target)
    policy = load_policy(args.policy if args.policy == "default" else Path(args.policy), target)
    methods = [a.strip() for a in args.methods.split(",") if a.strip()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table, steps_table = out.with_name(out.name + ".csv"), out.with_name(out.name + "_steps.csv")
    done = set()
    if table.exists():
        done = {(r["problem"], r["method"]) for r in csv.DictReader(table.open(encoding="utf-8"))}
    fresh = not table.exists()
    with table.open("a", newline="", encoding="utf-8") as handle, steps_table.open("a", newline="", encoding="utf-8") as steps_handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        steps_writer = csv.writer(steps_handle)
        if fresh:
            writer.writeheader()
            steps_writer.writerow(["problem", "method", "step", "gflops"])
        for index, problem in enumerate(spread(args.problems)):
            answers = []
            for method in methods:
                if (problem.name, method) in done:
                    continue
                evaluator = Evaluator(":memory:", target=target)
                if method in ("policy", "policy-alone"):
                    result = tune(problem, policy, measure=method == "policy", cache=evaluator.cache, target=target, remember=False, threads=1)
                    seconds, initial, found, nest, names = result.seconds, result.initial_gflops, result.gflops, result.nest, result.actions
                else:
                    result = run(problem, method, budget_s=args.budget, evaluator=evaluator, verify_s=None)
                    if result.stopped == "interrupted":
                        print("interrupted; finished problems are kept in", table)
                        return 130
                    seconds, initial, found, nest, names = result.elapsed_s, result.initial_gflops, result.best_gflops, result.best_nest, result.actions
                answers.append((method, evaluator, seconds, initial, found, nest, names))
            retimed = retime_together([answer[5] for answer in answers], target, args.rounds) if answers else {}
            for method, evaluator, seconds, initial, found, nest, names in answers:
                gflops = retimed[nest.key]
                sizes = dict(problem.sizes)
                writer.writerow({"problem": problem.name, "m": sizes["m"], "n": sizes["n"], "k": sizes["k"], "method": method,
                                 "seconds": f"{seconds:.3f}", "initial_gflops": f"{initial:.2f}", "found_gflops": f"{found:.2f}",
                                 "gflops": f"{gflops:.2f}", "actions": " ".join(names)})
                for step, value in enumerate(measured_path(problem, names, evaluator)):
                    steps_writer.writerow([problem.name, method, step, f"{value:.2f}"])
                print(f"[{index + 1}/{args.problems}] {method:>9} {problem.name}: {gflops:.1f} GFLOPS (re-timed) in {seconds:.2f} s", flush=True)
            handle.flush()
            steps_handle.flush()
    summarise(table, steps_table)
    return 0


def args_budget(rows) -> str:
    """The searches' time, as their rows record it (e.g. "60 s")."""
    spent = [float(r["seconds"]) for r in rows if not r["method"].startswith("policy")]
    return f"{round(max(spent)):.0f} s" if spent else ""


def summarise(table: Path, steps_table: Path) -> None:
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    by_problem = defaultdict(dict)
    for row in rows:
        by_problem[row["problem"]][row["method"]] = row
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print(f"{'method':>9} {'GFLOPS':>8} {'speedup':>8} {'seconds':>8}")
    for method in methods:
        group = [r for r in rows if r["method"] == method]
        print(f"{method:>9} {statistics.fmean(float(r['gflops']) for r in group):8.1f} "
              f"{statistics.geometric_mean(float(r['gflops']) / float(r['initial_gflops']) for r in group):8.2f} "
              f"{statistics.fmean(float(r['seconds']) for r in group):8.2f}")
    searches = [m for m in methods if not m.startswith("policy")]
    for mine in [m for m in methods if m.startswith("policy")]:
        complete = [p for p, m in by_problem.items() if mine in m and all(s in m for s in searches)]
        if not complete or not searches:
            continue
        ratios = [float(by_problem[p][mine]["gflops"]) / max(float(by_problem[p][s]["gflops"]) for s in searches) for p in complete]
        wins = [r for r in ratios if r >= 1.0]
        print(f"{mine}: matches or beats the best {args_budget(rows)} search on {len(wins)} of {len(complete)} problems "
              f"({len(wins) / len(complete):.0%}; re-timed GFLOPS), within 2% on {sum(r >= 0.98 for r in ratios)}; "
              f"its GFLOPS / best search's: geomean {statistics.geometric_mean(ratios):.3f}, "
              f"on its wins {statistics.geometric_mean(wins) if wins else float('nan'):.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for i, method in enumerate(methods):
        group = [r for r in rows if r["method"] == method]
        axes.scatter([float(r["seconds"]) for r in group], [float(r["gflops"]) for r in group], s=8, alpha=0.4, color=f"C{i}")
        axes.scatter([statistics.fmean(float(r["seconds"]) for r in group)], [statistics.fmean(float(r["gflops"]) for r in group)],
                     s=80, marker="*", color=f"C{i}", label=method, edgecolors="black")
    axes.set_xscale("log")
    axes.set_xlabel("seconds spent (log)")
    axes.set_ylabel("GFLOPS of the returned schedule (re-timed)")
    axes.legend(fontsize=7, ncols=2)
    figure.tight_layout()
    figure.savefig(table.with_name(table.stem + "_time.png"), dpi=120)

    steps = defaultdict(lambda: defaultdict(list))
    for row in csv.DictReader(steps_table.open(encoding="utf-8")):
        steps[row["method"]][int(row["step"])].append(float(row["gflops"]))
    figure, axes = plt.subplots(figsize=(6, 4))
    for i, method in enumerate(methods):
        points = sorted(steps[method].items())
        curve = [statistics.fmean(values) for _, values in points]
        axes.plot([s for s, _ in points], curve, marker="o", markersize=3, label=method, color=f"C{i}")
    axes.set_xlabel("action (step) of the returned sequence")
    axes.set_ylabel("mean GFLOPS after the step")
    axes.legend(fontsize=7, ncols=2)
    figure.tight_layout()
    figure.savefig(table.with_name(table.stem + "_steps.png"), dpi=120)
    print("wrote", table, steps_table, "and two plots")


if __name__ == "__main__":
    sys.exit(main())
