"""The libraries a benchmark compares looprl's kernels with, timed in turn with them.

numpy (:func:`~looprl.measurement.numpy_baseline.numpy_child`: OpenBLAS in a child process,
``OPENBLAS_CORETYPE`` unset for the host's own ISA; a cold problem's weight rotated in copies
as looprl's kernels and torch's calls rotate it) and torch
(:func:`~looprl.bench.torch_baseline.torch_child`: ``torch.matmul``, ``F.linear`` and oneDNN's
linear on a weight packed once, in a child process) stay up for the whole benchmark. For each
problem, after it is tuned, :meth:`Peers.timed_with` times the problem's kernels, then numpy,
then torch, round after round (:data:`TIMING_ROUNDS`), each keeping its best: a drift of the
machine (a shared VM's neighbour) touches every figure of a problem alike, rather than
biasing the ratios as timing the libraries once before all tuning did. A child that fails
(killed, or ``import torch`` raising) is one warning line; its figures are NaN from then on.
"""

from __future__ import annotations

import contextlib
import math
import sys

from looprl.bench.torch_baseline import CALLS, torch_child
from looprl.measurement.lock import machine_lock
from looprl.measurement.numpy_baseline import numpy_child
from looprl.measurement.timing import time_kernel

TIMING_ROUNDS = 3


def _better(old, new):
    """The better of two figures of one peer: GFLOPS, None (not timed), or a dict of them per call."""
    if isinstance(new, dict):
        old = old or {}
        return {call: _better(old.get(call), value) for call, value in new.items()}
    if new is None or (old is not None and old >= new):
        return old
    return new


class Peers:
    """The libraries looprl is compared with, each in a child process that stays up
    (:class:`~looprl.measurement.numpy_baseline.BaselineChild`): numpy and torch on each
    thread count. A child that fails is reported once, in one line on ``errors``; its figures
    are then NaN. ``torch_float32``: torch's child also times bfloat16 problems' calls on
    float32 tensors (:func:`~looprl.bench.torch_baseline.torch_child`)."""

    def __init__(self, isa: str | None, counts: list[int], errors=None, torch: bool = True, torch_float32: bool = False):
        self.errors, self.reported, self.children = errors, set(), {}  # errors: None, sys.stderr when a line is printed
        try:
            for n in counts:
                self.children[("numpy", n)] = numpy_child(isa, threads=n)
                if torch:
                    self.children[("torch", n)] = torch_child(isa, threads=n, float32=True) if torch_float32 else torch_child(isa, threads=n)
        except BaseException:
            self.close()
            raise
        for child in self.children.values():
            self._report(child)

    def label(self, library: str, threads: int) -> str:
        child = self.children.get((library, threads))
        return "not timed" if child is None else child.label or f"{library} (failed)"

    def _report(self, child) -> None:
        if child.failure is not None and child not in self.reported:
            self.reported.add(child)
            print(f"looprl-bench: warning: {child.failure}; its figures are nan", file=self.errors or sys.stderr, flush=True)

    def timed_with(self, kernels: dict, problem, budget_s: float, threads: int, rounds: int = TIMING_ROUNDS) -> dict:
        """Each of ``kernels`` (name -> kernel, timed on its own thread count) and numpy and
        torch on ``threads`` threads, in turn, for ``rounds`` rounds of ``budget_s`` each, under
        the machine-wide lock held throughout; the best of each: name -> GFLOPS, ``"numpy"`` ->
        GFLOPS (NaN: failed) and ``"torch"`` -> {call: GFLOPS or None} (all None: not timed)."""
        best = dict.fromkeys(kernels, 0.0)
        numpy_value, torch_calls = None, None
        numpy, torch = self.children[("numpy", threads)], self.children.get(("torch", threads))
        with machine_lock():
            for _ in range(rounds):
                for name, kernel in kernels.items():
                    best[name] = max(best[name], time_kernel(kernel, budget_s, lock=contextlib.nullcontext()).gflops)
                numpy_value = _better(numpy_value, numpy.time(problem, budget_s))
                if torch is not None:
                    torch_calls = _better(torch_calls, torch.time(problem, budget_s))
        for child in (numpy, torch):
            if child is not None:
                self._report(child)
        best["numpy"] = math.nan if numpy_value is None else numpy_value
        best["torch"] = torch_calls or dict.fromkeys(CALLS)
        return best

    def close(self) -> None:
        for child in self.children.values():
            child.close()
