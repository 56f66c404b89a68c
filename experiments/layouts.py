"""Loops only against loops and data layouts jointly (ALT's row), same search and budget.

For each problem, target and split-factor set, beam4bfs runs with the same wall-clock budget
in three modes (and ``tune``: ``looprl.tune`` with its own scaled budget, for reference): loops only (LoopTune's actions), joint (``layouts=True``: adds ``pack`` and
``pad``, and starts a share of the budget from each input re-laid with the output's columns
innermost, :func:`looprl.ir.schedules.layout_starts`) and joint with ALT's two-stage budget (30% joint, then loops only). Every figure
includes the conversion of packed inputs inside the kernel (no input is declared constant;
``converted_in_kernel`` names them), and the winners are re-measured (``verified_gflops``).
numpy (one thread, the OpenBLAS kernels of the target's ISA; for a spec that is not a plain
matmul the faster of einsum and matmul on views) is timed once per problem and target in a
child process.

Split-factor sets: ``paper`` (4, 8, 16) and ``target`` (those plus the splits that form the
target's register tiles, :func:`looprl.ir.schedules.target_split_factors`).

    python experiments/layouts.py --budget 20 --repeats 2   # -> experiments/results/layouts.csv, .png
    python experiments/layouts.py --sensitive --budget 20 --factors target --out experiments/results/layouts_sensitive.csv
    python experiments/layouts.py --test-problems 8 --modes loops joint --factors paper --out experiments/results/layouts_test.csv

Prints, per target, factor set and mode, the geometric mean over the problems of the verified
GFLOPS against numpy, and how often joint beats loops only.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import looprl
import looprl.search
from looprl import defaults
from looprl.backend.host import cpu_model_name
from looprl.target import Target
from looprl.workloads.datasets import dataset_problems
from looprl.backend.layout_plan import conversions
from looprl.ir.problem import as_problem
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.numpy_baseline import numpy_gflops

# Where layout matters (issue 32): operands stored transposed, attention's batched q.k^T (no
# constant operand: a re-laid input is converted on every call) and 1x1 convolutions over NCHW
# and NHWC activations (constant weights, converted once), at shapes of the models test split
# (ViT-S/16: 6 heads of 64, 197 tokens; SmolLM-360M: 15 heads of 64; MobileNetV2's 1x1 convs).
SENSITIVE = (
    "mk,nk->mn:m=197,k=64,n=197",  # one ViT-S head's scores, K not constant
    "bmk,bnk->bmn:b=6,m=197,k=64,n=197",  # ViT-S, all heads
    "bmk,bnk->bmn:b=15,m=128,k=64,n=128",  # SmolLM-360M at 128 tokens
    "mk,nk->mn:m=128,k=960,n=960",  # a product with a right operand stored [n, k] that changes per call
    "km,kn->mn:m=384,k=197,n=384",  # A stored transposed (a weight gradient X^T dY)
    "km,kn->mn:m=960,k=128,n=960",
    "nchw,oc->nohw:n=1,c=96,h=14,w=14,o=576;const=in1",  # MobileNetV2 expand 1x1, NCHW
    "nhwc,oc->nhwo:n=1,h=14,w=14,c=96,o=576;const=in1",  # the same in NHWC
    "nhwc,oc->nhwo:n=1,h=56,w=56,c=24,o=144;const=in1",
)
PROBLEMS = ("128x256x64", "256x256x256", "384x128x64", "67x139x229", "mk,nk->mn:m=128,k=64,n=256")  # the last: A @ B.T
MODES = {"loops": {}, "joint": {"layouts": True}, "two-stage": {"layouts": True, "layout_stage": 0.3}, "tune": None}
FACTOR_SETS = {"paper": (4, 8, 16), "target": "target"}
FIELDS = ["problem", "target", "factors", "mode", "repeat", "budget_s", "initial_gflops", "best_gflops", "verified_gflops",
          "numpy_gflops", "evaluations", "schedule", "host", "converted_in_kernel"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per search")
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS), help="MxNxK problems or 'spec:m=..' strings")
    parser.add_argument("--sensitive", action="store_true", help="instead of --problems: the layout-sensitive set (SENSITIVE)")
    parser.add_argument("--test-problems", type=int, default=None, metavar="N",
                        help="instead of --problems: N problems spread evenly over the test split of mm64-256")
    parser.add_argument("--targets", nargs="*", default=["host", "avx2"])
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--factors", nargs="*", default=list(FACTOR_SETS), choices=list(FACTOR_SETS), help="split-factor sets")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each search (the CSV keeps every run)")
    parser.add_argument("--cache", default=":memory:", help="measurement cache (default: a fresh in-memory one per search, so no mode reuses another's timings)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "layouts.csv"))
    args = parser.parse_args()
    if args.repeats < 1 or not args.budget > 0:
        raise SystemExit("--repeats must be >= 1 and --budget > 0")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.test_problems is not None:
        if args.test_problems < 1:
            raise SystemExit("--test-problems must be >= 1")
        test = dataset_problems(defaults.DATASET, "test")
        problems = [test[int(i * len(test) / args.test_problems)] for i in range(args.test_problems)]
    else:
        problems = [as_problem(p) for p in (SENSITIVE if args.sensitive else args.problems)]
    numpy = {}  # (problem, isa) -> numpy's GFLOPS with the OpenBLAS kernels of that ISA
    for target_name in args.targets:
        target = Target.resolve(target_name)
        if not target.missing_on_host():
            numpy.update({(p.name, target.isa): g for p, g in zip(problems, numpy_gflops(problems, isa=target.isa))})
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        for problem in problems:
            for target_name in args.targets:
                target = Target.resolve(target_name)
                if target.missing_on_host():
                    print(f"skip {target_name}: the host lacks {target.missing_on_host()}")
                    continue
                for repeat in range(args.repeats):
                    for factors in args.factors:
                        for mode in args.modes:
                            started = time.perf_counter()
                            if mode == "tune":  # looprl.tune, its own scaled budget (re-laid inputs included)
                                result = tuned(problem, target, args.cache)
                            else:
                                result = looprl.search.run(problem, "beam4bfs", budget_s=args.budget, target=target, cache=args.cache,
                                                           split_factors=FACTOR_SETS[factors], **MODES[mode])
                            row = {
                                "problem": problem.name, "target": target.isa, "factors": factors, "mode": mode, "repeat": repeat,
                                "budget_s": args.budget,
                                "initial_gflops": round(result.initial_gflops, 2),
                                "best_gflops": round(result.best_gflops, 2),
                                "verified_gflops": None if result.verified_gflops is None else round(result.verified_gflops, 2),
                                "numpy_gflops": round(numpy[problem.name, target.isa], 2),
                                "evaluations": result.evaluations,
                                "schedule": result.best_nest.key,
                                "host": cpu_model_name(),
                                "converted_in_kernel": ",".join(conversions(result.best_nest)["per_call"]) or "-",
                            }
                            writer.writerow(row)
                            handle.flush()
                            ratio = (row["verified_gflops"] or row["best_gflops"]) / numpy[problem.name, target.isa]
                            print(f"{problem.name} {target.isa} {factors} {mode} #{repeat}: {row['verified_gflops']} GFLOPS, "
                                  f"{ratio:.2f}x numpy ({time.perf_counter() - started:.0f} s) {row['schedule']}", flush=True)
    summarise(out)
    plot(out)


def tuned(problem, target: Target, cache: str) -> SimpleNamespace:
    """``looprl.tune`` (one thread, nothing remembered) in the fields of a search result; the
    winner re-timed as the searches' are (about 0.1 s of fresh timings, at least three)."""
    result = looprl.tune(problem, cache=cache, target=target, remember=False, threads=1)
    evaluator = Evaluator(":memory:", target=target)
    verified = max(evaluator.remeasure(result.nest).sample_gflops for _ in range(max(3, round(0.1 / evaluator.budget_s))))
    return SimpleNamespace(initial_gflops=result.initial_gflops, best_gflops=result.gflops, verified_gflops=verified,
                           evaluations=result.measured, best_nest=result.nest)


