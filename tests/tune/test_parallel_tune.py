"""looprl.tune with threads: parallel proposals of the best serial schedules, the faster kept."""

import numpy as np
import pytest

import looprl
from looprl.backend.threads import available_cores
from looprl.actions import ActionSet, State, reach
from looprl.search.context import SearchContext
from looprl.ir.nest import COMPUTE, WRITE_BACK
from looprl.measurement.cache import MeasurementCache
from looprl.search.parallel import outermost_parallel_loop, parallel_proposals, parallel_variant, teams_per_call, hoisted_variant
from looprl.search import ScheduleRecord
from tests.policies import random_policy

needs_two = pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
PROBLEM = looprl.matmul(192, 160, 128)


def test_the_outermost_eligible_loops_are_marked():
    nest = looprl.initial_nest(looprl.matmul(64, 48, 32)).swap(0)  # k, m, n | m, n
    assert outermost_parallel_loop(nest, COMPUTE, 2) == 1  # m: k is a reduction
    assert outermost_parallel_loop(nest, WRITE_BACK, 2) == 3
    marked, indices = parallel_variant(nest, 2)
    assert indices == (1, 3) and marked == nest.parallel(1).parallel(3)
    assert parallel_variant(marked, 2)[0] == marked  # a parallel nest is made serial first
    tiled = looprl.initial_nest(looprl.matmul(64, 48, 32)).split(0, 64)  # m: one iteration of 64, then m64
    assert outermost_parallel_loop(tiled, COMPUTE, 2) == 1  # too few iterations for two threads
    vector = looprl.initial_nest(looprl.contraction("k,kn->n", k=5, n=1))
    assert parallel_variant(vector, 2) is None  # n has one iteration: nothing to divide


def test_proposals_replay_from_the_untuned_nest_and_the_fastest_wins():
    problem = looprl.matmul(64, 48, 32)
    actions = ("split_4", "down", "swap_down")
    nest = looprl.initial_nest(problem).split(0, 4).swap(1)
    values = iter([5.0, 9.0])

    def evaluator(candidate):
        return looprl.Measurement(next(values), False)

    other = looprl.initial_nest(problem)
    # Each candidate's first variant (both nests parallel), then the first candidate's second (its copy serial).
    values = iter([5.0, 9.0, 4.0])
    proposals = parallel_proposals([ScheduleRecord(nest, 3.0, actions), ScheduleRecord(other, 1.0, ())], SearchContext(problem, ActionSet(), evaluator), 2)
    chosen = max(proposals, key=lambda c: c.gflops)
    assert chosen.gflops == 9.0 and chosen.nest == other.parallel(0).parallel(3) and len(proposals) == 3
    replay = ActionSet.covering(chosen.actions)
    assert reach(replay, State(other, 0), chosen.actions).nest == chosen.nest
    first = parallel_proposals([ScheduleRecord(nest, 3.0, actions)], SearchContext(problem, ActionSet(), lambda n: looprl.Measurement(7.0, False)), 2)
    assert first[0].actions[:3] == actions and first[0].actions.count("parallel") == 2


@needs_two
def test_tune_on_two_threads_is_never_slower_than_its_serial_best(tmp_path):
    cache = MeasurementCache(str(tmp_path / "c.sqlite"))
    policy = random_policy(seed=1)
    result = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.3, measure_budget_s=0.002, threads=2)
    assert result.threads == 2 and result.serial_gflops is not None
    assert result.gflops >= result.serial_gflops
    assert result.kernel.threads == 2
    if result.nest.is_parallel:
        assert result.gflops == pytest.approx(cache.get(result.nest, budget_s=0.002, threads=2))
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in PROBLEM.input_shapes)
    expected = looprl.compile(result.nest.serial())(a, b)
    assert np.array_equal(result.kernel(a, b), expected)
    assert reach(result.action_set, State(looprl.initial_nest(PROBLEM), 0), result.actions).nest == result.nest
    # remembered per thread count: the one-thread answer is another one
    again = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.3, measure_budget_s=0.002, threads=2)
    assert again.mode == "remembered" and again.nest == result.nest and again.kernel.threads == 2
    serial = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.3, measure_budget_s=0.002, threads=1)
    assert serial.mode == "measured" and not serial.nest.is_parallel and serial.serial_gflops is None


