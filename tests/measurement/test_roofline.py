"""The roofline: the streaming kernel reads what it is given, bandwidths are measured once and
cached, and each problem gets the bound of the memory its working set lives in."""

import ctypes
import math

import numpy as np
import pytest

import looprl
from looprl.backend.buffers import aligned_zeros
from looprl.backend.jit import CompiledModule
from looprl.backend.stream_kernel import PREFETCH_DISTANCES, STREAM_ACCUMULATORS, STREAM_PATTERNS, stream_ir
from looprl.backend.threads import available_cores, before_parallel_call, ensure_openmp_runtime
from looprl.measurement import roofline as roofline_module
from looprl.measurement.roofline import Roofline, memory_bandwidth, problem_bytes
from looprl.target import TARGET_NAMES, Target

HOST_TARGETS = [name for name in TARGET_NAMES if not Target.named(name).missing_on_host()]


@pytest.mark.parametrize("ahead", PREFETCH_DISTANCES)
@pytest.mark.parametrize("streams", STREAM_PATTERNS)
@pytest.mark.parametrize("name", HOST_TARGETS)
def test_the_stream_kernel_sums_every_element_it_reads(name, streams, ahead):
    """Every element once per repetition, whatever the read pattern (one stream, or regions side
    by side) and however far ahead it prefetches (past the buffer's end too: a prefetch never faults)."""
    target = Target.named(name)
    module = CompiledModule(stream_ir(target, streams=streams, prefetch_bytes=ahead), "stream", target)
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(module.address)
    blocks = 37
    data = aligned_zeros(blocks * STREAM_ACCUMULATORS * target.vector_width)
    data[:] = np.random.default_rng(0).integers(0, 4, data.size)
    out = aligned_zeros(target.vector_width)
    kernel(data.ctypes.data, blocks, 3, out.ctypes.data)
    assert out.sum() == pytest.approx(3 * data.sum())
    with pytest.raises(ValueError, match="divide"):
        stream_ir(target, streams=3)
    for bad in (-64, 100, 64.0, True):
        with pytest.raises(ValueError, match="prefetch_bytes"):
            stream_ir(target, prefetch_bytes=bad)


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
def test_the_team_stream_kernel_gives_each_thread_its_own_share():
    target = Target.host()
    ensure_openmp_runtime()
    module = CompiledModule(stream_ir(target, team=True), "stream_team", target)
    team = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int32)(module.address)
    blocks, lanes = 5, target.vector_width
    data = aligned_zeros(2 * blocks * STREAM_ACCUMULATORS * lanes)
    data[: data.size // 2] = 1.0  # the first thread's share
    data[data.size // 2:] = 2.0
    out = aligned_zeros(2 * lanes)
    before_parallel_call(2)
    team(data.ctypes.data, blocks, 1, out.ctypes.data, 2)
    assert out[:lanes].sum() == blocks * STREAM_ACCUMULATORS * lanes and out[lanes:].sum() == 2 * blocks * STREAM_ACCUMULATORS * lanes


def test_bandwidths_are_measured_once_and_cached(monkeypatch, tmp_path):
    calls = []

    def measured(target, buffer_bytes, threads=1, budget_s=0.3):
        calls.append(buffer_bytes)
        return 10.0 * len(calls)

    monkeypatch.setattr(roofline_module, "measure_bandwidth_gbs", measured)
    cache = looprl.MeasurementCache(str(tmp_path / "c.sqlite"))
    first = memory_bandwidth(cache=cache)
    assert first == {"l2": 10.0, "llc": 20.0, "dram": 30.0} and calls[0] < calls[1] < calls[2]  # L2, LLC, DRAM buffers: larger each
    assert memory_bandwidth(cache=cache) == first and len(calls) == 3
    assert memory_bandwidth(cache=cache, refresh=True) == {"l2": 40.0, "llc": 50.0, "dram": 60.0}


def test_a_real_measurement_is_a_plausible_bandwidth():
    gbs = roofline_module.measure_bandwidth_gbs(Target.host(), 2**20, budget_s=0.05)
    assert math.isfinite(gbs) and 0.5 < gbs < 10_000


def test_each_problem_gets_the_bound_of_the_memory_its_data_lives_in():
    ceilings = Roofline(peak_gflops=100.0, llc_gbs=80.0, dram_gbs=20.0, l2_bytes=2**20, llc_bytes=32 * 2**20)
    small = looprl.matmul(64, 64, 64)  # 48 KB: in the L2
    assert ceilings.bound(small).limit == "peak" and ceilings.bound(small).gflops == 100.0  # L2 not measured: no bound below the peak
    measured_l2 = Roofline(100.0, 80.0, 20.0, 2**20, 32 * 2**20, l2_gbs=150.0)
    assert measured_l2.bound(small).limit == "peak"  # 64^3: 5 flops per byte, 750 GFLOPS from the L2
    few_rows = looprl.linear(1, 256, 256)  # 257 KB, half a flop per byte
    assert measured_l2.bound(few_rows).limit == "L2 bandwidth" and 70 < measured_l2.bound(few_rows).gflops < 75
    assert measured_l2.gbs(few_rows, measured_l2.bound(few_rows).gflops) == pytest.approx(150.0)
    decode = looprl.matmul(1, 4096, 4096)  # a 64 MB weight read for 2 flops per 4 bytes
    bound = ceilings.bound(decode)
    assert bound.limit == "DRAM bandwidth" and bound.gflops == pytest.approx(20.0 * decode.flops / problem_bytes(decode))
    assert 9.9 < bound.gflops < 10.1
    gemv = looprl.matmul(1, 1000, 1280)  # 5 MB: in the last-level cache
    assert ceilings.bound(gemv).limit == "LLC bandwidth"
    large = looprl.matmul(1024, 1024, 1024)  # past the caches, but 170 flops per byte
    assert ceilings.bound(large).limit == "peak"
    with_bias = looprl.linear(1, 4096, 4096, bias=True)
    assert problem_bytes(with_bias) == problem_bytes(decode) + 4 * 4096
