import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from looprl.policy import Policy
from looprl.train.config import ALGORITHMS, apex_epsilon, load_agent, validate_agent
from looprl.train.loop import parse_duration

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


def test_durations():
    assert [parse_duration(t) for t in ("90", "90s", "30m", "1.5h")] == [90, 90, 1800, 5400]
    for bad in ("soon", "-5m", "0"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# -- one iteration of each algorithm, checkpoint, export ------------------------------------------


@pytest.fixture(scope="module")
def ray_session():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_one_iteration_checkpoint_and_exported_policy_match(algo, ray_session, tmp_path):
    import torch

    from looprl.train.config import build_config
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

    module = load_module(checkpoint)
    observations = np.random.default_rng(0).random((300, 10, 20), dtype=np.float32)
    with torch.no_grad():
        output = module.forward_inference({"obs": torch.from_numpy(observations.reshape(300, -1))})
    if "actions" in output:
        theirs = output["actions"].numpy()
    else:
        theirs = output["action_dist_inputs"].numpy().argmax(-1)
    ours = np.array([policy.act(o) for o in observations])
    np.testing.assert_array_equal(ours, theirs)


# -- the command line: checkpoints, resume, Ctrl-C, evaluation ------------------------------------------


def run_cli(*arguments, timeout=600):
    result = subprocess.run([sys.executable, "-m", "looprl.train", *arguments], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def write_tiny_config(tmp_path, algo="dqn"):
    import yaml

    agent = tiny_agent(algo, str(tmp_path / "cache.sqlite"))
    path = tmp_path / f"{algo}.yaml"
    path.write_text(yaml.safe_dump(agent))
    return path


def test_cli_trains_checkpoints_resumes_and_evaluates(tmp_path):
    run = tmp_path / "run"
    config = write_tiny_config(tmp_path)
    common = ["--num-env-runners", "0", "--checkpoint-every", "1"]
    out = run_cli("--algo", "dqn", "--config", str(config), "--iterations", "2", "--out", str(run), *common)
    assert "[iter 2/2]" in out and (run / "policy" / "policy.json").exists()
    first = json.loads((run / "run.json").read_text())["state"]
    assert first["iteration"] == 2 and first["checkpoint"] == "iter_000002"

    out = run_cli("--resume", "--out", str(run), "--iterations", "3", *common)
    assert "resumed" in out and "[iter 3/3]" in out
    state = json.loads((run / "run.json").read_text())["state"]
    assert state["iteration"] == 3 and state["env_steps"] > first["env_steps"]
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3]
    assert [int(r["env_steps"]) for r in rows] == sorted(int(r["env_steps"]) for r in rows)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002", "iter_000003"]
    assert (run / "checkpoints" / "iter_000003" / "replay_buffer.pkl").exists()  # exact DQN resume
    held = int(out.split("replay buffer: ")[1].split()[0])
    assert held >= first["env_steps"] // 2  # restored, not empty
    assert any((run / "tb").iterdir())

    table = tmp_path / "eval.csv"
    out = run_cli("--evaluate", str(run), "--split", "test", "--limit", "2", "--csv", str(table), "--cache", str(tmp_path / "cache.sqlite"))
    assert "2 problems: speed-up over untuned" in out
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 2 and all(float(r["initial_gflops"]) > 0 and float(r["final_gflops"]) > 0 for r in rows)
    assert all(len(r["actions"].split()) == 10 for r in rows)

    # An RLlib checkpoint inside a run folder is exported on the fly.
    out = run_cli("--evaluate", str(run / "checkpoints" / "iter_000003"), "--split", "test", "--limit", "1", "--cache", str(tmp_path / "cache.sqlite"))
    assert "1 problems" in out


def test_ctrl_c_saves_a_final_checkpoint(tmp_path):
    run = tmp_path / "run"
    config = write_tiny_config(tmp_path)
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        "from looprl.train.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--algo", "dqn", "--config", str(config), "--iterations", "100000", "--out", str(run),
         "--num-env-runners", "0", "--checkpoint-every", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if not line or line.startswith("[iter 2/"):
            break
    try:
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=300)
    finally:
        process.kill()  # never leave a 100000-iteration run behind if the test fails
    output = "".join(lines) + rest
    assert process.returncode == 0, output[-3000:]
    assert "saving a final checkpoint" in output
    state = json.loads((run / "run.json").read_text())["state"]
    assert state["iteration"] >= 2 and (run / "checkpoints" / state["checkpoint"]).exists()
    assert (run / "policy" / "policy.npz").exists()


def test_cli_rejects_bad_input(tmp_path):
    for arguments, message in [
        (["--time-budget", "soon"], "bad duration"),
        (["--resume"], "--resume needs --out"),
        (["--resume", "--out", str(tmp_path / "none")], "nothing to resume"),
        (["--evaluate", str(tmp_path)], "no policy at"),
        (["--iterations", "0"], "--iterations"),
    ]:
        result = subprocess.run([sys.executable, "-m", "looprl.train", *arguments], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and message in result.stderr, (arguments, result.stderr[-500:])
