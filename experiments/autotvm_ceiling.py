"""How much room random search leaves at 64 measurements: AutoTVM's target (1.2x random search
at 64 measurements) against the best schedule known for each problem.

    python experiments/autotvm_ceiling.py --target avx512
    python experiments/autotvm_ceiling.py --target avx2

For each problem of ``autotvm_trials.py``'s last runs (the CSVs under ``--trials-dir``: the
classes ``models``, ``offgrid`` and ``mm64``), three answers are found again, each from an
empty cache: random search with ``--trials`` measurements, AutoTVM whose first batch the
shipped policy ranks (``autotvm-policy``) with as many, and measured ``looprl.tune`` at its
own budget (the best schedule known here: its stages measure every register tile, cache block
and packing of the target). The three schedules are then re-timed together in ``--rounds``
interleaved rounds on one buffer set per problem (best kept; ``looprl.train.adapt.retimed``),
so the figures compare in one run. Prints per class the geometric means of autotvm-policy / random and of tune / random:
the second is the most any method could gain over random search on that class; writes one
CSV row per problem (``<out>.csv``).
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import looprl
from looprl.ir.problem import parse_problem
from looprl.measurement.evaluator import Evaluator
from looprl.policy.loading import load_policy
from looprl.policy.rollout import PolicyPrior
from looprl.search import run
from looprl.target import TARGET_CHOICES, Target
from looprl.train.adapt import geomean_ratio, retimed

RESULTS = Path(__file__).resolve().parent / "results"
CLASSES = ("models", "offgrid", "mm64")
METHODS = ("random", "autotvm-policy", "tune")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES, help="the code generated and timed (default: this host)")
    parser.add_argument("--trials-dir", default=str(RESULTS / "autotvm_prior_plans"), help="autotvm_trials.py's CSVs (their problems)")
    parser.add_argument("--trials", type=int, default=64, help="measurements of each search")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-timing rounds")
    parser.add_argument("--out", default=None, help="CSV path prefix (default: <trials-dir>/autotvm_ceiling_<isa>)")
    args = parser.parse_args(argv)
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    trials_dir = Path(args.trials_dir)
    classes = {}
    for name in CLASSES:
        table = trials_dir / f"autotvm64_{name}_{target.isa}.csv"
        if not table.exists():
            raise SystemExit(f"{table} is missing: run experiments/autotvm_trials.py for this class and target first")
        with table.open(encoding="utf-8") as handle:
            classes[name] = list(dict.fromkeys(row["problem"] for row in csv.DictReader(handle)))
    policy = load_policy("default", target)
    rows = []
    for name, problems in classes.items():
        for index, problem_name in enumerate(problems):
            problem = parse_problem(problem_name)
            nests = {}
            for method in ("random", "autotvm-policy"):
                options = {"prior": PolicyPrior(policy, target)} if method == "autotvm-policy" else {}
                result = run(problem, "random" if method == "random" else "autotvm", budget_s=math.inf, max_evaluations=args.trials,
                             seed=0, evaluator=Evaluator(":memory:", target=target), verify_s=None, **options)
                nests[method] = result.best_nest
            tuned = looprl.tune(problem, policy, cache=":memory:", target=target, remember=False, threads=1)
            nests["tune"] = tuned.nest
            best = {method: gflops[0] for method, gflops in retimed({m: [n] for m, n in nests.items()}, target, args.rounds).items()}
            rows.append({"class": name, "problem": problem_name, "target": target.isa, "tune_measured": tuned.measured,
                         **{f"{m}_gflops": round(best[m], 2) for m in METHODS}})
            print(f"[{name} {index + 1}/{len(problems)}] {problem_name}: " + ", ".join(f"{m} {best[m]:.1f}" for m in METHODS)
                  + f" GFLOPS (tune measured {tuned.measured})", flush=True)
    out = Path(args.out) if args.out else trials_dir / f"autotvm_ceiling_{target.isa}"
    with out.with_suffix(".csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{target.isa} ({target.cpu}), {args.trials} measurements, re-timed together; geomean ratios to random search:")
    for name in list(CLASSES) + ["all"]:
        chosen = [r for r in rows if name == "all" or r["class"] == name]
        random = [r["random_gflops"] for r in chosen]
        prior, tuned = [r["autotvm-policy_gflops"] for r in chosen], [r["tune_gflops"] for r in chosen]
        lowest = min(a / b for a, b in zip(prior, random))
        print(f"  {name:8s} autotvm-policy/random {geomean_ratio(prior, random):.3f} (lowest {lowest:.3f})   "
              f"tune/random {geomean_ratio(tuned, random):.3f}   ({len(chosen)} problems)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
