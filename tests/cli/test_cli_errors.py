"""Bad input on a command line: one line on stderr, exit status 2, no traceback."""

import os
import subprocess
import sys

import pytest

from looprl.cli import common
from tests.policies import random_policy


def run_cli(module, *arguments, cwd=None):
    command = [sys.executable, "-m", *module.split(), *arguments]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120, cwd=cwd)


def assert_one_line_error(result, prog, fragment):
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and fragment in lines[0], result.stderr


@pytest.fixture
def corrupt_policy(tmp_path):
    folder = random_policy().save(tmp_path / "policy")
    data = (folder / "policy.npz").read_bytes()
    (folder / "policy.npz").write_bytes(data[: len(data) // 2])
    return folder


def test_each_command_reports_bad_input_in_one_line(tmp_path, corrupt_policy):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    cases = [
        ("looprl tune", ["16", "16", "16", "--no-numpy", "--cache", ":memory:", "--policy", str(corrupt_policy)],
         "looprl-tune", str(corrupt_policy / "policy.npz")),
        ("looprl tune", ["16", "16", "16", "--no-numpy", "--cache", str(tmp_path)], "looprl-tune", "is a folder"),
        ("looprl.search", ["--problem", "16x16x16", "--cache", ":memory:", "--json", str(tmp_path)], "looprl-search", "--json"),
        ("looprl.search", ["--split", "test", "--limit", "1", "--cache", ":memory:", "--csv", str(a_file / "x.csv")],
         "looprl-search", "is not a folder"),
        ("looprl.train", ["--evaluate", str(corrupt_policy), "--cache", ":memory:"], "looprl-train", str(corrupt_policy)),
        ("looprl.bench", ["tune", "--limit", "1", "--json", str(tmp_path)], "looprl-bench", "--json"),
    ]
    for module, arguments, prog, fragment in cases:
        assert_one_line_error(run_cli(module, *arguments, cwd=tmp_path), prog, fragment)
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


def test_one_line():
    assert common.one_line(ValueError("a\n\n  b ")) == "a b"
    assert common.one_line(ValueError()) == "ValueError"


def test_a_failed_numpy_baseline_is_one_line_and_the_tuned_figures_still_print(monkeypatch, capsys, tmp_path):
    """looprl-tune prints what it tuned; numpy's child process failing (killed, its import
    raising) is one line on stderr, not a traceback."""
    from looprl.cli import tune as tune_command
    from looprl.measurement import numpy_baseline

    def failed(*_args, **_kwargs):
        raise RuntimeError("numpy baseline process killed by SIGKILL")

    monkeypatch.setattr(numpy_baseline, "numpy_gflops", failed)
    policy = random_policy().save(tmp_path / "p")
    assert tune_command.main(["16", "16", "16", "--policy", str(policy), "--budget", "0", "--cache", ":memory:"]) == 0
    out, err = capsys.readouterr()
    assert "GFLOPS" in out and "Traceback" not in err
    assert err.strip().endswith("not measured (numpy baseline process killed by SIGKILL)") and len(err.strip().splitlines()) == 1
