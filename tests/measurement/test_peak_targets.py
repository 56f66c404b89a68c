"""The peak follows the target: its width, FMA or multiply-add, its own cache entry."""

import pytest

import looprl
from looprl.backend.peak_kernel import peak_chain_counts, peak_ir
from looprl.measurement import peak as peak_module
from looprl.measurement.cache import MeasurementCache
from looprl.target import TARGET_NAMES, Target

RUNNABLE = [name for name in TARGET_NAMES if not Target.named(name).missing_on_host()]


def test_peak_ir_without_fma_multiplies_then_adds():
    with_fma = peak_ir(Target.named("avx2"), 10)
    without = peak_ir(Target.named("sse4"), 12)
    assert "@llvm.fma.v8f32" in with_fma and with_fma.count("call <8 x float> @llvm.fma") == 10
    assert "llvm.fma" not in without
    assert without.count("fmul <4 x float>") == 12 and without.count("fadd <4 x float>") >= 12
    team = peak_ir(Target.named("avx2"), 10, team=True)
    assert "define void @peak_team(" in team and "@GOMP_parallel(ptr @peak_team_body" in team


def test_peak_chains_fit_the_register_file_with_their_two_operands():
    assert peak_chain_counts(Target.named("avx512")) == [8, 10, 12, 14, 16]
    assert peak_chain_counts(Target.named("avx2")) == [8, 10, 12, 14]  # 16 registers: 14 chains + x + y
    assert peak_chain_counts(Target.named("sse4")) == [10, 11, 12, 13, 14]  # no FMA: more chains hide the latency


def test_only_the_backend_writes_llvm_ir():
    import inspect

    from looprl.measurement import peak

    assert "define void" not in inspect.getsource(peak) and "phi" not in inspect.getsource(peak)


@pytest.mark.parametrize("name", RUNNABLE)
def test_measure_peak_compiles_for_the_target(name, monkeypatch):
    seen = []
    original = peak_module.CompiledModule

    def spy(ir_text, function, target):
        seen.append((ir_text, target))
        return original(ir_text, function, target)

    monkeypatch.setattr(peak_module, "CompiledModule", spy)
    peak_module.chain_kernel.cache_clear()  # compiled once per process: an earlier test's kernels would not be compiled again
    target = Target.named(name)
    gflops = peak_module.measure_peak_gflops(target, budget_s=0.05)
    assert gflops > 0
    assert seen and all(t == target for _, t in seen)
    assert all(f"<{target.vector_width} x float>" in ir for ir, _ in seen)
    assert all(("llvm.fma" in ir) == target.fma for ir, _ in seen)


def test_measure_peak_refuses_a_target_the_host_cannot_run(monkeypatch):
    from looprl import target as target_module

    monkeypatch.setattr(target_module, "host_cpu", lambda: ("x86-64-v2", "+sse4.2,-avx,-avx2,-fma,-avx512f"))
    with pytest.raises(ValueError, match="cannot run code for target 'avx2'"):
        peak_module.measure_peak_gflops(Target.named("avx2"), budget_s=0.05)


def test_peak_is_cached_per_target(monkeypatch):
    cache = MeasurementCache(":memory:")
    measured = []

    def fake(target=None, budget_s=0.5, threads=1, dtype="float32"):
        measured.append(Target.resolve(target))
        return {"avx2": 50.0, "sse4": 20.0}.get(Target.resolve(target).isa, 100.0)

    monkeypatch.setattr(peak_module, "measure_peak_gflops", fake)
    assert looprl.peak_gflops("avx2", cache) == 50.0
    assert looprl.peak_gflops(Target.named("sse4"), cache=cache) == 20.0
    assert looprl.peak_gflops("avx2", cache) == 50.0  # from the cache
    assert measured == [Target.named("avx2"), Target.named("sse4")]
    assert cache.get_peak(Target.named("avx2")) == 50.0
    assert cache.get_peak(Target.named("sse4")) == 20.0
    assert looprl.peak_gflops("avx2", cache, refresh=True) == 50.0
    assert len(measured) == 3


def test_exports():
    assert looprl.Target is Target
    assert callable(looprl.peak_gflops)
