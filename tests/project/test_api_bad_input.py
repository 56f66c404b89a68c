"""Bad input to the env, the searches, tune and the measurement layer is a ValueError naming
what is wrong; numpy numbers are accepted wherever Python numbers are."""

import hashlib
import json
import math

import numpy as np
import pytest

import looprl
from looprl import search
from looprl.actions import ActionSet
from looprl.env.loopnest_env import LoopNestEnv
from looprl.ir.problem import as_problem
from looprl.measurement import peak as peak_module
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator, Measurement
from looprl.measurement.keys import measurement_key
from looprl.measurement.timing import best_time
from looprl.search.budget import MAX_BUDGET_S
from tests.policies import random_policy

PEAK = 100.0
SMALL = "mk,kn->mn:m=64,k=20,n=32"
SEARCHED = looprl.matmul(m=48, n=40, k=36)
TOO_MANY_LOOPS = looprl.contraction("abcdmk,abcdkn->abcdmn", a=2, b=2, c=2, d=2, m=8, k=8, n=8)  # 7 + 6 loops
BAD_NUMBERS = [math.nan, math.inf, -math.inf, 0, -1.0, "1", None, True]


def make_env(**kwargs):
    kwargs.setdefault("problems", [SMALL])
    kwargs.setdefault("cache", ":memory:")
    kwargs.setdefault("peak", PEAK)
    kwargs.setdefault("measure_budget_s", 0.001)
    return LoopNestEnv(**kwargs)


class FakeEvaluator:
    """Deterministic pseudo-random GFLOPS per schedule, no compiling."""

    budget_s = 0.001

    def __call__(self, nest):
        digest = hashlib.sha256(nest.key.encode()).hexdigest()
        return Measurement(10.0 + int(digest[:6], 16) % 9000 / 100.0, from_cache=False)


class MustNotMeasure:
    budget_s = 0.001

    def __call__(self, nest):
        raise AssertionError("measured before the arguments were checked")


def run(problem=SEARCHED, algo="random", **kwargs):
    kwargs.setdefault("verify_s", None)
    kwargs.setdefault("evaluator", FakeEvaluator())
    kwargs.setdefault("max_evaluations", 5)
    return search.run(problem, algo, **kwargs)


@pytest.fixture
def policy_dir(tmp_path):
    return random_policy(seed=3).save(tmp_path / "policy")


# -- 1. budgets and peaks ---------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_env_refuses_bad_budgets_and_peaks(bad):
    with pytest.raises(ValueError, match="measure_budget_s must be a positive"):
        make_env(measure_budget_s=bad)
    if bad is not None:  # peak=None means "measure the host"
        with pytest.raises(ValueError, match="peak must be a positive"):
            make_env(peak=bad)


def test_env_accepts_numpy_peaks_and_budgets():
    for peak in (np.float32(50.0), np.float64(50.0), np.int64(50)):
        env = make_env(peak=peak, measure_budget_s=np.float32(0.001))
        assert env.peak == 50.0 and type(env.peak) is float
        assert env.evaluator.budget_s == pytest.approx(0.001)


@pytest.mark.parametrize("name", ["budget_s", "verify_s", "measure_budget_s"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0, "1", True])
def test_search_refuses_bad_budgets(name, bad):
    if name == "budget_s" and bad == math.inf:  # no time limit
        assert run(budget_s=bad).settings["budget_s"] == math.inf
        return
    with pytest.raises(ValueError, match=f"{name} must be a positive"):
        run(**{name: bad})


def test_search_budgets_none_and_numpy():
    assert run(budget_s=None).stopped == "evaluation budget"
    assert 0 < run(budget_s=None).settings["budget_s"] <= MAX_BUDGET_S  # scaled to the problem, as tune's
    result = run(budget_s=np.float32(5.0), measure_budget_s=np.float64(0.002))
    assert result.settings["budget_s"] == 5.0
    with pytest.raises(ValueError, match="measure_budget_s"):
        run(measure_budget_s=None)  # only budget_s and verify_s take None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0, "1", None, True])
