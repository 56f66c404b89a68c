"""A cold problem's copies are counted for the threads of the tune, not of the schedule: a tune
on two threads times its serial schedules on the copies its teams read (``Evaluator``'s
``cold_threads``), so that neither reads warmer copies than the other."""

from __future__ import annotations

import looprl
from looprl.backend.kernel import Kernel
from looprl.measurement import timing
from looprl.measurement.evaluator import Evaluator
from looprl.tune.measurer import Measurer


def _weights_read(monkeypatch, evaluator: Evaluator, nest) -> set[int]:
    """The addresses of the weight (``in1``) that ``evaluator``'s timing of ``nest`` read."""
    read = set()
    original = Kernel._call

    def recording(self, function, pointers, reps, threads, rows=None):
        read.add(pointers[self.tensors.index("in1")])
        original(self, function, pointers, reps, threads, rows)

    monkeypatch.setattr(Kernel, "_call", recording)
    assert evaluator.remeasure(nest).ok
    monkeypatch.setattr(Kernel, "_call", original)
    return read


def test_a_serial_schedule_timed_for_a_two_thread_tune_reads_the_copies_counted_for_two_threads(monkeypatch):
    monkeypatch.setattr(timing, "cache_sizes", lambda: (1 << 16, 100_000))  # 32 KB weights: 8 copies a thread
    problem = looprl.matmul(2, 200, 40, constant="b").with_cold()
    serial = looprl.initial_nest(problem)
    one, two = (timing.cold_copy_count(200 * 40 * 4, threads=t) for t in (1, 2))
    assert (one, two) == (8, 14)
    assert len(_weights_read(monkeypatch, Evaluator(":memory:", 0.002, timing_lock=False), serial)) == one
    alike = Evaluator(":memory:", 0.002, timing_lock=False, cold_threads=2)
    assert len(_weights_read(monkeypatch, alike, serial)) == two
    # the team's evaluator keeps the larger count, and a tune's measurer counts its threads
    assert alike.with_threads(2).cold_threads == 2 and Evaluator(":memory:", cold_threads=1).with_threads(2).cold_threads == 2
    assert Measurer.open(":memory:", 0.002, looprl.target.Target.resolve(None), 2).evaluator.cold_threads == 2


def test_small_weights_get_copies_enough_to_pass_the_cache():
    # 256 KB copies passing twice a 32 MB cache: 257 copies, capped at 256 (the cap was 64: 16 MB, a warm rotation)
    assert timing.cold_copy_count(256 << 10, llc_bytes=32 << 20) == timing.MAX_COLD_COPIES == 256
    assert timing.cold_copy_count(1 << 20, llc_bytes=32 << 20, threads=2) == 129
