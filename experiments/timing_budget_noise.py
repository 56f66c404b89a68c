"""How much the env's reward loses with a shorter timing budget per new state (issue 28: cold steps).

    python experiments/timing_budget_noise.py [--states 80] [--rounds 3] [--budgets-ms 2,4,8]

States an agent visits (random walks of swaps and splits on mm64-256 training problems) are
compiled once, then each is timed with every budget in every round, in a shuffled interleaved
order, so a slow phase of the machine hits every budget alike. A state's reference is the
best of all its timings plus one long (``--reference-ms``) timing. For each budget the script
prints how far one timing falls short of the reference (median, p90, p99; the env keeps a
state's first timing, so this is the error an agent's reward carries), the rank correlation of
one timing with the reference over all states, and the time one timing costs (the cold step's
measuring part). Writes one CSV row per timing (``<out>.csv``) and a summary (``<out>.json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import time
from pathlib import Path

import numpy as np

from looprl.backend.host import cpu_model_name
from looprl.backend.kernel import compile
from looprl.ir.schedules import random_schedule
from looprl.measurement.timing import Workspace, time_kernel
from looprl.target import TARGET_CHOICES, Target
from looprl.train.validation import spread
from looprl.workloads.datasets import dataset_problems

RESULTS = Path(__file__).resolve().parent / "results"


def _ranks(values: list[float]) -> np.ndarray:
    order = np.argsort(values)
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budgets-ms", default="2,4,8")
    parser.add_argument("--reference-ms", type=float, default=40.0)
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="path prefix (default experiments/results/timing_budget_noise_<isa>)")
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets_ms.split(",")]
    if args.states < 2 or args.rounds < 1 or not budgets or min(budgets) <= 0:
        parser.error("need --states >= 2, --rounds >= 1 and positive budgets")
    target = Target.resolve(args.target)
    rng = random.Random(args.seed)
    problems = spread(dataset_problems("mm64-256", "train"), args.states)
    states = []
    for problem in problems:
        nest = random_schedule(problem, rng, steps=rng.randint(0, 10))
        states.append((problem, nest, compile(nest, target)))
    workspaces = {p.name: Workspace(p) for p, _, _ in states}
    print(f"CPU {cpu_model_name()}; target {target.isa} ({target.cpu}); {len(states)} states, {args.rounds} rounds", flush=True)

    rows, best = [], [0.0] * len(states)
    for round_ in range(1, args.rounds + 1):
        work = [(i, b) for i in range(len(states)) for b in budgets]
        rng.shuffle(work)
        for i, budget_ms in work:
            problem, _, kernel = states[i]
            started = time.perf_counter()
            timing = time_kernel(kernel, budget_ms / 1000, workspace=workspaces[problem.name])
            cost = time.perf_counter() - started
            rows.append({"round": round_, "state": i, "problem": problem.name, "budget_ms": budget_ms,
                         "gflops": timing.gflops, "runs": timing.runs, "cost_ms": 1000 * cost})
            best[i] = max(best[i], timing.gflops)
        print(f"round {round_}/{args.rounds} done", flush=True)
    for i, (problem, _, kernel) in enumerate(states):
        best[i] = max(best[i], time_kernel(kernel, args.reference_ms / 1000, workspace=workspaces[problem.name]).gflops)

    summary = {"cpu": cpu_model_name(), "target": target.isa, "states": len(states), "rounds": args.rounds,
               "reference_ms": args.reference_ms, "budgets": {}}
    print(f"{'budget':>8}  {'short median':>12}  {'p90':>6}  {'p99':>6}  {'rank corr':>9}  {'ms/timing':>9}")
    for budget_ms in budgets:
        mine = [r for r in rows if r["budget_ms"] == budget_ms]
        shortfall = [1 - r["gflops"] / best[r["state"]] for r in mine]
        correlations = []
        for round_ in range(1, args.rounds + 1):
            values = {r["state"]: r["gflops"] for r in mine if r["round"] == round_}
            single = [values[i] for i in range(len(states))]
            correlations.append(float(np.corrcoef(_ranks(single), _ranks(best))[0, 1]))
        entry = {
            "shortfall_median": float(np.median(shortfall)),
            "shortfall_p90": float(np.percentile(shortfall, 90)),
            "shortfall_p99": float(np.percentile(shortfall, 99)),
            "rank_correlation": statistics.mean(correlations),
            "cost_ms_mean": statistics.mean(r["cost_ms"] for r in mine),
        }
        summary["budgets"][f"{budget_ms:g}"] = entry
        print(f"{budget_ms:>6g}ms  {entry['shortfall_median']:>12.3%}  {entry['shortfall_p90']:>6.1%}  {entry['shortfall_p99']:>6.1%}  "
              f"{entry['rank_correlation']:>9.4f}  {entry['cost_ms_mean']:>9.2f}")

    out = Path(args.out) if args.out else RESULTS / f"timing_budget_noise_{target.isa}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}.csv and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
