"""The command lines as a new user meets them (issue 30): optional extras missing, bad input,
interrupts, a shared CSV, a policy made for another CPU. Each test reproduces one defect."""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.target import Target
from tests.policies import random_policy
from tests.cli.test_cli_errors import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--dataset", "mm64-256", "--split", "test"]  # small problems: a greedy episode takes a second or two


def python(code: str, *arguments, cwd=None, timeout=120):
    """Run ``code`` in a fresh interpreter with the worktree's looprl first on the path."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment)


def command(module: str, *arguments, cwd=None, timeout=120):
    return python(f"import sys; from looprl.cli.{module} import main; sys.exit(main(sys.argv[1:]))", *arguments, cwd=cwd, timeout=timeout)


def without(modules, cli: str, *arguments, cwd=None):
    """``cli``'s main with ``modules`` made unimportable, as when an extra is not installed."""
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in modules)
    return python(f"import sys; {hide}from looprl.cli.{cli} import main; sys.exit(main(sys.argv[1:]))", *arguments, cwd=cwd)


def tiny_config(tmp_path, **env) -> Path:
    """A tiny DQN agent YAML (two small problems, a fixed peak) with ``env`` settings changed."""
    import yaml

    from tests.train.test_train import tiny_agent

    agent = tiny_agent("dqn", str(tmp_path / "cache.sqlite"))
    agent["env"].update(env)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(agent))
    return path


# -- 1: help and a clear message without the [train] extra ------------------------------------------


def test_train_help_prints_and_training_names_the_extra_without_it(tmp_path):
    result = without(["yaml", "ray"], "train", "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: looprl-train"), result.stderr[-2000:]
    out = tmp_path / "run"
    result = without(["yaml", "ray"], "train", "--iterations", "1", "--out", str(out))
    assert_one_line_error(result, "looprl-train", "pip install 'looprl[train]'")
    assert not out.exists()


def test_evaluating_a_policy_folder_needs_no_train_extra(tmp_path):
    policy = random_policy().save(tmp_path / "policy")
    result = without(["yaml", "ray"], "train", "--evaluate", str(policy), *SMALL, "--limit", "1", "--cache", ":memory:")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 problems: speed-up over untuned" in result.stdout


# -- 2, 3: refused starts leave nothing behind; a folder without a checkpoint starts again ---------


@pytest.mark.parametrize("arguments, env, fragment", [
    (["--problems", "abc"], {}, "cannot parse problem 'abc'"),
    ([], {"episode_length": -3}, "episode_length must be a positive integer, got -3"),
    ([], {"no_such_setting": 1}, "unknown settings ['no_such_setting']"),
    (["--address", "127.0.0.1:1"], {}, "--address 127.0.0.1:1: no Ray cluster answers there"),
    (["--address", "nowhere"], {}, "expected HOST:PORT"),
])
def test_a_start_refused_for_bad_input_is_one_line_and_creates_no_folder(tmp_path, arguments, env, fragment):
    config = tiny_config(tmp_path, **env)
    out = tmp_path / "run"
    result = command("train", "--algo", "dqn", "--config", str(config), "--iterations", "1", "--out", str(out), *arguments, timeout=300)
    assert_one_line_error(result, "looprl-train", fragment)
    assert not out.exists()


def unstarted_run(tmp_path) -> Path:
    """A run folder as a start that failed after writing it (Ray unreachable, SIGTERM while Ray started) leaves it."""
    from looprl.train.config import load_agent
    from looprl.train.loop import RunDirectory

    folder = tmp_path / "run"
    run = RunDirectory(folder)
    run.create(load_agent("dqn", tiny_config(tmp_path)), {"algo": "dqn", "seed": 0, "num_env_runners": 0})
    (folder / "metrics.csv").write_text("iteration\n")
    assert run.exists() and not run.checkpointed()
    return folder


def test_a_run_folder_without_a_checkpoint_can_be_started_again(tmp_path):
    folder = unstarted_run(tmp_path)
    config = tiny_config(tmp_path)
    # The start goes past the folder check to the (unreachable) cluster, instead of "already holds a run" ...
    result = command("train", "--algo", "dqn", "--config", str(config), "--out", str(folder), "--address", "127.0.0.1:1")
    assert_one_line_error(result, "looprl-train", "--address 127.0.0.1:1")
    # ... and --resume of it starts it too, instead of "has no checkpoint yet".
    result = command("train", "--resume", "--out", str(folder), "--address", "127.0.0.1:1")
    assert_one_line_error(result, "looprl-train", "--address 127.0.0.1:1")
    assert (folder / "run.json").exists()  # a refused start leaves the folder as it was


