"""looprl.tune on real models' GEMMs it never saw, against numpy, the untuned nest, the best
hand-written schedule, the policy's greedy rollout alone, and the same tune with random weights.

    python experiments/real_models.py --split test [--target avx2] [--limit N] [--search-budget 60]

Problems: the ``models`` dataset's split (the test split holds whole models no training
problem comes from). For each problem, from an empty cache:

* ``tune``: ``looprl.tune`` with the shipped policy for the target (default budget: scaled to
  the problem);
* ``tune-random``: the same call with the policy's network re-initialised at random (the
  ablation: what the trained weights add to tune's result);
* ``rollout`` / ``rollout-random``: ``tune(budget_s=0)``, the greedy rollout alone, trained /
  random weights;
* ``tune-third`` / ``tune-random-third``: the same tune, trained / random weights, capped at a
  third of the schedules ``tune-random`` measured (``tune(max_evaluations=...)``, the untuned
  nest and the rollout's states included): what the trained weights add at equal
  measurements, and whether they reach the random weights' quality with a third of them;
* ``tune-4`` / ``tune-random-4``: the same, capped at four schedules (:data:`SCARCE`): what
  the weights are worth when measurements are scarce;
* ``hand``: the best of every hand-written register tile, cache-blocked variant and packed
  variant (``looprl.search.tiles.all_tiles``), each measured: what the action space can express;
* ``search`` (with ``--search-budget S``): beam4bfs for S seconds;
* ``untuned``: the initial nest.

Every kernel ``tune`` returns is checked against numpy (float64 reference) before it is timed.

A method's seconds exclude time spent waiting for another looprl process's timing
(``TuneResult.waited_s``). Once every method has answered a problem, their schedules are re-timed together in interleaved
rounds (best kept), so the same schedule gets the same figure. numpy is timed in a child
process with one BLAS thread and the target's OpenBLAS kernels (``numpy_gflops(isa=...)``).
Writes ``<out>.csv`` (a row per problem and method; appended, so an interrupted run resumes),
``<out>.png`` (per-model bars: geomean of each method over numpy) and prints the summary.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from looprl.backend.kernel import compile
from looprl.target import TARGET_CHOICES, Target
from looprl.workloads.datasets import dataset_entries
from looprl.workloads.entries import DatasetEntry
from looprl.ir.problem import parse_problem
from looprl.measurement.peak import peak_gflops
from looprl.ir.nest import initial_nest
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.numpy_baseline import numpy_gflops
from looprl.measurement.timing import time_kernel
from looprl.policy.loading import load_policy
from looprl.search.tiles import all_tiles
from looprl.tune.api import tune

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["model", "layer", "problem", "method", "seconds", "gflops", "numpy_gflops", "ratio", "peak_gflops", "actions", "measured"]
METHODS = ("untuned", "tune", "tune-random", "rollout", "rollout-random", "tune-third", "tune-random-third", "tune-4", "tune-random-4",
           "hand")
SCARCE = 4  # the tune-4 rows: four distinct schedules (the untuned nest, the policy's answer and two more)


def retime_together(nests: dict[str, object], target: Target, rounds: int, threads: int = 1) -> dict[str, float]:
    """Best GFLOPS of each distinct schedule over ``rounds`` interleaved rounds, by method."""
    kernels = {}
    for nest in nests.values():
        if nest.key not in kernels:
            kernels[nest.key] = compile(nest, target=target, threads=threads)
    best = dict.fromkeys(kernels, 0.0)
    for _ in range(rounds):
        for key, kernel in kernels.items():
            best[key] = max(best[key], time_kernel(kernel, 0.03).gflops)
    return {method: best[nest.key] for method, nest in nests.items()}


def check_correct(kernel) -> None:
    """Raise if ``kernel`` does not compute what numpy does (float64 reference)."""
    problem = kernel.problem
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in problem.input_shapes)
    expected = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))
    reduction = math.prod(problem.size(d) for d in problem.reduction_dims)
    error = float(np.abs(kernel(a, b) - expected).max())
    if error > 1e-5 * reduction:
        raise AssertionError(f"{problem.name}: tuned kernel differs from numpy by {error}")


def run_problem(entry, target, policy, random_policy, search_budget: float, threads: int = 1) -> dict[str, tuple]:
    """method -> (nest, seconds, actions, schedules measured) for one problem, each from an empty cache."""
    problem = entry.problem
    found = {"untuned": (initial_nest(problem), 0.0, "", 1)}
    for method, chosen, budget in (("tune", policy, None), ("tune-random", random_policy, None),
                                   ("rollout", policy, 0), ("rollout-random", random_policy, 0),
                                   ("tune-third", policy, None), ("tune-random-third", random_policy, None),
                                   ("tune-4", policy, None), ("tune-random-4", random_policy, None)):
        cap = max(1, round(found["tune-random"][3] / 3)) if method.endswith("-third") else SCARCE if method.endswith("-4") else None
        result = tune(problem, chosen, cache=":memory:", budget_s=budget, target=target, remember=False, threads=threads,
                      max_evaluations=cap)
        found[method] = (result.nest, result.seconds - result.waited_s, " ".join(result.actions), result.measured)
        if method == "tune":
            check_correct(result.kernel)
    started = time.perf_counter()
    evaluator = Evaluator(":memory:", target=target, samples=1)
    best = max(all_tiles(problem, target) or [initial_nest(problem)], key=lambda nest: evaluator(nest).gflops)
    found["hand"] = (best, time.perf_counter() - started, "", evaluator.compiled)
    if search_budget > 0:
        from looprl.search import run

        started = time.perf_counter()
        outcome = run(problem, "beam4bfs", budget_s=search_budget, cache=":memory:", target=target)
        found["search"] = (outcome.best_nest, time.perf_counter() - started, " ".join(outcome.best_actions), outcome.evaluations)
    return found


def summarize(rows: list[dict]) -> str:
    by_model: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_model[row["model"]][row["method"]].append(float(row["ratio"]))
        by_model["all"][row["method"]].append(float(row["ratio"]))
    methods = [m for m in METHODS + ("search",) if any(m in v for v in by_model.values())]
    lines = ["geomean x numpy", f"{'model':16s}" + "".join(f"{m:>16s}" for m in methods)]
    for model in sorted(by_model, key=lambda m: (m == "all", m)):
        cells = []
        for method in methods:
            values = by_model[model].get(method, [])
            cells.append(f"{_geomean(values):16.2f}" if values else f"{'-':>16s}")
        lines.append(f"{model:16s}" + "".join(cells))
    peaks = [float(r["peak_gflops"]) for r in rows if r.get("peak_gflops")]
    if peaks:
        for method in ("hand", "tune"):
            fractions = [float(r["gflops"]) / float(r["peak_gflops"]) for r in rows if r["method"] == method and r.get("peak_gflops")]
            if fractions:
                lines.append(f"{method} / peak: geomean {_geomean(fractions):.2f}, max {max(fractions):.2f}")
    tune_seconds = [float(r["seconds"]) for r in rows if r["method"] == "tune"]
    if tune_seconds:
        lines.append(f"tune seconds: median {statistics.median(tune_seconds):.2f}, max {max(tune_seconds):.2f}")
    ratios = defaultdict(dict)
    for row in rows:
        ratios[row["problem"]][row["method"]] = float(row["gflops"])
    for trained, random in (("tune", "tune-random"), ("rollout", "rollout-random"), ("tune-third", "tune-random-third"),
                            ("tune-third", "tune-random"), ("tune-4", "tune-random-4"), ("tune-4", "tune-random"), ("rollout", "tune")):
        pairs = [v[trained] / v[random] for v in ratios.values() if v.get(random, 0) > 0 and trained in v]
        if pairs:
            lines.append(f"{trained} / {random}: geomean {_geomean(pairs):.3f} over {len(pairs)} problems")
    measured = defaultdict(list)
    for row in rows:
        if row.get("measured"):
            measured[row["method"]].append(int(row["measured"]))
    if measured:
        lines.append("schedules measured (median): " + ", ".join(f"{m} {statistics.median(v):g}" for m, v in measured.items()))
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_model: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_model[row["model"]][row["method"]].append(float(row["ratio"]))
    models = sorted(by_model)
    methods = [m for m in METHODS + ("search",) if any(m in by_model[x] for x in models)]
    width = 0.8 / len(methods)
    figure, axes = plt.subplots(figsize=(max(6, 2 * len(models)), 4))
    for i, method in enumerate(methods):
        values = [_geomean(by_model[m].get(method, [])) if by_model[m].get(method) else 0 for m in models]
        axes.bar([x + i * width for x in range(len(models))], values, width, label=method)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([x + 0.4 - width / 2 for x in range(len(models))], models)
    axes.set_ylabel("GFLOPS / numpy (geomean)")
    axes.set_title(title)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="models")
    parser.add_argument("--split", default="test", choices=("train", "test", "all"))
    parser.add_argument("--limit", type=int, default=None, help="N problems spread evenly over the split (default: all)")
    parser.add_argument("--problems", default=None,
                        help="explicit problems instead of the dataset (comma-separated MxNxK), reported as model 'given'")
    parser.add_argument("--policy", default="default", help="policy folder (default: the shipped one for the target)")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--search-budget", type=float, default=0.0, help="seconds of beam4bfs per problem (0: no search)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--threads", type=int, default=1, help="threads of every kernel and of numpy (default 1)")
    parser.add_argument("--out", default=None, help="path prefix of the CSV and plot (default experiments/results/real_models_<target>)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or (args.limit is not None and args.limit < 1) or args.search_budget < 0:
        parser.error("--rounds and --limit must be positive, --search-budget non-negative")
    target = Target.resolve(args.target)
    policy = load_policy(args.policy if args.policy == "default" else Path(args.policy), target)
    random_policy = policy.with_random_weights(args.seed)
    peak = peak_gflops(target)
    if args.problems:
        entries = [DatasetEntry("mk,kn->mn", tuple(parse_problem(p.strip()).sizes), "given", p.strip(), "given on the command line")
                   for p in args.problems.split(",") if p.strip()]
    else:
        entries = list(dataset_entries(args.dataset, args.split))
    if args.limit is not None and args.limit < len(entries):
        entries = [entries[int(i * len(entries) / args.limit)] for i in range(args.limit)]
    out = Path(args.out) if args.out else RESULTS / f"real_models_{target.isa}"
    out.parent.mkdir(parents=True, exist_ok=True)
    table = out.with_name(out.name + ".csv")
    rows = list(csv.DictReader(table.open(encoding="utf-8"))) if table.exists() else []
    done = {row["problem"] for row in rows}
    print(f"{len(entries)} problems of {args.dataset}/{args.split}, target {target.isa} ({target.cpu}); "
          f"{len(done)} already in {table}", flush=True)
    todo = [e for e in entries if e.problem.name not in done]
    references = dict(zip((e.problem.name for e in todo), numpy_gflops([e.problem for e in todo], 0.2, isa=target.isa, threads=args.threads))) if todo else {}
    with table.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if not rows:
            writer.writeheader()
        for index, entry in enumerate(todo):
            found = run_problem(entry, target, policy, random_policy, args.search_budget, args.threads)
            gflops = retime_together({m: nest for m, (nest, _, _, _) in found.items()}, target, args.rounds, args.threads)
            reference = references[entry.problem.name]
            for method, (nest, seconds, actions, measured) in found.items():
                row = {"model": entry.model or args.dataset, "layer": entry.layer or "", "problem": entry.problem.name, "method": method,
                       "seconds": f"{seconds:.3f}", "gflops": f"{gflops[method]:.2f}", "numpy_gflops": f"{reference:.2f}",
                       "ratio": f"{gflops[method] / reference:.4f}", "peak_gflops": f"{peak:.1f}", "actions": actions,
                       "measured": measured}
                writer.writerow(row)
                rows.append(row)
            handle.flush()
            print(f"[{index + 1}/{len(todo)}] {entry.model or args.dataset:14s} {entry.problem.name:42s} numpy {reference:6.1f}  " +
                  "  ".join(f"{m} {gflops[m] / reference:.2f}" for m in found), flush=True)
    print(summarize(rows))
    plot(rows, out.with_name(out.name + ".png"), f"{args.dataset}/{args.split}, {target.isa} on {target.cpu}, {args.threads} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
