"""Cold problems are cold for every peer and every thread count: numpy's baseline rotates
copies of a cold problem's weight as looprl's kernels and torch's calls do, and the number of
copies grows with the threads that may each sit under a cache of their own."""

import numpy as np
import pytest

from looprl.ir.problem import parse_problem
from looprl.measurement import numpy_baseline, timing

COLD_LINEAR = "mk,nk->mn:m=1,k=256,n=128;const=in1;cold"


def _recorded_weights(monkeypatch, name: str, calls: int) -> list[int]:
    """The address of the weight (``b``) of each of ``calls`` numpy products of problem ``name``."""
    seen = []
    real = np.matmul

    def matmul(a, b, *args, **kwargs):
        seen.append(b.ctypes.data)
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(np, "matmul", matmul)
    monkeypatch.setattr(timing, "cache_sizes", lambda: (1 << 20, 1 << 20))  # a 1 MB cache: a few copies of a 128 KB weight
    repeat = numpy_baseline._numpy_call(parse_problem(name), np.random.default_rng(0), 0.001)
    repeat(calls)
    return seen


def test_numpy_reads_a_cold_problem_s_weight_from_rotating_copies(monkeypatch):
    count = timing.cold_copy_count(256 * 128 * 4, llc_bytes=1 << 20)
    assert count > 2
    seen = _recorded_weights(monkeypatch, COLD_LINEAR, 2 * count)
    assert len(set(seen)) == count  # every copy used
    assert seen[:count] == seen[count:]  # in turn, each call the next
    assert all(x != y for x, y in zip(seen, seen[1:]))  # never the same copy twice running


def test_numpy_reads_a_warm_problem_s_weight_from_one_buffer(monkeypatch):
    seen = _recorded_weights(monkeypatch, COLD_LINEAR.removesuffix(";cold"), 6)
    assert len(set(seen)) == 1


def test_numpy_s_cold_copies_hold_the_weight_s_values():
    problem = parse_problem(COLD_LINEAR)
    a = np.zeros((1, 256), np.float32)
    b = np.random.default_rng(1).uniform(-1, 1, (128, 256)).astype(np.float32)
    sets = numpy_baseline.operand_sets(problem, a, b)
    assert len(sets) == timing.cold_copy_count(b.nbytes)
    assert all(x is a for x, _ in sets)  # the activations are not constant: one buffer
    assert len({w.ctypes.data for _, w in sets}) == len(sets)
    assert all(np.array_equal(w, b) for _, w in sets)


def test_a_team_rotates_enough_copies_for_a_cache_per_thread():
    mb = 1 << 20
    # 32 MB weight, 32 MB cache: three copies pass 64 MB on one thread; on two threads, each
    # of which may read its share through a 32 MB cache of its own, five pass 128 MB.
    assert timing.cold_copy_count(32 * mb, llc_bytes=32 * mb) == 3
    assert timing.cold_copy_count(32 * mb, llc_bytes=32 * mb, threads=2) == 5
    # a 64 MB weight was one copy (twice one cache); two threads' caches would hold it
    assert timing.cold_copy_count(64 * mb, llc_bytes=32 * mb) == 1
    assert timing.cold_copy_count(64 * mb, llc_bytes=32 * mb, threads=2) == 3
    assert timing.cold_copy_count(32 * mb, llc_bytes=32 * mb, threads=3) == 7  # arithmetic: not checked against this host's cores
    with pytest.raises(ValueError):
        timing.cold_copy_count(mb, llc_bytes=32 * mb, threads=0)


def test_a_workspace_makes_its_cold_copies_for_the_thread_count_asked(monkeypatch):
    monkeypatch.setattr(timing, "cache_sizes", lambda: (1 << 20, 1 << 20))
    ws = timing.Workspace(parse_problem(COLD_LINEAR))
    one = ws.cold_copies("in1")
    two = ws.cold_copies("in1", threads=2)
    assert len(one) + 1 == timing.cold_copy_count(128 * 256 * 4, threads=1)
    assert len(two) + 1 == timing.cold_copy_count(128 * 256 * 4, threads=2) > len(one) + 1
    assert ws.cold_copies("in1", threads=2) is two  # kept while the count holds
