"""Does the measured bandwidth bound hold? The host's memory bandwidth as looprl measures it
(``looprl.measurement.roofline.measure_bandwidth_gbs``: the best of its read patterns) with and
without the software-prefetching patterns, against the rate at which numpy (OpenBLAS) reads a
weight too large for any cache in a one-row GEMM.

    python experiments/bandwidth_bound.py [--threads 1,2] [--mb 235] [--target host|avx2] [--out experiments/results]

Per thread count: looprl's DRAM bound measured now twice (every pattern, and the patterns
without prefetches alone: what the bound was before they were added), and numpy's
``x @ W`` with ``x`` one row and ``W`` a ``--mb`` MB float32 ``[k, n]`` matrix (k = n), timed in a
child process with ``OPENBLAS_CORETYPE`` unset and as many BLAS threads (best of 20 calls after
two warm-up calls; ``W`` is read from memory on every call: it is many times the last-level
cache). numpy's GB/s counts ``W``'s bytes once per call. A bound is a bound where numpy's rate
stays below it. Writes ``<out>/bandwidth_bound_<cpu>[_avx2].txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"

NUMPY_GEMV = """
import json, sys, time
import numpy as np
side = int(sys.argv[1])
x = np.random.default_rng(0).random((1, side), dtype=np.float32)
w = np.random.default_rng(1).random((side, side), dtype=np.float32)
for _ in range(2):
    x @ w
best = min(((time.perf_counter(), x @ w, time.perf_counter()) for _ in range(20)), key=lambda t: t[2] - t[0])
print(json.dumps(w.nbytes / (best[2] - best[0]) / 1e9))
"""


def numpy_gbs(side: int, threads: int) -> float:
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    environment.update(OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", NUMPY_GEMV, str(side)], env=environment, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(argv=None) -> int:
    from looprl.backend.host import host_cpu
    from looprl.measurement import roofline
    from looprl.measurement.roofline import level_buffer_bytes, measure_bandwidth_gbs
    from looprl.target import Target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--mb", type=int, default=235, help="numpy's operand in MB (default 235, as issue 61's)")
    parser.add_argument("--target", default="host", choices=("host", "avx2"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    target = Target.host() if args.target == "host" else Target.named(args.target)
    side = int((args.mb * 2**20 / 4) ** 0.5)
    suffix = "" if args.target == "host" else f"_{args.target}"
    path = args.out / f"bandwidth_bound_{host_cpu()[0]}{suffix}.txt"
    with open(path, "w") as file:
        out = Tee(sys.stdout, file)
        print(f"{host_cpu()[0]}, target {target.isa}; numpy: one row times a {side}x{side} float32 matrix "
              f"({4 * side * side / 1e6:.0f} MB); looprl's DRAM buffer {level_buffer_bytes('dram') / 1e6:.0f} MB", file=out)
        print(f"{'threads':>7} {'bound GB/s':>10} {'no prefetch':>11} {'numpy GB/s':>10} {'numpy/bound':>11}", file=out)
        for threads in (int(t) for t in args.threads.split(",")):
            bound = measure_bandwidth_gbs(target, level_buffer_bytes("dram"), threads)
            kept = roofline.PREFETCH_DISTANCES
            roofline.PREFETCH_DISTANCES = (0,)  # the patterns without prefetches alone
            try:
                plain = measure_bandwidth_gbs(target, level_buffer_bytes("dram"), threads)
            finally:
                roofline.PREFETCH_DISTANCES = kept
            numpy = numpy_gbs(side, threads)
            print(f"{threads:>7} {bound:>10.1f} {plain:>11.1f} {numpy:>10.1f} {numpy / bound:>11.2f}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
