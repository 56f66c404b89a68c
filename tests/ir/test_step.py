"""One schedule step as data (looprl.ir.step.Step): what LoopNest.apply takes, what an env action
names relative to the cursor, what AutoTVM's annealing proposes; the merge transform; action
names written and read in one place."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import Action, ActionSet, State
from looprl.actions.action_set import STEP_ACTIONS
from looprl.ir.nest import LoopNest
from looprl.ir.plans import Plan, plan_catalogue
from looprl.ir.step import MERGE, OPS, PARALLEL, SPLIT, SWAP, Step
from looprl.search.autotvm import AUTOTVM_MAX_SPLIT, ScheduleSpace, in_space
from looprl.target import Target
from tests.schedules import action_steps, walk

PROBLEM = looprl.matmul(67, 100, 250)  # no factor below divides these: splits leave tails


def test_a_step_is_a_value_with_checked_fields():
    step = Step(SPLIT, np.int64(1), np.int16(4))
    assert step == Step("split", 1, 4) and hash(step) == hash(Step("split", 1, 4))
    assert type(step.loop) is int and type(step.arg) is int and step.args == (1, 4) and str(step) == "split(1, 4)"
    assert Step(SWAP, 2).args == (2,) and Step(MERGE, 0).arg == 0
    with pytest.raises(ValueError, match="unknown transform"):
        Step("fuse", 0)
    with pytest.raises(ValueError, match="only a split"):
        Step(SWAP, 0, 4)
    for bad in (True, 1.0, "0", None):
        with pytest.raises(ValueError, match="must be an integer"):
            Step(SWAP, bad)
    with pytest.raises(ValueError, match="must be an integer"):
        Step(SPLIT, 0, 2.0)


def test_apply_applies_each_op_by_its_transform_and_refuses_what_it_refuses():
    nest = looprl.initial_nest(PROBLEM)
    assert nest.apply([Step(SPLIT, 0, 8), Step(SWAP, 1), Step(PARALLEL, 0)]) == nest.split(0, 8).swap(1).parallel(0)
    assert nest.apply([Step(SPLIT, 2, 16), Step(MERGE, 2)]) == nest
    assert nest.apply([]) == nest
    refused = [Step(SPLIT, 0, 1), Step(SPLIT, 0, 68), Step(SWAP, 2), Step(SWAP, 4), Step(MERGE, 0), Step(PARALLEL, 1), Step(SPLIT, 5, 2),
               Step(SWAP, -1)]
    for step in refused:
        why = nest.why_not(step)
        assert why is not None
        with pytest.raises(ValueError) as raised:
            nest.apply([step])
        assert why in str(raised.value)  # the transform's own message (a parallel mark's names the loop first)
    with pytest.raises(ValueError, match="expected a Step"):
        nest.apply([("split", 0, 4)])  # the tuple form is gone
    with pytest.raises(ValueError, match="expected a Step"):
        nest.why_not(("swap", 0))


@settings(max_examples=60, deadline=None)
@given(steps=action_steps(kinds=("split", "split", "swap_down", "swap_up", "parallel")), index=st.integers(0, 20))
def test_merge_undoes_a_split_and_refuses_what_is_not_one(steps, index):
    nest = walk(PROBLEM, steps)
    index %= len(nest)
    for factor in (2, 3, 7, 16):
        if nest.why_not(Step(SPLIT, index, factor)) is None:
            assert nest.split(index, factor).merge(index) == nest  # a parallel mark stays where it was
    why = nest.why_not(Step(MERGE, index))
    pair = nest.loops[index : index + 2]
    is_split = len(pair) == 2 and pair[0].nest == pair[1].nest and pair[0].var == pair[1].var and not pair[1].tail
    assert (why is None) == is_split
    if why is None:
        merged = nest.merge(index)
        assert len(merged) == len(nest) - 1 and LoopNest.from_key(PROBLEM, merged.key) == merged  # a schedule splits and swaps build
        loop = merged.loops[index]
        assert (loop.var, loop.budget, loop.step) == (pair[0].var, pair[0].budget, pair[1].step)
        assert loop.parallel == (pair[0].parallel or pair[1].parallel)
    else:
        with pytest.raises(ValueError):
            nest.merge(index)


def test_merge_refusals_say_why():
    nest = looprl.initial_nest(PROBLEM)
    assert "innermost loop of the compute nest" in nest.why_not_merge(2)
    assert "not a split of one dimension" in nest.why_not_merge(0)
    assert "out of range" in nest.why_not_merge(6)
    inner_split = nest.split(0, 16).split(1, 3)  # m5s16t3, m5s3t1, m3s1: the middle loop has a tail
    assert "tail of its own" in inner_split.why_not_merge(0)
    assert inner_split.merge(1).merge(0) == nest


def _all_action_sets():
    factors = tuple(range(2, 65)) + (96, 128, 256, 512)
    for name in ("avx512", "avx2"):
        target = Target.named(name)
        yield target, ActionSet.for_target(target, factors, layouts=True, parallel=True, plans=True)


def test_every_action_name_round_trips_on_both_targets():
    for target, actions in _all_action_sets():
        for action in actions.actions:
            assert Action.parse(action.name) == action
        assert actions.names[:4] == ("up", "down", "swap_up", "swap_down")
        assert [n for n in actions.names if n.startswith("split_")] == [f"split_{f}" for f in actions.split_factors]
        assert actions.names[-len(actions.plans) - 3 :][:3] == ("pack", "pad", "parallel")
        assert list(actions.plans) == [plan.name for plan in plan_catalogue(target)]
        for plan in plan_catalogue(target):
            assert Plan.parse(plan.name) == plan
    assert "plan_6x2_k256_pack" in dict(_all_action_sets())[Target.named("avx2")].names
    assert [Action.parse(name) for name in ("split_0", "plan_6x2_k300", "plan_", "merge", "swap")] == [None] * 5


def test_an_action_names_a_step_relative_to_the_cursor():
    _, actions = next(_all_action_sets())
    state = State(looprl.initial_nest(PROBLEM).split(0, 8), 1)
    kinds = {action.kind: action.step(state.cursor) for action in actions.actions if action.kind in ("up", "swap_up", "swap_down", "parallel")}
    assert kinds == {"up": None, "swap_up": Step(SWAP, 0), "swap_down": Step(SWAP, 1), "parallel": Step(PARALLEL, 1)}
    assert Action(SPLIT, 4).step(3) == Step(SPLIT, 3, 4) and Action("pack").step(0) is None
    for cursor in range(len(state.nest)):
        here = state.at(cursor)
        for index, action in enumerate(actions.actions):
            step = action.step(cursor)
            if step is None:
                continue
            after = actions.apply(here, index)
            if after is None:
                assert actions.why_not(here, index) in (state.nest.why_not(step), f"a split would make more than max_loops={actions.max_loops} loops")
            else:
                assert after.nest == state.nest.apply([step]) and after.cursor == action.cursor_after(cursor)
    assert {op for op, _, _ in STEP_ACTIONS.values()} == set(OPS) - {MERGE} | {"stage", "prefetch"}  # no action merges; the right operand staged, prefetched
    assert Action.taking(Step(MERGE, 0)) == [] and ActionSet().path(state, [Step(MERGE, 0)]) is None


def test_paths_take_the_nearest_action_for_a_step():
    actions = ActionSet((4, 8))
    start = State(looprl.initial_nest(PROBLEM), 2)
    path, reached = actions.path(start, [Step(SWAP, 1)])  # from loop 2 (swap_up) rather than loop 1 (swap_down)
    assert [actions.names[a] for a in path] == ["swap_up"] and reached == State(start.nest.swap(1), 1)
    path, reached = actions.path(start.at(0), [Step(SWAP, 1), Step(SPLIT, 0, 8)])
    assert [actions.names[a] for a in path] == ["down", "swap_down", "up", "up", "split_8"]
    assert reached.nest == start.nest.swap(1).split(0, 8)
    assert actions.path(start, [Step(SPLIT, 0, 16)]) is None  # no split_16 in this set


def test_autotvm_space_moves_are_steps_of_its_one_factor_range():
    root = looprl.initial_nest(looprl.matmul(512, 64, 64))
    assert in_space(root.split(0, 64).split(1, 4), Step(MERGE, 1))  # m8s64, m16s4, m4s1: 64 iterations, a split by 64 makes them
    assert not in_space(root.split(0, 128).split(0, 2), Step(MERGE, 1))  # m2s256, m2s128, m128s1: 256 inside another m loop
    assert in_space(root.split(0, 128), Step(MERGE, 0))  # the outermost loop of m may be any size
    assert not in_space(root, Step(MERGE, 0)) and in_space(root, Step(SWAP, 0))
    assert AUTOTVM_MAX_SPLIT == 64
    space = ScheduleSpace(looprl.initial_nest(PROBLEM), 10)
    rng = np.random.default_rng(1)
    current = looprl.initial_nest(PROBLEM)
    for _ in range(200):
        following = space.neighbour(current, rng)
        assert following == current or any(current.apply([step]) == following for step in _steps_of(current))
        current = following


def _steps_of(nest):
    for index in range(len(nest)):
        for step in [Step(SWAP, index), Step(MERGE, index)] + [Step(SPLIT, index, f) for f in range(2, AUTOTVM_MAX_SPLIT + 1)]:
            if nest.why_not(step) is None:
                yield step
