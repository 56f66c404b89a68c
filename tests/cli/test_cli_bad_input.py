"""Bad input on a command line (issues 30 and 38): refused before any work, as one line on stderr
naming what is wrong, exit status 2, no traceback, nothing created; an optional extra that is
missing is named; a policy made for another CPU runs with a warning. The checks of
looprl.cli.common that the commands share are tested here too."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.cli import bench as bench_cli
from looprl.cli import common
from looprl.cli import search as search_cli
from looprl.cli import tune as tune_cli
from looprl.cli.common import writable_file, writable_folder
from looprl.measurement.tuned_records import write_tuned_records
from looprl.target import Target
from tests.measurement.test_cache_hardening import read_only
from tests.policies import random_policy

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--dataset", "mm64-256", "--split", "test"]  # small problems: a greedy episode takes a second or two
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


def run_cli(module, *arguments, cwd=None):
    command = [sys.executable, "-m", *module.split(), *arguments]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120, cwd=cwd)


def python(code: str, *arguments, cwd=None, timeout=120):
    """Run ``code`` in a fresh interpreter with the worktree's looprl first on the path."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment)


def tiny_config(tmp_path, **env) -> Path:
    """A tiny DQN agent YAML (two small problems, a fixed peak) with ``env`` settings changed."""
    import yaml

    from tests.train.test_train import tiny_agent

    agent = tiny_agent("dqn", str(tmp_path / "cache.sqlite"))
    agent["env"].update(env)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(agent))
    return path


