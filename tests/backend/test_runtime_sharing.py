"""looprl's OpenMP runtime shares the machine: a private libgomp whose threads spin briefly,
leaving the process's environment and any other libgomp user as they were; and the benchmark
that measures a parallel kernel called in turn with numpy."""

import json
import os
import subprocess
import sys

import pytest

from looprl.backend.threads import available_cores

CODE = (
    "import os; from looprl.backend.threads import ensure_openmp_runtime; path = ensure_openmp_runtime(); "
    "import looprl, numpy as np; p = looprl.matmul(64, 48, 32); nest = looprl.initial_nest(p).parallel(0); "
    "k = looprl.compile(nest, threads=2); a, b = (np.ones(s, np.float32) for s in p.input_shapes); "
    "assert (k(a, b) == a @ b).all(); "
    "print(path); print(sorted(n for n in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY') if n in os.environ))"
)


def _run(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_extra)
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()


@pytest.mark.skipif(available_cores() < 2 or not os.path.exists("/proc/self/maps"), reason="needs two cores and /proc")
def test_looprl_runs_its_own_briefly_spinning_libgomp_and_leaves_the_environment_alone():
    path, settings = _run({})
    assert "private copy, GOMP_SPINCOUNT=1000" in path
    assert settings == "[]"  # the spin count was set only while the copy loaded


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
def test_a_user_s_own_wait_settings_are_respected():
    path, settings = _run({"OMP_WAIT_POLICY": "active"})
    assert "private copy" not in path and settings == "['OMP_WAIT_POLICY']"


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
def test_the_mixed_benchmark_reports_alone_and_mixed_times(tmp_path, capsys):
    """Through looprl-bench's main() in this process (``python -m looprl.bench`` itself is started
    by tests/bench/test_bench.py::test_benchmark_rejects_bad_shapes): what the report says is
    asserted, not the process it ran in."""
    from looprl.cli.bench import main

    out = tmp_path / "mixed.json"
    capsys.readouterr()
    assert main(["mixed", "--problems", "96x64x80", "--calls", "3", "--numpy-size", "64", "--threads", "2", "--json", str(out)]) == 0
    assert "mixed/alone" in capsys.readouterr().out
    report = json.loads(out.read_text())
    row = report["rows"][0]
    assert row["alone_s"] > 0 and row["mixed_s"] > 0 and row["ratio"] == pytest.approx(row["mixed_s"] / row["alone_s"])
    assert row["paused_s"] > 0 and row["ratio_to_paused"] == pytest.approx(row["mixed_s"] / row["paused_s"])


def test_bad_thread_counts_are_refused(capsys):
    from looprl.cli.bench import main

    capsys.readouterr()
    assert main(["mixed", "--threads", "1"]) == 2
    errors = capsys.readouterr().err
    assert "--threads" in errors and "Traceback" not in errors


@pytest.mark.skipif(available_cores() < 2 or not os.path.exists("/proc/self/maps"), reason="needs two cores and /proc")
def test_inside_torch_the_kernels_share_torch_s_libgomp():
    pytest.importorskip("torch")
    code = "import torch; torch.ones(4).sum(); " + CODE  # torch loads its libgomp first
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    path, settings = result.stdout.strip().splitlines()
    assert "already loaded in this process" in path and "private copy" not in path and settings == "[]"
