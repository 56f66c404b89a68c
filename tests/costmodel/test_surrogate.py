"""LoopNest-v0 with ``reward="model"``: a cost model predicts most new states' GFLOPS."""

import json
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import looprl  # (registers LoopNest-v0)
from looprl.costmodel.schedule_features import features_batch
from looprl.costmodel.model import CostModel
from looprl.costmodel.surrogate_reward import PROBLEM_ROWS, SurrogateReward
from looprl.env.loopnest_env import LoopNestEnv
from looprl.ir.nest import initial_nest
from looprl.ir.problem import as_problem

PEAK = 100.0
PROBLEMS = ["48x32x40", "64x16x24"]


def make_env(**kwargs):
    kwargs.setdefault("problems", PROBLEMS)
    kwargs.setdefault("cache", ":memory:")
    kwargs.setdefault("peak", PEAK)
    kwargs.setdefault("measure_budget_s", 0.001)
    kwargs.setdefault("reward", "model")
    return LoopNestEnv(**kwargs)


def random_steps(env, steps, seed=0):
    """Random valid actions; counts of the structural steps by outcome."""
    rng = np.random.default_rng(seed)
    counts = {"predicted": 0, "measured": 0, "cached": 0, "resets": 1}
    _, info = env.reset(seed=seed)
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
        assert obs in env.observation_space and np.isfinite(reward) and not terminated
        assert isinstance(info["predicted"], bool)
        if info["predicted"]:
            counts["predicted"] += 1
            assert info["from_cache"] is None and 0.0 <= info["gflops"] <= env.peak
        elif info["from_cache"] is not None:
            counts["cached" if info["from_cache"] else "measured"] += 1
        if truncated:
            _, info = env.reset()
            counts["resets"] += 1
    return counts


class ConstantModel:
    """A reward model by the env's protocol: predicts 42 GFLOPS, records what it is shown."""

    def __init__(self):
        self.observed = []

    def predict(self, nests):
        return np.full(len(nests), 42.0)

    def observe(self, nest, gflops):
        self.observed.append((nest.key, gflops))


def fitted_model():
    """A CostModel fitted on real measurements of the test problems' first states."""
    env = make_env(reward="measured")
    nests, values = [], []
    for name in PROBLEMS:
        root = initial_nest(as_problem(name))
        for nest in (root, root.split(0, 4), root.split(0, 8), root.swap(0), root.split(1, 8)):
            nests.append(nest)
            values.append(env.evaluator(nest).gflops)
    model = CostModel("rank", rounds=10, isa=env.target.isa, target=env.target.key)
    model.fit(features_batch(nests, target=env.target), values, [n.problem.name for n in nests])
    return model


def test_env_with_a_protocol_model_measures_the_given_fraction():
    model = ConstantModel()
    env = make_env(model=model, measure_fraction=0.25)
    assert env.surrogate is model
    counts = random_steps(env, 400)
    new = counts["predicted"] + counts["measured"]
    assert new >= 60
    assert 0.12 <= counts["measured"] / new <= 0.4
    # Every compile is a drawn state or a reset's untuned nest: first measured, then timed
    # again until it has the evaluator's samples (a reset measures as with reward="measured").
    evaluator = env.evaluator
    assert evaluator.compiled - evaluator.resampled == counts["measured"] + len(PROBLEMS)
    assert evaluator.resampled == len(PROBLEMS) * (evaluator.samples - 1)
    # The model saw every measurement: each episode's untuned nest, drawn and cached states.
    assert len(model.observed) == counts["resets"] + counts["measured"] + counts["cached"]


def test_all_and_none_measured():
    env = make_env(model=ConstantModel(), measure_fraction=1.0)
    counts = random_steps(env, 60)
    assert counts["predicted"] == 0 and counts["measured"] > 0
    env = make_env(model=ConstantModel(), measure_fraction=0.0)
    counts = random_steps(env, 60)
    assert counts["measured"] == 0 and counts["predicted"] > 0
    assert env.evaluator.compiled == len(PROBLEMS) * env.evaluator.samples  # the untuned nests only