def summarise(table: Path) -> None:
    """Geometric mean of verified GFLOPS / numpy per target, factor set and mode; joint's wins."""
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    value = lambda row: float(row["verified_gflops"] or row["best_gflops"])  # noqa: E731
    means = defaultdict(list)  # (problem, target, factors, mode) -> values over repeats
    for row in rows:
        means[(row["problem"], row["target"], row["factors"], row["mode"])].append(value(row))
    numpy = {(row["problem"], row["target"]): float(row["numpy_gflops"]) for row in rows}
    for target, factors in sorted({(key[1], key[2]) for key in means}):
        modes = sorted({key[3] for key in means if key[1:3] == (target, factors)})
        problems = sorted({key[0] for key in means if key[1:3] == (target, factors)})
        line = []
        for mode in modes:
            ratios = [statistics.fmean(means[(p, target, factors, mode)]) / numpy[p, target] for p in problems if (p, target, factors, mode) in means]
            line.append(f"{mode} {statistics.geometric_mean(ratios):.3f}")
        print(f"{target} {factors}: geomean x numpy over {len(problems)} problems: " + ", ".join(line))
        if "loops" in modes and "joint" in modes:
            pairs = [(statistics.fmean(means[(p, target, factors, "joint")]), statistics.fmean(means[(p, target, factors, "loops")]))
                     for p in problems if (p, target, factors, "joint") in means and (p, target, factors, "loops") in means]
            print(f"  joint above loops on {sum(j > l for j, l in pairs)} of {len(pairs)}; "
                  f"geomean joint / loops {statistics.geometric_mean([j / l for j, l in pairs]):.3f}")


def plot(table: Path) -> None:
    """Per problem and target: the mean verified GFLOPS of each factor set and mode, with numpy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    groups = defaultdict(list)
    for row in rows:
        groups[(row["problem"], row["target"])].append(row)
    if not groups:
        return
    figure, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.6), squeeze=False, sharey=True)
    for axis, ((problem, target), members) in zip(axes[0], sorted(groups.items())):
        bars = defaultdict(list)
        for row in members:
            bars[f"{row['factors']}\n{row['mode']}"].append(float(row["verified_gflops"] or row["best_gflops"]))
        labels = sorted(bars)
        axis.bar(range(len(labels)), [statistics.fmean(bars[label]) for label in labels], color="tab:blue")
        axis.axhline(float(members[0]["numpy_gflops"]), color="tab:red", linestyle="--", label="numpy")
        axis.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
        axis.set_title(f"{problem.replace('mk,', '').replace(':', ' ')}\n{target}", fontsize=7)
    axes[0][0].set_ylabel("GFLOPS (beam4bfs, verified)")
    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