def test_tune_evaluator_and_peak_measurement_refuse_bad_budgets(bad, policy_dir):
    with pytest.raises(ValueError, match="measure_budget_s must be a positive"):
        looprl.tune((16, 16, 16), policy_dir, cache=":memory:", measure_budget_s=bad)
    if bad is not None and bad != 0:  # tune's search budget may be 0 (the rollout alone) or None (scaled)
        with pytest.raises(ValueError, match="budget_s must be a"):
            looprl.tune((16, 16, 16), policy_dir, cache=":memory:", budget_s=bad)
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        Evaluator(":memory:", budget_s=bad)
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        peak_module.measure_peak_gflops(looprl.Target.host(), budget_s=bad)


@pytest.mark.parametrize("stored", [math.inf, 0.0, -5.0, math.nan])
def test_a_bad_cached_peak_is_measured_again(stored, monkeypatch):
    cache = MeasurementCache(":memory:")
    # The cache refuses to store such values; an older looprl or a damaged row could still
    # hand one back, which is what the reader sees here.
    monkeypatch.setattr(cache, "get_peak", lambda target=None, threads=1, dtype="float32": stored)
    monkeypatch.setattr(peak_module, "measure_peak_gflops", lambda target=None, budget_s=0.5, threads=1, dtype="float32": 77.0)
    assert peak_module.peak_gflops(cache=cache) == 77.0
    monkeypatch.undo()
    assert cache.get_peak() == 77.0


def test_a_good_cached_peak_is_used(monkeypatch):
    cache = MeasurementCache(":memory:")
    cache.put_peak(123.0)
    monkeypatch.setattr(peak_module, "measure_peak_gflops", lambda target=None, budget_s=0.5, threads=1, dtype="float32": pytest.fail("re-measured"))
    assert peak_module.peak_gflops(cache=cache) == 123.0


def test_peak_cache_argument_is_checked(monkeypatch):
    monkeypatch.setattr(peak_module, "measure_peak_gflops", lambda target=None, budget_s=0.5, threads=1, dtype="float32": 77.0)
    assert peak_module.peak_gflops(cache=":memory:") == 77.0  # a path, like everywhere else
    for bad in (3, 3.5, [1]):
        with pytest.raises(ValueError, match="cache must be"):
            peak_module.peak_gflops(cache=bad)


# -- 2. numpy integers ------------------------------------------------------------------


def test_env_takes_numpy_integer_actions_and_seeds():
    env = make_env(episode_length=np.int64(5), max_loops=np.int64(10), split_factors=[np.int64(4), np.int32(8)])
    assert env.episode_length == 5 and env.max_loops == 10 and env.action_names[4:] == ("split_4", "split_8")
    env.reset(seed=np.int64(3))
    down = env.action_names.index("down")
    _, _, _, _, info = env.step(np.int64(down))
    assert info["valid"] and info["action"] == "down" and env.cursor == 1
    _, _, _, _, info = env.step(np.array(down))  # a 0-d array
    assert info["valid"] and info["action"] == "down" and env.cursor == 2
    env.step(env.action_space.sample())  # np.int64 from gymnasium
    for bad in (True, np.bool_(False), np.array(True), np.array([1]), np.array(1.0), 1.0, "down", None):
        with pytest.raises(ValueError, match="action"):
            env.step(bad)


@pytest.mark.parametrize("bad", [1.5, "1", -1, True])
def test_env_refuses_bad_seeds(bad):
    env = make_env()
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=bad)


def test_search_takes_numpy_integers():
    result = run(max_evaluations=np.int64(5), depth=np.int64(3), seed=np.int64(1), max_loops=np.int64(10))
    assert result.evaluations == 5
    plain = run(max_evaluations=5, depth=3, seed=1)
    assert (result.best_nest, result.actions) == (plain.best_nest, plain.actions)
    json.dumps(result.to_dict())  # settings hold Python ints
    assert type(result.settings["seed"]) is int and type(result.settings["depth"]) is int


@pytest.mark.parametrize(
    "name, bad",
    [("max_evaluations", True), ("max_evaluations", 5.0), ("depth", np.bool_(True)), ("depth", "3"), ("seed", 1.5), ("seed", "x"), ("seed", -1), ("seed", True)],
)
def test_search_refuses_bad_integers(name, bad):
    with pytest.raises(ValueError, match=name):
        run(**{name: bad})


