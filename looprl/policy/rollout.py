"""The one greedy rollout of a numpy :class:`~looprl.policy.Policy`, without Gymnasium or Ray.

Evaluation, validation during training, :func:`looprl.tune` and the experiments all run
:func:`greedy_rollout`. It moves by the env's one transition rule
(:func:`looprl.actions.step`: an action that cannot apply is a no-op, a cursor move measures
nothing, a schedule that fails to compile or run leaves the state as it was) and observes as
the env does (:func:`~looprl.env.observation.observation`).

A greedy policy is deterministic and its observation depends only on the state, so once a
state comes back the rest of the episode repeats: the rollout stops there and works out the
state the episode would end in (an invalid action, which changes nothing, is the shortest
such cycle). A rollout of a million steps therefore costs what its first cycle costs.
"""

from __future__ import annotations

import math

import numpy as np
from dataclasses import dataclass

from looprl import checks
from looprl.target import Target
from looprl.actions import ActionSet, State, step
from looprl.actions import replay
from looprl.actions.transition import FAILED
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.schedule_record import BestOf, ScheduleRecord
from looprl.policy.numpy_policy import Policy
from looprl.policy.retarget import retargeted
from looprl.search.context import BudgetExhausted


@dataclass(frozen=True)
class Rollout(BestOf):
    """One greedy episode: where it started, where it ended and the best state on the way.

    GFLOPS are NaN when the rollout ran without an evaluator (nothing measured)."""

    problem: Problem
    actions: tuple[str, ...]  # actions taken until the episode ended or its first cycle closed
    episode_length: int  # the episode length asked for (the env's name for it)
    initial_gflops: float
    final: ScheduleRecord  # the state after ``episode_length`` actions, its actions the shortest prefix of ``actions`` that reaches it
    best: ScheduleRecord  # the fastest state measured on the way (the initial one included)
    measured: int  # schedules compiled and timed (not found in the cache)
    failures: int  # structural actions refused because their schedule failed to compile or run
    stopped: str  # "length" (all actions taken), "cycle" (the rest repeats a cycle) or "budget" (a search's cap ran out)

    @property
    def final_nest(self) -> LoopNest:
        return self.final.nest

    @property
    def final_gflops(self) -> float:
        return self.final.gflops

    @property
    def final_actions(self) -> tuple[str, ...]:
        return self.final.actions

    @property
    def speedup(self) -> float:
        """Final over initial GFLOPS (the paper's protocol: the state the episode ends in)."""
        if not self.initial_gflops > 0:
            return math.nan
        return self.final_gflops / self.initial_gflops


def policy_actions(policy: Policy, target: Target | None = None) -> ActionSet:
    """The action set a policy was trained with (names checked against the metadata), its
    layout actions (if any) padding for ``target`` (default: the policy's own, else the host)."""
    meta = policy.metadata
    target = target if target is not None else policy.target or Target.default()
    actions = ActionSet.for_target(target, meta["split_factors"], meta["observation_shape"][0], layouts=bool(meta.get("layouts", False)),
                                   parallel=bool(meta.get("parallel", False)), plans=tuple(meta.get("plans", ())))
    if actions.names != policy.action_names:
        raise ValueError(f"policy actions {policy.action_names} do not match split factors {meta['split_factors']}")
    return actions