def test_starting_an_unstarted_folder_again_discards_what_its_first_start_left(tmp_path):
    from looprl.train.loop import RunDirectory

    folder = unstarted_run(tmp_path)
    (folder / "notes.txt").write_text("mine")
    RunDirectory(folder).discard_unstarted()
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # only the run's own files go
    (folder / "checkpoints").mkdir()
    RunDirectory(folder).discard_unstarted()
    assert (folder / "checkpoints").exists()  # not a run folder (no run.json): nothing is removed


def test_a_run_with_a_checkpoint_is_still_only_resumed(tmp_path):
    folder = unstarted_run(tmp_path)
    record = json.loads((folder / "run.json").read_text())
    record["state"]["checkpoint"] = "iter_000001"
    (folder / "run.json").write_text(json.dumps(record))
    result = command("train", "--algo", "dqn", "--config", str(tiny_config(tmp_path)), "--out", str(folder))
    assert_one_line_error(result, "looprl-train", "already holds a run")


# -- 4: several searches appending to one CSV -------------------------------------------------------


def test_searches_sharing_one_csv_keep_one_header_first_and_the_file_resumable(tmp_path):
    table = tmp_path / "one.csv"
    table.touch()  # created (empty) by whichever search opened it first
    arguments = ["--algo", "random", *SMALL, "--limit", "1", "--evaluations", "3", "--budget", "0", "--verify-ms", "0",
                 "--cache", ":memory:", "--quiet", "--csv", str(table)]
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    processes = [subprocess.Popen([sys.executable, "-m", "looprl.cli.search", *arguments, "--offset", str(offset)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment) for offset in range(3)]
    for process in processes:
        _, errors = process.communicate(timeout=300)
        assert process.returncode == 0, errors[-2000:]
    from looprl.cli.search import CSV_FIELDS

    lines = table.read_text().splitlines()
    assert lines[0] == ",".join(CSV_FIELDS) and lines.count(lines[0]) == 1
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 3 and len({row["problem"] for row in rows}) == 3
    for offset in range(3):  # resumed: every pair is done
        result = command("search", *arguments, "--offset", str(offset))
        assert result.returncode == 0 and "wrote" in result.stdout, result.stderr[-2000:]
    assert table.read_text().splitlines() == lines


# -- 5: an interrupted evaluation keeps its rows ---------------------------------------------------


def test_sigterm_during_an_evaluation_keeps_the_rows_done_and_exits_130(tmp_path):
    policy = random_policy().save(tmp_path / "policy")
    table = tmp_path / "eval.csv"
    process = subprocess.Popen(
        [sys.executable, "-m", "looprl.cli.train", "--evaluate", str(policy), *SMALL, "--csv", str(table), "--cache", ":memory:"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        rows_seen = 0
        for line in process.stdout:
            if line.strip().split(" ")[0].count("x") == 2:  # a table row: MxNxK ...
                rows_seen += 1
                if rows_seen == 2:
                    break
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, errors[-2000:]
    assert "Traceback" not in errors
    rows = list(csv.DictReader(table.open()))
    assert len(rows) >= 2 and all(float(row["final_gflops"]) > 0 for row in rows)


# -- 6: an interrupted training run ----------------------------------------------------------------


def test_sigterm_to_the_process_group_of_a_training_run_saves_it_and_exits_130(tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "looprl.cli.train", "--algo", "dqn", "--config", str(tiny_config(tmp_path)), "--iterations", "100000",
         "--out", str(run), "--num-env-runners", "0", "--checkpoint-every", "1000", "--validate-every", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("[iter 2/"):
                break
        os.killpg(process.pid, signal.SIGTERM)  # as a scheduler stops a job: Ray's processes get it too
        # Ray would wait 60 s for its killed GCS, then exit with status 1: well past this timeout.
        rest, _ = process.communicate(timeout=45)
    finally:
        process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 130, output[-3000:]
    assert "saving a final checkpoint" in output and "resume with --resume" in output
    state = json.loads((run / "run.json").read_text())["state"]
    assert state["iteration"] >= 2 and (run / "checkpoints" / state["checkpoint"]).exists()


class _FakeAlgo:
    """Just enough of an RLlib algorithm for the training loop: ``interrupt_at`` raises
    KeyboardInterrupt in that call of train(), after sampling (as a signal mid-iteration does)."""

    def __init__(self, interrupt_at=None):
        self.calls, self.sampled, self.interrupt_at = 0, 0, interrupt_at
        self.config = type("Config", (), {"store_buffer_in_checkpoints": False})()
        self.metrics = self

    def peek(self, key, default=None):
        assert key == ("env_runners", "num_env_steps_sampled_lifetime")
        return self.sampled

    def train(self):
        self.calls += 1
        self.sampled += 20
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return {"num_env_steps_sampled_lifetime": self.sampled}

    def save_to_path(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "steps").write_text(str(self.sampled))


def test_an_interrupted_training_loop_saves_then_reraises_and_run_json_counts_the_checkpoints_steps(tmp_path):
    from looprl.train.loop import RunDirectory, RunState, train

    run = RunDirectory(tmp_path / "run")
    run.create({"algorithm": "dqn"}, {})
    state = RunState()
    algo = _FakeAlgo(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        train(algo, run, state, {}, iterations=10, time_budget_s=None, checkpoint_every=5, export=lambda path: None,
              out=open(os.devnull, "w"))
    saved = json.loads((run.path / "run.json").read_text())["state"]
    checkpoint = run.checkpoints / saved["checkpoint"]
    # Two iterations finished, the third sampled 20 steps more before the signal: the
    # checkpoint holds 60 and so must run.json, which the resumed run continues from.
    assert saved["iteration"] == 2 and int((checkpoint / "steps").read_text()) == 60 and saved["env_steps"] == 60


# -- 7: values that are not numbers, and a long tune that says why ----------------------------------


@pytest.mark.parametrize("module, arguments, prog, fragment", [
    ("train", ["--time-budget", "inf"], "looprl-train", "--time-budget"),
    ("train", ["--time-budget", "nan"], "looprl-train", "--time-budget"),
    ("search", ["--problem", "16x16x16", "--verify-ms", "nan"], "looprl-search", "--verify-ms"),
    ("search", ["--problem", "16x16x16", "--budget", "nan"], "looprl-search", "--budget"),
    ("search", ["--problem", "16x16x16", "--measure-budget-ms", "inf"], "looprl-search", "--measure-budget-ms"),
])
def test_non_finite_numbers_are_refused(tmp_path, module, arguments, prog, fragment):
    assert_one_line_error(command(module, *arguments, cwd=tmp_path), prog, fragment)


def test_tuning_a_long_kernel_says_what_takes_the_time_first(monkeypatch, capsys):
    from looprl.cli import tune as tune_cli

    def stop(*args, **kwargs):
        raise ValueError("stopped before tuning")

    monkeypatch.setattr(tune_cli, "tune", stop)
    assert tune_cli.main(["3000", "3000", "3000", "--budget", "0.1", "--no-numpy", "--cache", ":memory:"]) == 2
    notice, error = capsys.readouterr().err.splitlines()
    assert notice.startswith("looprl-tune: ") and "54 GFLOP" in notice and "untuned nest" in notice
    assert error == "looprl-tune: error: stopped before tuning"
    assert tune_cli.main(["64", "64", "64", "--no-numpy", "--cache", ":memory:"]) == 2
    assert capsys.readouterr().err == "looprl-tune: error: stopped before tuning\n"  # a small one: no notice


# -- 8: each command's help names the command as it is run --------------------------------------------


@pytest.mark.parametrize("name", ["tune", "search", "train", "bench"])
def test_help_names_a_command_that_exists(name):
    import importlib.util

    result = command(name, "--help")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: looprl-{name} "), result.stdout[:200]
    for word in result.stdout.split("python -m ")[1:]:
        module = word.split()[0].strip("`.,:;()")
        if module != "looprl":
            assert importlib.util.find_spec(module) is not None, f"the help of looprl-{name} names python -m {module}"


# -- 9: a policy made for a wider ISA than the host's ----------------------------------------------


def test_evaluating_an_avx512_policy_on_an_avx2_host_uses_the_host_target(tmp_path):
    policy = random_policy(target=Target.named("avx512")).save(tmp_path / "policy")
    as_avx2_host = (
        "import sys; import looprl.target as target; name, features = target.host_cpu();"
        "target.host_cpu = lambda: ('haswell', features.replace('+avx512', '-avx512'));"
        "from looprl.cli.train import main; sys.exit(main(sys.argv[1:]))"
    )
    result = python(as_avx2_host, "--evaluate", str(policy), *SMALL, "--limit", "1", "--cache", ":memory:")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 problems: speed-up over untuned" in result.stdout
    warning = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "trained for avx512" in warning[0] and "avx2" in warning[0]


# -- 10: autotvm without XGBoost ---------------------------------------------------------------------


def test_autotvm_without_xgboost_names_the_extra(tmp_path):
    result = without(["xgboost"], "search", "--algo", "autotvm", "--problem", "16x16x16", "--cache", ":memory:", cwd=tmp_path)
    assert_one_line_error(result, "looprl-search", "pip install 'looprl[autotvm]'")
    assert not list(tmp_path.iterdir())
