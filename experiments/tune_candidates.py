"""Why fresh tunes of one problem return different answers: every schedule each tune measured,
its figure in the tune against its speed when the tunes' best schedules are timed again together.

    python experiments/tune_candidates.py [--problems 32x1000x1280,1x4864x896] [--tunes 4] [--threads 1]
        [--top 6] [--rounds 7] [--out experiments/results]

Each problem (``MxNxK``: ``looprl.matmul(m, n, k)``) is tuned ``--tunes`` times, each from a
measurement cache of its own in a temporary folder (nothing remembered), with the shipped policy
and tune's own budget. The ``--top`` fastest schedules each tune measured (by its own figures) and
every answer are then compiled in one process and timed in ``--rounds`` interleaved rounds of
0.05 s each on the threads they were made for, each keeping its best. Prints, per tune, its
answer (re-timed, and over the fastest re-timed schedule of all the tunes) and its top schedules
with both figures; writes ``<out>/tune_candidates_<cpu>[_t<threads>].txt``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    import looprl
    from looprl.backend.host import host_cpu
    from looprl.backend.kernel import compile as compile_nest
    from looprl.ir.nest import LoopNest
    from looprl.measurement.cache import MeasurementCache
    from looprl.measurement.timing import Workspace, time_kernel
    from looprl.target import Target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default="32x1000x1280,1x4864x896")
    parser.add_argument("--tunes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.tunes < 2 or args.top < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--tunes must be at least 2; --top, --rounds and --threads at least 1")
    target = Target.resolve(None)
    path = args.out / f"tune_candidates_{host_cpu()[0]}{f'_t{args.threads}' if args.threads > 1 else ''}.txt"
    with open(path, "w") as file, tempfile.TemporaryDirectory() as folder:
        out = Tee(sys.stdout, file)
        print(f"{host_cpu()[0]}, {args.threads} thread(s); {args.tunes} fresh tunes per problem, the top {args.top} schedules of each "
              f"re-timed together in {args.rounds} rounds", file=out)
        for problem in (looprl.parse_problem(text) for text in args.problems.split(",")):
            tunes = []
            for index in range(args.tunes):
                cache_path = str(Path(folder) / f"{problem.name.replace(':', '_')}_{index}.sqlite")
                result = looprl.tune(problem, cache=cache_path, remember=False, threads=args.threads)
                with MeasurementCache(cache_path) as cache:
                    rows = cache.records(target) + (cache.records(target, threads=args.threads) if args.threads > 1 else [])
                figures = {key: gflops for name, key, gflops in rows if name == problem.name}
                tunes.append((result.nest.key, result.gflops, figures))
            keys = {answer for answer, _, _ in tunes}
            for _, _, figures in tunes:
                keys.update(sorted(figures, key=lambda key: -figures[key])[:args.top])
            kernels = {}
            for key in keys:
                nest = LoopNest.from_key(problem, key)
                kernels[key] = compile_nest(nest, target, threads=args.threads if nest.is_parallel else 1)
            workspace = Workspace(problem)
            best = dict.fromkeys(kernels, 0.0)
            for _ in range(args.rounds):
                for key, kernel in kernels.items():
                    best[key] = max(best[key], time_kernel(kernel, 0.05, workspace=workspace, threads=kernel.threads).gflops)
            fastest = max(best.values())
            print(f"{problem.name}: the fastest re-timed schedule {fastest:.1f} GFLOPS: {max(best, key=best.get)}", file=out)
            for index, (answer, gflops, figures) in enumerate(tunes):
                print(f"  tune {index}: answer {gflops:.1f} in the tune, {best[answer]:.1f} re-timed ({best[answer] / fastest:.2f} of the "
                      f"fastest); {len(figures)} schedules measured", file=out)
                for key in sorted(figures, key=lambda key: -figures[key])[:args.top]:
                    print(f"    {figures[key]:7.1f} in the tune {best[key]:7.1f} re-timed {'*' if key == answer else ' '} {key}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
