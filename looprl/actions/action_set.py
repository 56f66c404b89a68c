"""LoopTune's actions as data, and the set of them an env, a search or a policy acts with.

A state is a schedule (:class:`~looprl.ir.nest.LoopNest`) and a cursor: an index into
:attr:`LoopNest.loops` (depth-first: compute loops, then write-back loops). The actions:

* ``up`` / ``down``: move the cursor to the previous / next loop;
* ``swap_up`` / ``swap_down``: exchange the cursor loop with the loop above / below it in the
  same nest; the cursor follows the loop it was on;
* ``split_<f>``: split the cursor loop (size s) into an outer loop of ``s // f`` iterations
  plus a tail and an inner loop of ``f``; the cursor stays on the outer loop.

With ``layouts=True`` two data-layout actions follow (ALT's primitives, cursor-local):

* ``pack``: tile every input the cursor's compute loop walks by that loop's step (for a loop
  of step 1: by the step of the enclosing loop of its dimension, the tile it walks), the new
  outer piece outermost and the tile innermost (:meth:`Layout.pack`: ALT's tiling template,
  e.g. B[k, n] packed by a loop of step 16 becomes B[n/16, k, 16]);
* ``pad``: pad the cursor loop's dimension, in every tensor where it is not the outermost
  physical dimension, to a multiple of ``pad_multiple`` (the target's vector width).

With ``parallel=True`` (an env or search on more than one thread) one more action follows:

* ``parallel``: mark the cursor loop parallel (:meth:`LoopNest.parallel`: a loop over an
  output dimension, no other parallel loop in its nest); the cursor stays.

``stage`` and ``prefetch_<bytes>`` (the right operand staged, or prefetched that many bytes
ahead, at the cursor's loop), then ``ksplit`` (the cursor loop, over a reduction, divided among
the threads with partial sums: :meth:`LoopNest.ksplit`) and ``spill`` (the output tile stored and
reloaded at each iteration of the cursor's reduction loop: :meth:`LoopNest.spill`) come last, only
in a set made with them (``stages``, ``prefetches``, ``ksplit``, ``spills``) or extended by a path
that names them: never in the env's (tune proposes split-k teams after its search,
:mod:`looprl.search.ksplit`, and spilled streaming tiles among its tiles, :mod:`looprl.search.streams`).

With ``plans`` (names of :class:`~looprl.ir.plans.Plan`, e.g. all of
:func:`~looprl.ir.plans.plan_catalogue` for the target) one action per plan comes last:

* ``plan_<rows>x<vectors>[_k<block>][_pack]``, ``plan_stream_<k>x<columns>``: replace the
  schedule by the plan's (:func:`~looprl.ir.plans.plan_nest`: built from the untiled nest,
  whatever the state), the cursor on the first loop. It cannot apply where the problem has no
  such plan, where the schedule already is the plan's, or past ``max_loops``.

Every action but a cursor move is a name for schedule steps (:class:`~looprl.ir.step.Step`)
relative to the cursor: a swap, a split and ``parallel`` one step each, ``pack`` and ``pad`` one
layout step per tensor they change, a plan its plan's steps from the untiled nest. The actions
themselves, their names and the steps they take are data of :mod:`looprl.ir.action` (the one
place that writes and reads action names), so a path of names replays to steps without an
action set (:func:`~looprl.ir.action.action_steps`).

An action that cannot apply (moving past either end, a swap :meth:`LoopNest.why_not_swap`
refuses, a factor larger than the loop, a split that would exceed ``max_loops``, or a layout
action that changes no tensor) is invalid: :meth:`ActionSet.why_not` says why,
:meth:`ActionSet.apply` returns None. What a caller then does (keep the state) is the one
transition rule of :mod:`looprl.actions.transition`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from looprl import checks, defaults
from looprl.ir.action import (  # noqa: F401  (the action names' one place, re-exported)
    DEFAULT_PAD_MULTIPLE, KINDS, LAYOUT_ACTIONS, MOVES, PLAN, STEP_ACTIONS, SWAPS, Action, pad_multiple,
)
from looprl.ir.step import KSPLIT, PREFETCH, SPILL, STAGE
from looprl.ir.nest import LoopNest
from looprl.ir.plans import Plan, plan_catalogue, planned
from looprl.ir.problem import Problem
from looprl.ir.step import MAX_FACTOR, MIN_FACTOR, PARALLEL, SPLIT

PLANS_REMEMBERED = 4096  # plan schedules (or reasons) an action set keeps, per problem and plan


def plans_named(names) -> list[str]:
    """The names of the plan actions among ``names``, in order."""
    return [action.name for action in map(Action.parse, names) if action is not None and action.kind == PLAN]


def _plan_names(plans) -> tuple[str, ...]:
    """``plans`` (plan names) checked: known, distinct."""
    if isinstance(plans, (str, bytes)) or not hasattr(plans, "__iter__"):
        raise ValueError(f"plans must be a sequence of plan names, got {plans!r}")
    names = tuple(plans)
    for name in names:
        plan = Plan.parse(name)
        if plan is None or plan.name != name:
            raise ValueError(f"unknown plan {name!r}: plans are named like plan_6x2, plan_6x2_k256_pack or plan_stream_8x64")
    if len(set(names)) != len(names):
        raise ValueError(f"plans must be distinct, got {names}")
    return names


def split_factors_named(names) -> list[int]:
    """The factors of the ``split_<f>`` actions among ``names``."""
    return [action.factor for action in map(Action.parse, names) if action is not None and action.kind == SPLIT]


@dataclass(frozen=True)
class State:
    """A schedule and the loop the cursor is on."""

    nest: LoopNest
    cursor: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.nest.key, self.cursor)

    def at(self, cursor: int) -> "State":
        """The same schedule with the cursor on loop ``cursor``."""
        return State(self.nest, cursor)


class ActionSet:
    """The discrete actions for a given set of split factors and loop bound: ``actions[i]`` is
    what the agent's action ``i`` does."""

    def __init__(
        self, split_factors=defaults.SPLIT_FACTORS, max_loops: int = defaults.MAX_LOOPS, layouts: bool = False,
        pad_multiple: int = DEFAULT_PAD_MULTIPLE,
        parallel: bool = False, plans=(), target=None, stages: bool = False, prefetches=(), ksplit: bool = False,
        spills: bool = False,
    ):
        if isinstance(split_factors, (str, bytes)) or not hasattr(split_factors, "__iter__"):
            raise ValueError(f"split_factors must be a sequence of integers, got {split_factors!r}")
        factors = tuple(checks.integer(factor, "split factor", MIN_FACTOR, MAX_FACTOR) for factor in split_factors)
        if not factors:
            raise ValueError("split_factors must not be empty")
        if len(set(factors)) != len(factors):
            raise ValueError(f"split factors must be distinct, got {factors}")
        self.split_factors = factors
        self.max_loops = checks.positive_int(max_loops, "max_loops")
        self.layouts = checks.flag(layouts, "layouts")
        self.pad_multiple = checks.integer(pad_multiple, "pad_multiple", minimum=2)
        self.parallel = checks.flag(parallel, "parallel")
        self.stages = checks.flag(stages, "stages")  # the stage action: the right operand staged at the cursor's loop (last)
        # the prefetch_<bytes> actions: the right operand prefetched that far ahead at the cursor's loop (last)
        self.prefetches = tuple(dict.fromkeys(checks.positive_int(ahead, "prefetch distance") for ahead in prefetches))
        self.ksplit = checks.flag(ksplit, "ksplit")  # the ksplit action: the cursor's reduction loop on the threads (last)
        self.spills = checks.flag(spills, "spills")  # the spill action: the output tile spilled at the cursor's reduction loop (last)
        self.plans = _plan_names(plans)
        if self.plans and target is None:
            raise ValueError("plan actions need the target whose register tiles they name")
        self.target = target
        self.actions: tuple[Action, ...] = (
            tuple(Action(kind) for kind in MOVES + SWAPS)
            + tuple(Action(SPLIT, f) for f in self.split_factors)
            + (tuple(Action(kind) for kind in LAYOUT_ACTIONS) if self.layouts else ())
            + ((Action(PARALLEL),) if self.parallel else ())
            + tuple(Action(PLAN, plan=Plan.parse(name)) for name in self.plans)
            + ((Action(STAGE),) if self.stages else ())
            + tuple(Action(PREFETCH, ahead) for ahead in self.prefetches)
            + ((Action(KSPLIT),) if self.ksplit else ())
            + ((Action(SPILL),) if self.spills else ())
        )
        self.names = tuple(action.name for action in self.actions)
        self._planned: dict = {}

    @classmethod
    def for_target(
        cls, target, split_factors=defaults.SPLIT_FACTORS, max_loops: int = defaults.MAX_LOOPS, layouts: bool = False, parallel: bool = False,
        plans=(),
    ) -> "ActionSet":
        """The env's action set on ``target``: ``pad`` pads to a multiple of its vector width;
        ``plans``: plan names, or True for every plan of the target
        (:func:`~looprl.ir.plans.plan_catalogue`)."""
        if plans is True:
            plans = tuple(plan.name for plan in plan_catalogue(target))
        elif plans is False:
            plans = ()
        return cls(split_factors, max_loops, layouts=layouts, pad_multiple=pad_multiple(target), parallel=parallel,
                   plans=plans, target=target)

    @classmethod
    def covering(cls, names, split_factors=defaults.SPLIT_FACTORS, max_loops: int = defaults.MAX_LOOPS, target=None) -> "ActionSet":
        """``split_factors``' action set plus a ``split_<f>`` action for every other factor
        named in ``names``, the layout actions (for ``target``) if ``names`` has one, the
        parallel action if it is named and the plans named: the actions that replay a path of
        ``looprl.tune``, whose tiles may split by a target's tile rows."""
        base = cls(split_factors, max_loops) if target is None else cls.for_target(target, split_factors, max_loops)
        return base.extended(names)

    def with_splits(self, factors) -> "ActionSet":
        """This action set plus a ``split_<f>`` for each of ``factors`` it lacks, after its own
        splits: the moves, swaps and splits keep their indices, the layout actions (if any)
        follow the new splits. Map actions between the two sets by name."""
        extra = tuple(f for f in dict.fromkeys(factors) if f not in self.split_factors)
        if not extra:
            return self
        return ActionSet(self.split_factors + extra, self.max_loops, self.layouts, self.pad_multiple, self.parallel, self.plans, self.target,
                         self.stages, self.prefetches, self.ksplit, self.spills)

    def extended(self, names) -> "ActionSet":
        """This action set plus what replaying ``names`` needs: a ``split_<f>`` for each factor
        named that it lacks (after its own splits), the layout actions if ``pack`` or ``pad`` is
        named, the parallel action if it is, the stage action if it is, each ``prefetch_<bytes>``
        named, the ksplit and spill actions if they are and each plan named that it lacks (plans need a set
        made for a target). Moves, swaps and its own splits keep their indices."""
        names = list(names)
        extended = self.with_splits(split_factors_named(names))
        layouts = extended.layouts or any(n in LAYOUT_ACTIONS for n in names)
        parallel = extended.parallel or PARALLEL in names
        plans = extended.plans + tuple(p for p in dict.fromkeys(plans_named(names)) if p not in extended.plans)
        stages = extended.stages or STAGE in names
        named = [action.factor for action in map(Action.parse, names) if action is not None and action.kind == PREFETCH]
        prefetches = extended.prefetches + tuple(a for a in dict.fromkeys(named) if a not in extended.prefetches)
        ksplit = extended.ksplit or KSPLIT in names
        spills = extended.spills or SPILL in names
        if (layouts, parallel, plans, stages, prefetches, ksplit, spills) != (extended.layouts, extended.parallel, extended.plans,
                                                                              extended.stages, extended.prefetches, extended.ksplit,
                                                                              extended.spills):
            extended = ActionSet(extended.split_factors, extended.max_loops, layouts, extended.pad_multiple, parallel, plans,
                                 extended.target, stages, prefetches, ksplit, spills)
        return extended

    def __len__(self) -> int:
        return len(self.actions)

    def as_index(self, action) -> int:
        """An action given by name or by index, as its index."""
        return self.index(action) if isinstance(action, str) else self.validate(action)

    def named(self, path) -> tuple[str, ...]:
        """The names of the actions ``path`` (indices into this set), in order: how a path is
        written down (records, demonstrations)."""
        return tuple(self.names[self.validate(action)] for action in path)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown action {name!r}; actions are {', '.join(self.names)}") from None

    def is_structural(self, action: int) -> bool:
        """Whether the action changes the schedule (and so needs a measurement)."""
        return not self.actions[self.validate(action)].is_move

    def why_not(self, state: State, action: int) -> str | None:
        """Why ``action`` cannot apply in ``state`` (checked without building the nest a step
        action makes), or None if it applies."""
        found = self._next(state, action, build=False)
        return found if isinstance(found, str) else None

    def can_apply(self, state: State, action: int) -> bool:
        """Whether ``action`` applies in ``state``."""
        return self.why_not(state, action) is None

    def apply(self, state: State, action: int) -> State | None:
        """The state after ``action``, or None when the action cannot apply."""
        found = self.after(state, action)
        return None if isinstance(found, str) else found

    def after(self, state: State, action: int) -> State | str:
        """The state after ``action`` in ``state``, or why it cannot apply (a string): the one
        rule asked once, for a caller that needs the reason as well as the state."""
        return self._next(state, action, build=True)

    def applicable_plans(self, state: State) -> list[int]:
        """The indices of the plan actions that apply in ``state``, in the set's order."""
        return [index for index, action in enumerate(self.actions) if action.kind == PLAN and self.can_apply(state, index)]

    def _next(self, state: State, action: int, build: bool) -> State | str:
        """The one rule of what ``action`` does in ``state``: the state after it, or why it
        cannot apply. A plan's schedule is remembered per problem (an episode asks for every
        plan's mask at each step); a layout action takes its steps (:meth:`Action.layout_steps`);
        with ``build`` False a step action's nest is checked, not built (the state returned then
        keeps ``state``'s nest: :meth:`why_not` reads only the reason)."""
        act = self.actions[self.validate(action)]
        nest, cursor = state.nest, state.cursor
        if act.kind == "up" and cursor == 0:
            return "the cursor is on the first loop"
        if act.kind == "down" and cursor + 1 >= len(nest):
            return "the cursor is on the last loop"
        if act.kind == PLAN:
            key = (nest.problem, act.plan)
            after = self._planned.get(key)
            if after is None:
                after = planned(nest.problem, self.target, act.plan)
                if not isinstance(after, str) and len(after) > self.max_loops:
                    after = f"{act.plan.name} makes {len(after)} loops, more than max_loops={self.max_loops}"
                if len(self._planned) > PLANS_REMEMBERED:
                    self._planned.clear()
                self._planned[key] = after
            if isinstance(after, str):
                return after
            if after.key == nest.key:
                return f"the schedule already is {act.name}'s"
        elif act.kind in LAYOUT_ACTIONS:
            steps = Action(act.kind).layout_steps(nest, cursor, self.pad_multiple)
            if not steps:
                return f"{act.kind} changes no tensor here"
            after = nest.apply(steps) if build else nest
        elif act.kind in MOVES:
            after = nest
        else:
            if act.kind == SPLIT and len(nest) + 1 > self.max_loops:
                return f"a split would make more than max_loops={self.max_loops} loops"
            step = act.step(cursor)
            reason = nest.why_not(step)
            if reason is not None:
                return reason
            after = nest.apply((step,)) if build else nest
        return State(after, act.cursor_after(cursor))

    def moves(self, start: int, cursor: int) -> tuple[int, ...]:
        """The cursor moves (action indices) from loop ``start`` to loop ``cursor``."""
        move = self.index("up" if cursor < start else "down")
        return (move,) * abs(start - cursor)

    def path(self, state: State, steps) -> tuple[tuple[int, ...], State] | None:
        """The actions that carry out the IR ``steps`` (:class:`~looprl.ir.step.Step`, as
        :meth:`LoopNest.apply` takes them) from ``state``: for each, cursor moves to the loop
        an action taking it must start from (:meth:`Action.taking`), the nearest where there
        are two (a swap: ``swap_down`` from loop i or ``swap_up`` from i + 1), then that action.
        Returns the actions and the state reached, or None when a step has no action here (a
        merge, a factor outside this set, a split past ``max_loops``)."""
        path: list[int] = []
        for step in steps:
            taking = [(act, at) for act, at in Action.taking(step) if act.name in self.names]
            if not taking:
                return None
            act, index = min(taking, key=lambda pair: abs(state.cursor - pair[1]))
            action = self.names.index(act.name)
            path += self.moves(state.cursor, index)
            following = self.apply(state.at(index), action)
            if following is None:
                return None
            path.append(action)
            state = following
        return tuple(path), state

    def mask(self, state: State) -> np.ndarray:
        """int8 array: 1 for each action that applies in ``state``."""
        return np.array([self.can_apply(state, a) for a in range(len(self))], dtype=np.int8)

    def fits(self, problem: Problem) -> bool:
        """Whether ``problem``'s untiled nest has at most ``max_loops`` loops."""
        return len(problem.dims) + len(problem.output) <= self.max_loops

    def check_fits(self, problem) -> None:
        """Refuse a problem whose untiled nest already has more than ``max_loops`` loops."""
        if not isinstance(problem, Problem):
            raise ValueError(f"expected a Problem, got {type(problem).__name__}")
        if not self.fits(problem):
            loops = len(problem.dims) + len(problem.output)
            raise ValueError(f"problem {problem.name} starts with {loops} loops, more than max_loops={self.max_loops}")

    def validate(self, action) -> int:
        """``action`` as an int: a Python or numpy integer (a 0-d array included), not a bool."""
        return checks.integer(action, "action", 0, len(self) - 1)
