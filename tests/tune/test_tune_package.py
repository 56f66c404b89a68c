"""looprl.tune as a package: the name stays the function, the parts keep their jobs and sizes,
the winner rule's choices, the fast path's cap on timings, and the store's way in and out."""

import ast
import importlib
import math
import pkgutil
from dataclasses import replace
from pathlib import Path

import pytest

import looprl
from looprl.ir.nest import initial_nest
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target

PACKAGE = Path(looprl.__file__).parent / "tune"
SUBMODULES = sorted(info.name for info in pkgutil.iter_modules([str(PACKAGE)]))


@pytest.mark.parametrize("name", SUBMODULES)
def test_looprl_tune_stays_the_function_after_each_part_is_imported(name):
    from looprl.tune.api import tune

    module = importlib.import_module(f"looprl.tune.{name}")
    exec(f"import looprl.tune.{name}", {})  # the statement form binds the parent's attribute too
    assert looprl.tune is tune and callable(looprl.tune) and looprl.tune.__module__ == "looprl.tune.api"
    assert module.__name__ == f"looprl.tune.{name}"
    from looprl import tune as imported

    assert imported is tune


def test_the_public_names_are_importable_from_looprl():
    from looprl.tune.results import Answer, TuneResult

    assert looprl.TuneResult is TuneResult and looprl.Answer is Answer
    from looprl.tune import TUNER, measured_search

    assert TUNER == "tune-v21" and callable(measured_search)


def test_the_package_s_modules_and_functions_stay_small():
    """The issue's targets: no module of looprl/tune over 300 lines, no function over 60."""
    assert {"api", "measured", "measurer", "policy_alone", "proposers", "results", "store", "teams", "winner"} <= set(SUBMODULES)
    for path in PACKAGE.glob("*.py"):
        source = path.read_text()
        assert len(source.splitlines()) <= 300, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{path.name}: {node.name}"


def test_the_winner_rule_s_constants_live_in_one_place():
    from looprl.search import dots, staged
    from looprl.tune import winner

    for name in ("IN_PLACE_ROWS", "in_place_rows"):
        assert hasattr(winner, name) and not hasattr(dots, name)
    for name in ("CONTENDER_WITHIN", "CONTENDER_ROUNDS", "TEAM_MARGIN"):
        assert hasattr(winner, name) and not hasattr(staged, name)
    assert winner.IN_PLACE_ROWS == 16 and winner.IN_PLACE_MARGIN == 0.05 and winner.COMPARISON_SHARE == 0.02


# ---- the winner rule ---------------------------------------------------------------------------

PROBLEM = looprl.matmul(16, 32, 24)
ROOT = initial_nest(PROBLEM)
SPLIT = ROOT.split(0, 4)
SWAPPED = ROOT.swap(0)


def _record(nest, gflops, actions=()):
    return ScheduleRecord(nest, gflops, tuple(actions))


def test_fastest_keeps_the_earliest_among_equals():
    from looprl.tune.winner import fastest

    first, equal, slower = _record(ROOT, 2.0, ("a",)), _record(SPLIT, 2.0, ("b",)), _record(SWAPPED, 1.0)
    assert fastest([first, equal, slower]) is first
    assert fastest([slower, equal]) is equal
    assert fastest([]) is None


def test_an_in_place_episode_that_re_lays_the_weight_is_a_copy_and_the_faster_copy_is_kept():
    from looprl.ir.rewrites import relaid
    from looprl.tune.results import Answer
    from looprl.tune.winner import preferred

    layer = looprl.linear(4, 64, 48)
    start = Answer(_record(relaid(layer).start, 10.0), "policy", math.nan, measured=1)
    as_stored = initial_nest(layer)
    in_place = Answer(_record(as_stored, 8.0), "policy", math.nan, measured=1)
    assert preferred([start, in_place]).nest == start.nest  # reads the weight in place: the margin decides
    copy = Answer(_record(as_stored.layout_reorder("in1", (1, 0)), 12.0), "policy", math.nan, measured=2)  # the weight re-laid: a copy
    answer = preferred([start, copy])
    assert answer.nest == copy.nest and answer.gflops == 12.0 and answer.measured == 3
    slower_copy = replace(copy, record=replace(copy.record, gflops=9.0))
    answer = preferred([start, slower_copy])
    assert answer.nest == start.nest and answer.gflops == 10.0 and answer.measured == 3


# ---- the fast path's cap -----------------------------------------------------------------------

class _Timings:
    """An evaluator that times nothing: each nest's speed from a table, every call counted."""

    def __init__(self, speeds):
        self.speeds, self.asked, self.compiled = speeds, [], 0
        self.target, self.threads = Target.host(), 1

    def __call__(self, nest):
        self.asked.append(nest.key)
        self.compiled += 1
        return looprl.Measurement(self.speeds[nest.key], False)


class _Proposals:
    """A proposer whose policy alone proposes a fixed list."""

    def __init__(self, records):
        self.records = records

    def alone(self, problem, pairs, excluded=frozenset()):
        return list(self.records)


