"""The command lines check everything before they work, and never wait or fail without saying why
(issue 38): output paths opened before the run, numbers before any timing, a read-only cache,
a size given twice, Ctrl-C, a CSV whose lock another search keeps."""

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.cli import bench as bench_cli
from looprl.cli import search as search_cli
from looprl.cli import tune as tune_cli
from looprl.cli.common import writable_file, writable_folder
from looprl.measurement.lock import LockWaitTimeout
from looprl.measurement.tuned_records import write_tuned_records
from tests.measurement.test_cache_hardening import read_only

ROOT = Path(__file__).resolve().parents[2]
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


def one_error_line(capsys, prog: str) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


def test_tune_refuses_a_size_given_twice(capsys):
    assert tune_cli.main(["--spec", "mk,kn->mn", "--sizes", "m=4,k=4,n=4,m=8", "--no-numpy", "--cache", ":memory:"]) == 2
    assert "size of 'm' given twice" in one_error_line(capsys, "looprl-tune")


# -- output paths: opened (created) before the work, nothing left behind ------------------------------
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


# -- numbers: checked before any work ------------------------------------------------------------------
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


# -- a read-only cache -----------------------------------------------------------------------------------
def test_tune_with_a_read_only_default_cache_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    from looprl.measurement.cache import MeasurementCache

    cache = tmp_path / "measurements.sqlite"
    MeasurementCache(cache).close()
    monkeypatch.setenv("LOOPRL_CACHE_DIR", str(tmp_path))
    with read_only(cache):
        assert tune_cli.main(["24", "16", "8", "--fresh", "--budget", "0", "--no-numpy"]) == 2
    assert f"cannot use {cache} as the measurement cache: it cannot be opened for writing" in one_error_line(capsys, "looprl-tune")


# -- Ctrl-C ----------------------------------------------------------------------------------------------
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


# -- a CSV another search keeps locked -----------------------------------------------------------------
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
