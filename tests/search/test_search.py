import csv
import hashlib
import json
import math
import signal
import subprocess
import sys
import time
from collections import Counter

import networkx as nx
import pytest

import looprl
from looprl import search
from looprl.actions import ActionSet, State
from looprl.env.loopnest_env import LoopNestEnv
from looprl.measurement.evaluator import Evaluator, Measurement

SMALL = looprl.matmul(m=48, n=40, k=36)


class FakeEvaluator:
    """Deterministic pseudo-random GFLOPS per schedule; counts how often each is asked for."""

    budget_s = 0.001

    def __init__(self, boost: dict[str, float] | None = None):
        self.calls = Counter()
        self.boost = boost or {}

    def value(self, nest) -> float:
        if nest.key in self.boost:
            return self.boost[nest.key]
        digest = hashlib.sha256(nest.key.encode()).hexdigest()
        return 10.0 + int(digest[:6], 16) % 9000 / 100.0

    def __call__(self, nest):
        self.calls[nest.key] += 1
        return Measurement(self.value(nest), from_cache=False)


def reachable(actions: ActionSet, depth: int) -> set[str]:
    """Every schedule reachable from SMALL's initial nest in at most ``depth`` actions."""
    layer = {State(looprl.initial_nest(SMALL), 0)}
    seen = {s.nest.key for s in layer}
    for _ in range(depth):
        layer = {child for state in layer for a in range(len(actions)) if (child := actions.apply(state, a)) is not None}
        seen |= {s.nest.key for s in layer}
    return seen


def replay(result, cache=":memory:"):
    env = LoopNestEnv(problems=[result.problem], cache=cache, peak=100.0)
    env.reset(options={"problem": result.problem})
    for name in result.actions:
        _, _, _, _, info = env.step(env.action_names.index(name))
        assert info["valid"]
    return env.nest


@pytest.mark.parametrize("algo", search.PAPER_ALGORITHMS)
def test_each_algorithm_improves_replays_and_measures_nothing_twice(algo):
    evaluator = FakeEvaluator()
    result = search.run(SMALL, algo, verify_s=None, budget_s=math.inf, max_evaluations=150, evaluator=evaluator, depth=6)
    assert result.best_gflops >= result.initial_gflops
    assert result.best_gflops == evaluator.value(result.best_nest)
    assert replay(result) == result.best_nest
    assert max(evaluator.calls.values()) == 1
    assert result.evaluations == len(evaluator.calls) <= 150
    assert result.curve[-1][2] == result.best_gflops
    assert [point[2] for point in result.curve] == sorted(point[2] for point in result.curve)
    assert result.graph.number_of_nodes() >= result.evaluations


@pytest.mark.parametrize("algo", ["greedy1", "beam2dfs", "random"])
def test_real_measurements_through_the_cache(algo):
    cache = looprl.MeasurementCache(":memory:")
    evaluator = Evaluator(cache, budget_s=0.001, samples=1)  # cached values are final (verification still adds samples)
    result = search.run(looprl.matmul(24, 40, 20), algo, budget_s=20, max_evaluations=25, evaluator=evaluator, depth=4)
    stored = cache.lookup(result.best_nest, budget_s=0.001)
    assert stored.gflops >= max(result.best_gflops, result.verified_gflops)  # the best of all samples
    assert stored.samples >= 4  # the search's timing and at least three for verification
    initial = looprl.initial_nest(result.problem)
    if result.best_nest == initial:  # nothing beat it (a loaded host): verification re-timed it, the cache keeps its best sample
        assert cache.get(initial, budget_s=0.001) >= result.initial_gflops
    else:
        assert cache.get(initial, budget_s=0.001) == result.initial_gflops
    assert result.best_gflops >= result.initial_gflops
    assert evaluator.compiled - evaluator.resampled == result.new_measurements == result.evaluations
    assert result.verified_gflops > 0 and result.to_dict()["verified_gflops"] == result.verified_gflops
    assert replay(result, cache) == result.best_nest
    again = search.run(result.problem, algo, budget_s=20, max_evaluations=25, evaluator=evaluator, depth=4)
    assert again.new_measurements == 0 and again.best_gflops == stored.gflops  # now the best of its samples


