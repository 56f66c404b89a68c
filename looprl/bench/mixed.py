"""``looprl-bench mixed``: a tuned parallel kernel called in turn with numpy's matmul, in one process.

A real program mixes looprl's kernels with numpy (OpenBLAS) or another runtime's threads. For
each problem: ``looprl.tune(threads=N)`` from a cold cache, then the kernel's time per call in
three ways, each the best of :data:`ROUNDS` rounds of ``--calls`` calls (the mean over a
round's calls, only the kernel's calls timed), the three interleaved round by round (with a
pause of :data:`SETTLE_S` after each mixed round, so that numpy's threads are asleep again):

* **alone**: back to back;
* **mixed**: each call right after a numpy matmul of ``--numpy-size``² on N BLAS threads;
* **paused**: each call right after the main thread computed alone (a busy wait) for as long as
  that matmul takes: what any pause between calls costs (the kernel's threads asleep, its data
  partly out of the caches), with no other runtime's threads about.

``mixed/alone`` is what a program sees; ``mixed/paused`` what numpy's threads add. Both
runtimes' threads spin for a while after their work (:mod:`looprl.backend.threads`). numpy
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

from looprl import checks
from looprl.backend.host import cpu_model_name
from looprl.backend.threads import available_cores
from looprl.ir.problem import parse_problems
from looprl.tune.api import tune

DEFAULT_PROBLEMS = "3136x24x144,256x256x256,512x512x512,197x1536x384"
ROUNDS = 5
SETTLE_S = 0.25  # OpenBLAS's threads spin for about 2**28 cycles after a call (0.1 s at 2.7 GHz)


def _busy(seconds: float) -> None:
    """Compute on this thread alone for ``seconds`` (a busy wait)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def add_arguments(parser) -> None:
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS, help=f"comma-separated MxNxK (default {DEFAULT_PROBLEMS})")
    parser.add_argument("--threads", type=int, default=None, help="threads of the kernel and of numpy's BLAS (default: the cores, at least 2)")
    parser.add_argument("--numpy-size", type=int, default=512, help="numpy's matmul between kernel calls: N x N (default 512)")
    parser.add_argument("--calls", type=int, default=50, help="calls per round (default 50)")
    parser.add_argument("--json", type=Path, default=None)


def main(args, out=None) -> dict:
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    threads = available_cores() if args.threads is None else args.threads
    if threads < 2 or threads > available_cores():
        raise ValueError(f"--threads must be 2..{available_cores()} (the cores this process may use), got {threads}")
    checks.positive_int(args.numpy_size, "--numpy-size")
    checks.positive_int(args.calls, "--calls")
    problems = parse_problems(args.problems)
    x = np.random.default_rng(0).random((args.numpy_size, args.numpy_size), dtype=np.float32)
    print(f"CPU {cpu_model_name()}; kernels and numpy on {threads} threads; numpy {args.numpy_size}x{args.numpy_size} matmul "
          "between mixed calls", file=out)
    print(f"{'problem':>18} {'parallel':>8} {'alone ms':>9} {'mixed ms':>9} {'paused ms':>9} {'mixed/alone':>11} {'mixed/paused':>12}",
          file=out)
    started = time.perf_counter()
    for _ in range(5):
        x @ x
    numpy_s = (time.perf_counter() - started) / 5
    rows = []
    for problem in problems:  # numpy's BLAS threads: as this process has it
        result = tune(problem, cache=":memory:", threads=threads)
        kernel = result.kernel
        rng = np.random.default_rng(1)
        a, b = (rng.random(shape, dtype=np.float32) for shape in problem.input_shapes)
        output = np.empty(problem.output_shape, np.float32)
        kernel.run(a, b, output)  # warm

        def after(between) -> float:
            spent = 0.0
            for _ in range(args.calls):
                between()
                started = time.perf_counter()
                kernel.run(a, b, output)
                spent += time.perf_counter() - started
            return spent / args.calls

        best = {"alone": math.inf, "mixed": math.inf, "paused": math.inf}
        for _ in range(ROUNDS):
            best["alone"] = min(best["alone"], after(lambda: None))
            best["mixed"] = min(best["mixed"], after(lambda: x @ x))
            time.sleep(SETTLE_S)  # numpy's threads stop spinning before the next round
            best["paused"] = min(best["paused"], after(lambda: _busy(numpy_s)))
        row = {"problem": problem.name, "parallel": result.nest.is_parallel, "alone_s": best["alone"], "mixed_s": best["mixed"],
               "paused_s": best["paused"], "ratio": best["mixed"] / best["alone"], "ratio_to_paused": best["mixed"] / best["paused"]}
        rows.append(row)
        label = f"{problem.size('m')}x{problem.size('n')}x{problem.size('k')}"
        print(f"{label:>18} {str(row['parallel']):>8} {1e3 * row['alone_s']:9.3f} {1e3 * row['mixed_s']:9.3f} {1e3 * row['paused_s']:9.3f} "
              f"{row['ratio']:11.2f} {row['ratio_to_paused']:12.2f}", file=out, flush=True)
    parallel = [r for r in rows if r["parallel"]]
    summary = {"threads": threads, "numpy_call_s": numpy_s, "ratio_geomean": statistics.geometric_mean([r["ratio"] for r in rows]),
               "ratio_to_paused_geomean": statistics.geometric_mean([r["ratio_to_paused"] for r in rows]),
               "parallel_ratio_geomean": statistics.geometric_mean([r["ratio"] for r in parallel]) if parallel else None}
    print(f"geomean mixed/alone {summary['ratio_geomean']:.2f}, mixed/paused {summary['ratio_to_paused_geomean']:.2f}"
          + (f" ({summary['parallel_ratio_geomean']:.2f} mixed/alone over the {len(parallel)} parallel kernels)" if parallel else "")
          + f"; numpy's matmul {1e3 * numpy_s:.2f} ms", file=out)
    report = {"cpu": cpu_model_name(), "summary": summary, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
