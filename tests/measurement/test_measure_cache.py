import multiprocessing
import os
import sqlite3
import sys
import warnings

import pytest

import looprl
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import measurement_key, peak_key
from looprl.measurement.records import measured_nests, stored_nest
from looprl.measurement.timing import time_kernel


def test_measure_kernel_and_nest():
    nest = looprl.initial_nest(looprl.matmul(32, 32, 32))
    gflops = looprl.measure(nest, budget_s=0.005)
    assert 0.01 < gflops < 10_000
    timing = time_kernel(looprl.compile(nest), budget_s=0.005, min_runs=3)
    assert timing.runs >= 3 and timing.reps >= 1
    assert timing.gflops == pytest.approx(nest.problem.flops / timing.seconds / 1e9)


def test_measure_rejects_other_things():
    with pytest.raises(ValueError, match="expects a Kernel or a LoopNest"):
        looprl.measure(looprl.matmul(4, 4, 4))
    kernel = looprl.compile(looprl.initial_nest(looprl.matmul(4, 4, 4)))
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        time_kernel(kernel, budget_s=0)


def test_cache_round_trip_and_hits(cache_path):
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16))
    cache = MeasurementCache(cache_path)
    first = looprl.measure(nest, budget_s=0.002, cache=cache, samples=2)
    assert (cache.hits, cache.misses, len(cache)) == (0, 1, 1)
    second = looprl.measure(nest, budget_s=0.002, cache=cache, samples=2)  # timed again: best of two
    assert second >= first and cache.lookup(nest, budget_s=0.002).samples == 2
    assert looprl.measure(nest, budget_s=0.002, cache=cache, samples=2) == second  # final: from the cache
    cache.close()
    reopened = MeasurementCache(cache_path)
    assert reopened.get(nest, budget_s=0.002) == second
    assert reopened.get(nest.swap(0)) is None


def test_cache_keys_include_host_target_codegen_version_and_timing_protocol():
    from looprl.backend.codegen import CODEGEN_VERSION
    from looprl.backend.host import host_fingerprint
    from looprl.measurement.timing import TIMING_PROTOCOL_VERSION

    avx2 = looprl.Target.named("avx2")
    key = measurement_key(avx2, 0.008)
    assert key.startswith(host_fingerprint()) and avx2.key in key
    assert f"codegen-{CODEGEN_VERSION}" in key and f"timing-v{TIMING_PROTOCOL_VERSION}-8ms" in key
    assert len({key, measurement_key(avx2, 0.015), measurement_key(looprl.Target.named("sse4"), 0.008)}) == 3
    assert peak_key(avx2) != peak_key(looprl.Target.named("sse4"))


def test_values_for_other_targets_and_budgets_are_never_reused():
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16))
    with MeasurementCache(":memory:") as cache:
        cache.put(nest, 5.0, "avx2", 0.008)
        assert cache.get(nest, "avx2", 0.008) == 5.0
        assert cache.get(nest, "sse4", 0.008) is None
        assert cache.get(nest, "avx2", 0.015) is None
        cache.put_peak(100.0, "avx2")
        assert cache.get_peak("avx2") == 100.0 and cache.get_peak("sse4") is None


def test_samples_keep_the_best_and_are_counted():
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16))
    with MeasurementCache(":memory:") as cache:
        assert cache.add_sample(nest, 3.0).samples == 1
        assert cache.add_sample(nest, 5.0) == cache.lookup(nest)
        third = cache.add_sample(nest, 4.0)
        assert (third.gflops, third.samples) == (5.0, 3)
        assert cache.records() == [(nest.problem.name, nest.key, 5.0)]
        assert cache.records(exclude_problem=nest.problem.name) == []


