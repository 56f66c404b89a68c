"""A linear layer's re-laid weight is a layout of the one problem (issue 59, item 2).

What is checked: the re-laid start (:class:`looprl.ir.rewrites.Relaid`) is the problem's untuned
nest with its right operand in another layout; the policy sees every schedule of it exactly as it
saw the same schedule of the problem its policies were trained on (so its greedy actions stay the
same); the env's actions move the two in step; records' former names for the start are read in
one place; the one winner rule picks between re-laid and as-stored schedules of the one problem;
the store keeps the re-laid answers where tune-v9 kept them.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import looprl
from looprl import MeasurementCache
from looprl.actions import ActionSet, State
from looprl.env.observation import observation
from looprl.ir.nest import initial_nest
from looprl.ir.rewrites import FORMER_RELAID_NAMES, RELAID, Relaid, plan_rewrites, relaid, replays_on
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.policy.loading import load_policy
from looprl.policy.retarget import retargeted
from looprl.policy.rollout import greedy_rollout
from looprl.target import Target
from looprl.tune.results import Answer, replayed
from looprl.tune.winner import IN_PLACE_MARGIN, preferred, reads_a_copy

PROBLEMS = {
    "decode linear": looprl.linear(4, 256, 512),
    "linear with bias": looprl.linear(64, 96, 128),
    "one-row linear, gelu": looprl.linear(1, 384, 256, activation="gelu"),
    "bfloat16 linear": looprl.linear(4, 512, 256, dtype="bfloat16"),
    "attention keys (per call)": looprl.contraction("bmk,bnk->bmn", b=2, m=32, k=64, n=48),
    "cold weight": looprl.linear(8, 256, 512, bias=False).with_cold(),
}
MAX_LOOPS = 12


@functools.cache
def default_policy(target_name: str, weights: bool):
    target = Target.named(target_name)
    return retargeted(load_policy("default", target, weights=weights), target)


@pytest.mark.parametrize("name", PROBLEMS)
def test_the_re_laid_start_is_the_problems_untuned_nest_with_its_weight_in_another_layout(name):
    problem = PROBLEMS[name]
    start = relaid(problem)
    assert start is not None and start.start.problem == problem
    assert start.start.loops == initial_nest(problem).loops
    assert [tensor for tensor, _ in start.start.layouts] == ["in1"] and not start.layout.is_row_major
    assert start.layout.dims[-1][0].var == problem.output[-1]  # the output's columns innermost
    assert start.schedule(initial_nest(start.coordinates)) == start.start
    assert start.in_coordinates(start.start) == initial_nest(start.coordinates)
    assert start.exact == ("in1" in problem.constant)


def test_only_a_right_operand_stored_across_the_columns_has_a_re_laid_start():
    assert relaid(looprl.matmul(4, 8, 16)) is None  # already contiguous along the columns
    assert relaid(looprl.contraction("mk,k->m", m=4, k=8, constant="b")) is None
    with pytest.raises(ValueError, match="re-laid start"):
        Relaid(looprl.matmul(4, 8, 16))
    with pytest.raises(ValueError, match="schedule of"):
        relaid(looprl.linear(4, 8, 16)).schedule(initial_nest(looprl.linear(4, 8, 16)))
    assert plan_rewrites(looprl.linear(6, 8, 16)).chain == ()  # no twin problem: the fused view is the only rewrite


@pytest.mark.parametrize("target_name", ["avx2", "avx512"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_the_policy_sees_every_state_of_its_episode_as_it_saw_it_before(name, target_name):
    """The greedy episode (plans, packs and splits included): each state's observation of the
    problem with the weight re-laid equals the one of the coordinates problem, normalised or
    not, at every cursor; so the policy's scores, and its greedy actions, are the same."""
    problem = PROBLEMS[name]
    start = relaid(problem)
    policy = default_policy(target_name, "in1" in problem.constant)
    rollout = greedy_rollout(policy, start.coordinates, None)
    actions = ActionSet.covering(rollout.actions, target=Target.named(target_name))
    state = State(initial_nest(start.coordinates), 0)
    states = [state]
    for action in rollout.actions:
        state = actions.apply(state, actions.index(action)) or state
        states.append(state)
    assert len({s.nest.key for s in states}) > 1
    loops, normalized = policy.observation_shape[0], policy.observation_kind == "normalized"
    for state in states:
        laid = start.schedule(state.nest)
        for kind in (False, True):
            seen = observation(state.nest, state.cursor, loops, kind)
            np.testing.assert_array_equal(observation(laid, state.cursor, loops, kind), seen)
        assert np.array_equal(policy.scores(observation(laid, state.cursor, loops, normalized)),
                              policy.scores(observation(state.nest, state.cursor, loops, normalized)))


