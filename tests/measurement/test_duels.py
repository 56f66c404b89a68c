"""looprl.measurement.duels without torch: interleaved rounds until the sign test decides, and
two schedules dueled through an evaluator (each compiled once, timed in turn). Every timer
here is scripted: no wall-clock time is asserted."""

import math

import pytest

import looprl
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.duels import DUEL_MAX_ROUNDS, duel_rounds, faster, schedule_duel
from looprl.measurement.timing import Timing


def test_rounds_alternate_the_two_sides_and_stop_once_decided():
    times = {"fast": iter([1.0] * 5), "slow": iter([1.5] * 5), "even": iter([1.0] * 4), "same": iter([1.0] * 4)}
    order = []

    def seconds(side):
        order.append(side)
        return next(times[side])

    won, tied = duel_rounds([("fast", "slow"), ("even", "same")], seconds, 0.05)
    assert (won.wins, won.rounds, tied.wins, tied.rounds) == (5, 5, 0, 4)
    assert order[:4] == ["fast", "slow", "even", "same"] and order[-2:] == ["fast", "slow"]
    assert won.shown_faster(0.05) and not tied.shown_faster(0.05)
    assert faster(0, 4) is False and faster(5, 5) is True and DUEL_MAX_ROUNDS == 15


def test_a_failed_timing_is_no_win():
    duel, = duel_rounds([("a", "b")], lambda side: math.nan if side == "a" else 1.0, 0.05, max_rounds=3)
    assert (duel.wins, duel.rounds) == (0, 1) and not duel.shown_faster(0.05)


@pytest.mark.parametrize("bad, match", [({"margin": -0.1}, "margin"), ({"max_rounds": 0}, "rounds"), ({"confidence": 1.0}, "confidence")])
def test_bad_settings_are_refused(bad, match):
    settings = {"margin": 0.05, **bad}
    with pytest.raises(ValueError, match=match):
        duel_rounds([], lambda side: 1.0, **settings)


def test_two_schedules_are_compiled_once_and_timed_in_turn(monkeypatch):
    problem = looprl.matmul(24, 16, 8)
    first, second = looprl.initial_nest(problem), looprl.initial_nest(problem).split(0, 4)
    timed = []

    def timer(kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        timed.append(kernel)
        gflops = 2.0 if kernel.nest == first else 1.0
        return Timing(problem.flops / (gflops * 1e9), 3, 1, problem.flops)

    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    evaluator = looprl.Evaluator(":memory:", 0.001)
    duel = schedule_duel(evaluator, first, second, 0.05)
    assert (duel.wins, duel.rounds) == (5, 5) and duel.shown_faster(0.05)
    assert [kernel.nest for kernel in timed] == [first, second] * 5
    assert len({id(kernel) for kernel in timed}) == 2  # each compiled once
    assert evaluator.cache.lookup(first, evaluator.target, 0.001).samples == 5  # every timing is a sample


def test_a_duel_needs_two_schedules_of_one_problem():
    evaluator = looprl.Evaluator(":memory:", 0.001)
    with pytest.raises(ValueError, match="one problem"):
        schedule_duel(evaluator, looprl.initial_nest(looprl.matmul(8, 8, 8)), looprl.initial_nest(looprl.matmul(8, 8, 4)), 0.05)
    with pytest.raises(ValueError, match="LoopNests"):
        schedule_duel(evaluator, "m8", looprl.initial_nest(looprl.matmul(8, 8, 8)), 0.05)
