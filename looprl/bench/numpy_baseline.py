"""numpy's single-thread GFLOPS, timed in a child process.

OpenBLAS reads ``OPENBLAS_CORETYPE`` and its thread count when numpy is first imported, so the
strong baseline (native kernels, one BLAS thread) needs a fresh interpreter with a clean
environment. ``numpy_gflops`` starts one; run this module directly to time in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def baseline_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update({name: "1" for name in _THREAD_VARIABLES})
    return env


def numpy_gflops(problems: list, budget_s: float = 0.3) -> list[float]:
    """GFLOPS of numpy (``matmul`` for matmuls, else ``einsum``) for each problem, measured in
    a child process with ``OPENBLAS_CORETYPE`` unset and one BLAS thread."""
    request = json.dumps({"problems": [p.name for p in problems], "budget_s": budget_s})
    result = subprocess.run(
        [sys.executable, "-m", "looprl.bench.numpy_baseline"],
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
    import time

    import numpy as np

    from looprl.buffers import aligned_empty
    from looprl.problem import parse_problem

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
        run()
        start = time.perf_counter()
        run()
        reps = max(1, int(budget_s / 20 / max(time.perf_counter() - start, 1e-7)))
        best = float("inf")
        deadline = time.perf_counter() + budget_s
        while time.perf_counter() < deadline or best == float("inf"):
            start = time.perf_counter()
            for _ in range(reps):
                run()
            best = min(best, (time.perf_counter() - start) / reps)
        results.append(problem.flops / best / 1e9)
    return results


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())
    print(json.dumps({"gflops": _time_in_process(request["problems"], request["budget_s"])}))
