"""Does a two-thread team pay when its kernel is called from Python, with and without team
placement (looprl.backend.placement: each thread of the team held to a core of its own)?

    python experiments/team_placement.py [--problems 128x320x960,256x256x256,3136x144x24,197x1536x384]
        [--target host|avx2] [--threads 2] [--rounds 3] [--out experiments/results]

Each problem (``MxNxK``: ``looprl.matmul(m, n, k)``) is tuned on one thread (empty cache,
nothing remembered); its answer and the team made of it the way tune makes its first team
(``looprl.search.parallel.parallel_variant``: the outermost loop over the output parallel) are
then timed in child processes, ``LOOPRL_PLACE_TEAMS=1`` and ``=0`` in turn, ``--rounds``
times each (interleaved: 1, 0, 1, 0, ...), each keeping its best. A child times, as GFLOPS:

* ``serial``: the answer on one thread, one call at a time from a Python loop;
* ``loop``: the team, one call at a time from a Python loop (how a program calls it);
* ``reps``: the team, 10 calls in one native loop (how tune's timing rule calls it).

Prints each problem's figures and ``loop`` over ``serial`` both ways; writes
``<out>/team_placement_<cpu>[_avx2].{txt,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"
PROBLEMS = "128x320x960,256x256x256,3136x144x24,197x1536x384"
CALLS = 20  # calls per timed batch (the batch's fastest call counts)
BATCHES = 10

CHILD = r"""
import json, sys, time
import numpy as np
import looprl
from looprl.ir.nest import LoopNest
problem = looprl.parse_problem(sys.argv[1])
serial = looprl.compile(LoopNest.from_key(problem, sys.argv[2]), target=sys.argv[4], threads=1)
team = looprl.compile(LoopNest.from_key(problem, sys.argv[3]), target=sys.argv[4], threads=int(sys.argv[5]))
rng = np.random.default_rng(0)
a, b = (rng.standard_normal(shape).astype(np.float32) for shape in problem.input_shapes)
out = np.empty(problem.output_shape, np.float32)
team.run(a, b, out)
assert np.allclose(out, a @ b, rtol=1e-3, atol=1e-3)


def best(call, reps):
    fastest = float("inf")
    for _ in range(%(batches)d):
        for _ in range(%(calls)d):
            started = time.perf_counter()
            call()
            fastest = min(fastest, (time.perf_counter() - started) / reps)
    return problem.flops / fastest / 1e9


print(json.dumps({"serial": best(lambda: serial.run(a, b, out), 1), "loop": best(lambda: team.run(a, b, out), 1),
                  "reps": best(lambda: team.run(a, b, out, reps=10), 10)}))
""" % {"batches": BATCHES, "calls": CALLS}


def child(problem: str, serial_key: str, team_key: str, target: str, threads: int, place: str) -> dict:
    env = {**os.environ, "LOOPRL_PLACE_TEAMS": place}
    env.pop("GOMP_SPINCOUNT", None), env.pop("OMP_WAIT_POLICY", None)
    done = subprocess.run([sys.executable, "-c", CHILD, problem, serial_key, team_key, target, str(threads)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    import looprl
    from looprl.backend.host import host_cpu
    from looprl.search.parallel import parallel_variant

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=PROBLEMS)
    parser.add_argument("--target", default="host", choices=("host", "avx2"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads < 2 or args.rounds < 1:
        parser.error("--threads must be at least 2 and --rounds at least 1")
    if args.threads > len(os.sched_getaffinity(0)):
        parser.error(f"--threads {args.threads}: this process may use {len(os.sched_getaffinity(0))} core(s)")
    cpu = host_cpu()[0]
    stem = args.out / f"team_placement_{cpu}{'' if args.target == 'host' else '_' + args.target}"
    rows = []
    with open(stem.with_suffix(".txt"), "w") as file:
        out = Tee(sys.stdout, file)
        print(f"{cpu}, target {args.target}, teams of {args.threads}; GFLOPS, best of {args.rounds} child runs per setting "
              f"({BATCHES} batches of {CALLS} calls each); {time.strftime('%Y-%m-%d %H:%M')}", file=out)
        print(f"{'problem':>14} {'serial':>7} {'loop 1':>7} {'reps 1':>7} {'loop 0':>7} {'reps 0':>7} "
              f"{'loop/serial 1':>13} {'loop/serial 0':>13}  team", file=out)
        for text in args.problems.split(","):
            problem = looprl.parse_problem(text)
            answer = looprl.tune(problem, target=args.target, threads=1, cache=":memory:", remember=False)
            variant = parallel_variant(answer.nest, args.threads)
            if variant is None:
                print(f"{text:>14} no loop to share out", file=out)
                continue
            team_key = variant[0].key
            best = {"1": {}, "0": {}}
            for _ in range(args.rounds):
                for place in ("1", "0"):
                    figures = child(text, answer.nest.key, team_key, answer.target.isa, args.threads, place)
                    best[place] = {key: max(value, best[place].get(key, 0.0)) for key, value in figures.items()}
            serial = max(best["1"]["serial"], best["0"]["serial"])
            row = {"problem": text, "serial": serial, "team": team_key, "placed": best["1"], "unplaced": best["0"],
                   "loop_over_serial_placed": best["1"]["loop"] / serial, "loop_over_serial_unplaced": best["0"]["loop"] / serial}
            rows.append(row)
            print(f"{text:>14} {serial:7.1f} {best['1']['loop']:7.1f} {best['1']['reps']:7.1f} {best['0']['loop']:7.1f} "
                  f"{best['0']['reps']:7.1f} {row['loop_over_serial_placed']:13.2f} {row['loop_over_serial_unplaced']:13.2f}  {team_key}",
                  file=out)
    stem.with_suffix(".json").write_text(json.dumps({"cpu": cpu, "target": args.target, "threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