@needs_two
def test_a_parallel_schedule_that_does_not_pay_is_not_returned(monkeypatch):
    """A parallel proposal measured slower than the serial best, and again beside it, leaves the
    serial answer, with no duel (looprl.tune.winner.team_or_serial). Teams time at a third of
    the serial speed here (a scripted timer)."""
    import importlib

    from looprl.measurement import evaluator as evaluator_module
    from tests.tune.test_team_duel import SERIAL_GFLOPS, ScriptedTimer

    monkeypatch.setattr(evaluator_module, "time_kernel", ScriptedTimer(lucky=SERIAL_GFLOPS / 3, team=SERIAL_GFLOPS / 3))
    tune_module = importlib.import_module("looprl.tune.teams")  # the module, not the function it exports

    def slow(candidates, context, threads, at_least=0):
        best = candidates[0]
        return [ScheduleRecord(parallel_variant(best.nest, threads)[0], best.gflops / 3, best.actions)]

    monkeypatch.setattr(tune_module, "parallel_proposals", slow)
    result = looprl.tune(PROBLEM, random_policy(seed=1), cache=":memory:", budget_s=0.2, measure_budget_s=0.002, threads=2, remember=False)
    assert not result.nest.is_parallel and result.gflops == result.serial_gflops


def test_teams_are_predicted_from_the_serial_best_not_the_last_schedule_measured(monkeypatch):
    """The team stage's budget predicts a measurement's cost from the serial schedule a team is
    made of. Predicted from the last serial schedule measured (8 GFLOPS after a 219 GFLOPS best
    on a batched product), every team was refused and tune stayed on one thread."""
    import importlib

    tune_module = importlib.import_module("looprl.tune.teams")
    seen = []

    def recording(candidates, context, threads, at_least=0):
        seen.append((context.budget.reference_gflops, candidates[0].gflops))
        return []

    monkeypatch.setattr(tune_module, "parallel_proposals", recording)
    looprl.tune(PROBLEM, random_policy(seed=1), cache=":memory:", budget_s=0.2, measure_budget_s=0.002, threads=2, remember=False)
    assert len(seen) == 1 and seen[0][0] == seen[0][1] > 0


def test_variants_that_start_fewest_teams_a_call_are_measured_first():
    problem = looprl.contraction("mk,kn->mn", m=1, k=64, n=32)
    inside_reduction = looprl.initial_nest(problem).swap(0).swap(1).split(1, 16)  # k64, n2, n16, m1: n2 inside k
    assert [(loop.var, loop.iterations) for loop in inside_reduction.loops[:3]] == [("k", 64), ("n", 2), ("n", 16)]
    outermost = inside_reduction.swap(0)  # n2, k64, ...: n2 first
    order = []

    class Recording:
        def __call__(self, nest):
            order.append(nest.key)
            return looprl.Measurement(1.0, False)

    context = SearchContext(problem, ActionSet(), Recording())
    found = parallel_proposals([ScheduleRecord(inside_reduction, 5.0, ()), ScheduleRecord(outermost, 4.0, ())], context, 2)
    teams = [teams_per_call(c.nest, next(i for i, loop in enumerate(c.nest.loops) if loop.parallel)) for c in found]
    assert teams == sorted(teams) and teams[0] == 1 and max(teams) >= 64
    assert found[0].nest.serial() == outermost  # the second candidate's one-team variant before the first's inside k
    assert order == [c.nest.key for c in found]