def test_the_winner_s_verification_times_it_round_after_round_on_one_compile(monkeypatch):
    """verify_s 0.1 on a 1 ms budget: 100 rounds of timings of the winner, on the kernel compiled
    at its search's timing (the evaluator's recent kernels), not compiled again for any round."""
    from looprl.measurement import evaluator as evaluator_module

    compiled, real = Counter(), evaluator_module.compile
    monkeypatch.setattr(evaluator_module, "compile", lambda nest, *a, **k: compiled.update([nest.key]) or real(nest, *a, **k))
    evaluator = Evaluator(looprl.MeasurementCache(":memory:"), budget_s=0.001, samples=1)
    result = search.run(looprl.matmul(24, 40, 20), "random", budget_s=20, max_evaluations=4, evaluator=evaluator, depth=2)
    assert evaluator.resampled == 100 and result.verified_gflops > 0
    assert compiled[result.best_nest.key] == 1  # its search's timing: the verification's rounds run that kernel


def test_beam_bfs_with_full_width_is_exhaustive():
    actions = ActionSet()
    evaluator = FakeEvaluator()
    result = search.run(SMALL, f"beam{len(actions)}bfs", verify_s=None, budget_s=math.inf, evaluator=evaluator, depth=3)
    everything = reachable(actions, 3)
    assert set(evaluator.calls) == everything
    assert result.best_gflops == max(evaluator.value(_Keyed(key)) for key in everything)
    assert result.stopped == "done"


class _Keyed:
    def __init__(self, key):
        self.key = key


def test_candidates_are_ranked_by_gflops_not_by_name():
    start = looprl.initial_nest(SMALL)
    # split_4 wins although "split_16" sorts first by name and comes first in no order here.
    boost = {start.split(0, 4).key: 500.0, start.split(0, 16).key: 1.0, start.split(0, 8).key: 2.0}
    for algo in ("beam1dfs", "beam1bfs", "greedy1"):
        result = search.run(SMALL, algo, verify_s=None, budget_s=math.inf, evaluator=FakeEvaluator(boost), depth=1)
        assert result.actions == ("split_4",) and result.best_gflops == 500.0


def test_greedy1_stops_at_a_local_optimum():
    actions = ActionSet()
    evaluator = FakeEvaluator()
    result = search.run(SMALL, "greedy1", verify_s=None, budget_s=math.inf, evaluator=evaluator, depth=10)
    state = State(looprl.initial_nest(SMALL), 0)
    values = [evaluator.value(state.nest)]
    for name in result.actions:
        state = actions.apply(state, actions.index(name))
        values.append(evaluator.value(state.nest))
    assert all(b > a for a, b in zip(values, values[1:]))  # every greedy1 step improves
    if len(result.actions) < 10:
        children = [actions.apply(state, a) for a in range(len(actions))]
        assert all(evaluator.value(c.nest) <= result.best_gflops for c in children if c is not None)


def test_greedy2_can_cross_a_step_that_is_no_better():
    actions = ActionSet()
    root = State(looprl.initial_nest(SMALL), 0)
    # Every first step is worse than the start; one two-step state is much better.
    boost = {child.nest.key: 1.0 for a in range(len(actions)) if (child := actions.apply(root, a)) is not None}
    boost[root.nest.key] = 50.0
    split = actions.index("split_4")
    two = actions.apply(actions.apply(root, split), split).nest
    boost[two.key] = 400.0
    assert search.run(SMALL, "greedy1", verify_s=None, budget_s=math.inf, evaluator=FakeEvaluator(boost), depth=10).best_gflops == 50.0
    result = search.run(SMALL, "greedy2", verify_s=None, budget_s=math.inf, evaluator=FakeEvaluator(boost), depth=10)
    assert result.best_gflops >= 400.0 and result.actions[:2] == ("split_4", "split_4")


def test_random_search_is_seeded():
    first = search.run(SMALL, "random", verify_s=None, budget_s=math.inf, max_evaluations=60, evaluator=FakeEvaluator(), seed=3)
    second = search.run(SMALL, "random", verify_s=None, budget_s=math.inf, max_evaluations=60, evaluator=FakeEvaluator(), seed=3)
    other = search.run(SMALL, "random", verify_s=None, budget_s=math.inf, max_evaluations=60, evaluator=FakeEvaluator(), seed=4)
    assert (first.actions, first.best_gflops) == (second.actions, second.best_gflops)
    assert first.stopped == "evaluation budget" and first.evaluations == 60
    assert set(first.graph.nodes) != set(other.graph.nodes)


