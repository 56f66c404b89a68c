"""Two versions of tune's answers, re-timed together: which version's schedules are faster.

    python experiments/retime_answers.py BEFORE.json AFTER.json [--target avx2]

BEFORE and AFTER are ``looprl-bench tune --json`` files of the same problems (e.g. one from a
checkout of the older version). Comparing their tuned/numpy ratios mixes two runs' noise,
numpy's included; here the two schedules of each problem are compiled in one process and
timed in ``--rounds`` interleaved rounds (best of each kept), so a slow phase of the machine
hits both alike. Prints the problems that moved by more than 5% and the geometric mean of
after / before.
"""

from __future__ import annotations

import argparse
import json
import statistics

from looprl.backend.host import cpu_model_name
from looprl.backend.kernel import compile
from looprl.measurement.records import stored_nest
from looprl.measurement.timing import Workspace, time_kernel
from looprl.target import TARGET_CHOICES, Target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.03, help="seconds per timing (default 0.03)")
    args = parser.parse_args(argv)
    target = Target.resolve(args.target)
    before = {r["problem"]: r["schedule"] for r in json.load(open(args.before, encoding="utf-8"))["rows"]}
    after = {r["problem"]: r["schedule"] for r in json.load(open(args.after, encoding="utf-8"))["rows"]}
    common = [p for p in after if p in before]
    if not common:
        parser.error("the two files share no problem")
    print(f"CPU {cpu_model_name()}; target {target.isa}; {len(common)} problems, {args.rounds} interleaved rounds")
    ratios = []
    for problem in common:
        if before[problem] == after[problem]:
            ratios.append(1.0)
            continue
        kernels = [compile(stored_nest(problem, schedule), target=target) for schedule in (before[problem], after[problem])]
        workspace = Workspace(kernels[0].problem)
        best = [0.0, 0.0]
        for _ in range(args.rounds):
            for i, kernel in enumerate(kernels):
                best[i] = max(best[i], time_kernel(kernel, args.budget, workspace=workspace).gflops)
        ratios.append(best[1] / best[0])
        if not 0.95 < ratios[-1] < 1.05:
            print(f"{problem:42s} before {best[0]:6.1f}  after {best[1]:6.1f} GFLOPS  {ratios[-1]:.2f}")
    same = sum(before[p] == after[p] for p in common)
    print(f"{len(common)} problems ({same} with the same schedule): after/before geomean {statistics.geometric_mean(ratios):.3f}, "
          f"min {min(ratios):.2f}, max {max(ratios):.2f}; faster by > 5%: {sum(r > 1.05 for r in ratios)}, "
          f"slower by > 5%: {sum(r < 0.95 for r in ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