def greedy_rollout(
    policy: Policy,
    problem: Problem,
    evaluator,
    *,
    episode_length: int | None = None,
    use_mask: bool = False,
    excluded: frozenset[str] = frozenset(),
) -> Rollout:
    """Run ``policy`` greedily for ``episode_length`` actions (its training episode length by default)
    from ``problem``'s untiled nest, measuring every new schedule through ``evaluator`` (an
    :class:`Evaluator`, or a :class:`~looprl.search.context.SearchContext` whose memo and
    budget then apply: a :class:`~looprl.search.context.BudgetExhausted` raised by the root's
    measurement propagates, one raised later ends the rollout there, ``stopped="budget"``).

    ``evaluator=None`` follows the policy without measuring anything (every transition then
    succeeds, as nothing is compiled). ``use_mask`` restricts choices to valid actions;
    without it an invalid choice is a no-op, as in the env. ``excluded``: names of actions the
    episode never takes (its best other action instead)."""
    if episode_length is None:
        episode_length = policy.metadata["episode_length"]
    episode_length = checks.count(episode_length, "episode_length")
    actions = policy_actions(policy, evaluator.target if evaluator is not None else None)
    actions.check_fits(problem)
    allowed = np.array([name not in excluded for name in actions.names])
    measured = 0

    def value(nest: LoopNest):  # a state's schedule as compiled: its bfloat16 weight paired where the kernel can
        nonlocal measured
        measurement = evaluator.measure(with_pairs(nest, evaluator.target))
        measured += not measurement.from_cache
        return measurement

    state = State(initial_nest(problem), 0)
    gflops = value(state.nest).gflops if evaluator is not None else math.nan
    initial = gflops
    best_nest, best, best_length = state.nest, initial, 0
    history: list[tuple[State, float]] = [(state, gflops)]  # the state before each action
    seen = {state.key: 0}
    taken: list[str] = []
    failures = 0
    stopped = "length"
    for _ in range(episode_length):
        mask = actions.mask(state) & allowed if use_mask else (allowed if excluded else None)
        action = policy.act(policy.observe(state.nest, state.cursor, actions.max_loops), mask)
        taken.append(actions.names[action])
        try:
            transition = step(actions, state, gflops, action, value if evaluator is not None else None)
        except BudgetExhausted:  # a search's evaluation cap: the rollout ends where it ran out
            taken.pop()
            stopped = "budget"
            break
        failures += transition.outcome == FAILED
        state, gflops = transition.state, transition.gflops
        if transition.changed and gflops > best:
            best_nest, best, best_length = state.nest, gflops, len(taken)
        if len(taken) == episode_length:
            break
        if state.key in seen:
            stopped = "cycle"
            break
        seen[state.key] = len(history)
        history.append((state, gflops))
    final_index = len(taken)
    if stopped == "cycle":
        # history[start:] repeats from here on: the state after ``episode_length`` actions is the one
        # the cycle reaches after the remaining steps.
        start = seen[state.key]
        period = len(history) - start
        final_index = start + (episode_length - start) % period
        state, gflops = history[final_index]
    return Rollout(
        problem=problem,
        actions=tuple(taken),
        episode_length=episode_length,
        initial_gflops=initial,
        final=ScheduleRecord(state.nest, gflops, tuple(taken[:final_index]), "policy", actions.target, 1),
        best=ScheduleRecord(best_nest, best, tuple(taken[:best_length]), "rollout", actions.target, 1),
        measured=measured,
        failures=failures,
        stopped=stopped,
    )


def greedy_schedules(policy: Policy, problem: Problem, target: Target | None = None) -> list[LoopNest]:
    """The distinct schedules one greedy episode of ``policy`` on ``problem`` passes through,
    nothing measured (the episode's end first, then back towards its start; the untuned nest
    left out); then, for a policy with plan actions, the other plans that apply to the untuned
    nest, in the order of the policy's scores there (its ranking of whole schedules)."""
    actions = policy_actions(policy, target)
    rollout = greedy_rollout(policy, problem, None)
    root = State(initial_nest(problem), 0)
    transitions = replay(actions, root, math.nan, rollout.final_actions)
    passed = {t.state.nest.key: t.state.nest for t in transitions if t.valid}
    passed.pop(root.nest.key, None)
    schedules = list(reversed(list(passed.values())))
    if actions.plans:
        scores = policy.scores(policy.observe(root.nest, 0, actions.max_loops))
        for index in sorted(actions.applicable_plans(root), key=lambda index: -scores[index]):
            nest = actions.apply(root, index).nest
            if nest.key not in passed:
                passed[nest.key] = nest
                schedules.append(nest)
    return schedules


@dataclass(frozen=True)
class PolicyPrior:
    """A search's prior from a trained policy: ``prior(problem)`` is
    :func:`greedy_schedules` (what AutoTVM's first batch measures instead of random schedules:
    a plan policy's greedy episode, then its other plans as it ranks them). A plan policy made
    for another ISA than ``target`` ranks ``target``'s plans, each mapped from its counterpart
    (:func:`~looprl.policy.retarget.retargeted`), as in :func:`looprl.tune`."""

    policy: Policy
    target: Target | None = None

    def __call__(self, problem: Problem) -> list[LoopNest]:
        policy = self.policy if self.target is None else retargeted(self.policy, self.target)
        return greedy_schedules(policy, problem, self.target)


def measured_path(problem: Problem, names, evaluator: Evaluator, actions: ActionSet | None = None) -> list[float]:
    """GFLOPS of the initial state and after each action of ``names``, under the env's rules
    (:func:`looprl.actions.step`). Without ``actions``: the default action set plus any other
    ``split_<f>`` in ``names`` (tune's tiles may split by a target's tile rows)."""
    if actions is None:
        actions = ActionSet.covering(names, target=evaluator.target)

    def value(nest: LoopNest):  # a state's schedule as compiled: its bfloat16 weight paired where the kernel can
        return evaluator(with_pairs(nest, evaluator.target))

    state = State(initial_nest(problem), 0)
    gflops = value(state.nest).gflops
    return [gflops] + [t.gflops for t in replay(actions, state, gflops, names, value)]