def test_tune_takes_a_numpy_episode_length(policy_dir):
    result = looprl.tune((16, 16, 16), policy_dir, episode_length=np.int64(3), cache=":memory:", budget_s=0)
    assert len(result.actions) <= 3
    with pytest.raises(ValueError, match="episode_length"):
        looprl.tune((16, 16, 16), policy_dir, episode_length=np.bool_(True), cache=":memory:")


def test_tune_takes_the_episode_length_by_its_former_name_with_a_warning(policy_dir):
    with pytest.warns(DeprecationWarning, match="episode_length"):
        result = looprl.tune((16, 16, 16), policy_dir, steps=2, cache=":memory:", budget_s=0)
    assert len(result.actions) <= 2
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="steps"):
        looprl.tune((16, 16, 16), policy_dir, steps=-1, cache=":memory:")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="only"):
        looprl.tune((16, 16, 16), policy_dir, 3, steps=3, cache=":memory:")
    with pytest.raises(TypeError, match="stepz"):
        looprl.tune((16, 16, 16), policy_dir, stepz=3, cache=":memory:")


def test_timing_min_runs_may_be_a_numpy_integer():
    timing = best_time(lambda reps: None, 0.001, min_runs=np.int64(4), lock=None)
    assert timing.runs >= 1
    with pytest.raises(ValueError, match="min_runs"):
        best_time(lambda reps: None, 0.001, min_runs=True)


# -- 3. None and unknown problems, datasets and splits ----------------------------------


def test_none_problems_are_refused_clearly():
    with pytest.raises(ValueError, match=r"problems\[0\].*got NoneType"):
        make_env(problems=[None])
    with pytest.raises(ValueError, match=r"problems\[1\]"):
        make_env(problems=[SMALL, None])
    with pytest.raises(ValueError, match="unknown dataset None; known datasets: gemm-shapes, mm384-1024, mm64-256"):
        make_env(problems=None, dataset=None)
    with pytest.raises(ValueError, match="problem is None"):
        run(None)
    with pytest.raises(ValueError, match="cannot tune None"):
        looprl.tune(None, cache=":memory:")


def test_unknown_datasets_and_splits_list_the_known_ones():
    for dataset in ("mm1-2", ["mm64-256", "mm1-2"], 3, []):
        with pytest.raises(ValueError, match="unknown dataset .*known datasets: gemm-shapes, mm384-1024, mm64-256"):
            make_env(problems=None, dataset=dataset)
    for split in ("valid", None, ["train"], np.array(["train"])):
        with pytest.raises(ValueError, match="unknown split .*expected one of train, validation, test, all"):
            make_env(problems=None, split=split)


def test_reset_problem_option():
    env = make_env(problems=[SMALL, "32x32x32"])
    env.reset(options={"problem": None})  # None: the next problem
    assert env.problem.name == as_problem(SMALL).name
    env.reset(options={"problem": None})
    assert env.problem == looprl.matmul(32, 32, 32)
    for bad in (5, [SMALL], 1.5):
        with pytest.raises(ValueError, match=r"options\['problem'\].*expected a Problem"):
            env.reset(options={"problem": bad})
    for bad in (5, "problem", [("problem", SMALL)]):
        with pytest.raises(ValueError, match="options must be a dict"):
            env.reset(options=bad)
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={1: 2, "x": 3})


# -- 4. problems that do not fit ---------------------------------------------------------


def test_a_problem_larger_than_the_observation_is_refused_clearly():
    env = make_env()
    with pytest.raises(ValueError, match="dimension m=128 is larger than 64.*observation space"):
        env.reset(options={"problem": "128x8x8"})


