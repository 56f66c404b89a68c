"""How much re-measuring a state moves its value: first timing against the best of several.

    python experiments/resampling.py --problems 8 --states 25 --samples 3

States: for each of ``--problems`` test matmuls of mm64-256, the untuned nest and
``--states - 1`` random schedules (random walks of split/swap, as an agent visits). Every state
is timed ``--samples`` times by the evaluator's rule (8 ms budget, the machine-wide lock), in
rounds: round r times every state once before round r+1 starts, so a state's samples are
seconds apart, as when an env revisits a state later. Reports, per state, the first sample and
the best of all (what the cache keeps), and for each problem whether the search's answer (the
best state) changes when states are ranked by their first sample instead of the best.
Writes ``experiments/results/resampling.csv``.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from pathlib import Path

from looprl import defaults
from looprl.target import Target
from looprl.workloads.datasets import dataset_problems
from looprl.ir.nest import initial_nest
from looprl.ir.schedules import random_schedule
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.peak import peak_gflops

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--states", type=int, default=25)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--target", default="host")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "resampling.csv")
    args = parser.parse_args()

    target = Target.named(args.target)
    test = dataset_problems(defaults.DATASET, "test")
    problems = [test[round(i * len(test) / args.problems)] for i in range(args.problems)]
    rng = random.Random(args.seed)
    states = []
    for problem in problems:
        chosen = {initial_nest(problem).key: initial_nest(problem)}
        while len(chosen) < args.states:
            nest = random_schedule(problem, rng, steps=rng.randint(2, 10))
            chosen.setdefault(nest.key, nest)
        states += list(chosen.values())

    evaluator = Evaluator(":memory:", target=target, samples=1)
    peak = peak_gflops(target=target, cache=evaluator.cache)
    samples = {nest: [] for nest in states}
    for round_ in range(args.samples):
        for nest in states:
            samples[nest].append(evaluator.remeasure(nest).sample_gflops)
        print(f"round {round_ + 1}/{args.samples} done ({len(states)} states)", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["target", "problem", "schedule", *[f"sample{i + 1}" for i in range(args.samples)], "best"])
        for nest, values in samples.items():
            writer.writerow([target.isa, nest.problem.name, nest.key, *[f"{v:.3f}" for v in values], f"{max(values):.3f}"])

    gains = sorted(max(v) / v[0] for v in samples.values())
    shifts = sorted((max(v) - v[0]) / peak for v in samples.values())
    quantile = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    print(f"target {target}; peak {peak:.1f} GFLOPS; {len(states)} states x {args.samples} samples")
    print(f"best/first: median {statistics.median(gains):.3f}, p90 {quantile(gains, 0.9):.3f}, max {gains[-1]:.3f}; "
          f"{sum(g > 1.10 for g in gains) / len(gains):.0%} of states gain > 10%")
    print(f"value shift (best - first) / peak, the size of a reward change: median {statistics.median(shifts):.4f}, "
          f"p90 {quantile(shifts, 0.9):.4f}, max {shifts[-1]:.4f}")
    changed, losses = 0, []
    for problem in problems:
        own = [nest for nest in states if nest.problem == problem]
        by_first = max(own, key=lambda nest: samples[nest][0])
        by_best = max(own, key=lambda nest: max(samples[nest]))
        changed += by_first != by_best
        losses.append(max(samples[by_first]) / max(samples[by_best]))
    print(f"search answer (best state) changes on {changed}/{len(problems)} problems when ranked by best-of-{args.samples}; "
          f"the first-sample winner reaches {statistics.mean(losses):.3f} of the best-of-{args.samples} winner on average")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
