"""The package as users get it: layering contract, the wheel's contents, a wheel installed
away from the repository, console scripts."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_layering_contract_holds():
    from importlinter.cli import lint_imports

    previous = os.getcwd()
    os.chdir(ROOT)  # the contract lives in pyproject.toml
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
    finally:
        os.chdir(previous)


def test_every_subpackage_is_declared_for_the_wheel():
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "looprl").rglob("__init__.py")}
    assert found <= declared, f"add {sorted(found - declared)} to [tool.setuptools] packages"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    (found,) = out.glob("looprl-*.whl")
    return found


def test_wheel_carries_the_data_the_library_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "looprl/_shipped/envs/mm64-256.json",
        "looprl/_shipped/envs/mm384-1024.json",
        "looprl/_shipped/agents/apex-dqn.yaml",
        "looprl/_shipped/checkpoints/apex-dqn/policy/policy.json",
        "looprl/_shipped/checkpoints/apex-dqn/policy/policy.npz",
    ):
        assert needed in names
    defaults = json.loads((ROOT / "checkpoints" / "default_policies.json").read_text(encoding="utf-8"))
    for folder in defaults.values():  # every default policy ships
        for part in ("policy.json", "policy.npz"):
            assert f"looprl/_shipped/checkpoints/{folder}/{part}" in names
    assert not any("/tb/" in name or name.endswith("metrics.csv") for name in names)  # logs stay in the repo
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in ("looprl-tune", "looprl-train", "looprl-search", "looprl-bench"):
        assert script in scripts


def test_installed_wheel_tunes_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = (
        "import looprl, sys; assert looprl.__file__.startswith(sys.argv[1]), looprl.__file__;"
        "r = looprl.tune((64, 48, 80), cache=':memory:'); print(r.gflops > 0, len(looprl.dataset_problems('mm64-256', 'test')))"
    )
    result = subprocess.run([sys.executable, "-c", code, str(target)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "440"]
    script = subprocess.run([str(target / "bin" / "looprl-tune"), "64", "48", "80", "--no-numpy", "--cache", ":memory:"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert script.returncode == 0, script.stderr
    assert "GFLOPS" in script.stdout
