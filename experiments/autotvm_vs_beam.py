"""How many measurements AutoTVM needs to reach what a long beam search finds (AutoTVM's
claim: about half the trials of black-box search, or fewer).

    python experiments/autotvm_vs_beam.py --problems 4 --budget 60

(about 2-3 minutes per problem; tiny check: ``--problems 1 --budget 5 --out /tmp/vs_beam``.)

Per problem, from an empty cache each (a private ``":memory:"`` evaluator, so every trial is
a new measurement): beam4bfs runs for ``--budget`` seconds and counts the distinct schedules
it measured, N; then AutoTVM (rank objective) gets N/2 measurements and no time limit. From
AutoTVM's best-so-far curve the script reads the trials it needed to reach beam's best, and to
come within 2% of it. Both bests are the highest figure measured during a search, and a search
that measures more schedules draws more noisy samples, so beam's best carries the larger
upward bias; the 2% band is the comparison the summary leads with.

Writes, appending (finished problems are skipped), ``<out>.csv`` (a row per problem and
target, both curves as JSON) and ``<out>.png`` (best GFLOPS against trials per problem), and
prints the summary.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from looprl import defaults
from looprl.target import TARGET_CHOICES, Target
from looprl.workloads.datasets import dataset_problems
from looprl.ir.problem import parse_problems
from looprl.measurement.evaluator import Evaluator
from looprl.search import run
from looprl.train.validation import spread

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["problem", "target", "budget_s", "beam_trials", "beam_best", "autotvm_trials", "autotvm_best",
          "trials_to_match", "trials_to_98", "beam_curve", "autotvm_curve"]
NEAR = 0.98


def trials_to_reach(curve, goal: float) -> int | None:
    """Trials after which a (seconds, trials, best) curve first reaches ``goal``; None if never."""
    return next((int(trials) for _, trials, best in curve if best >= goal), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=4, help="test-split problems, spread evenly")
    parser.add_argument("--dataset", default=defaults.DATASET, help="the benchmark set whose test split gives the problems")
    parser.add_argument("--given", nargs="+", default=None, help="these problems instead: MxNxK (several may be comma-separated) or problem names")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of beam4bfs per problem (default 60)")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES, help="the code generated and timed (default: the host's)")
    parser.add_argument("--seed", type=int, default=0, help="AutoTVM's seed")
    parser.add_argument("--out", default=str(RESULTS / "autotvm_vs_beam"), help="path prefix of the CSV and PNG")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error("--budget must be positive")
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    table = Path(args.out + ".csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    rows = list(csv.DictReader(table.open(encoding="utf-8"))) if table.exists() else []
    if table.exists() and table.read_text(encoding="utf-8").splitlines()[:1] != [",".join(FIELDS)]:
        raise SystemExit(f"{table} has other columns: give another --out")
    done = {(r["problem"], r["target"]) for r in rows if float(r["budget_s"]) == args.budget}
    problems = parse_problems(args.given) if args.given else spread(dataset_problems(args.dataset, "test"), args.problems)
    fresh = not table.exists()
    with table.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for index, problem in enumerate(problems):
            if (problem.name, target.isa) in done:
                continue
            beam = run(problem, "beam4bfs", budget_s=args.budget, evaluator=Evaluator(":memory:", target=target), verify_s=None)
            if beam.stopped == "interrupted":
                return 130
            allowed = max(32, beam.evaluations // 2)
            tuner = run(problem, "autotvm", budget_s=math.inf, max_evaluations=allowed, seed=args.seed,
                        evaluator=Evaluator(":memory:", target=target), verify_s=None)
            if tuner.stopped == "interrupted":
                return 130
            match, near = trials_to_reach(tuner.curve, beam.best_gflops), trials_to_reach(tuner.curve, NEAR * beam.best_gflops)
            writer.writerow({"problem": problem.name, "target": target.isa, "budget_s": args.budget, "beam_trials": beam.evaluations,
                             "beam_best": f"{beam.best_gflops:.2f}", "autotvm_trials": tuner.evaluations,
                             "autotvm_best": f"{tuner.best_gflops:.2f}", "trials_to_match": "" if match is None else match,
                             "trials_to_98": "" if near is None else near,
                             "beam_curve": json.dumps([[round(s, 3), int(n), round(g, 3)] for s, n, g in beam.curve]),
                             "autotvm_curve": json.dumps([[round(s, 3), int(n), round(g, 3)] for s, n, g in tuner.curve])})
            handle.flush()
            print(f"[{index + 1}/{len(problems)}] {problem.name} ({target.isa}): beam4bfs {beam.best_gflops:.1f} GFLOPS with "
                  f"{beam.evaluations} trials in {beam.elapsed_s:.0f} s; autotvm {tuner.best_gflops:.1f} with {tuner.evaluations}, "
                  f"within 2% after {near if near is not None else '-'}, matched after {match if match is not None else '-'}", flush=True)
    summarise(table, args.budget, [p.name for p in problems], target.isa)
    return 0


def summarise(table: Path, budget: float, problems: list[str], target: str) -> None:
    rows = [r for r in csv.DictReader(table.open(encoding="utf-8"))
            if r["problem"] in problems and r["target"] == target and float(r["budget_s"]) == budget]
    if not rows:
        return
    for column, label in (("trials_to_98", f"within {100 - 100 * NEAR:.0f}% of"), ("trials_to_match", "at or above")):
        reached = [r for r in rows if r[column]]
        half = sum(1 for r in reached if 2 * int(r[column]) <= int(r["beam_trials"]))
        savings = [int(r["beam_trials"]) / int(r[column]) for r in reached]
        median = f"; median {statistics.median(savings):.1f}x fewer trials" if savings else ""
        print(f"autotvm {label} beam4bfs's {budget:g} s best: {len(reached)} of {len(rows)} problems, "
              f"with at most half its trials on {half}{median}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), squeeze=False)
    for axis, row in zip(axes[0], rows):
        for j, (name, column) in enumerate((("beam4bfs", "beam_curve"), ("autotvm", "autotvm_curve"))):
            curve = json.loads(row[column])
            last = int(row["beam_trials"]) if name == "beam4bfs" else int(row["autotvm_trials"])
            xs = [n for _, n, _ in curve] + [last]
            ys = [g for _, _, g in curve] + [curve[-1][2]]
            axis.step(xs, ys, where="post", label=name, color=f"C{j}")
        axis.axhline(NEAR * float(row["beam_best"]), color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log")
        axis.set_title(row["problem"].split(":")[-1], fontsize=8)
        axis.set_xlabel("trials (log)")
        axis.set_ylabel(f"best GFLOPS ({target})")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
