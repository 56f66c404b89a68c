"""Command lines that are stopped, started again or share a file (issues 30 and 38): Ctrl-C and
SIGTERM exit 130 keeping what was done, a training run's folder starts again only where no
checkpoint holds it, searches appending to one CSV keep it whole, and a CSV another process keeps
locked is a bounded wait naming the holder."""

import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.cli import search as search_cli
from looprl.measurement.lock import LockWaitTimeout
from tests.cli.test_cli_bad_input import ROOT, SMALL, assert_one_line_error, here, tiny_config
from tests.policies import random_policy


# -- Ctrl-C and SIGTERM ----------------------------------------------------------------------------
def test_ctrl_c_during_tune_is_one_line_and_exit_130(tmp_path):
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
            "from looprl.cli.tune import main; sys.exit(main(sys.argv[1:]))")
    # 1024^3 untuned: each timing runs the whole kernel for a second or so; the notice comes first.
    arguments = ["1024", "1024", "1024", "--fresh", "--no-numpy", "--budget", "60", "--cache", str(tmp_path / "c.sqlite")]
    process = subprocess.Popen([sys.executable, "-c", code, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        notice = process.stderr.readline()
        assert "GFLOP of work" in notice
        try:
            process.wait(timeout=1.5)  # into the policy's loading and the first timings
        except subprocess.TimeoutExpired:
            pass
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130 and stderr == "looprl-tune: interrupted\n", stderr[-3000:]


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


def test_sigterm_to_the_process_group_of_a_training_run_saves_it_and_exits_130(tmp_path):
    """As a scheduler stops a job: every process of the group (Ray's too) gets the signal. Ctrl-C
    (SIGINT) takes the same way into the run (tests/project/test_interrupts.py): this run stands
    for both (the run that tests/train/ once interrupted with SIGINT asserted this one's checks)."""
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
    assert (run / "policy" / "policy.npz").exists()  # the final checkpoint's policy, exported


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


# -- a run folder started again --------------------------------------------------------------------
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


def test_a_run_folder_without_a_checkpoint_can_be_started_again(tmp_path, capsys):
    folder = unstarted_run(tmp_path)
    config = tiny_config(tmp_path)
    # The start goes past the folder check to the (unreachable) cluster, instead of "already holds a run" ...
    # (in this process: the address is checked before anything imports or attaches Ray)
    result = here(capsys, "train", "--algo", "dqn", "--config", str(config), "--out", str(folder), "--address", "127.0.0.1:1")
    assert_one_line_error(result, "looprl-train", "--address 127.0.0.1:1")
    # ... and --resume of it starts it too, instead of "has no checkpoint yet".
    result = here(capsys, "train", "--resume", "--out", str(folder), "--address", "127.0.0.1:1")
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


def test_a_run_with_a_checkpoint_is_still_only_resumed(tmp_path, capsys):
    folder = unstarted_run(tmp_path)
    record = json.loads((folder / "run.json").read_text())
    record["state"]["checkpoint"] = "iter_000001"
    (folder / "run.json").write_text(json.dumps(record))
    result = here(capsys, "train", "--algo", "dqn", "--config", str(tiny_config(tmp_path)), "--out", str(folder))  # refused before Ray
    assert_one_line_error(result, "looprl-train", "already holds a run")


# -- a CSV shared by several searches --------------------------------------------------------------
def test_searches_sharing_one_csv_keep_one_header_first_and_the_file_resumable(tmp_path, capsys):
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
    for offset in range(3):  # resumed: every pair is done (through main() in this process: no process start each)
        capsys.readouterr()
        assert search_cli.main([*arguments, "--offset", str(offset)]) == 0
        assert "wrote" in capsys.readouterr().out
    assert table.read_text().splitlines() == lines


HOLD_CSV = (
    "import fcntl, sys, time\n"
    "handle = open(sys.argv[1], 'a')\n"
    "fcntl.flock(handle, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_csv_lock_kept_too_long_is_a_bounded_wait_naming_the_holder(tmp_path, monkeypatch):
    path = tmp_path / "runs.csv"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CSV, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(search_cli, "CSV_LOCK_WAIT_S", 0.2)
        with pytest.raises(LockWaitTimeout, match=f"gave up after waiting 0.2 s for the lock on --csv {path}; it is held by pid {holder.pid} "):
            search_cli.append_row(path, {field: "" for field in search_cli.CSV_FIELDS})
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert path.read_text() == ""  # nothing written while another held it
    search_cli.append_row(path, {field: "x" for field in search_cli.CSV_FIELDS})
    assert len(path.read_text().splitlines()) == 2  # header and row, once free
    with open(path) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # and the lock was let go
