import json

import numpy as np
import pytest

import looprl
from looprl.env.loopnest_env import LoopNestEnv
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout
from tests.policies import random_policy


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


def _env_episode(policy, problem, evaluator, length, use_mask):
    """The same greedy episode, played through LoopNest-v0 itself."""
    env = LoopNestEnv(problems=[problem], cache=evaluator.cache, peak=100.0, observation=policy.metadata["observation"],
                      episode_length=length, measure_budget_s=evaluator.budget_s, measure_samples=evaluator.samples)
    obs, info = env.reset(options={"problem": problem})
    for _ in range(length):
        action = policy.act(obs, env.action_mask() if use_mask else None)
        obs, _, _, _, info = env.step(action)
    return env.nest, info["gflops"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("use_mask", [True, False])
def test_greedy_rollout_ends_where_the_env_episode_ends(seed, use_mask):
    policy = make_policy(seed=seed)
    evaluator = Evaluator(":memory:", budget_s=0.001, samples=1)  # final values: both see the same numbers
    problem = looprl.matmul(24, 16, 20)
    for length in (3, 10, 17):
        rollout = greedy_rollout(policy, problem, evaluator, episode_length=length, use_mask=use_mask)
        nest, gflops = _env_episode(policy, problem, evaluator, length, use_mask)
        assert rollout.final_nest == nest
        assert rollout.final_gflops == gflops
        assert len(rollout.actions) <= length
        assert rollout.best_gflops >= max(rollout.initial_gflops, rollout.final_gflops)
        assert evaluator.cache.get(rollout.best_nest, budget_s=0.001) == rollout.best_gflops


def test_greedy_rollout_stops_at_its_first_cycle():
    policy = make_policy(seed=1)
    evaluator = Evaluator(":memory:", budget_s=0.001)
    rollout = greedy_rollout(policy, looprl.matmul(24, 16, 20), evaluator, episode_length=10**9)
    assert rollout.stopped == "cycle" and len(rollout.actions) < 100


def test_greedy_rollout_keeps_the_state_when_a_schedule_fails(monkeypatch, failing_compiles):
    monkeypatch.setenv("LOOPRL_STRICT", "0")
    policy = random_policy(bias=[0, 0, 0, 0, 9, 0, 0])  # always split_4
    problem = looprl.matmul(24, 16, 20)
    reference = greedy_rollout(policy, problem, Evaluator(":memory:", budget_s=0.001), episode_length=10)
    assert reference.final_nest != looprl.initial_nest(problem)
    failing_compiles(lambda nest: nest != looprl.initial_nest(problem))
    rollout = greedy_rollout(policy, problem, Evaluator(":memory:", budget_s=0.001), episode_length=10)
    assert rollout.final_nest == looprl.initial_nest(problem)  # never moved to a failed state
    assert rollout.failures == 1 and rollout.stopped == "cycle" and rollout.final_actions == ()
    assert rollout.final_gflops == rollout.initial_gflops > 0
