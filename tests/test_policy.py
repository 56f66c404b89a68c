import json

import numpy as np
import pytest

import looprl
from looprl.env import LoopNestEnv
from looprl.evaluator import Evaluator
from looprl.policy import Policy
from looprl.rollout import greedy_episode

from .policies import random_policy

def make_policy(seed=0, hidden=8) -> Policy:
    return random_policy(seed, hidden)


def test_forward_pass_is_the_documented_mlp():
    policy = make_policy()
    obs = np.random.default_rng(1).random((10, 20), dtype=np.float32)
    w0, b0 = policy.trunk[0].weight, policy.trunk[0].bias
    w1, b1 = policy.heads["logits"][0].weight, policy.heads["logits"][0].bias
    expected = w1 @ np.maximum(w0 @ obs.reshape(-1) + b0, 0) + b1
    np.testing.assert_allclose(policy.scores(obs), expected, rtol=1e-5)
    assert policy.act(obs) == int(np.argmax(expected))
    batch = np.stack([obs, obs * 0.5])
    assert policy.scores(batch).shape == (2, 7)


def test_mask_restricts_the_choice():
    policy = make_policy()
    obs = np.random.default_rng(2).random((10, 20), dtype=np.float32)
    best = policy.act(obs)
    mask = np.ones(7, dtype=np.int8)
    mask[best] = 0
    assert policy.act(obs, mask) != best
    with pytest.raises(ValueError, match="allows no action"):
        policy.act(obs, np.zeros(7))
    with pytest.raises(ValueError, match="mask shape"):
        policy.act(obs, np.ones(3))
    with pytest.raises(ValueError, match="observation shape"):
        policy.act(np.zeros((9, 20)))


def test_save_load_round_trip_without_pickle(tmp_path):
    policy = make_policy()
    folder = policy.save(tmp_path / "p")
    loaded = Policy.load(folder)
    obs = np.random.default_rng(3).random((10, 20), dtype=np.float32)
    np.testing.assert_array_equal(loaded.scores(obs), policy.scores(obs))
    assert Policy.load(folder / "policy.json").metadata == policy.metadata
    # An object array would need pickle: refused.
    np.savez(folder / "policy.npz", **{"trunk.0.weight": np.array([object()], dtype=object)})
    with pytest.raises(ValueError, match="unreadable policy weights"):
        Policy.load(folder)


def test_corrupt_or_mismatched_policies_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="no policy"):
        Policy.load(tmp_path)
    folder = make_policy().save(tmp_path / "p")
    meta = json.loads((folder / "policy.json").read_text())
    meta["format_version"] = 99
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not a looprl-policy"):
        Policy.load(folder)
    good = make_policy()
    arrays = {"trunk.0.weight": np.zeros((8, 100), np.float32), "trunk.0.bias": np.zeros(8, np.float32),
              "logits.0.weight": np.zeros((7, 8), np.float32), "logits.0.bias": np.zeros(7, np.float32)}
    with pytest.raises(ValueError, match="do not chain"):
        Policy.from_arrays(good.metadata, arrays)


def test_greedy_episode_follows_the_policy_and_measures_states():
    policy = make_policy(seed=5)
    evaluator = Evaluator(":memory:", budget_s=0.001)
    problem = looprl.matmul(24, 16, 20)
    episode = greedy_episode(policy, problem, evaluator, use_mask=True)
    assert len(episode.actions) == 10
    env = LoopNestEnv(problems=[problem], cache=evaluator.cache, peak=100.0, observation="normalized")
    env.reset(options={"problem": problem})
    for name in episode.actions:
        assert env.action_mask()[env.action_names.index(name)] == 1  # masked: always valid
        env.step(env.action_names.index(name))
    assert env.nest == episode.final_nest
    assert episode.best_gflops >= max(episode.initial_gflops, episode.final_gflops)
    assert evaluator.cache.get(episode.best_nest) == episode.best_gflops