def test_time_budget_is_respected():
    class SlowEvaluator(FakeEvaluator):
        def __call__(self, nest):
            time.sleep(0.02)
            return super().__call__(nest)

    started = time.perf_counter()
    result = search.run(SMALL, "beam4dfs", verify_s=None, budget_s=0.5, evaluator=SlowEvaluator())
    assert result.stopped == "time budget"
    # The deadline is checked before every new evaluation: at most one evaluation past it.
    assert result.elapsed_s < 0.5 + 1.0 and time.perf_counter() - started < 0.5 + 2.0


def test_bad_arguments_are_rejected():
    for algo in ("greedy", "beam0dfs", "beam2", "greedy9", "annealing", 3):
        with pytest.raises(ValueError, match="algorithm|lookahead|width"):
            search.run(SMALL, algo, verify_s=None, evaluator=FakeEvaluator())
    with pytest.raises(ValueError, match="budget_s"):
        search.run(SMALL, "random", verify_s=None, budget_s=-1, evaluator=FakeEvaluator())
    with pytest.raises(ValueError, match="max_evaluations"):
        search.run(SMALL, "random", verify_s=None, max_evaluations=0, evaluator=FakeEvaluator())
    with pytest.raises(ValueError, match="depth"):
        search.run(SMALL, "random", verify_s=None, depth=0, evaluator=FakeEvaluator())
    with pytest.raises(ValueError, match="cannot parse problem"):
        search.run("12x12", "random", evaluator=FakeEvaluator())


def test_results_and_graph_are_saved(tmp_path):
    result = search.run(SMALL, "beam2bfs", verify_s=None, budget_s=math.inf, evaluator=FakeEvaluator(), depth=3)
    data = json.loads(result.save_json(tmp_path / "r.json").read_text())
    assert data["best_schedule"] == result.best_nest.key and data["actions"] == list(result.actions)
    assert data["evaluations"] == result.evaluations and data["stopped"] == "done"
    loaded = nx.node_link_graph(json.loads(result.save_graph(tmp_path / "g.json").read_text()), edges="edges")
    assert loaded.number_of_nodes() == result.graph.number_of_nodes()
    assert nx.read_graphml(result.save_graph(tmp_path / "g.graphml")).number_of_edges() == result.graph.number_of_edges()
    edge_actions = {d["action"] for _, _, d in result.graph.edges(data=True)}
    assert edge_actions <= set(ActionSet().names)


# -- command line -----------------------------------------------------------------------------

CLI = [sys.executable, "-m", "looprl.search"]


def measured_rows(cache) -> int:
    """How many measurements the SQLite measurement cache at ``cache`` holds (0 before it exists)."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{cache}?mode=ro", uri=True, timeout=5) as connection:
            return connection.execute("SELECT count(*) FROM measurements").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def interrupt_when_measuring(command, cache, signum, rows=3, deadline_s=120):
    """Start ``command`` (a search measuring into the cache file ``cache``), send it ``signum``
    once ``rows`` measurements are in that cache (the search is under way, its handlers in
    place; a fixed sleep of 5 s had burnt a core for as long); its return code and stderr."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + deadline_s
        while measured_rows(cache) < rows and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()  # never leave a long search running if the test fails
    return process.returncode, stderr


