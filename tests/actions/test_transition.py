"""The one transition rule: the env, a replay and a search context move through the same
states for any action sequence, failures included, and the rule itself says what happens to an
invalid action, a cursor move and a failed schedule."""

import math
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import Action, ActionSet, State, replay, step
from looprl.env.loopnest_env import LoopNestEnv
from looprl.measurement.evaluator import Evaluator, Measurement
from looprl.search.context import SearchContext

PROBLEMS = [looprl.matmul(16, 24, 20), looprl.contraction("bmk,bkn->bmn", b=2, m=8, k=12, n=16)]


def _fails(nest) -> bool:
    """A deterministic third of the schedules (never the untuned one) 'fail to compile'."""
    return nest != looprl.initial_nest(nest.problem) and zlib.crc32(nest.key.encode()) % 3 == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=st.sampled_from(PROBLEMS), path=st.lists(st.integers(0, 6), min_size=1, max_size=12))
def test_env_replay_and_search_context_move_alike(failing_compiles, problem, path):
    failing_compiles(_fails)
    cache = looprl.MeasurementCache(":memory:")
    env = LoopNestEnv(problems=[problem], cache=cache, measure_samples=1, measure_budget_s=0.001, peak=100.0,
                      episode_length=len(path))
    env.reset(seed=0)
    env_states, env_valid = [], []
    for action in path:
        _, reward, _, _, info = env.step(action)
        env_states.append(env.state)
        env_valid.append(info["valid"])
        if not info["valid"] or info["error"] is not None:
            assert reward == 0.0  # an invalid action or a failed schedule changes nothing
    evaluator = Evaluator(cache, 0.001, samples=1)
    actions = ActionSet()
    start = State(looprl.initial_nest(problem), 0)
    transitions = replay(actions, start, evaluator(start.nest).gflops, path, evaluator)
    assert [t.state for t in transitions] == env_states
    assert [t.valid for t in transitions] == env_valid
    assert all(not _fails(t.state.nest) for t in transitions)  # never moved to a failed schedule
    context = SearchContext(problem, actions, evaluator)
    assert context.node_after(context.root(), path).state == env_states[-1]


def _value(gflops=None, error=None):
    calls = []

    def value(nest):
        calls.append(nest)
        return Measurement(0.0 if error else gflops, False, error=error)

    return value, calls


def test_the_rule_for_each_outcome():
    actions = ActionSet()
    state = State(looprl.initial_nest(looprl.matmul(16, 16, 16)), 0)
    value, calls = _value(gflops=7.0)
    invalid = step(actions, state, 3.0, actions.index("up"), value)  # the cursor is on the first loop
    assert (invalid.outcome, invalid.state, invalid.gflops, invalid.valid) == ("invalid", state, 3.0, False) and "first" in invalid.why
    moved = step(actions, state, 3.0, actions.index("down"), value)
    assert (moved.outcome, moved.state.cursor, moved.gflops) == ("moved", 1, 3.0) and not calls  # nothing measured
    changed = step(actions, state, 3.0, actions.index("split_4"), value)
    assert changed.outcome == "changed" and changed.gflops == 7.0 and changed.state.nest == state.nest.split(0, 4) and len(calls) == 1
    failing, _ = _value(error="CompileError: boom")
    failed = step(actions, state, 3.0, actions.index("split_4"), failing)
    assert (failed.outcome, failed.state, failed.gflops, failed.valid, failed.applied) == ("failed", state, 3.0, True, False)
    assert failed.why == "CompileError: boom"
    unmeasured = step(actions, state, 3.0, actions.index("split_4"), None)
    assert unmeasured.changed and math.isnan(unmeasured.gflops)


def test_actions_are_data():
    actions = ActionSet((4, 6), layouts=True, parallel=True)
    assert actions.names == ("up", "down", "swap_up", "swap_down", "split_4", "split_6", "pack", "pad", "parallel")
    assert actions.actions[5] == Action("split", 6) and Action.parse("split_6") == Action("split", 6)
    assert [Action.parse(n) for n in ("split_x", "split", "jump", 3)] == [None, None, None, None]
    assert [actions.is_structural(i) for i in range(len(actions))] == [False, False] + [True] * 7
    with pytest.raises(ValueError, match="factor"):
        Action("up", 4)
    state = State(looprl.initial_nest(looprl.matmul(16, 16, 16)), 0)
    assert actions.moves(0, 2) == (1, 1) and actions.moves(3, 1) == (0, 0)
    mask = actions.mask(state)
    assert [bool(mask[i]) == (actions.why_not(state, i) is None) for i in range(len(actions))] == [True] * len(actions)
    assert actions.why_not(state, actions.index("swap_up")) is not None  # no loop above


def test_a_layout_action_that_changes_nothing_is_invalid_without_raising():
    actions = ActionSet(layouts=True)
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16))
    assert "changes no tensor" in actions.why_not(State(nest, 0), actions.index("pack"))  # m has step 1 and no tile
    padded = np.array([actions.can_apply(State(nest, c), actions.index("pad")) for c in range(len(nest))])
    assert not padded.any()  # 16 is a multiple of every pad multiple offered (16)


def test_after_is_apply_and_why_not_in_one_answer():
    """``ActionSet.after`` gives what ``apply`` gives where the action applies and what
    ``why_not`` says where it does not; the transition of an invalid action carries that reason."""
    actions = ActionSet((4, 6), layouts=True, parallel=True)
    nest = looprl.initial_nest(looprl.matmul(16, 24, 20))
    for state in (State(nest, 0), State(nest, 2), State(nest.split(2, 4), 1)):
        for a in range(len(actions)):
            found, why = actions.after(state, a), actions.why_not(state, a)
            if why is None:
                assert found == actions.apply(state, a)
            else:
                assert found == why and actions.apply(state, a) is None
                assert step(actions, state, 1.0, a, None).why == why