def test_too_many_loops_are_refused_before_anything_is_measured(monkeypatch, policy_dir):
    from looprl.env import loopnest_env as loopnest

    monkeypatch.setattr(loopnest, "peak_gflops", lambda cache: pytest.fail("measured the peak"))
    monkeypatch.setattr(Evaluator, "measure", lambda self, nest, kernel=None: pytest.fail("measured a schedule"))
    with pytest.raises(ValueError, match="13 loops, more than max_loops=10"):
        LoopNestEnv(problems=[TOO_MANY_LOOPS], cache=":memory:")
    env = make_env(problems=["64x64x64"], max_loops=5)
    with pytest.raises(ValueError, match="more than max_loops=5"):
        env.reset(options={"problem": "bmk,bkn->bmn:b=2,m=8,k=8,n=8"})
    with pytest.raises(ValueError, match="more than max_loops=10"):
        search.run(TOO_MANY_LOOPS, "greedy1", evaluator=MustNotMeasure())
    unfusable = looprl.contraction("abcdmk,dcbakn->abcdmn", a=2, b=2, c=2, d=2, m=8, k=8, n=8)  # no fused view
    for measure in (True, False):
        with pytest.raises(ValueError, match="more than max_loops=10"):
            looprl.tune(unfusable, policy_dir, measure=measure, cache=":memory:")


# -- 5. wrong types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(problems=3), "problems must be a list"),
        (dict(split_factors=None), "split_factors must be a sequence"),
        (dict(split_factors=4), "split_factors must be a sequence"),
        (dict(split_factors="48"), "split_factors must be a sequence"),
        (dict(order=np.array(["cycle"])), "unknown order"),
        (dict(order=None), "unknown order"),
        (dict(observation=np.array(["raw"])), "unknown observation"),
        (dict(observation=["raw"]), "unknown observation"),
        (dict(render_mode=np.array(["ansi"])), "unknown render_mode"),
        (dict(render_mode=1), "unknown render_mode"),
        (dict(cache=3), "cache must be"),
        (dict(cache=3.5), "cache must be"),
        (dict(max_loops="10"), "max_loops"),
        (dict(episode_length=None), "episode_length"),
    ],
)
def test_env_refuses_wrong_types(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_env(**kwargs)


def test_search_refuses_wrong_types():
    with pytest.raises(ValueError, match="split_factors must be a sequence"):
        run(split_factors=None)
    with pytest.raises(ValueError, match="evaluator must be"):
        run(evaluator=3)
    with pytest.raises(ValueError, match="progress must be"):
        run(progress=3)
    with pytest.raises(ValueError, match="cache must be"):
        run(evaluator=None, cache=3)


def test_tune_refuses_wrong_policy_types():
    for bad in (None, 3, 3.5, ["default"]):
        with pytest.raises(ValueError, match="policy must be"):
            looprl.tune((16, 16, 16), bad, cache=":memory:")


def test_measurement_layer_refuses_wrong_types():
    with pytest.raises(ValueError, match="timing_lock"):
        Evaluator(":memory:", timing_lock=3)
    with pytest.raises(ValueError, match="expected a Problem"):
        ActionSet().check_fits("64x64x64")


# -- 3. the same checks everywhere (looprl.checks) ---------------------------------------


def test_numpy_integers_count_samples_and_threads_in_the_evaluator_cache_and_keys():
    evaluator = Evaluator(":memory:", samples=np.int64(2))
    assert evaluator.samples == 2 and type(evaluator.samples) is int
    assert measurement_key(threads=np.int64(2)) == measurement_key(threads=2)
    nest = looprl.initial_nest(looprl.matmul(4, 4, 4))
    evaluator.cache.put(nest, 5.0, samples=np.int64(2))
    assert evaluator.cache.lookup(nest).samples == 2


def test_a_bool_budget_is_refused_after_the_same_number_made_a_key():
    measurement_key(budget_s=1.0)  # memoised: True == 1.0 there, so it is checked first
    with pytest.raises(ValueError, match="budget_s must be a positive"):
        measurement_key(budget_s=True)


def test_integers_too_large_for_a_float_are_value_errors():
    with pytest.raises(ValueError, match="epilogue scale must be a finite number"):
        looprl.Epilogue(scale=10**400)
    with pytest.raises(ValueError, match="budget_s must be a positive, finite number of seconds"):
        Evaluator(":memory:", budget_s=10**400)
