"""Measuring on several threads: cache keys, the evaluator, the N-thread peak, numpy's threads."""

import pytest

import looprl
from looprl.backend.threads import available_cores
from looprl.measurement import peak as peak_module
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import measurement_key, peak_key
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.measurement.numpy_baseline import baseline_environment, baseline_label

CORES = available_cores()
needs_two = pytest.mark.skipif(CORES < 2, reason="needs two cores")


def test_keys_for_one_thread_are_unchanged_and_others_differ():
    one = measurement_key(None, 0.008)
    assert one == measurement_key(None, 0.008, 1) and "threads" not in one
    assert measurement_key(None, 0.008, 2) == one + "|threads-2"
    assert peak_key(None, 2) == peak_key(None) + "|threads-2"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="threads"):
            measurement_key(None, 0.008, bad)


def test_the_cache_keeps_parallel_schedules_per_thread_count_and_serial_ones_once():
    cache = MeasurementCache(":memory:")
    serial = looprl.initial_nest(looprl.matmul(16, 16, 16))
    parallel = serial.parallel(0)
    cache.put(parallel, 10.0, threads=2)
    assert cache.get(parallel, threads=2) == 10.0
    assert cache.get(parallel) is None and cache.get(parallel, threads=3) is None
    cache.put(serial, 5.0)  # a serial schedule runs on one thread whatever is offered
    assert cache.get(serial, threads=2) == 5.0
    assert [r[1] for r in cache.records(threads=2)] == [parallel.key]
    assert [r[1] for r in cache.records()] == [serial.key]
    cache.put_tuned(ScheduleRecord(serial, 5.0, threads=2, budget_s=0.4, tuner="t"))
    assert cache.get_tuned(serial.problem, tuner="t") is None
    assert cache.get_tuned(serial.problem, tuner="t", threads=2).nest.key == serial.key


@needs_two
def test_the_evaluator_runs_parallel_schedules_on_its_threads(cache_path):
    nest = looprl.initial_nest(looprl.matmul(32, 32, 32)).parallel(0)
    evaluator = looprl.Evaluator(cache_path, budget_s=0.002, threads=2, samples=1)
    assert evaluator(nest).gflops > 0
    cache = MeasurementCache(cache_path)
    assert cache.get(nest, budget_s=0.002, threads=2) is not None
    assert cache.get(nest, budget_s=0.002) is None
    assert looprl.measure(nest, threads=2, budget_s=0.002) > 0
    assert looprl.measure(looprl.compile(nest, threads=2), budget_s=0.002) > 0


def test_peaks_are_cached_per_thread_count(monkeypatch):
    measured = []

    def fake(target=None, budget_s=0.5, threads=1, dtype="float32"):
        measured.append(threads)
        return 100.0 * threads

    monkeypatch.setattr(peak_module, "measure_peak_gflops", fake)
    cache = MeasurementCache(":memory:")
    assert looprl.peak_gflops(cache=cache) == 100.0
    if CORES >= 2:
        assert looprl.peak_gflops(cache=cache, threads=2) == 200.0
        assert looprl.peak_gflops(cache=cache, threads=2) == 200.0
    assert measured == [1, 2][: min(CORES, 2)]
    with pytest.raises(ValueError, match="threads"):
        looprl.peak_gflops(cache=cache, threads=CORES + 1)


@needs_two
def test_the_two_thread_peak_is_measured():
    one = peak_module.measure_peak_gflops(looprl.Target.host(), budget_s=0.05)
    two = peak_module.measure_peak_gflops(looprl.Target.host(), budget_s=0.05, threads=2)
    assert one > 0 and two > 0  # measured, not assumed: no ratio is asserted (a shared machine)


def test_numpy_runs_on_as_many_blas_threads():
    assert baseline_environment()["OPENBLAS_NUM_THREADS"] == "1"
    if CORES >= 2:
        env = baseline_environment(threads=2)
        assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "2"
        assert baseline_label(threads=2).startswith("numpy, 2 threads")
    assert baseline_label().startswith("numpy, 1 thread,")
    with pytest.raises(ValueError, match="threads"):
        baseline_environment(threads=0)