def test_from_scratch_measures_until_the_first_fit_then_refits():
    env = make_env(measure_fraction=0.2, refit_every=8)  # model=None and an empty cache
    surrogate = env.surrogate
    assert isinstance(surrogate, SurrogateReward) and not surrogate.ready
    _, info = env.reset(seed=1)
    rng = np.random.default_rng(1)
    while not surrogate.ready:  # nothing predicted before the first fit
        _, _, _, truncated, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
        assert not info["predicted"]
        if truncated:
            _, info = env.reset()
    assert surrogate.fits == 1
    counts = random_steps(env, 300, seed=2)
    assert counts["predicted"] > counts["measured"] > 0
    assert surrogate.fits >= 2  # refitted on the new measurements


def test_check_env_passes_and_make_takes_json_kwargs(tmp_path):
    path = fitted_model().save(tmp_path / "model.json")
    kwargs = {"problems": PROBLEMS, "cache": ":memory:", "peak": PEAK, "measure_budget_s": 0.001,
              "reward": "model", "model": str(path), "measure_fraction": 0.1, "refit_every": 16}
    json.dumps(kwargs)  # what an env config for Ray workers must be
    env = gymnasium.make("LoopNest-v0", **kwargs)
    assert env.unwrapped.surrogate.ready  # a loaded model predicts at once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    counts = random_steps(env.unwrapped, 60)
    assert counts["predicted"] > 0
    env.close()


def test_cost_model_predictions_are_calibrated_gflops():
    env = make_env(model=fitted_model(), measure_fraction=0.0)
    surrogate = env.surrogate
    env.reset(seed=0)
    root = env.nest
    predicted = surrogate.predict([root, root.split(0, 4), root.swap(0)])
    assert predicted[0] == pytest.approx(env.gflops)  # the anchor: the measured untuned nest
    assert np.all(np.isfinite(predicted)) and np.all(predicted >= 0)
    other = initial_nest(as_problem("96x32x32"))  # never measured: nothing to anchor on
    assert np.isnan(surrogate.predict([other])[0])


def test_a_problem_with_enough_measurements_is_calibrated_by_an_isotonic_fit():
    """Its measured GFLOPS, taken in the order of the model's scores, become the closest
    non-decreasing sequence (pool adjacent violators); predictions interpolate it."""
    problem = as_problem("48x32x40")
    root = initial_nest(problem)
    nests = [root, root.split(0, 4), root.split(0, 8), root.swap(0), root.split(1, 8), root.split(2, 4), root.split(2, 8), root.swap(1)]
    assert len(nests) == PROBLEM_ROWS
    rows = features_batch(nests, target=looprl.Target.named("avx2"))
    base = CostModel("regression", rounds=20, isa="avx2").fit(rows, np.arange(len(nests), dtype=float), [problem.name] * len(nests))
    order = np.argsort(base.predict(rows), kind="stable")  # the nests by rising score
    for by_score, pooled in (
        ([1, 3, 2, 4, 7, 5, 6, 8], [1, 2.5, 2.5, 4, 6, 6, 6, 8]),  # two descents, each pooled to its mean
        ([8, 7, 6, 5, 4, 3, 2, 1], [4.5] * 8),  # scores ordered against the measurements: one mean
    ):
        gflops = np.empty(len(nests))
        gflops[order] = by_score
        surrogate = SurrogateReward(base, isa="avx2", records=list(zip(nests, gflops)))
        assert surrogate.monotone[problem.name][1].tolist() == pytest.approx(pooled)
        assert surrogate.predict([nests[i] for i in order]).tolist() == pytest.approx(pooled)


def test_bad_reward_and_model_arguments(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    for kwargs in (
        {"reward": "predicted"},
        {"reward": None},
        {"reward": "measured", "model": "model.json"},
        {"model": 42},
        {"model": str(tmp_path / "missing.json")},
        {"model": str(bad)},
        {"model": CostModel()},  # not fitted
        {"measure_fraction": 1.5},
        {"measure_fraction": True},
        {"refit_every": 0},
    ):
        with pytest.raises(ValueError):
            make_env(**kwargs)
    other_isa = fitted_model()
    other_isa.layout = {**other_isa.layout, "isa": "sse4" if other_isa.layout["isa"] != "sse4" else "avx2"}
    with pytest.raises(ValueError, match="features describe"):
        make_env(model=other_isa)


def test_the_default_env_imports_no_cost_model():
    code = (
        "import sys, gymnasium, looprl\n"
        "env = gymnasium.make('LoopNest-v0', problems=['48x32x40'], cache=':memory:', peak=100.0)\n"
        "env.reset(seed=0)\n"
        "print(sorted(m for m in sys.modules if m == 'xgboost' or m.startswith('looprl.costmodel')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
