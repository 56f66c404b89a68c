"""Policy.env_kwargs: every shipped policy runs in the LoopNest-v0 env its metadata describes."""

import gymnasium as gym
import numpy as np
import pytest

import looprl
from looprl.workloads.datasets import dataset_problems
from looprl.policy.loading import default_policies, load_policy
from looprl.policy.numpy_policy import Policy
from looprl.resources import shipped_path

pytestmark = pytest.mark.target_dependent  # the shipped policies act on the default target's env

SHIPPED = sorted(path.parent for path in shipped_path("checkpoints").rglob("policy.json"))


def test_every_default_policy_is_among_the_shipped_ones():
    assert len(SHIPPED) >= 2 and {path.resolve() for path in default_policies().values()} <= {path.resolve() for path in SHIPPED}


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda path: str(path.relative_to(shipped_path("checkpoints"))))
def test_a_shipped_policy_acts_in_the_env_its_kwargs_make(folder):
    policy = load_policy(folder)
    kwargs = policy.env_kwargs
    assert kwargs["observation"] == "normalized" == policy.observation_kind
    runs_here = policy.target is None or not policy.target.missing_on_host()
    overrides = {"problems": ["64x64x64"], "cache": ":memory:", "peak": 100.0, **({} if runs_here else {"target": None})}
    env = gym.make(looprl.ENV_ID, **{**kwargs, **overrides})
    try:
        inner = env.unwrapped
        assert inner.actions.names == policy.action_names
        assert env.action_space.n == len(policy.action_names)
        assert env.observation_space.shape == policy.observation_shape
        assert inner.episode_length == policy.metadata["episode_length"]
        if runs_here and policy.target is not None:
            assert inner.target.isa == policy.target.isa
        observation, _ = env.reset(seed=0)
        for _ in range(3):
            observation, reward, terminated, truncated, info = env.step(policy.act(observation))
            assert np.isfinite(reward)
            if terminated or truncated:
                break
    finally:
        env.close()


def _metadata(**changes):
    policy = load_policy("default")
    return Policy(dict(policy.metadata, **changes), policy.trunk, policy.heads)


def test_env_kwargs_carry_the_training_problems_and_thread_count():
    policy = _metadata(training_problems=["64x64x64", "32x32x32"])
    assert policy.env_kwargs["problems"] == ["64x64x64", "32x32x32"] and "dataset" not in policy.env_kwargs
    policy = _metadata(training_problems={"dataset": ["models", "mm64-256"], "split": "train"})
    assert (policy.env_kwargs["dataset"], policy.env_kwargs["split"]) == (["models", "mm64-256"], "train")
    assert "threads" not in policy.env_kwargs
    assert _metadata(parallel=True, threads=4).env_kwargs["threads"] == 4
    without = dict(load_policy("default").metadata)
    del without["target"], without["training_problems"]
    bare = Policy(without, policy.trunk, policy.heads).env_kwargs
    assert "target" not in bare and "dataset" not in bare and "problems" not in bare


def test_the_env_made_from_a_policys_kwargs_uses_its_training_dataset():
    policy = load_policy("default")
    env = gym.make(looprl.ENV_ID, **{**policy.env_kwargs, "cache": ":memory:", "peak": 100.0})
    try:
        trained_on = policy.metadata["training_problems"]["dataset"]
        names = [trained_on] if isinstance(trained_on, str) else trained_on
        expected = {p for name in names for p in dataset_problems(name, "train")}
        assert set(env.unwrapped.problems) == expected
    finally:
        env.close()