def test_records_become_nests_and_unparsable_ones_are_skipped_with_a_warning():
    nest = looprl.initial_nest(looprl.matmul(16, 24, 8)).split(0, 4)
    other = looprl.initial_nest(looprl.matmul(8, 8, 8))
    rows = [(nest.problem.name, nest.key, 5.0), ("not a problem", other.key, 2.0), (other.problem.name, "m99s1|junk", 3.0),
            (other.problem.name, other.key, 7.0), ("not a problem", nest.key, 1.0)]
    with pytest.warns(RuntimeWarning, match=r"skipped 3 of 5 measurement records .*; the first: problem 'not a problem': cannot parse"):
        assert measured_nests(rows) == [(nest, 5.0), (other, 7.0)]


def test_readable_records_raise_no_warning():
    nest = looprl.initial_nest(looprl.matmul(16, 24, 8)).split(0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert measured_nests([(nest.problem.name, nest.key, 5.0)]) == [(nest, 5.0)]


def test_stored_nest_gives_the_reason_a_row_cannot_be_read():
    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    assert stored_nest(nest.problem.name, nest.key) == nest
    assert stored_nest(nest.problem.name, "m8s1,k8s1,n8s1|junk").startswith("bad loop 'junk' in schedule key")
    problems = {}
    assert stored_nest("abc", nest.key, problems).startswith("problem 'abc': cannot parse problem 'abc'")
    assert isinstance(problems["abc"], str)


def test_corrupt_cache_is_rebuilt_with_a_warning(cache_path):
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16))
    with MeasurementCache(cache_path) as cache:
        cache.put(nest, 1.0)
    assert not os.path.exists(cache_path + "-wal")  # the last close checkpointed it
    with open(cache_path, "rb") as handle:
        damaged = bytearray(handle.read())
    damaged[100:4096] = bytes(range(256)) * 15 + bytes(range(156))  # page 1 past the header: the schema
    with open(cache_path, "wb") as handle:
        handle.write(damaged)
    with pytest.warns(RuntimeWarning, match="is corrupt") as caught:
        cache = MeasurementCache(cache_path)
    folder = os.path.dirname(cache_path)
    aside = [os.path.join(folder, name) for name in os.listdir(folder) if ".corrupt-" in name]
    assert len(aside) == 1 and aside[0].startswith(cache_path + ".corrupt-")
    with open(aside[0], "rb") as handle:
        assert handle.read() == bytes(damaged)  # moved aside untouched
    message = str(caught[0].message)
    assert f"measurement cache {cache_path} is corrupt" in message and message.endswith(f"moved it to {aside[0]} and started a new one")
    assert cache.get(nest) is None
    cache.put(nest, 2.0)
    assert cache.get(nest) == 2.0
    cache.close()
    with MeasurementCache(cache_path) as reopened:  # the new cache is a working file in place
        assert reopened.get(nest) == 2.0


def _writer(path, worker, count):
    import random

    from looprl.ir.schedules import random_schedule

    cache = MeasurementCache(path)
    problem = looprl.matmul(64, 64, 64)
    for i in range(count):
        nest = random_schedule(problem, random.Random(i * 10 + worker % 2))  # workers overlap
        cache.put(nest, float(worker * 1000 + i))
        assert cache.get(nest) is not None


def test_concurrent_processes_share_the_cache(cache_path):
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_writer, args=(cache_path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    connection = sqlite3.connect(cache_path)
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert connection.execute("SELECT count(*) FROM measurements").fetchone()[0] > 0


def test_peak_is_measured_once_per_host(cache_path):
    cache = MeasurementCache(cache_path)
    cache.put_peak(123.0)
    assert looprl.peak_gflops(cache=cache) == 123.0  # from the cache, not re-measured


@pytest.mark.skipif(sys.platform != "linux", reason="uses the host's FMA units")
def test_measured_peak_is_plausible(cache_path):
    peak = looprl.peak_gflops(cache=MeasurementCache(cache_path), refresh=True)
    assert 1.0 < peak < 10_000
    kernel_gflops = looprl.measure(looprl.initial_nest(looprl.matmul(64, 64, 64)), budget_s=0.01)
    assert kernel_gflops < 1.5 * peak
