"""The producers of schedules pair a bfloat16 weight themselves, in one place
(:func:`looprl.measurement.pair_steps.with_pairs`): every schedule they compile or time, and
every record they answer with, carries the pair step where the kernel can take it, so the code
generator reads the pairs and decides none (issue 59)."""

import pytest

import looprl
from looprl.actions import ActionSet, State
from looprl.backend.pairs import pair_step, pairing
from looprl.ir.nest import initial_nest
from looprl.ir.register_tiles import tile_steps
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import measurement_key
from looprl.measurement.pair_steps import added_pairs, with_pairs
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target
from looprl.tune.results import replayed

LAYER = looprl.linear(16, 96, 64, bias=False, dtype="bfloat16")  # [m, k] x [n, k]: a weight as torch stores it
WEIGHT = looprl.contraction("mk,kn->mn", m=20, n=48, k=64, constant="in1", dtype="bfloat16")


@pytest.fixture
def compiled(monkeypatch):
    """The schedules the evaluator compiles (what a search or tune times), in order."""
    nests = []
    real = evaluator_module.compile

    def recording(nest, *args, **kwargs):
        nests.append((nest, kwargs.get("target")))
        return real(nest, *args, **kwargs)

    monkeypatch.setattr(evaluator_module, "compile", recording)
    return nests


def assert_carry_their_pairs(nests):
    """Every schedule compiled carries the pairs its kernel can take; at least one pairs."""
    assert nests and all(with_pairs(nest, target) == nest for nest, target in nests)
    assert any(pairing(nest, target) is not None for nest, target in nests)


@pytest.mark.target_dependent
def test_tune_of_a_bfloat16_weight_times_and_answers_paired_schedules(compiled):
    result = looprl.tune(LAYER, threads=1, cache=":memory:", measure=False)
    assert_carry_their_pairs(compiled)
    target = result.answer.record.target
    assert with_pairs(result.nest, target) == result.nest  # the answer carries its pairs
    if result.actions is not None:
        assert result.replayed() == result.nest  # its action path replays to the same schedule


@pytest.mark.target_dependent
def test_a_search_times_paired_schedules_and_its_states_stay_as_the_actions_made_them(compiled):
    found = looprl.search.run(WEIGHT, "greedy1", max_evaluations=12, budget_s=None, cache=":memory:", measure_budget_s=0.002)
    assert_carry_their_pairs(compiled)
    assert with_pairs(found.best_nest, Target.default()) == found.best_nest


def test_a_record_of_an_unpaired_schedule_is_read_back_paired_with_its_steps():
    """An old record (a cache's or a tuned-records file's, written before pairs were steps):
    read back for its target, its schedule and steps carry the pair step, so the kernel is
    the paired one it was measured as; its action path replays to the same schedule."""
    target = Target.named("avx2")
    actions = ActionSet.for_target(target)
    path, state = actions.path(State(initial_nest(WEIGHT), 0), tile_steps(WEIGHT, 4, 16))
    names = actions.named(path)
    nest = state.nest
    (pair,) = added_pairs(nest, target)
    assert pair == pair_step(nest, target)
    entry = {"host": measurement_key(target, 0.01, 1), "problem": WEIGHT.name, "tuner": "", "schedule": nest.key, "gflops": 10.0,
             "budget_s": 0.0, "actions": list(names), "replays_on": None, "found_by": "tiles"}  # no steps: an old record
    with MeasurementCache(":memory:") as cache:
        assert cache.import_tuned([entry]) == 1
        record = cache.get_tuned(WEIGHT, target, 0.01)
    assert record.nest == nest.apply((pair,)) and record.steps[-1] == pair
    assert pairing(record.nest, target) is not None
    assert replayed(WEIGHT, names, ActionSet.covering(names, target=target)) == record.nest
    assert ScheduleRecord(nest, 1.0, names).nest == nest  # no target: no code to pair for