@pytest.mark.parametrize("name", PROBLEMS)
def test_the_envs_loop_and_layout_actions_move_the_re_laid_start_in_step(name):
    """Random paths of moves, swaps, splits, pack, pad and parallel applied to the re-laid start
    reach the schedules the same paths reach in its coordinates, observed the same."""
    problem = PROBLEMS[name]
    start = relaid(problem)
    actions = ActionSet.for_target(Target.named("avx2"), layouts=True, parallel=True)
    rng = np.random.default_rng(sum(map(ord, name)))
    for _ in range(6):
        laid, twin = State(start.start, 0), State(initial_nest(start.coordinates), 0)
        for action in rng.integers(len(actions), size=14):
            after_laid, after_twin = actions.apply(laid, int(action)), actions.apply(twin, int(action))
            assert (after_laid is None) == (after_twin is None), actions.names[action]
            if after_twin is not None:
                laid, twin = after_laid, after_twin
                assert laid.nest == start.schedule(twin.nest) and laid.cursor == twin.cursor
                np.testing.assert_array_equal(observation(laid.nest, laid.cursor, MAX_LOOPS), observation(twin.nest, twin.cursor, MAX_LOOPS))


def test_a_re_laid_schedule_computes_the_product():
    problem = looprl.linear(3, 40, 24)
    start = relaid(problem)
    nest = start.schedule(initial_nest(start.coordinates).split(2, 8))
    rng = np.random.default_rng(0)
    a, w, bias = (rng.standard_normal(shape).astype(np.float32) for shape in (*problem.input_shapes, problem.output_shape[-1:]))
    out = looprl.compile(nest)(a, w, bias)
    np.testing.assert_allclose(out, a @ w.T + bias, rtol=1e-5, atol=1e-4)


def test_records_name_the_re_laid_start_and_former_names_are_read_as_it():
    assert replays_on(None) is None and replays_on(RELAID) == RELAID
    assert [replays_on(name) for name in FORMER_RELAID_NAMES] == [RELAID, RELAID]
    with pytest.raises(ValueError, match="replays_on"):
        replays_on("sideways twin")
    problem = looprl.linear(4, 24, 16)
    names = ["down", "down", "split_8"]
    assert replayed(problem, names, ActionSet.covering(names), "transposed twin") == relaid(problem).start.split(2, 8)
    assert replayed(problem, names, ActionSet.covering(names)) == initial_nest(problem).split(2, 8)
    with pytest.raises(ValueError, match="no re-laid start"):
        replayed(looprl.matmul(4, 8, 16), names, ActionSet.covering(names), RELAID)


# -- the one winner rule ---------------------------------------------------------------------------
def _answer(nest, gflops, measured=1, waited_s=0.0):
    return Answer(ScheduleRecord(nest, gflops, ()), "policy", math.nan, measured=measured, waited_s=waited_s)


LAYER = looprl.linear(4, 64, 48)
RELAID_NEST = relaid(LAYER).start  # reads a copy of the weight
AS_STORED = initial_nest(LAYER)
PACKED = AS_STORED.layout_pack("in1", "n", 16)


def test_a_schedule_reads_a_copy_where_a_constant_input_is_re_laid():
    assert reads_a_copy(RELAID_NEST) and reads_a_copy(PACKED) and not reads_a_copy(AS_STORED)
    per_call = looprl.contraction("bmk,bnk->bmn", b=2, m=3, k=5, n=4)
    assert not reads_a_copy(relaid(per_call).start)  # re-laid inside every call: nothing kept


def test_a_copy_wins_only_by_the_margin_with_its_comparison_counted():
    kept = _answer(AS_STORED, 9.0, 2, 0.25)
    copy = _answer(RELAID_NEST, 9.0 * (1.0 + IN_PLACE_MARGIN) * 1.01, 3, 0.5)
    assert preferred([copy, None]) is copy  # one answer: itself, as it is
    chosen = preferred([copy, kept])  # the margin beaten: the copy, both searches counted
    assert chosen.nest == RELAID_NEST and chosen.measured == 5 and chosen.waited_s == 0.75
    within = _answer(RELAID_NEST, 9.0 * (1.0 + IN_PLACE_MARGIN) * 0.99)
    assert preferred([within, kept]).nest == AS_STORED  # faster, but within the margin: the schedule that keeps nothing
    compare_s = LAYER.flops / (copy.gflops * 1e9)  # the comparison doubles the copy's call
    assert preferred([copy, kept], compare_s).nest == AS_STORED
    assert preferred([kept, copy], compare_s).nest == AS_STORED  # the order of the answers does not decide


