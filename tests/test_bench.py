import json
import subprocess
import sys


def test_codegen_benchmark_runs_and_writes_json(tmp_path):
    path = tmp_path / "codegen.json"
    result = subprocess.run(
        [sys.executable, "-m", "looprl.bench", "codegen", "--shapes", "32x48x16", "--budget", "0.05", "--compiles", "20", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "measured peak" in result.stdout and "32x48x16" in result.stdout
    report = json.loads(path.read_text())
    row = report["rows"][0]
    assert row["numpy_gflops"] > 0 and row["expert_gflops"] > 0 and row["untuned_gflops"] > 0
    assert report["compile"]["count"] == 20


def test_benchmark_rejects_bad_shapes():
    result = subprocess.run(
        [sys.executable, "-m", "looprl.bench", "codegen", "--shapes", "32x48"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "bad shape" in result.stderr