class Ran:
    """What a command run in this process left: its exit status and what it printed."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def here(capsys, cli: str, *arguments) -> Ran:
    """``looprl.cli.<cli>``'s main(arguments) run in this process (argparse's exits included),
    as a fresh interpreter runs it: the same exit status and lines, without a process start
    (and its imports) each. The process starts themselves are tested by
    test_unknown_flags_keep_argparse_usage, the extras-missing cases (a training start among
    them) and the runs that tests/cli/test_cli_interrupts_and_shared_files.py stops by a signal."""
    import importlib

    main = importlib.import_module(f"looprl.cli.{cli}").main
    capsys.readouterr()
    try:
        status = main(list(arguments))
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return Ran(status, captured.out, captured.err)


def assert_one_line_error(result, prog, fragment):
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and fragment in lines[0], result.stderr


def one_error_line(capsys, prog: str) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


@pytest.fixture
def corrupt_policy(tmp_path):
    folder = random_policy().save(tmp_path / "policy")
    data = (folder / "policy.npz").read_bytes()
    (folder / "policy.npz").write_bytes(data[: len(data) // 2])
    return folder


# -- each command: one line, exit status 2 ---------------------------------------------------------
def test_each_command_reports_bad_input_in_one_line(tmp_path, corrupt_policy, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    cases = [
        ("tune", ["16", "16", "16", "--no-numpy", "--cache", ":memory:", "--policy", str(corrupt_policy)],
         "looprl-tune", str(corrupt_policy / "policy.npz")),
        ("tune", ["16", "16", "16", "--no-numpy", "--cache", str(tmp_path)], "looprl-tune", "is a folder"),
        ("search", ["--problem", "16x16x16", "--cache", ":memory:", "--json", str(tmp_path)], "looprl-search", "--json"),
        ("search", ["--split", "test", "--limit", "1", "--cache", ":memory:", "--csv", str(a_file / "x.csv")],
         "looprl-search", "is not a folder"),
        ("train", ["--evaluate", str(corrupt_policy), "--cache", ":memory:"], "looprl-train", str(corrupt_policy)),
        ("bench", ["tune", "--limit", "1", "--json", str(tmp_path)], "looprl-bench", "--json"),
    ]
    for module, arguments, prog, fragment in cases:
        assert_one_line_error(here(capsys, module, *arguments), prog, fragment)
    assert a_file.read_text() == "not a folder"


def test_unknown_flags_keep_argparse_usage():
    result = run_cli("looprl tune", "16", "16", "16", "--no-such-flag")
    assert result.returncode == 2 and result.stderr.startswith("usage:") and "unrecognized arguments" in result.stderr


def test_a_value_error_from_deep_inside_is_one_line(monkeypatch, capsys):
    from looprl.cli import tune as tune_cli

    def deep(*args, **kwargs):
        raise ValueError("something deep\n  went wrong")

    monkeypatch.setattr(tune_cli, "tune", deep)
    assert tune_cli.main(["16", "16", "16", "--no-numpy", "--cache", ":memory:"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "looprl-tune: error: something deep went wrong\n" and captured.out == ""


def test_one_line():
    assert common.one_line(ValueError("a\n\n  b ")) == "a b"
    assert common.one_line(ValueError()) == "ValueError"


@pytest.mark.parametrize("name", ["tune", "search", "train", "bench"])
def test_help_names_a_command_that_exists(name, capsys):
    import importlib.util

    result = here(capsys, name, "--help")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: looprl-{name} "), result.stdout[:200]
    for word in result.stdout.split("python -m ")[1:]:
        module = word.split()[0].strip("`.,:;()")
        if module != "looprl":
            assert importlib.util.find_spec(module) is not None, f"the help of looprl-{name} names python -m {module}"


# -- sizes and numbers: checked before any work ----------------------------------------------------
def test_tune_refuses_a_size_given_twice(capsys):
    assert tune_cli.main(["--spec", "mk,kn->mn", "--sizes", "m=4,k=4,n=4,m=8", "--no-numpy", "--cache", ":memory:"]) == 2
    assert "size of 'm' given twice" in one_error_line(capsys, "looprl-tune")


@pytest.mark.parametrize("arguments, first_work, flag", [
    (["tune", "--problems", "64x64x64", "--tune-budget", "-1"], "looprl.bench.tune_quality.load_policy", "--tune-budget"),
    (["tune", "--problems", "64x64x64", "--tune-budget", "inf"], "looprl.bench.tune_quality.load_policy", "--tune-budget"),
    (["tune", "--problems", "64x64x64", "--budget", "inf"], "looprl.bench.tune_quality.load_policy", "--budget"),
    (["codegen", "--shapes", "16x16x16", "--budget", "nan"], "looprl.bench.codegen.run", "--budget"),
    (["env", "--budget-ms", "inf"], "looprl.bench.env.peak_gflops", "--budget-ms"),
    (["layers", "--layers", "4,8,8", "--tune-budget", "-1"], "looprl.bench.layers.Peers", "--tune-budget"),
])
def test_bench_numbers_are_checked_before_any_work(arguments, first_work, flag, monkeypatch, capsys):
    monkeypatch.setattr(first_work, lambda *args, **kwargs: pytest.fail(f"{first_work} ran before {flag} was checked"))
    assert bench_cli.main(arguments) == 2
    assert flag in one_error_line(capsys, "looprl-bench")


@pytest.mark.parametrize("module, arguments, prog, fragment", [
    ("train", ["--time-budget", "inf"], "looprl-train", "--time-budget"),
    ("train", ["--time-budget", "nan"], "looprl-train", "--time-budget"),
    ("search", ["--problem", "16x16x16", "--verify-ms", "nan"], "looprl-search", "--verify-ms"),
    ("search", ["--problem", "16x16x16", "--budget", "nan"], "looprl-search", "--budget"),
    ("search", ["--problem", "16x16x16", "--measure-budget-ms", "inf"], "looprl-search", "--measure-budget-ms"),
])
def test_non_finite_numbers_are_refused(capsys, module, arguments, prog, fragment):
    assert_one_line_error(here(capsys, module, *arguments), prog, fragment)


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


# -- output paths and the cache: opened (created) before the work, nothing left behind -------------
def test_writable_file(tmp_path):
    assert common.writable_file(None, "--csv") is None
    assert common.writable_file(tmp_path / "new" / "deeper" / "x.csv", "--csv") == tmp_path / "new" / "deeper" / "x.csv"
    existing = tmp_path / "x.json"
    existing.write_text("{}")
    assert common.writable_file(str(existing), "--json") == existing
    with pytest.raises(ValueError, match="--json .* is a folder"):
        common.writable_file(tmp_path, "--json")
    with pytest.raises(ValueError, match="x.json is not a folder"):
        common.writable_file(existing / "sub" / "y.csv", "--csv")
    assert not (tmp_path / "new").exists()  # checking creates nothing


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write into read-only folders")
def test_read_only_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="not writable"):
            common.writable_file(locked / "x.json", "--json")
        with pytest.raises(ValueError, match="not writable"):
            common.writable_folder(locked, "--graph-dir")
    finally:
        locked.chmod(0o700)


def test_writable_folder(tmp_path):
    assert common.writable_folder(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="--out .* is not a folder"):
        common.writable_folder(tmp_path / "f", "--out")


@needs_proc
def test_search_refuses_a_csv_it_cannot_create_before_searching(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(search_cli, "run", lambda *args, **kwargs: pytest.fail("searched before checking --csv"))
    status = search_cli.main(["--split", "test", "--limit", "1", "--cache", ":memory:", "--csv", "/proc/looprl-test.csv", "--quiet"])
    assert status == 2
    assert "--csv /proc/looprl-test.csv is not writable" in one_error_line(capsys, "looprl-search")


@needs_proc
def test_output_paths_are_checked_by_creating_them_and_the_check_leaves_nothing(tmp_path):
    for bad in ("/proc/looprl-test.json", "/proc/looprl-test/deeper/x.json"):
        with pytest.raises(ValueError, match="not writable"):
            writable_file(bad, "--json")
    with pytest.raises(ValueError, match="--graph-dir /proc/looprl-test is not writable"):
        writable_folder("/proc/looprl-test", "--graph-dir")
    assert writable_file(tmp_path / "a" / "b" / "x.csv", "--csv") == tmp_path / "a" / "b" / "x.csv"
    assert writable_folder(tmp_path / "c" / "d", "--out") == tmp_path / "c" / "d"
    existing = tmp_path / "kept.csv"
    existing.write_text("rows\n")
    assert writable_file(existing, "--csv") == existing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.csv"] and existing.read_text() == "rows\n"


def test_tuned_records_refuse_a_folder_or_an_unwritable_path_and_write_nothing(tmp_path):
    place = tmp_path / "place"
    place.mkdir()
    with pytest.raises(ValueError, match=f"tuned records {place} is a folder"):
        write_tuned_records(place, [])
    (place / "a-file").write_text("")
    with pytest.raises(ValueError, match="is not a folder"):
        write_tuned_records(place / "a-file" / "records.json", [])
    if os.path.isdir("/proc/self"):
        with pytest.raises(ValueError, match="tuned records /proc/looprl-test.json is not writable"):
            write_tuned_records("/proc/looprl-test.json", [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["place"]  # no stray place.tmp beside it
    assert sorted(p.name for p in place.iterdir()) == ["a-file"]
    written = write_tuned_records(place / "new" / "records.json", [])
    assert written.exists() and sorted(p.name for p in written.parent.iterdir()) == ["records.json"]


def test_cache_path_refuses_what_it_would_otherwise_move_aside(tmp_path):
    assert common.cache_path(None) is None and common.cache_path(":memory:") == ":memory:"
    assert common.cache_path(str(tmp_path / "new.sqlite")) == str(tmp_path / "new.sqlite")
    with pytest.raises(ValueError, match="is a folder"):
        common.cache_path(str(tmp_path))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(ValueError, match="not an SQLite database"):
        common.cache_path(str(notes))
    (tmp_path / "empty.sqlite").write_bytes(b"")
    assert common.cache_path(str(tmp_path / "empty.sqlite"))


def test_tune_with_a_read_only_default_cache_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    from looprl.measurement.cache import MeasurementCache

    cache = tmp_path / "measurements.sqlite"
    MeasurementCache(cache).close()
    monkeypatch.setenv("LOOPRL_CACHE_DIR", str(tmp_path))
    with read_only(cache):
        assert tune_cli.main(["24", "16", "8", "--fresh", "--budget", "0", "--no-numpy"]) == 2
    assert f"cannot use {cache} as the measurement cache: it cannot be opened for writing" in one_error_line(capsys, "looprl-tune")


def test_a_failed_numpy_baseline_is_one_line_and_the_tuned_figures_still_print(monkeypatch, capsys, tmp_path):
    """looprl-tune prints what it tuned; numpy's child process failing (killed, its import
    raising) is one line on stderr, not a traceback."""
    from looprl.cli import tune as tune_command
    from looprl.measurement import numpy_baseline

    def failed(*_args, **_kwargs):
        raise RuntimeError("numpy baseline process killed by SIGKILL")

    monkeypatch.setattr(numpy_baseline, "in_turn_with_numpy", failed)
    policy = random_policy().save(tmp_path / "p")
    assert tune_command.main(["16", "16", "16", "--policy", str(policy), "--budget", "0", "--cache", ":memory:"]) == 0
    out, err = capsys.readouterr()
    assert "GFLOPS" in out and "Traceback" not in err
    assert err.strip().endswith("not measured (numpy baseline process killed by SIGKILL)") and len(err.strip().splitlines()) == 1


# -- a training start refused for bad input leaves nothing -----------------------------------------
@pytest.mark.parametrize("arguments, env, fragment", [
    (["--problems", "abc"], {}, "cannot parse problem 'abc'"),
    ([], {"episode_length": -3}, "episode_length must be a positive integer, got -3"),
    ([], {"no_such_setting": 1}, "unknown settings ['no_such_setting']"),
    (["--address", "127.0.0.1:1"], {}, "--address 127.0.0.1:1: no Ray cluster answers there"),
    (["--address", "nowhere"], {}, "expected HOST:PORT"),
])
def test_a_start_refused_for_bad_input_is_one_line_and_creates_no_folder(tmp_path, arguments, env, fragment, capsys):
    config = tiny_config(tmp_path, **env)
    out = tmp_path / "run"
    arguments = ["--algo", "dqn", "--config", str(config), "--iterations", "1", "--out", str(out), *arguments]
    # in this process, --address's too: the address is checked (a socket, not Ray) with the rest
    # of the input, before anything imports or attaches Ray (looprl.train.run.prepare)
    result = here(capsys, "train", *arguments)
    assert_one_line_error(result, "looprl-train", fragment)
    assert not out.exists()


# -- optional extras missing, a policy made for another CPU ----------------------------------------
WITHOUT_EXTRAS = (  # each run's main(argv) in its folder, its streams closed by a line "=== exit STATUS" on both
    "import importlib, json, os, sys\n"
    "for name in ('yaml', 'ray', 'xgboost'):\n    sys.modules[name] = None\n"
    "for cli, argv, folder in json.loads(sys.argv[1]):\n"
    "    os.chdir(folder)\n"
    "    try:\n        status = importlib.import_module(f'looprl.cli.{cli}').main(argv)\n"
    "    except SystemExit as stop:\n        status = stop.code\n"
    "    print(f'=== exit {status}', flush=True); print(f'=== exit {status}', file=sys.stderr, flush=True)\n"
)


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory):
    """The command lines that run without an optional extra, in one fresh interpreter where
    ``yaml``, ``ray`` and ``xgboost`` cannot be imported (a process start each before, ~1.2 CPU s):
    ``looprl-train --help``, a training start (which names the train extra), an AutoTVM search
    (which names the autotvm extra), a policy folder's evaluation (which needs neither), each in
    a folder of its own. name -> (its folder, what it left: a :class:`Ran`; one the interpreter
    never finished holds the interpreter's exit status and the end of its stderr), so that each
    test fails alone."""
    root = tmp_path_factory.mktemp("without-extras")
    folders = {name: root / name for name in ("help", "train", "autotvm", "evaluate")}
    for folder in folders.values():
        folder.mkdir()
    policy = random_policy().save(folders["evaluate"] / "policy")
    runs = {
        "help": ("train", ["--help"]),
        "train": ("train", ["--iterations", "1", "--out", str(folders["train"] / "run")]),
        "autotvm": ("search", ["--algo", "autotvm", "--problem", "16x16x16", "--cache", ":memory:"]),
        "evaluate": ("train", ["--evaluate", str(policy), *SMALL, "--limit", "1", "--cache", ":memory:"]),
    }
    result = python(WITHOUT_EXTRAS, json.dumps([(cli, argv, str(folders[name])) for name, (cli, argv) in runs.items()]))
    outs, errs = re.split(r"^=== exit .*\n", result.stdout, flags=re.M), re.split(r"^=== exit .*\n", result.stderr, flags=re.M)
    statuses = re.findall(r"^=== exit (.*)$", result.stdout, flags=re.M)
    left = {}
    for index, name in enumerate(runs):
        if index < len(statuses):
            ran = Ran(None if statuses[index] == "None" else int(statuses[index]), outs[index], errs[index])
        else:
            ran = Ran(result.returncode, outs[index] if index < len(outs) else "", result.stderr[-3000:])  # where it stopped
        left[name] = (folders[name], ran)
    return left


def test_train_help_prints_and_training_names_the_extra_without_it(without_extras):
    """Without yaml and ray: ``--help`` prints, then a training start names the extra."""
    _, help_run = without_extras["help"]
    assert help_run.returncode == 0 and help_run.stderr == "" and help_run.stdout.startswith("usage: looprl-train"), help_run.stderr[-2000:]
    folder, train_run = without_extras["train"]
    assert_one_line_error(train_run, "looprl-train", "pip install 'looprl[train]'")
    assert not (folder / "run").exists()


def test_evaluating_a_policy_folder_needs_no_train_extra(without_extras):
    _, result = without_extras["evaluate"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 problems: speed-up over untuned" in result.stdout


def test_autotvm_without_xgboost_names_the_extra(without_extras):
    folder, result = without_extras["autotvm"]
    assert_one_line_error(result, "looprl-search", "pip install 'looprl[autotvm]'")
    assert not list(folder.iterdir())


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
