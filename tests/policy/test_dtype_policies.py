"""A policy per dtype: the default list's ``<isa>[/weights]/bfloat16`` keys, the most specific
one listed taken (a float32 key where none is), and a training run whose env sets a dtype
demonstrating, validating and recording that dtype."""

import json

import pytest

import looprl
from looprl.ir.dtypes import BFLOAT16
from looprl.policy import loading


def test_the_most_specific_role_listed_serves_a_problem():
    assert loading.role_keys("avx512") == ("avx512",)
    assert loading.role_keys("avx512", weights=True) == ("avx512/weights", "avx512")
    assert loading.role_keys("avx2", weights=True, dtype="bfloat16") == (  # the role before the dtype
        "avx2/weights/bfloat16", "avx2/weights", "avx2/bfloat16", "avx2")
    assert loading.role_keys("avx2", dtype=BFLOAT16) == ("avx2/bfloat16", "avx2")


def test_a_bfloat16_weight_gets_its_own_policy_where_one_is_listed_and_the_float32_one_elsewhere(monkeypatch, tmp_path):
    listed = tmp_path / "default_policies.json"
    listed.write_text(json.dumps({"avx512": "a", "avx512/weights": "w", "avx512/weights/bfloat16": "wb", "avx2": "c"}))
    monkeypatch.setattr(loading, "DEFAULT_POLICIES", listed)
    assert loading.default_policy_dir("avx512", weights=True, dtype="bfloat16") == tmp_path / "wb"
    assert loading.default_policy_dir("avx512", weights=True) == tmp_path / "w"
    assert loading.default_policy_dir("avx512", dtype="bfloat16") == tmp_path / "a"  # no general bfloat16 policy: float32's
    assert loading.default_policy_dir("avx2", weights=True, dtype="bfloat16") == tmp_path / "c"  # nothing more specific listed
    listed.write_text(json.dumps({"avx512": "a", "avx512/weights": "w", "avx512/bfloat16": "b"}))
    assert loading.default_policy_dir("avx512", weights=True, dtype="bfloat16") == tmp_path / "w"  # a weight's policy first
    assert loading.default_policy_dir("avx512", dtype="bfloat16") == tmp_path / "b"
    listed.write_text(json.dumps({"avx512": "a", "avx512/bfloat16/weights": "x"}))  # the suffixes in the wrong order
    with pytest.raises(ValueError, match="unknown ISA"):
        loading.default_policies()
    listed.write_text(json.dumps({"avx512": "a", "avx512/float16": "x"}))
    with pytest.raises(ValueError, match="unknown ISA"):
        loading.default_policies()


def test_tune_asks_for_the_policy_of_the_problem_s_dtype(monkeypatch):
    from looprl.tune import proposers

    asked = []

    def recording(policy, target, weights=False, dtype="float32"):
        asked.append((weights, str(dtype)))
        return loading.load_policy(policy, target)

    monkeypatch.setattr(proposers, "load_policy", recording)
    looprl.tune(looprl.linear(4, 64, 96).with_dtype("bfloat16"), measure=False, cache=":memory:", threads=1)
    looprl.tune(looprl.linear(4, 64, 96), measure=False, cache=":memory:", threads=1)
    assert asked == [(True, "bfloat16"), (True, "float32")]


def test_a_run_whose_env_sets_a_dtype_demonstrates_validates_and_records_it(tmp_path):
    import numpy as np

    from looprl.env.observation import FEATURES_PER_LOOP
    from looprl.train.cloning import cloned_policy
    from looprl.train.config import agent_actions
    from looprl.train.validation import spread_over_datasets, training_groups
    from tests.train.test_train import tiny_agent

    agent = tiny_agent("apex-dqn", str(tmp_path / "c.sqlite"))
    assert {p.dtype for group in training_groups(agent) for p in group} == {"float32"}
    agent["env"]["dtype"] = "bfloat16"
    problems = spread_over_datasets(agent, 2)  # what the planner demonstrates and validation measures
    assert problems and {p.dtype for p in problems} == {"bfloat16"}
    on_dataset = {**agent, "env": {**{k: v for k, v in agent["env"].items() if k != "problems"}, "dataset": "models-called"}}
    assert {p.dtype for group in training_groups(on_dataset) for p in group} == {"bfloat16"}
    agent["pretrain"] = {"epochs": 1}
    max_loops = agent["env"].get("max_loops", 10)
    x = np.zeros((2, max_loops, FEATURES_PER_LOOP), dtype=np.float32)
    policy = cloned_policy(agent, x, np.zeros(2, dtype=np.int64), 0, {}, log=lambda *_: None)
    assert policy.metadata["dtype"] == "bfloat16" and policy.env_kwargs["dtype"] == "bfloat16"
    assert len(agent_actions(agent)) == len(policy.metadata["action_names"])
    float32_agent = tiny_agent("apex-dqn", str(tmp_path / "c.sqlite"))
    float32_agent["pretrain"] = {"epochs": 1}
    unset = cloned_policy(float32_agent, x, np.zeros(2, dtype=np.int64), 0, {}, log=lambda *_: None)
    assert "dtype" not in unset.metadata and "dtype" not in unset.env_kwargs  # each problem keeps its own
