"""``looprl-bench mixed``: a tuned parallel kernel called in turn with numpy's matmul, in one process.

A real program mixes looprl's kernels with numpy (OpenBLAS) or another runtime's threads. For
each problem: ``looprl.tune(threads=N)`` from a cold cache, then the kernel's time per call
**alone** (best of several rounds of back-to-back calls) and **mixed** (each call right after
a numpy matmul of ``--numpy-size``² on N BLAS threads, only the kernel's call timed; the mean
over the calls, as a program would see it), and their ratio. Both runtimes' threads spin for a
while after their work (:mod:`looprl.backend.threads`); the ratio says what that costs. numpy
runs here as the process has it (OpenBLAS: a thread per core unless ``OPENBLAS_NUM_THREADS``
says otherwise; the machine's ``OPENBLAS_CORETYPE`` is left as set, which changes its kernels,
not its threads).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from looprl.backend.host import cpu_model_name
from looprl.backend.threads import available_cores
from looprl.ir.problem import parse_problems
from looprl.policy.tuner import tune

DEFAULT_PROBLEMS = "3136x24x144,256x256x256,512x512x512,197x1536x384"
ROUNDS = 5


def add_arguments(parser) -> None:
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS, help=f"comma-separated MxNxK (default {DEFAULT_PROBLEMS})")
    parser.add_argument("--threads", type=int, default=None, help="threads of the kernel and of numpy's BLAS (default: the cores, at least 2)")
    parser.add_argument("--numpy-size", type=int, default=512, help="numpy's matmul between kernel calls: N x N (default 512)")
    parser.add_argument("--calls", type=int, default=50, help="mixed calls per problem (default 50)")
    parser.add_argument("--json", type=Path, default=None)


def main(args, out=sys.stdout) -> dict:
    threads = available_cores() if args.threads is None else args.threads
    if threads < 2 or threads > available_cores():
        raise ValueError(f"--threads must be 2..{available_cores()} (the cores this process may use), got {threads}")
    if args.numpy_size < 1 or args.calls < 1:
        raise ValueError("--numpy-size and --calls must be positive")
    problems = parse_problems(args.problems)
    x = np.random.default_rng(0).random((args.numpy_size, args.numpy_size), dtype=np.float32)
    print(f"CPU {cpu_model_name()}; kernels and numpy on {threads} threads; numpy {args.numpy_size}x{args.numpy_size} matmul "
          "between mixed calls", file=out)
    print(f"{'problem':>18} {'parallel':>8} {'alone ms':>9} {'mixed ms':>9} {'mixed/alone':>11}", file=out)
    rows = []
    for problem in problems:  # numpy's BLAS threads: as this process has them
        result = tune(problem, cache=":memory:", threads=threads)
        kernel = result.kernel
        rng = np.random.default_rng(1)
        a, b = (rng.random(shape, dtype=np.float32) for shape in problem.input_shapes)
        output = np.empty(problem.output_shape, np.float32)
        kernel.run(a, b, output)  # warm
        alone = math.inf
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for _ in range(args.calls):
                kernel.run(a, b, output)
            alone = min(alone, (time.perf_counter() - started) / args.calls)
        spent = 0.0
        for _ in range(args.calls):
            x @ x
            started = time.perf_counter()
            kernel.run(a, b, output)
            spent += time.perf_counter() - started
        mixed = spent / args.calls
        row = {"problem": problem.name, "parallel": result.nest.is_parallel, "alone_s": alone, "mixed_s": mixed, "ratio": mixed / alone}
        rows.append(row)
        label = f"{problem.size('m')}x{problem.size('n')}x{problem.size('k')}"
        print(f"{label:>18} {str(row['parallel']):>8} {1e3 * alone:9.3f} {1e3 * mixed:9.3f} {row['ratio']:11.2f}", file=out, flush=True)
    parallel = [r["ratio"] for r in rows if r["parallel"]]
    summary = {"threads": threads, "ratio_geomean": statistics.geometric_mean([r["ratio"] for r in rows]),
               "parallel_ratio_geomean": statistics.geometric_mean(parallel) if parallel else None}
    print(f"geomean mixed/alone {summary['ratio_geomean']:.2f}" +
          (f" ({summary['parallel_ratio_geomean']:.2f} over the {len(parallel)} parallel kernels)" if parallel else ""), file=out)
    report = {"cpu": cpu_model_name(), "summary": summary, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
