"""The evaluator: per-target keys, best-of-samples re-measurement, and what reaches the cache."""

import pytest

import looprl
from looprl.env import LoopNestEnv
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.timing import Timing

NEST = looprl.initial_nest(looprl.matmul(16, 16, 16))


@pytest.fixture
def scripted_timings(monkeypatch):
    """time_kernel returns the GFLOPS listed in ``values``, in order (a kernel is still compiled)."""
    values = []
    targets = []

    def fake_time_kernel(kernel, budget_s, workspace=None, lock=None, threads=None, cold_threads=None):
        targets.append(kernel.target)
        flops = kernel.nest.problem.flops
        return Timing(seconds=flops / (values.pop(0) * 1e9), runs=1, reps=1, flops=flops)

    monkeypatch.setattr(evaluator_module, "time_kernel", fake_time_kernel)
    return values, targets


def test_a_revisited_state_is_timed_again_until_it_has_its_samples(scripted_timings):
    values, _ = scripted_timings
    values += [10.0, 30.0, 20.0]
    evaluator = Evaluator(":memory:", samples=3)
    first, second, third, fourth = (evaluator(NEST) for _ in range(4))
    assert (first.gflops, first.samples, first.from_cache) == pytest.approx((10.0, 1, False))
    assert (second.gflops, second.samples, second.sample_gflops) == pytest.approx((30.0, 2, 30.0))
    assert (third.gflops, third.samples, third.sample_gflops) == pytest.approx((30.0, 3, 20.0))  # the best stays
    assert (fourth.gflops, fourth.samples, fourth.from_cache) == pytest.approx((30.0, 3, True))  # final: no timing
    assert values == [] and (evaluator.compiled, evaluator.resampled) == (3, 2)


def test_one_sample_means_a_cached_value_is_final(scripted_timings):
    values, _ = scripted_timings
    values += [10.0]
    evaluator = Evaluator(":memory:", samples=1)
    assert [evaluator(NEST).from_cache for _ in range(3)] == [False, True, True]


def test_remeasure_always_times_and_adds_a_sample(scripted_timings):
    values, _ = scripted_timings
    values += [10.0, 5.0, 12.0, 11.0]
    evaluator = Evaluator(":memory:", samples=1)
    evaluator(NEST)
    fresh = [evaluator.remeasure(NEST) for _ in range(3)]
    assert [m.sample_gflops for m in fresh] == pytest.approx([5.0, 12.0, 11.0])
    assert (fresh[-1].gflops, fresh[-1].samples) == pytest.approx((12.0, 4))


def test_the_target_decides_the_code_and_the_cache_key(scripted_timings):
    values, targets = scripted_timings
    values += [7.0, 9.0]
    cache = MeasurementCache(":memory:")
    sse4 = Evaluator(cache, target="sse4", samples=1)
    host = Evaluator(cache, samples=1)
    assert sse4.target == looprl.Target.named("sse4") and host.target == looprl.Target.default()
    assert sse4(NEST).gflops == pytest.approx(7.0)
    assert host(NEST).from_cache is False  # another target: not the sse4 value
    assert targets == [looprl.Target.named("sse4"), looprl.Target.default()]
    assert cache.get(NEST, "sse4") == pytest.approx(7.0) and cache.get(NEST) == pytest.approx(9.0)


def test_bad_samples_and_targets_are_value_errors():
    for samples in (0, -1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="samples"):
            Evaluator(":memory:", samples=samples)
    with pytest.raises(ValueError, match="unknown target"):
        Evaluator(":memory:", target="avx1024")


def test_the_env_learns_for_the_target_it_is_given():
    env = LoopNestEnv(problems=["32x32x32"], target="sse4", cache=":memory:", peak=10.0)
    _, info = env.reset(seed=0)
    assert env.target == looprl.Target.named("sse4") and info["target"] == "sse4"
    assert env.evaluator.target == env.target
    assert env.evaluator.cache.get(looprl.initial_nest(looprl.matmul(32, 32, 32)), "sse4", env.evaluator.budget_s) is not None


def test_kernel_for_gives_a_recently_timed_schedule_its_kernel_and_compiles_any_other(scripted_timings, monkeypatch):
    """A tune's finishing step asks ``kernel_for`` for the answer it has just timed: the kernel
    that timed it (its code; the thread count is the call's default, not part of the code), not
    a second compile of the same code. A schedule not among the last timed is compiled."""
    from looprl.backend import jit

    values, _ = scripted_timings
    values += [10.0, 20.0]
    modules = []
    real = jit.CompiledModule.__init__

    def counted(self, *args, **kwargs):
        modules.append(self)
        real(self, *args, **kwargs)

    monkeypatch.setattr(jit.CompiledModule, "__init__", counted)
    evaluator = Evaluator(":memory:")
    other = looprl.initial_nest(looprl.matmul(8, 8, 8))
    evaluator(NEST), evaluator(other)
    assert len(modules) == 2
    kernel = evaluator.kernel_for(NEST, threads=1)
    assert len(modules) == 2 and kernel.nest == NEST and kernel._module is modules[0]
    import numpy as np

    a, b = np.random.rand(16, 16).astype(np.float32), np.random.rand(16, 16).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-5)
    untimed = looprl.initial_nest(looprl.matmul(4, 4, 4))
    assert evaluator.kernel_for(untimed).nest == untimed and len(modules) == 3  # compiled now
    for extent in range(evaluator_module.RECENT_KERNELS):  # the kept kernels are the last timings' alone
        values.append(1.0)
        evaluator(looprl.initial_nest(looprl.matmul(4, 4, 5 + extent)))
    evaluator.kernel_for(NEST)
    assert len(modules) == 4 + evaluator_module.RECENT_KERNELS
