"""Can a user count on tune's answer? Four fresh tunes of each problem, their answers re-timed
together: the slowest answer over the fastest (issue 61: at least 0.9).

    python experiments/tune_stability.py [--problems 1x4864x896,32x1000x1280,...] [--tunes 4] [--threads 1]
        [--target host|avx2] [--rounds 5] [--tune-budget S] [--out experiments/results]

Each problem (``MxNxK``: ``looprl.matmul(m, n, k)``, B an input) is tuned ``--tunes`` times, each
from an empty cache and remembering nothing (``cache=":memory:", remember=False``), with the
shipped policy and tune's own budget (scaled to the problem), or ``--tune-budget`` seconds of
search (``budget_s``: does a larger budget make the answer one to count on?); tune's wall time
is kept. Then
the answers (the distinct schedules among them) are compiled in one process and timed in
``--rounds`` interleaved rounds on the threads they were tuned for, each keeping its best
GFLOPS, so that a slow phase of the machine hits every answer alike. Prints, per problem, each
answer's GFLOPS, the slowest over the fastest and the tunes' seconds; writes
``<out>/tune_stability_<cpu>[_avx2][_t<threads>][_b<seconds>].txt``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"
PROBLEMS = "1x4864x896,32x1000x1280,64x3072x768,384x4096x1024,1500x384x384"


def main(argv=None) -> int:
    import looprl
    from looprl.backend.host import host_cpu
    from looprl.measurement.timing import Workspace, time_kernel

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=PROBLEMS)
    parser.add_argument("--tunes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", default="host", choices=("host", "avx2"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per re-timing (default 0.05)")
    parser.add_argument("--tune-budget", type=float, default=None, help="tune's search budget in seconds (default: scaled to the problem)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.tunes < 2 or args.rounds < 1 or args.threads < 1:
        parser.error("--tunes must be at least 2, --rounds and --threads at least 1")
    if args.tune_budget is not None and not args.tune_budget > 0:
        parser.error("--tune-budget must be a positive number of seconds")
    problems = [looprl.parse_problem(text) for text in args.problems.split(",")]
    suffix = (("" if args.target == "host" else f"_{args.target}") + (f"_t{args.threads}" if args.threads > 1 else "")
              + (f"_b{args.tune_budget:g}" if args.tune_budget is not None else ""))
    path = args.out / f"tune_stability_{host_cpu()[0]}{suffix}.txt"
    worst = []
    with open(path, "w") as file:
        out = Tee(sys.stdout, file)
        budget = "scaled to the problem" if args.tune_budget is None else f"{args.tune_budget:g} s"
        print(f"{host_cpu()[0]}, target {args.target}, {args.threads} thread(s); {args.tunes} fresh tunes per problem "
              f"(search budget {budget}), answers re-timed together in {args.rounds} rounds", file=out)
        for problem in problems:
            results, seconds = [], []
            for _ in range(args.tunes):
                started = time.perf_counter()
                results.append(looprl.tune(problem, target=args.target, threads=args.threads, cache=":memory:", remember=False,
                                           budget_s=args.tune_budget))
                seconds.append(time.perf_counter() - started)
            kernels = {result.nest.key: result.kernel for result in results}  # the distinct answers
            workspace = Workspace(problem)
            best = dict.fromkeys(kernels, 0.0)
            for _ in range(args.rounds):
                for key, kernel in kernels.items():
                    best[key] = max(best[key], time_kernel(kernel, args.budget, workspace=workspace, threads=kernel.threads).gflops)
            answers = [best[result.nest.key] for result in results]
            worst.append(min(answers) / max(answers))
            print(f"{problem.name}: answers {', '.join(f'{g:.1f}' for g in answers)} GFLOPS ({len(kernels)} distinct); "
                  f"slowest/fastest {worst[-1]:.2f}; tune {min(seconds):.1f}-{max(seconds):.1f} s", file=out)
        print(f"lowest slowest/fastest {min(worst):.2f}; problems at 0.9 or more: {sum(w >= 0.9 for w in worst)} of {len(worst)}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
