"""Greedy episodes of a numpy :class:`~looprl.policy.Policy`, without Gymnasium or Ray.

The transitions and observations are the environment's own (:class:`~looprl.actions.ActionSet`
and :func:`~looprl.features.observation`), so an episode here is the episode
``LoopNest-v0`` would run with the same actions; only the bookkeeping is lighter, which keeps
:func:`looprl.tune` well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from .actions import ActionSet, State
from .evaluator import Evaluator
from .features import observation
from .nest import LoopNest
from .policy import Policy
from .problem import Problem


@dataclass(frozen=True)
class Episode:
    """One greedy episode: where it started, where it ended and the best state on the way."""

    problem: Problem
    actions: tuple[str, ...]
    initial_gflops: float
    final_nest: LoopNest
    final_gflops: float
    best_nest: LoopNest
    best_gflops: float
    measured: int  # states compiled and timed (not found in the cache)

    @property
    def speedup(self) -> float:
        return self.final_gflops / self.initial_gflops if self.initial_gflops > 0 else float("nan")


def policy_actions(policy: Policy) -> ActionSet:
    """The action set a policy was trained with (names checked against the metadata)."""
    meta = policy.metadata
    actions = ActionSet(meta["split_factors"], meta["observation_shape"][0])
    if actions.names != policy.action_names:
        raise ValueError(f"policy actions {policy.action_names} do not match split factors {meta['split_factors']}")
    return actions


def greedy_episode(
    policy: Policy,
    problem: Problem,
    evaluator: Evaluator,
    episode_length: int | None = None,
    use_mask: bool = True,
) -> Episode:
    """Run ``policy`` greedily for ``episode_length`` actions (the policy's training length by
    default) from ``problem``'s untiled nest, measuring every new schedule on the way.
    ``use_mask`` restricts choices to valid actions (without it an invalid choice is a no-op,
    as in the env)."""
    actions = policy_actions(policy)
    length = int(episode_length if episode_length is not None else policy.metadata["episode_length"])
    normalized = policy.metadata["observation"] == "normalized"
    state = State(problem.initial_nest(), 0)
    before = evaluator.compiled
    initial = _gflops(evaluator, state.nest)
    best_nest, best = state.nest, initial
    taken = []
    for _ in range(length):
        obs = observation(state.nest, state.cursor, actions.max_loops, normalized)
        action = policy.act(obs, actions.mask(state) if use_mask else None)
        taken.append(actions.names[action])
        following = actions.apply(state, action)
        if following is None:
            # A no-op leaves the observation as it was, so the greedy policy would repeat it
            # for the rest of the episode.
            taken.extend([taken[-1]] * (length - len(taken)))
            break
        if following.nest is not state.nest:
            value = _gflops(evaluator, following.nest)
            if value > best:
                best_nest, best = following.nest, value
        state = following
    final = _gflops(evaluator, state.nest)
    if final > best:
        best_nest, best = state.nest, final
    return Episode(problem, tuple(taken), initial, state.nest, final, best_nest, best, evaluator.compiled - before)


def _gflops(evaluator: Evaluator, nest: LoopNest) -> float:
    """GFLOPS, or 0 for a schedule that failed (it is then never the best)."""
    return evaluator(nest).gflops
