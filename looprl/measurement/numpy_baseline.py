"""numpy's single-thread GFLOPS, timed in a child process.

OpenBLAS reads ``OPENBLAS_CORETYPE`` and its thread count when numpy is first imported, so the
strong baseline (native kernels, one BLAS thread) needs a fresh interpreter with a clean
environment. ``numpy_gflops`` starts one; run this module directly to time in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import best_time, check_budget

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def baseline_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update({name: "1" for name in _THREAD_VARIABLES})
    return env


def numpy_gflops(problems: list, budget_s: float = 0.3) -> list[float]:
    """GFLOPS of numpy (``matmul`` for matmuls, else ``einsum``) for each problem, measured in
    a child process with ``OPENBLAS_CORETYPE`` unset and one BLAS thread, by the common timing
    rule; this process holds the machine-wide lock meanwhile."""
    budget_s = check_budget(budget_s)
    request = json.dumps({"problems": [p.name for p in problems], "budget_s": budget_s})
    with machine_lock():
        result = subprocess.run(
            [sys.executable, "-m", "looprl.measurement.numpy_baseline"],
            input=request,
            capture_output=True,
            text=True,
            env=baseline_environment(),
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"numpy baseline process failed:\n{result.stderr}")
    return json.loads(result.stdout)["gflops"]


def _time_in_process(names: list[str], budget_s: float) -> list[float]:
    import numpy as np

    from looprl.backend.buffers import aligned_empty
    from looprl.ir.problem import parse_problem

    results = []
    rng = np.random.default_rng(0)
    for name in names:
        problem = parse_problem(name)
        a, b = (aligned_empty(s) for s in problem.input_shapes)
        a[...] = rng.uniform(-1, 1, a.shape)
        b[...] = rng.uniform(-1, 1, b.shape)
        out = aligned_empty(problem.output_shape)
        if problem.spec in ("mk,kn->mn", "bmk,bkn->bmn"):
            def run():
                np.matmul(a, b, out=out)
        else:
            path = np.einsum_path(problem.spec, a, b, optimize="optimal")[0]

            def run():
                np.einsum(problem.spec, a, b, out=out, optimize=path)

        def repeat(reps: int) -> None:
            for _ in range(reps):
                run()

        # The parent holds the machine-wide lock while this process runs.
        results.append(best_time(repeat, budget_s, flops=problem.flops, lock=contextlib.nullcontext()).gflops)
    return results


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())
    print(json.dumps({"gflops": _time_in_process(request["problems"], request["budget_s"])}))
