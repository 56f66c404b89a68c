"""Loops only against loops and data layouts jointly (ALT's row), same search and budget.

For each problem and target, beam4bfs runs three times with the same wall-clock budget:
loops only (LoopTune's actions), joint (``layouts=True``: adds ``pack`` and ``pad``) and
joint with ALT's two-stage budget (30% joint, then loops only). Every figure includes the
conversion of packed inputs inside the kernel (no input is declared constant), and the
winners are re-measured (``verified_gflops``). Writes one CSV row per run.

    python experiments/layouts.py --budget 20   # -> experiments/results/layouts.csv
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import looprl
import looprl.search
from looprl.backend.codegen import conversions
from looprl.backend.jit import cpu_model_name
from looprl.backend.target import Target

PROBLEMS = ("128x256x64", "256x256x256", "384x128x64", "67x139x229", "mk,nk->mn:m=128,k=64,n=256")  # the last: A @ B.T
MODES = {"loops": {}, "joint": {"layouts": True}, "two-stage": {"layouts": True, "layout_stage": 0.3}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per search")
    parser.add_argument("--problems", nargs="*", default=list(PROBLEMS), help="MxNxK problems")
    parser.add_argument("--targets", nargs="*", default=["host", "avx2"])
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--cache", default=":memory:", help="measurement cache (default: a fresh in-memory one per search, so no mode reuses another's timings)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "layouts.csv"))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = ["problem", "target", "mode", "budget_s", "initial_gflops", "best_gflops", "verified_gflops", "evaluations", "schedule", "host", "converted_in_kernel"]
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for problem in args.problems:
            for target_name in args.targets:
                target = Target.resolve(target_name)
                if target.missing_on_host():
                    print(f"skip {target_name}: the host lacks {target.missing_on_host()}")
                    continue
                for mode in args.modes:
                    started = time.perf_counter()
                    result = looprl.search.run(problem, "beam4bfs", budget_s=args.budget, target=target, cache=args.cache, **MODES[mode])
                    row = {
                        "problem": result.problem.name,
                        "target": target.isa,
                        "mode": mode,
                        "budget_s": args.budget,
                        "initial_gflops": round(result.initial_gflops, 2),
                        "best_gflops": round(result.best_gflops, 2),
                        "verified_gflops": None if result.verified_gflops is None else round(result.verified_gflops, 2),
                        "evaluations": result.evaluations,
                        "schedule": result.best_nest.key,
                        "host": cpu_model_name(),
                        "converted_in_kernel": ",".join(conversions(result.best_nest)["per_call"]) or "-",
                    }
                    writer.writerow(row)
                    handle.flush()
                    print(f"{problem} {target.isa} {mode}: {row['verified_gflops']} GFLOPS ({time.perf_counter() - started:.0f} s) {row['schedule']}")


if __name__ == "__main__":
    main()
