import csv
import json
import os

import numpy as np
import pytest

import looprl
from looprl.policy.numpy_policy import Policy
from looprl.train.config import ALGORITHMS, load_agent, validate_agent
from looprl.train.exploration import apex_epsilon
from looprl.train.loop import parse_duration
from looprl.train.warm_start import check_compatible, seeded_weights
from tests.policies import random_policy

TINY = ["16x16x16", "24x16x8"]


def tiny_agent(algo: str, cache: str) -> dict:
    """The shipped YAML, shrunk to a few env steps per iteration on two tiny problems."""
    agent = load_agent(algo)
    env = agent["env"]
    env.pop("dataset", None)
    env.pop("split", None)
    env.update(problems=TINY, cache=cache, peak=100.0, measure_budget_s=0.001)
    agent.setdefault("reporting", {}).update(min_sample_timesteps_per_iteration=20, min_time_s_per_iteration=0)
    training = agent["training"]
    if agent["algorithm"] == "dqn":
        training.update(num_steps_sampled_before_learning_starts=10, train_batch_size=16)
        training["replay_buffer_config"]["capacity"] = 1000
    else:
        training.update(train_batch_size_per_learner=20)
        if agent["algorithm"] == "ppo":
            training.update(minibatch_size=10, num_epochs=1)
    agent["env_runners"]["rollout_fragment_length"] = 10
    return agent


# -- configuration ------------------------------------------------------------------------------


def test_apex_epsilons_follow_the_paper():
    values = [apex_epsilon(i, 8) for i in range(8)]
    assert values[0] == pytest.approx(0.4) and values[-1] == pytest.approx(0.4**8)
    assert values == sorted(values, reverse=True)
    assert apex_epsilon(0, 1) == 0.4
    with pytest.raises(ValueError):
        apex_epsilon(3, 3)


def test_every_shipped_agent_configuration_loads():
    for algo in ALGORITHMS:
        agent = load_agent(algo)
        assert agent["env"]["episode_length"] == 10 and agent["env"]["split_factors"] == [4, 8, 16]
    assert load_agent("apex-dqn")["apex"] is True and load_agent("dqn")["apex"] is False


def test_bad_agent_configurations_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown algorithm"):
        load_agent("a3c")
    with pytest.raises(ValueError, match="not found"):
        load_agent("dqn", tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="unknown sections"):
        validate_agent({"algorithm": "dqn", "optimizer": {}})
    with pytest.raises(ValueError, match="apex"):
        validate_agent({"algorithm": "ppo", "apex": True})
    with pytest.raises(ValueError, match="must be a mapping"):
        validate_agent({"algorithm": "ppo", "training": [1, 2]})


def test_the_schema_names_rllib_s_own_keys():
    import dataclasses
    import inspect

    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from looprl.train.learners import ALGORITHM_CONFIGS
    from looprl.train.schema import ENV_RUNNERS, LEARNERS, MODEL, REPORTING, RLLIB_ALGORITHMS, TRAINING

    assert tuple(ALGORITHM_CONFIGS) == RLLIB_ALGORITHMS == tuple(TRAINING)
    for name, config_class in ALGORITHM_CONFIGS.items():
        config = config_class()
        assert not [key for key in TRAINING[name].settings if not hasattr(config, key)], name
    for section, method in ((ENV_RUNNERS, AlgorithmConfig.env_runners), (LEARNERS, AlgorithmConfig.learners),
                            (REPORTING, AlgorithmConfig.reporting)):
        assert set(section.settings) <= set(inspect.signature(method).parameters)
    assert set(MODEL.settings) <= {field.name for field in dataclasses.fields(DefaultModelConfig)}