def test_the_fast_path_times_at_most_its_cap_and_never_the_fastest_so_far_again():
    from looprl.tune.measurer import Measurer
    from looprl.tune.policy_alone import POLICY_TIMINGS, policy_answer

    speeds = {ROOT.key: 1.0, SPLIT.key: 3.0, SWAPPED.key: 2.0}
    proposals = _Proposals([_record(ROOT, math.nan, ("r",)), _record(SPLIT, math.nan, ("s",)), _record(SPLIT, math.nan, ("s2",)),
                            _record(SWAPPED, math.nan, ("w",))])
    timings = _Timings(speeds)
    answer = policy_answer(proposals, PROBLEM, False, Measurer(timings, 1), timings, frozenset(), POLICY_TIMINGS)
    assert timings.asked == [ROOT.key, SPLIT.key, SWAPPED.key]  # the split again is the fastest so far: not timed
    assert answer.nest == SPLIT and answer.actions == ("s",) and answer.gflops == 3.0 and answer.measured == 3
    assert answer.mode == "policy" and math.isnan(answer.initial_gflops) and answer.record.found_by == "policy"
    capped = _Timings(speeds)
    answer = policy_answer(proposals, PROBLEM, False, Measurer(capped, 1), capped, frozenset(), 1)
    assert capped.asked == [ROOT.key] and answer.nest == ROOT and answer.measured == 1
    assert POLICY_TIMINGS == 4


# ---- the store ---------------------------------------------------------------------------------

def test_an_answer_remembered_is_recalled_only_with_enough_budget_and_by_this_version(monkeypatch):
    from looprl.tune import store
    from looprl.tune.measurer import Measurer
    from looprl.tune.results import Answer

    measurer = Measurer.open(":memory:", 0.001, Target.host(), 1)
    measurer.cache.add_sample(ROOT, 1.5, measurer.target, measurer.budget_s, 1)  # the untuned nest's speed, known
    found = Answer(ScheduleRecord(SPLIT, 4.0, ("split_4",), "tiles", measurer.target, 1, budget_s=0.4), "measured", 1.5)
    assert store.recall(measurer, PROBLEM, 0.4) is None
    store.remember(found, measurer, store.load_now(measurer))
    again = store.recall(measurer, PROBLEM, 0.4)
    assert again.mode == "remembered" and again.nest == SPLIT and again.actions == ("split_4",) and again.gflops == 4.0
    assert again.initial_gflops == 1.5 and again.measured == 0 and again.record.tuner == store.TUNER
    assert store.recall(measurer, PROBLEM, 0.5) is None  # a larger budget tunes again
    monkeypatch.setattr(store, "TUNER", store.TUNER + "-next")
    assert store.recall(measurer, PROBLEM, 0.4) is None  # another version's answer is not returned


def test_an_answer_remembered_with_steps_and_no_action_path_is_recalled_by_its_steps():
    """A record replays from its steps without an action set (a split-k team whose factor no
    action names has only those): the store serves it; one that nothing replays is tuned again."""
    from looprl.ir.step import SPLIT as SPLIT_OP, Step
    from looprl.tune import store
    from looprl.tune.measurer import Measurer
    from looprl.tune.results import Answer

    measurer = Measurer.open(":memory:", 0.001, Target.host(), 1)
    measurer.cache.add_sample(ROOT, 1.5, measurer.target, measurer.budget_s, 1)  # the untuned nest's speed, known
    steps = (Step(SPLIT_OP, 0, 4),)
    found = Answer(ScheduleRecord(SPLIT, 4.0, None, "parallel", measurer.target, 1, budget_s=0.4, steps=steps), "measured", 1.5)
    assert found.record.actions is None and found.record.steps == steps
    store.remember(found, measurer, store.load_now(measurer))
    again = store.recall(measurer, PROBLEM, 0.4)
    assert again is not None and again.mode == "remembered" and again.nest == SPLIT and again.gflops == 4.0
    assert again.record.steps == steps and again.record.actions is None and again.actions == ()  # no action path, as found
    assert initial_nest(PROBLEM).apply(again.record.steps) == again.nest and again.initial_gflops == 1.5
    unreplayable = Answer(ScheduleRecord(SWAPPED, 5.0, None, "parallel", measurer.target, 1, budget_s=0.4), "measured", 1.5)
    assert unreplayable.record.steps is None
    store.remember(unreplayable, measurer, store.load_now(measurer))
    assert store.recall(measurer, PROBLEM, 0.4) is None  # neither actions nor steps: tuned again


def test_an_answer_without_an_action_path_replays_by_its_steps():
    """TuneResult.replayed() of an answer found without an action path (a split-k team's, an
    in-place answer's) is its schedule, from its record's steps, not the untuned nest that an
    empty action path reaches."""
    from dataclasses import replace

    import looprl

    result = looprl.tune(looprl.matmul(24, 40, 56), threads=1, cache=":memory:", remember=False)
    assert result.replayed() == result.nest and result.record.steps
    pathless = replace(result, answer=replace(result.answer, record=replace(result.record, actions=None)))
    assert pathless.actions == () and pathless.record.steps == result.record.steps
    assert pathless.replayed() == result.nest != looprl.initial_nest(result.problem)
