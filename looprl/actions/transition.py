"""The one transition rule: what an action does to a (schedule, cursor) state and its speed.

The environment, the policy's rollout, the searches, tune's stages, the demonstrations and the
tests all move from state to state through :func:`step`, so a policy trained in the env acts
the same wherever it runs:

* an action that cannot apply (:meth:`ActionSet.after` says why) is a no-op: the state and its GFLOPS
  stay (``outcome == "invalid"``);
* a cursor move changes no schedule: the new state keeps the GFLOPS, nothing is measured
  (``"moved"``);
* any other action makes a new schedule, which ``value`` measures; a schedule that fails to
  compile or run, or that the caller's budget refuses to measure, leaves the state and its
  GFLOPS as they were (``"failed"``, the measurement's error says why);
* else the new state and its GFLOPS (``"changed"``).

``value`` is any callable from a :class:`~looprl.ir.nest.LoopNest` to an object with ``ok``,
``gflops`` and ``error`` (a :class:`~looprl.measurement.evaluator.Measurement`): an
evaluator, a search context's ``measure``, an env's reward model. ``value=None`` follows the
actions without measuring anything: every new schedule is taken, at NaN GFLOPS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from looprl.actions.action_set import ActionSet, State

INVALID, MOVED, CHANGED, FAILED = "invalid", "moved", "changed", "failed"


@dataclass(frozen=True)
class Transition:
    """Where one action led: the state after it and that state's GFLOPS."""

    state: State
    gflops: float
    outcome: str  # "invalid", "moved", "changed" or "failed"
    measurement: object | None = None  # what ``value`` returned (a new schedule only)
    why: str | None = None  # why the action was invalid, or the failed measurement's error

    @property
    def valid(self) -> bool:
        """Whether the action applied (a failed schedule's action did; the state stayed)."""
        return self.outcome != INVALID

    @property
    def applied(self) -> bool:
        """Whether the state moved on (a cursor move or a new schedule taken)."""
        return self.outcome in (MOVED, CHANGED)

    @property
    def changed(self) -> bool:
        """Whether the schedule changed (a new schedule was taken)."""
        return self.outcome == CHANGED


def step(actions: ActionSet, state: State, gflops: float, action: int, value: Callable | None) -> Transition:
    """Apply ``action`` (an index into ``actions``) in ``state`` (whose speed is ``gflops``)."""
    following = actions.after(state, action)
    if isinstance(following, str):
        return Transition(state, gflops, INVALID, why=following)
    if not actions.is_structural(action):
        return Transition(following, gflops, MOVED)
    if value is None:
        return Transition(following, math.nan, CHANGED)
    measurement = value(following.nest)
    if not measurement.ok:
        return Transition(state, gflops, FAILED, measurement, measurement.error)
    return Transition(following, measurement.gflops, CHANGED, measurement)


def replay(actions: ActionSet, state: State, gflops: float, path: Iterable, value: Callable | None = None) -> list[Transition]:
    """The transitions of the actions ``path`` (indices or names of ``actions``) from ``state``,
    each from where the previous one left."""
    transitions = []
    for action in path:
        transition = step(actions, state, gflops, actions.as_index(action), value)
        transitions.append(transition)
        state, gflops = transition.state, transition.gflops
    return transitions


def reach(actions: ActionSet, state: State, path: Iterable) -> State:
    """The state ``path`` (indices or names) leads to from ``state`` under the rule, nothing
    measured: an action that cannot apply where it is taken leaves the state."""
    for transition in replay(actions, state, math.nan, path):
        state = transition.state
    return state


def follow(actions: ActionSet, state: State, path: Iterable) -> State | None:
    """The state ``path`` (indices or names) reaches from ``state`` without measuring, or None
    if one of its actions cannot apply where it is taken (a path that must replay exactly)."""
    for action in path:
        state = actions.apply(state, actions.as_index(action))
        if state is None:
            return None
    return state