def test_cli_single_problem_writes_json(tmp_path):
    out = tmp_path / "one.json"
    result = subprocess.run(
        CLI + ["--algo", "greedy1", "--problem", "32x24x16", "--budget", "20", "--evaluations", "12", "--cache", ":memory:", "--measure-budget-ms", "1",
              "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "greedy1" in result.stdout and "GFLOPS" in result.stdout
    data = json.loads(out.read_text())
    assert data["sizes"] == {"m": 32, "k": 16, "n": 24} and data["best_gflops"] >= data["initial_gflops"]


def test_cli_dataset_csv_resumes_and_survives_ctrl_c(tmp_path):
    from looprl.cli.search import main

    # The searches through main() in this process (the process start: test_cli_single_problem_writes_json);
    # the interrupted one below in a process of its own.
    path = tmp_path / "runs.csv"
    base = ["--split", "test", "--budget", "30", "--evaluations", "8", "--cache", str(tmp_path / "c.sqlite"), "--measure-budget-ms", "1", "--csv", str(path), "--quiet"]
    assert main(base + ["--algo", "greedy1,random", "--limit", "2"]) == 0
    rows = list(csv.DictReader(path.open()))
    assert [(r["m"], r["n"], r["k"], r["algorithm"]) for r in rows] == [("64", "64", "112", "greedy1"), ("64", "64", "112", "random"), ("64", "64", "128", "greedy1"), ("64", "64", "128", "random")]
    assert all(float(r["best_gflops"]) >= float(r["initial_gflops"]) and float(r["verified_gflops"]) > 0 for r in rows)
    assert main(base + ["--algo", "greedy1,random", "--limit", "2"]) == 0
    assert len(list(csv.DictReader(path.open()))) == 4  # nothing redone

    # A long random search, interrupted: its partial result is still written.
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        "from looprl.cli.search import main; sys.exit(main(sys.argv[1:]))"
    )
    cache = tmp_path / "slow.sqlite"
    slow = [sys.executable, "-c", code, "--split", "test", "--offset", "2", "--limit", "1", "--algo", "random", "--budget", "600",
            "--cache", str(cache), "--measure-budget-ms", "1", "--csv", str(path), "--quiet"]
    returncode, stderr = interrupt_when_measuring(slow, cache, signal.SIGINT)
    assert returncode == 130, stderr
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 5 and rows[-1]["stopped"] == "interrupted" and int(rows[-1]["evaluations"]) >= 1


def test_cli_sigterm_keeps_the_partial_result(tmp_path):
    # SIGTERM is how a scheduler, `kill` or a background job (which ignores SIGINT) stops it.
    path = tmp_path / "runs.csv"
    cache = tmp_path / "slow.sqlite"
    slow = CLI + ["--split", "test", "--limit", "1", "--algo", "random", "--budget", "600", "--cache", str(cache),
                  "--measure-budget-ms", "1", "--csv", str(path), "--quiet"]
    returncode, stderr = interrupt_when_measuring(slow, cache, signal.SIGTERM)
    assert returncode == 130, stderr
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 1 and rows[0]["stopped"] == "interrupted" and int(rows[0]["evaluations"]) >= 1


def test_cli_rejects_bad_input(tmp_path, capsys):
    from looprl.cli.search import main

    # One through a process of its own (the command line as a user starts it), the rest through
    # its main() in this process (argparse's refusals exit, the command's return): the same exit
    # status and message, without a process start each.
    def status(argv):
        try:
            return main(argv)
        except SystemExit as exit:
            return exit.code

    result = subprocess.run(CLI + ["--problem", "8x8x8", "--algo", "beam", "--cache", ":memory:"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "unknown search algorithm" in result.stderr, result.stderr
    for extra, message in [
        (["--problem", "8x8"], "cannot parse problem"),
        (["--split", "test", "--limit", "0"], "--limit"),
        (["--problem", "8x8x8", "--split-factors", "4,x"], "split factors"),
        (["--problem", "8x8x8", "--split-factors", "1"], "split factor"),
    ]:
        assert status(extra + ["--cache", ":memory:"]) == 2
        err = capsys.readouterr().err
        assert "looprl-search: error: " in err and message in err, (extra, err)


def test_target_split_factors_form_each_target_s_register_tiles():
    from looprl.ir.schedules import target_split_factors

    for name in ("avx512", "avx2", "sse4"):
        target = looprl.Target.named(name)
        factors = target_split_factors(target)
        assert {4, 8, 16} <= set(factors) and all(2 <= f <= 64 for f in factors) and list(factors) == sorted(set(factors))
        for rows, vectors in target.register_tiles():
            assert rows in factors or rows < 2
            assert vectors * target.vector_width in factors or vectors * target.vector_width > 64
    assert {6, 24} <= set(target_split_factors(looprl.Target.named("avx2")))  # 6 x 2 and 4 x 3 vectors of 8
    assert {14, 32, 48} <= set(target_split_factors(looprl.Target.named("avx512")))


def test_search_with_the_target_s_split_factors_uses_and_reports_them(tmp_path):
    from looprl.ir.schedules import target_split_factors

    sse4 = looprl.Target.named("sse4")  # runs on every x86-64 host
    result = search.run("24x16x8", "random", max_evaluations=6, budget_s=math.inf, cache=":memory:", target=sse4,
                        split_factors="target", measure_budget_s=0.001, verify_s=None)
    assert result.settings["split_factors"] == list(target_split_factors(sse4))
    assert result.settings["target"] == "sse4"
    with pytest.raises(ValueError, match="split_factors"):
        search.run("8x8x8", "random", max_evaluations=2, cache=":memory:", split_factors="wide")
    from looprl.cli.search import main

    out = tmp_path / "r.json"
    assert main(["--problem", "16x16x8", "--algo", "greedy1", "--target", "sse4", "--split-factors", "target",
                 "--evaluations", "4", "--cache", ":memory:", "--json", str(out), "--quiet"]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["split_factors"] == list(target_split_factors(sse4)) and settings["target"] == "sse4"
