"""Compile time and memory growth over many compiles, run in a fresh child process."""

from __future__ import annotations

import json
import subprocess
import sys


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def compile_stats(count: int, seed: int = 0, target=None) -> dict:
    """Compile ``count`` random-walk schedules of matmuls 64..256 (step 16) for ``target``
    (a Target, a target name or None for the host) in a new process; returns per-compile
    seconds (median, p95) and resident-memory growth in MB. A schedule drawn again is compiled
    again but not timed: its code may still be alive, and the JIT shares it instead of running
    LLVM (:mod:`looprl.backend.jit`); the figures are those of new schedules."""
    from looprl.target import Target

    target = Target.resolve(target)
    result = subprocess.run(
        [sys.executable, "-m", "looprl.bench.compile_stats", str(count), str(seed), json.dumps(target.to_dict())],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"compile benchmark process failed:\n{result.stderr}")
    return json.loads(result.stdout)


def _run(count: int, seed: int, target_json: str | None = None) -> dict:
    import random
    import time

    import numpy as np

    import looprl
    from looprl.ir.nest import initial_nest
    from looprl.ir.schedules import random_schedule
    from looprl.target import Target

    target = Target.from_dict(json.loads(target_json)) if target_json else Target.default()
    rng = random.Random(seed)
    sizes = range(64, 257, 16)
    looprl.compile(initial_nest(looprl.matmul(64, 64, 64)), target)  # LLVM initialisation
    rss_start = _rss_mb()
    seconds, drawn = [], set()
    for _ in range(count):
        problem = looprl.matmul(rng.choice(sizes), rng.choice(sizes), rng.choice(sizes))
        nest = random_schedule(problem, rng)
        start = time.perf_counter()
        looprl.compile(nest, target)
        if nest not in drawn:
            seconds.append(time.perf_counter() - start)
            drawn.add(nest)
    rss_end = _rss_mb()
    return {
        "count": count,
        "target": target.isa,
        "median_ms": float(np.median(seconds) * 1e3),
        "p95_ms": float(np.percentile(seconds, 95) * 1e3),
        "rss_start_mb": rss_start,
        "rss_end_mb": rss_end,
        "rss_growth_mb": rss_end - rss_start,
    }


if __name__ == "__main__":
    print(json.dumps(_run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)))