def test_durations():
    assert [parse_duration(t) for t in ("90", "90s", "30m", "1.5h")] == [90, 90, 1800, 5400]
    for bad in ("soon", "-5m", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# -- one iteration of each algorithm, checkpoint, export ------------------------------------------


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_one_iteration_checkpoint_and_exported_policy_match(algo, ray_session, tmp_path):
    import torch

    from looprl.train.learners import build_config
    from looprl.train.export import export_policy, load_module

    agent = tiny_agent(algo, str(tmp_path / "cache.sqlite"))
    built = build_config(agent, seed=1, num_env_runners=0).build_algo()
    try:
        result = built.train()
        assert result["num_env_steps_sampled_lifetime"] >= 20
        checkpoint = tmp_path / "ckpt"
        built.save_to_path(str(checkpoint))
    finally:
        built.stop()
    folder = export_policy(checkpoint, tmp_path / "policy", agent)
    policy = Policy.load(folder)
    assert policy.action_names == ("up", "down", "swap_up", "swap_down", "split_4", "split_8", "split_16")
    assert policy.metadata["algorithm"] == agent["algorithm"] and policy.metadata["observation"] == "normalized"
    assert policy.metadata["training_problems"] == TINY
    dueling = agent["algorithm"] == "dqn" and agent["training"].get("dueling", True)
    assert ("value" in policy.heads) == dueling  # the dueling value head, kept for --init-from

    module = load_module(checkpoint)
    observations = np.random.default_rng(0).random((300, 10, 20), dtype=np.float32)
    with torch.no_grad():
        output = module.forward_inference({"obs": torch.from_numpy(observations.reshape(300, -1))})
    scores = policy.scores(observations)
    if "actions" in output:
        theirs = output["actions"].numpy()
    else:
        logits = output["action_dist_inputs"].numpy()
        np.testing.assert_allclose(scores, logits, rtol=1e-4, atol=1e-5)  # the same network, the same outputs
        theirs = logits.argmax(-1)
    ours = np.array([policy.act(o) for o in observations])
    # The greedy actions agree wherever the best two scores are not a float rounding apart
    # (numpy's and torch's matmuls round differently: a near-tie may go either way).
    top_two = np.sort(scores, axis=-1)[:, -2:]
    clear = (top_two[:, 1] - top_two[:, 0]) > 1e-4 * np.maximum(1.0, np.abs(top_two[:, 1]))
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(ours[clear], theirs[clear])


def test_a_layout_agent_trains_and_exports_a_policy_with_pack_and_pad(ray_session, tmp_path):
    from looprl.policy.rollout import greedy_rollout, policy_actions
    from looprl.train.learners import build_config
    from looprl.train.export import export_policy

    agent = tiny_agent("dqn", str(tmp_path / "cache.sqlite"))
    agent["env"]["layouts"] = True
    built = build_config(agent, seed=1, num_env_runners=0).build_algo()
    try:
        built.train()
        checkpoint = tmp_path / "ckpt"
        built.save_to_path(str(checkpoint))
    finally:
        built.stop()
    policy = Policy.load(export_policy(checkpoint, tmp_path / "policy", agent))
    assert policy.action_names[-2:] == ("pack", "pad") and policy.metadata["layouts"] is True
    assert policy_actions(policy).layouts
    assert greedy_rollout(policy, looprl.matmul(16, 24, 8), None).episode_length == policy.metadata["episode_length"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_two_thread_agent_trains_and_exports_a_policy_with_the_parallel_action(ray_session, tmp_path):
    from looprl.policy.rollout import greedy_rollout, policy_actions
    from looprl.train.learners import build_config
    from looprl.train.export import export_policy

    agent = tiny_agent("dqn", str(tmp_path / "cache.sqlite"))
    agent["env"]["threads"] = 2
    built = build_config(agent, seed=1, num_env_runners=0).build_algo()
    try:
        built.train()
        checkpoint = tmp_path / "ckpt"
        built.save_to_path(str(checkpoint))
    finally:
        built.stop()
    policy = Policy.load(export_policy(checkpoint, tmp_path / "policy", agent))
    assert policy.action_names[-1] == "parallel" and policy.metadata["threads"] == 2
    assert policy_actions(policy).parallel
    evaluator = looprl.Evaluator(str(tmp_path / "cache.sqlite"), 0.001, threads=2)
    assert greedy_rollout(policy, looprl.matmul(16, 24, 8), evaluator).episode_length == policy.metadata["episode_length"]


# -- the command line: checkpoints, resume, Ctrl-C, evaluation ------------------------------------------


def train_here(capsys, *arguments) -> str:
    """``looprl-train arguments`` run in this process, exit status 0: what it printed. A
    training run attaches to the test process's Ray (the ``ray_session`` fixture) and leaves it
    running, where a process of its own imported torch and RLlib and started a Ray each time
    (the command line's own process start is tested by tests/cli/'s SIGTERM run, and an
    evaluation's by tests/cli/test_cli_bad_input.py's run without the train extra)."""
    from looprl.cli.train import main as train_main

    capsys.readouterr()
    status = train_main(list(arguments))
    captured = capsys.readouterr()
    assert status == 0, captured.out[-2000:] + captured.err[-4000:]
    return captured.out


def write_tiny_config(tmp_path, algo="dqn"):
    import yaml

    agent = tiny_agent(algo, str(tmp_path / "cache.sqlite"))
    path = tmp_path / f"{algo}.yaml"
    path.write_text(yaml.safe_dump(agent))
    return path


@pytest.mark.slow
def test_cli_trains_checkpoints_resumes_and_evaluates(ray_session, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_tiny_config(tmp_path)
    common = ["--num-env-runners", "0", "--checkpoint-every", "1", "--validate-every", "1", "--validation-problems", "2"]
    out = train_here(capsys, "--algo", "dqn", "--config", str(config), "--iterations", "2", "--out", str(run), *common)
    assert "[iter 2/2]" in out and (run / "policy" / "policy.json").exists()
    assert out.count("validation: greedy speed-up") == 2
    best = Policy.load(run / "policy-best").metadata["validation"]
    assert best["iteration"] in (1, 2) and best["speedup_geomean"] > 0
    first = json.loads((run / "run.json").read_text())["state"]
    assert first["iteration"] == 2 and first["checkpoint"] == "iter_000002"

    out = train_here(capsys, "--resume", "--out", str(run), "--iterations", "3", *common)
    assert "resumed" in out and "[iter 3/3]" in out
    state = json.loads((run / "run.json").read_text())["state"]
    assert state["iteration"] == 3 and state["env_steps"] > first["env_steps"]
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    scores = [float(r["validation_speedup"]) for r in rows]
    assert all(score > 0 for score in scores)
    assert Policy.load(run / "policy-best").metadata["validation"]["speedup_geomean"] == pytest.approx(max(scores))
    assert [int(r["env_steps"]) for r in rows] == sorted(int(r["env_steps"]) for r in rows)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "iter_000003"]
    assert (run / "checkpoints" / "iter_000003" / "replay_buffer.pkl").exists()  # exact DQN resume
    held = int(out.split("replay buffer: ")[1].split()[0])
    assert held >= first["env_steps"] // 2  # restored, not empty
    assert any((run / "tb").iterdir())

    table = tmp_path / "eval.csv"
    out = train_here(capsys, "--evaluate", str(run), "--split", "test", "--limit", "2", "--csv", str(table),
                        "--cache", str(tmp_path / "cache.sqlite"))
    assert "2 problems: speed-up over untuned" in out
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 2 and all(float(r["initial_gflops"]) > 0 and float(r["final_gflops"]) > 0 for r in rows)
    # Ten actions, or fewer when the greedy episode closed a cycle (the rest repeats it).
    assert all(len(r["actions"].split()) == 10 or r["stopped"] == "cycle" for r in rows)

    # An RLlib checkpoint inside a run folder is exported on the fly.
    out = train_here(capsys, "--evaluate", str(run / "checkpoints" / "iter_000003"), "--split", "test", "--limit", "1",
                        "--cache", str(tmp_path / "cache.sqlite"))
    assert "1 problems" in out


def test_cli_rejects_bad_input(tmp_path, capsys):
    from looprl.cli.train import main as train_main

    small_policy = random_policy(hidden=8).save(tmp_path / "small-policy")
    for arguments, message in [
        (["--time-budget", "soon"], "bad duration"),
        (["--resume"], "--resume needs --out"),
        (["--resume", "--out", str(tmp_path / "none")], "nothing to resume"),
        (["--evaluate", str(tmp_path)], "no policy at"),
        (["--iterations", "0"], "--iterations"),
        (["--validate-every", "-1"], "--validate-every"),
        (["--validation-problems", "0"], "--validation-problems"),
        (["--resume", "--out", str(tmp_path), "--init-from", "checkpoints/apex-dqn"], "cannot be combined with --resume"),
        (["--resume", "--out", str(tmp_path), "--layouts"], "a resumed run keeps its own"),
        (["--resume", "--out", str(tmp_path), "--threads", "2"], "a resumed run keeps its own"),
        (["--threads", str(len(os.sched_getaffinity(0)) + 1)], "core(s) this process may use"),
        (["--init-from", str(small_policy), "--out", str(tmp_path / "new")], "trunk layers [8]"),
    ]:
        try:  # in this process: each refusal must come before anything starts Ray or trains
            returncode = train_main(arguments)
        except SystemExit as exit_:  # argparse's own refusals
            returncode = exit_.code
        stderr = capsys.readouterr().err
        assert returncode == 2 and message in stderr, (arguments, stderr[-500:])
    assert not (tmp_path / "new").exists()


# -- warm start from an exported policy ----------------------------------------------------------


def wide_policy(seed=0, value=False) -> Policy:
    """A random policy with the shipped agents' network (200 -> 256 -> 256 -> 7 advantages,
    and a dueling value head when ``value``)."""
    rng = np.random.default_rng(seed)
    base = random_policy(seed)
    shapes = {"trunk.0": (256, 200), "trunk.1": (256, 256), "advantages.0": (7, 256)}
    if value:
        shapes["value.0"] = (1, 256)
    arrays = {}
    for name, shape in shapes.items():
        arrays[f"{name}.weight"] = rng.normal(scale=0.1, size=shape).astype(np.float32)
        arrays[f"{name}.bias"] = rng.normal(scale=0.1, size=shape[0]).astype(np.float32)
    layer = lambda name, activation: {"weight": f"{name}.weight", "bias": f"{name}.bias", "activation": activation}  # noqa: E731
    network = {"trunk": [layer("trunk.0", "relu"), layer("trunk.1", "relu")],
               "heads": {"advantages": [layer("advantages.0", "linear")]}, "greedy": "advantages"}
    if value:
        network["heads"]["value"] = [layer("value.0", "linear")]
    return Policy.from_arrays({**base.metadata, "network": network}, arrays)


def test_seeded_weights_fill_online_and_target_networks_only():
    policy = wide_policy()
    names = ["encoder.net.mlp.0", "encoder.net.mlp.2", "af.net.mlp.0", "vf.net.mlp.0",
             "_target_encoder.net.mlp.0", "_target_encoder.net.mlp.2", "_target_af.net.mlp.0", "_target_vf.net.mlp.0"]
    shapes = {"encoder.net.mlp.0": (256, 200), "encoder.net.mlp.2": (256, 256), "af.net.mlp.0": (7, 256), "vf.net.mlp.0": (1, 256)}
    weights = {}
    for name in names:
        shape = shapes[name.replace("_target_", "")]
        weights[f"{name}.weight"], weights[f"{name}.bias"] = np.zeros(shape, np.float32), np.zeros(shape[0], np.float32)
    seeded, count = seeded_weights(weights, policy)
    assert count == 12
    for prefix in ("", "_target_"):
        np.testing.assert_array_equal(seeded[f"{prefix}encoder.net.mlp.2.weight"], policy.trunk[1].weight)
        np.testing.assert_array_equal(seeded[f"{prefix}af.net.mlp.0.bias"], policy.heads["advantages"][0].bias)
        assert not seeded[f"{prefix}vf.net.mlp.0.weight"].any()  # not in the policy file: untouched
    with_value = wide_policy(value=True)
    seeded, count = seeded_weights(weights, with_value)
    assert count == 16
    np.testing.assert_array_equal(seeded["vf.net.mlp.0.weight"], with_value.heads["value"][0].weight)
    weights["encoder.net.mlp.2.weight"] = np.zeros((128, 256), np.float32)
    with pytest.raises(ValueError, match="encoder.net.mlp.2.weight"):
        seeded_weights(weights, policy)


def test_a_loops_only_policy_seeds_a_layout_agent_with_its_new_actions_as_the_average_action():
    policy = wide_policy(value=True)
    agent = load_agent("apex-dqn")
    agent["env"]["layouts"] = True
    check_compatible(policy, agent, "p")  # pack and pad come after the policy's 7 actions
    shapes = {"encoder.net.mlp.0": (256, 200), "encoder.net.mlp.2": (256, 256), "af.net.mlp.0": (9, 256), "vf.net.mlp.0": (1, 256)}
    weights = {}
    for prefix in ("", "_target_"):
        for name, shape in shapes.items():
            weights[f"{prefix}{name}.weight"], weights[f"{prefix}{name}.bias"] = np.zeros(shape, np.float32), np.zeros(shape[0], np.float32)
    seeded, count = seeded_weights(weights, policy)
    assert count == 16
    head = policy.heads["advantages"][0]
    for prefix in ("", "_target_"):
        np.testing.assert_array_equal(seeded[f"{prefix}af.net.mlp.0.weight"][:7], head.weight)
        for row in (7, 8):
            np.testing.assert_allclose(seeded[f"{prefix}af.net.mlp.0.weight"][row], head.weight.mean(axis=0), rtol=1e-6)
            assert seeded[f"{prefix}af.net.mlp.0.bias"][row] == pytest.approx(head.bias.mean())
    weights["af.net.mlp.0.weight"] = np.zeros((5, 256), np.float32)  # fewer actions than the policy: refused
    with pytest.raises(ValueError, match="af.net.mlp.0.weight"):
        seeded_weights(weights, policy)


def test_incompatible_policies_are_named(tmp_path):
    agent = load_agent("apex-dqn")
    check_compatible(wide_policy(), agent, "p")
    with pytest.raises(ValueError, match="trunk layers"):
        check_compatible(random_policy(hidden=8), agent, "p")
    agent["env"]["split_factors"] = [2, 4]
    with pytest.raises(ValueError, match="actions"):
        check_compatible(wide_policy(), agent, "p")


def test_warm_start_makes_the_module_act_like_the_policy(ray_session, tmp_path):
    import torch

    from looprl.train.learners import build_config
    from looprl.train.warm_start import warm_start

    policy = wide_policy(seed=3)
    agent = tiny_agent("apex-dqn", str(tmp_path / "cache.sqlite"))
    built = build_config(agent, seed=1, num_env_runners=0).build_algo()
    try:
        assert warm_start(built, policy) == 12
        module = built.env_runner.module  # the module that samples
        observations = np.random.default_rng(0).random((200, 10, 20), dtype=np.float32)
        with torch.no_grad():
            q = module.forward_inference({"obs": torch.from_numpy(observations.reshape(200, -1))})
        ours = np.array([policy.act(o) for o in observations])
        np.testing.assert_array_equal(q["actions"].numpy(), ours)
        learner = built.learner_group.get_weights()["default_policy"]
        np.testing.assert_array_equal(learner["_target_af.net.mlp.0.weight"], policy.heads["advantages"][0].weight)
    finally:
        built.stop()


def test_validation_set_and_score():
    from looprl.ir.problem import as_problem
    from looprl.measurement.evaluator import Evaluator
    from looprl.train.validation import Validator, spread

    problems = [as_problem(f"{16 * i}x16x16") for i in range(1, 11)]
    assert spread(problems, 5) == problems[::2]
    assert spread(problems, 50) == problems
    with pytest.raises(ValueError, match="positive"):
        spread(problems, 0)
    # A policy that always asks for swap_up at the top (its "stop") keeps the untuned nest.
    stays = random_policy(bias=[0, 0, 9, 0, 0, 0, 0])
    assert Validator(problems[:2], Evaluator(":memory:", 0.001))(stays) == pytest.approx(1.0)