def test_a_schedule_that_starts_with_the_reduction_gets_a_variant_with_the_output_loop_outermost():
    """A decode GEMV tuned as k320, n3, ... would start 320 teams a call: the same schedule with
    the n loop moved outermost is proposed too, its actions replay to it, and it computes the
    problem."""
    problem = looprl.contraction("mk,kn->mn", m=1, k=64, n=32)
    actions = ("swap_down", "down", "swap_down", "split_16")  # m1, k64, n32 -> k64, m1, n2, n16
    nest = reach(ActionSet.covering(actions), State(looprl.initial_nest(problem), 0), actions).nest
    assert [(loop.var, loop.iterations) for loop in nest.loops[:4]] == [("k", 64), ("m", 1), ("n", 2), ("n", 16)]
    assert hoisted_variant(looprl.initial_nest(looprl.matmul(64, 48, 32)), 2) is None  # m, outermost, is the one made parallel
    marked, swaps, indices = hoisted_variant(nest, 2)
    assert swaps == (1, 0) and indices[0] == 0 and teams_per_call(marked, 0) == 1
    assert [(loop.var, loop.iterations) for loop in marked.loops[:3]] == [("n", 2), ("k", 64), ("m", 1)] and marked.loops[0].parallel
    context = SearchContext(problem, ActionSet(), lambda nest: looprl.Measurement(1.0, False))
    found = parallel_proposals([ScheduleRecord(nest, 5.0, actions)], context, 2)
    hoisted = next(candidate for candidate in found if candidate.nest == marked)
    assert hoisted is found[0]  # one team a call: measured first
    replayed = reach(ActionSet.covering(hoisted.actions), State(looprl.initial_nest(problem), 0), hoisted.actions).nest
    assert replayed == marked  # its actions replay to it
    a, b = np.random.rand(1, 64).astype(np.float32), np.random.rand(64, 32).astype(np.float32)
    np.testing.assert_allclose(looprl.compile(marked, threads=2)(a, b), a @ b, rtol=1e-5)


def test_default_threads_are_the_cores():
    result = looprl.tune((16, 16, 16), random_policy(), cache=":memory:", budget_s=0, measure_budget_s=0.001)
    assert result.threads == available_cores() and result.kernel.threads == available_cores()


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "2", available_cores() + 1])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(ValueError, match="threads"):
        looprl.tune((16, 16, 16), random_policy(), cache=":memory:", threads=bad)


def test_the_command_line_takes_threads(tmp_path, capsys):
    """Through the command line's main() in this process: the same exit statuses and lines,
    without a process start each (``python -m looprl tune`` as a user starts it is
    tests/tune/test_tune.py::test_cli's)."""
    from looprl.cli.tune import main

    folder = random_policy().save(tmp_path / "policy")
    capsys.readouterr()
    assert main(["16", "16", "16", "--policy", str(folder), "--threads", "0", "--cache", ":memory:"]) == 2
    assert "threads" in capsys.readouterr().err
    assert main(["32", "32", "32", "--policy", str(folder), "--threads", "1", "--cache", ":memory:", "--budget", "0"]) == 0
    assert "numpy, 1 thread," in capsys.readouterr().out


def test_a_proposal_slower_than_the_serial_best_is_timed_again_before_it_loses():
    problem = looprl.matmul(64, 48, 32)
    nest = looprl.initial_nest(problem)

    class Noisy:
        def __init__(self):
            self.calls = []

        def __call__(self, candidate):
            self.calls.append("measure")
            return looprl.Measurement(2.0, False)  # caught a busy moment

        def remeasure(self, candidate):
            self.calls.append("remeasure")
            return looprl.Measurement(8.0 if candidate.is_parallel else 5.0, False)

    noisy = Noisy()
    context = SearchContext(problem, ActionSet(), noisy)
    proposals = parallel_proposals([ScheduleRecord(nest, 5.0, ())], context, 2)
    # each variant slower than the serial best it was made of: timed again at once
    assert noisy.calls == ["measure", "remeasure"] * 2 and [p.gflops for p in proposals] == [8.0, 8.0]


@needs_two
def test_an_evaluator_on_more_threads_shares_cache_and_buffers():
    serial = looprl.Evaluator(":memory:", 0.002)
    team = serial.with_threads(2)
    assert team.threads == 2 and team.cache is serial.cache and team._workspaces is serial._workspaces
    assert (team.budget_s, team.target, team.samples) == (serial.budget_s, serial.target, serial.samples)


def test_a_loop_of_few_iterations_gets_a_balanced_alternative():
    from looprl.search.parallel import parallel_variants

    nest = looprl.initial_nest(looprl.matmul(64, 96, 32)).split(2, 40)  # m, k, n/40 (2 + tail), n40 | m, n
    nest = nest.swap(1).swap(0)  # n/40, m, k, n40: 3 iterations, then m with 64
    variants = parallel_variants(nest, 2)
    assert [v.parallel_loops for v, _ in variants] == [(0, 4), (1, 4)]
    assert [v.parallel_loops for v, _ in parallel_variants(nest.swap(0), 2)] == [(0, 4)]  # m first: 64 iterations
    assert [v.parallel_loops for v, _ in parallel_variants(nest.swap(0), 2, serial_copy=True)] == [(0, 4), (0,)]
