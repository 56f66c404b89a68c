"""Every experiment script imports and parses its arguments (a renamed import broke one)."""

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted(p for p in (Path(__file__).resolve().parents[2] / "experiments").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_experiment_script_starts(script, monkeypatch, capsys):
    """``python experiments/<script> --help``, run in this process as tests/project/test_docs.py runs
    the documented command lines: the script's imports and its parser, no second interpreter
    importing numpy, looprl and torch again for each script."""
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python experiments/x.py` puts its folder first
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(script), run_name="__main__")
    output = capsys.readouterr()
    assert stopped.value.code == 0, output.err
    assert "usage" in output.out


def test_the_real_models_experiment_writes_every_method_and_its_summary(tmp_path):
    """A one-problem run (each problem is tuned by every method: ~2.5 CPU s a problem): each
    method's row, the ablation's ratios, the plot."""
    import csv
    import os

    out = tmp_path / "rm"
    env = dict(os.environ, LOOPRL_CACHE_DIR=str(tmp_path / "cache"))
    script = Path(__file__).resolve().parents[2] / "experiments" / "real_models.py"
    done = subprocess.run([sys.executable, str(script), "--problems", "48x64x32", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((tmp_path / "rm.csv").open()))
    assert {r["method"] for r in rows} == {"untuned", "tune", "tune-random", "rollout", "rollout-random", "tune-third",
                                           "tune-random-third", "tune-4", "tune-random-4", "hand"}
    assert len(rows) == 10 and all(float(r["gflops"]) > 0 and float(r["numpy_gflops"]) > 0 for r in rows)
    assert "tune / tune-random" in done.stdout and "tune-third / tune-random" in done.stdout and (tmp_path / "rm.png").exists()
    by = {(r["problem"], r["method"]): int(r["measured"]) for r in rows}
    for problem in {r["problem"] for r in rows}:  # the capped tunes measured at most a third of tune-random's schedules
        cap = max(1, round(by[problem, "tune-random"] / 3))
        assert by[problem, "tune-third"] <= cap and by[problem, "tune-random-third"] <= cap
        assert by[problem, "tune-4"] <= 4 and by[problem, "tune-random-4"] <= 4


def test_the_autotvm_ceiling_experiment_times_three_answers_per_problem_and_prints_each_class(tmp_path, monkeypatch):
    """One small problem per class: random search, AutoTVM with the policy's prior and measured
    tune found, re-timed together, one row each; the per-class ratios printed. A missing trials
    table is refused by the script run in this process (as test_experiment_script_starts runs
    them): its SystemExit's message is what the interpreter prints, exit status 1."""
    import csv

    from looprl.target import Target

    isa = Target.default().isa  # the script's target (LOOPRL_TARGET, else the host's)
    for name, problem in (("models", "mk,kn->mn:m=20,k=24,n=32"), ("offgrid", "mk,kn->mn:m=13,k=17,n=19"), ("mm64", "mk,kn->mn:m=16,k=16,n=16")):
        (tmp_path / f"autotvm64_{name}_{isa}.csv").write_text(f'problem,method\n"{problem}",random\n"{problem}",autotvm\n')
    script = Path(__file__).resolve().parents[2] / "experiments" / "autotvm_ceiling.py"
    done = subprocess.run([sys.executable, str(script), "--trials-dir", str(tmp_path), "--trials", "4", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((tmp_path / f"autotvm_ceiling_{isa}.csv").open()))
    assert [r["class"] for r in rows] == ["models", "offgrid", "mm64"]
    assert all(float(r[f"{m}_gflops"]) > 0 for r in rows for m in ("random", "autotvm-policy", "tune"))
    assert all(f"  {name}" in done.stdout for name in ("models", "offgrid", "mm64", "all")) and "tune/random" in done.stdout
    monkeypatch.setattr(sys, "argv", [str(script), "--trials-dir", str(tmp_path / "none")])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as missing:
        runpy.run_path(str(script), run_name="__main__")
    assert isinstance(missing.value.code, str) and "is missing" in missing.value.code


# ---- experiments/README.md: the map of the scripts and their results ---------------------------

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
HELPERS = sorted(p for p in EXPERIMENTS.glob("_*.py"))


def _map_text() -> str:
    return (EXPERIMENTS / "README.md").read_text(encoding="utf-8")


def _expanded(pattern: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (each brace in turn); ``<placeholder>`` and an optional
    ``[part]`` -> ``*``: the glob patterns a backticked result name in the map stands for."""
    import re

    pattern = re.sub(r"<[^<>]*>|\[[^\[\]]*\]", "*", pattern)
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [name for choice in match.group(1).split(",")
            for name in _expanded(pattern[:match.start()] + choice + pattern[match.end():])]


def _result_patterns() -> list[str]:
    """Every backticked name in the map's tables, expanded (a result file's relative path, or a
    script, a command, ...: only the result names can match a result file)."""
    import re

    tokens = re.findall(r"`([^`\s]+)`", _map_text())
    return [name for token in tokens for name in _expanded(token)]


def _first_cells() -> set[str]:
    import re

    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", _map_text(), re.MULTILINE)}


def test_every_experiment_script_and_helper_is_in_the_map():
    listed = _first_cells()
    missing = [p.name for p in [*SCRIPTS, *HELPERS] if p.name not in listed]
    assert not missing, f"experiments/README.md has no row for {missing}"
    gone = sorted(name for name in listed if name.endswith(".py") and not (EXPERIMENTS / name).is_file())
    assert not gone, f"experiments/README.md lists scripts that do not exist: {gone}"


def test_every_result_is_in_the_map():
    """Each entry of experiments/results/ (a file, or a folder as ``name/`` or one of its files)
    matches a result name the map gives."""
    import fnmatch

    patterns = _result_patterns()
    results = EXPERIMENTS / "results"
    missing = []
    for entry in sorted(results.iterdir()):
        if entry.is_dir():
            found = any(p == entry.name + "/" or p.startswith(entry.name + "/") for p in patterns)
        else:
            found = any(fnmatch.fnmatchcase(entry.name, p) for p in patterns)
        if not found:
            missing.append(entry.name)
    assert not missing, f"experiments/README.md does not say which script wrote {missing}"


def test_the_map_names_only_results_that_exist():
    """A concrete result name in the map (no ``*``, no placeholder) is a file or folder of experiments/results/."""
    results = EXPERIMENTS / "results"
    suffixes = (".csv", ".json", ".txt", ".png", ".log", "/")
    concrete = [p for p in _result_patterns() if "*" not in p and p.endswith(suffixes) and not p.startswith(("experiments/", "RUN/", "tests/"))]
    missing = [p for p in concrete if not (results / p.rstrip("/")).exists()]
    assert not missing, f"experiments/README.md names results that are not in experiments/results/: {missing}"
