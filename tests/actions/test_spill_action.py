"""The spill step as an action and a step name (looprl.ir.nest_spill): offered only in a set made
with it or extended by a path that names it, and replayed by name."""

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.ir.action import Action
from looprl.ir.step import SPILL, Step


def test_the_spill_action_is_named_parsed_and_takes_the_spill_step_at_the_cursor():
    assert Action.parse("spill") == Action(SPILL) and Action(SPILL).name == "spill"
    assert Action(SPILL).step(2) == Step(SPILL, 2)
    assert Step.parse("spill(1)") == Step(SPILL, 1) and str(Step(SPILL, 1)) == "spill(1)"


def test_the_spill_action_is_offered_only_where_asked_or_named():
    plain = ActionSet()
    assert "spill" not in plain.names
    extended = plain.extended(["down", "spill"])
    assert extended.names[-1] == "spill" and extended.names[: len(plain)] == plain.names
    state = reach(extended, State(looprl.initial_nest(looprl.matmul(1, 37, 300)), 0), ("down", "spill"))
    assert state.nest.compute[1].spilled and state.nest.key.startswith("m1s1,k300s1~,")