def test_a_copy_s_comparison_reads_from_memory_where_other_work_between_calls_evicts_it(monkeypatch):
    """Both the weight and its copy are read by the comparison: from the last-level cache where
    they fit it with what other work reads between two calls, else from memory (a decode step's
    layer, whose weights the other layers evict)."""
    from looprl.tune import measurer as measuring

    monkeypatch.setattr(measuring, "cache_sizes", lambda: (1 << 19, 32 << 20))
    monkeypatch.setattr(measuring, "memory_bandwidth", lambda *args, **kwargs: {"llc": 80.0, "dram": 16.0})
    timer = measuring.Measurer.open(":memory:", 0.001, None, 1)
    weight = 3 << 20
    assert timer.comparison_seconds(weight) == pytest.approx(2 * weight / 80e9)  # warm: both in the last level
    assert timer.comparison_seconds(weight, between=20 << 20) == pytest.approx(2 * weight / 80e9)  # 26 MB in all: still there
    assert timer.comparison_seconds(weight, between=64 << 20) == pytest.approx(2 * weight / 16e9)  # evicted: from memory
    assert timer.comparison_seconds(20 << 20) == pytest.approx(2 * (20 << 20) / 16e9)  # 40 MB: more than the last level holds


def test_between_copies_the_faster_is_kept_and_between_schedules_keeping_nothing_the_faster():
    first, faster_copy = _answer(RELAID_NEST, 10.0), _answer(PACKED, 12.0, 2)
    chosen = preferred([first, faster_copy], compare_s=1e-6)
    assert chosen.nest == PACKED and chosen.measured == 3
    assert preferred([first, _answer(PACKED, 10.0)]).nest == RELAID_NEST  # equals: the earliest
    per_call = looprl.contraction("bmk,bnk->bmn", b=2, m=3, k=5, n=4)
    through, direct = _answer(relaid(per_call).start, 4.0), _answer(initial_nest(per_call), 4.1)
    assert preferred([through, direct]).nest == direct.nest  # no copy either way: the faster
    assert preferred([through, _answer(initial_nest(per_call), 4.0)]).nest == through.nest
    with pytest.raises(ValueError, match="at least one"):
        preferred([None])


# -- the store -------------------------------------------------------------------------------------
def test_the_store_keeps_a_re_laid_answer_where_tune_v9_kept_the_twins():
    from looprl.tune import store
    from looprl.tune.measurer import Measurer

    start = relaid(LAYER)
    assert store.remembered_names(LAYER) == (LAYER.name, start.coordinates.name)
    per_call = looprl.contraction("bmk,bnk->bmn", b=2, m=3, k=5, n=4)
    assert store.remembered_names(per_call) == (per_call.name,)
    with MeasurementCache(":memory:") as cache:
        measurer = Measurer.open(cache, 0.001, None, 1)
        nest = start.schedule(initial_nest(start.coordinates).split(2, 8))
        record = ScheduleRecord(nest, 5.0, ("down", "down", "split_8"), "tiles", measurer.target, 1, 0.4, store.TUNER, RELAID)
        loaded = store.LoadAtStart(store.load_now(measurer).reading, 0.0)
        store.remember(Answer(record, "measured", 1.0), measurer, loaded, start)
        kept = cache.get_tuned(start.coordinates, measurer.target, 0.001, tuner=store.TUNER, threads=1, provisional=True)
        assert kept is not None and kept.nest == start.in_coordinates(nest) and kept.replays_on is None  # v9's form
        assert cache.get_tuned(LAYER, measurer.target, 0.001, tuner=store.TUNER, threads=1, provisional=True) is None
        back = store.recall(measurer, LAYER, 0.1, None, start)
        if back is not None:  # (None where the machine read busy while remembering: provisional)
            assert back.nest == nest and back.record.replays_on == RELAID and back.mode == "remembered"
        assert store.recall(measurer, LAYER, 0.1, None) is None  # the as-stored answer is another one


def test_a_tune_v9_answer_through_the_re_laid_twin_is_read_as_one_from_the_re_laid_start():
    """tune-v9 stored a changing operand's re-laid answer under the problem with ``replays_on``
    "re-laid twin": recalled, it is the same schedule, replaying from the re-laid start."""
    from looprl.tune import store
    from looprl.tune.measurer import Measurer

    keys = looprl.contraction("bmk,bnk->bmn", b=2, m=3, k=5, n=4)
    start = relaid(keys)
    names = ("down", "down", "down", "split_2")
    nest = replayed(keys, names, ActionSet.covering(names), RELAID)
    assert nest == start.start.split(3, 2)
    with MeasurementCache(":memory:") as cache:
        measurer = Measurer.open(cache, 0.001, None, 1)
        cache.put_tuned(ScheduleRecord(nest, 5.0, names, "measured", measurer.target, 1, 0.4, store.TUNER, "re-laid twin"), 0.001)
        back = store.recall(measurer, keys, 0.1)
        assert back is not None and back.nest == nest and back.record.replays_on == RELAID
        cache.put_tuned(ScheduleRecord(nest, 5.0, names, "measured", measurer.target, 1, 0.4, store.TUNER, "sideways twin"), 0.001)
        assert store.recall(measurer, keys, 0.1) is None  # a start this looprl does not know: tuned again
