"""A neighbour: another process doing BLAS work beside a benchmark, as on a shared machine.

``with Neighbour("steady", threads=1): ...`` runs a child process that multiplies 512×512
float32 matrices with numpy on ``threads`` BLAS threads until the block ends:

* ``steady``: back to back, without a pause;
* ``bursty``: bursts of :data:`BURST_S` seconds of matmuls, then :data:`PAUSE_S` seconds asleep
  (a program that computes in phases; its BLAS threads spin and sleep in between).

The block starts once the child has run its first matmul (so its threads exist) and the child
is killed when the block ends, also on an exception or Ctrl-C. ``python -m
looprl.bench.neighbour KIND`` runs the child's loop itself (what the context starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from looprl import checks

KINDS = ("steady", "bursty")
BURST_S = 0.02
PAUSE_S = 0.03
SIZE = 512


class Neighbour:
    """A child process doing ``kind`` BLAS work on ``threads`` threads while the block runs."""

    def __init__(self, kind: str, threads: int = 1):
        self.kind = checks.one_of(kind, "neighbour kind", KINDS)
        self.threads = checks.positive_int(threads, "neighbour threads")
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Neighbour":
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(self.threads), OMP_NUM_THREADS=str(self.threads))
        self.process = subprocess.Popen([sys.executable, "-m", "looprl.bench.neighbour", self.kind], env=env,
                                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self._stop()
            raise RuntimeError(f"the {self.kind} neighbour process did not start (it printed {line!r})")
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()
            self.process = None


def _run(kind: str) -> None:
    import numpy as np

    x = np.random.default_rng(0).random((SIZE, SIZE), dtype=np.float32)
    x @ x
    print("ready", flush=True)
    while True:
        if kind == "steady":
            x @ x
            continue
        until = time.perf_counter() + BURST_S
        while time.perf_counter() < until:
            x @ x
        time.sleep(PAUSE_S)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in KINDS:
        raise SystemExit(f"usage: python -m looprl.bench.neighbour {{{','.join(KINDS)}}}")
    _run(sys.argv[1])
