"""Tune's proposers: what the policy (and the searches it guides) propose for a problem. They
only propose schedules, as records with the action path to each; the measurer times them
(directly, or through a search context that measures within a budget) and the winner rule
(:mod:`looprl.tune.winner`) decides.

* :class:`PolicyProposer` holds the policy made ready for the target (loaded, mapped to the
  target's plans, checked against the problem), its action set and episode length, and gives
  the policy alone's proposals (:meth:`~PolicyProposer.alone`: the fast path) and the measured
  search's stages: the rollout (:meth:`~PolicyProposer.rollout_stage`), the register tiles
  refined (:func:`tiles_stage`) and the policy-guided search (:meth:`~PolicyProposer.guided_stage`).
* The in-place search's dot-product tiles: :func:`looprl.search.dots.dot_proposals`; the
  teams: :mod:`looprl.tune.teams`.

The environment has no stop action: a trained policy that is content with a schedule picks an
action that cannot apply (a no-op there) and, being greedy, would pick it again and again.
The rollout sees that cycle (as any other) and stops.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

from looprl.actions import ActionSet, State, replay
from looprl.ir.plans import Plan
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import tile_of
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.policy.guided import guided_search
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.policy.retarget import retargeted
from looprl.policy.rollout import Rollout, greedy_rollout, policy_actions
from looprl.search.context import BudgetExhausted, Node
from looprl.search.staged import Stage, StagedSearch
from looprl.search.tiles import packed_path, tile_contenders
from looprl.target import Target

_warned_mismatch: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class PolicyProposer:
    """A policy's proposals: ``policy``, its ``actions`` (for the target tuned for) and the
    ``episode_length`` of its greedy episodes (None: its training episode length)."""

    policy: Policy
    actions: ActionSet
    episode_length: int | None = None

    @classmethod
    def prepared(cls, policy, target: Target, searched: Problem, episode_length: int | None) -> "PolicyProposer":
        """``policy`` (a :class:`Policy`, ``"default"`` or a folder) loaded for ``target`` (the
        weights policy where ``searched``'s right operand is a weight), a policy made for another
        ISA acting with this target's plans (each mapped from its counterpart, with a warning),
        and its actions checked against ``searched`` before anything is measured."""
        loaded = load_policy(policy, target, weights="in1" in searched.constant, dtype=searched.dtype)
        _warn_if_made_for_another_target(loaded, target)
        loaded = retargeted(loaded, target)  # another ISA's plans would spill here: this target's, each from its counterpart
        actions = policy_actions(loaded, target)
        actions.check_fits(searched)
        return cls(loaded, actions, episode_length)

    @classmethod
    def of(cls, policy: Policy, target: Target, episode_length: int | None) -> "PolicyProposer":
        """A loaded policy's proposals for ``target``, as they are."""
        return cls(policy, policy_actions(policy, target), episode_length)

    def episode(self, problem: Problem, observe=None, excluded: frozenset[str] = frozenset()) -> Rollout:
        """The policy's greedy episode on ``problem`` (measured through ``observe``, if given),
        never taking one of ``excluded``."""
        return greedy_rollout(self.policy, problem, observe, episode_length=self.episode_length, excluded=excluded)

    def alone(self, problem: Problem, pairs: bool, excluded: frozenset[str] = frozenset()) -> list[ScheduleRecord]:
        """The policy alone's proposals (unmeasured: speed NaN), in the order they are timed:
        the state its greedy episode ends in. For a bfloat16 problem whose weight its kernels
        pair (``pairs``: :func:`~looprl.backend.pairs.pairs_a_weight`), re-laying allowed, also that state
        with the weight packed into panels of its tile and, where the answer is a dot-product
        tile, the greedy episode without dot-product tiles (packed too): the shipped policies
        learnt on float32, where a weight re-laid whole streams as fast as in panels and few-row
        dot products compete with register tiles; in bfloat16 a paired register tile computes at
        twice the rate. At most four proposals."""
        rollout = self.episode(problem, excluded=excluded)
        proposals = [ScheduleRecord(rollout.final_nest, math.nan, tuple(rollout.final_actions))]
        if not pairs or "pack" in excluded:
            return proposals
        paths = [proposals[0].actions]
        dots = frozenset(name for name in self.actions.names if (plan := Plan.parse(name)) is not None and plan.dot)
        if dots & set(paths[0]):
            tiled = self.episode(problem, excluded=excluded | dots)
            if tiled.final_nest != rollout.final_nest:
                proposals.append(ScheduleRecord(tiled.final_nest, math.nan, tuple(tiled.final_actions)))
                paths.append(tuple(tiled.final_actions))
        for path in paths:
            packed = packed_path(problem, path, self.actions)
            if packed is not None:
                proposals.append(ScheduleRecord(packed[1].nest, math.nan, packed[0]))
        return proposals

    def rollout_stage(self, untuned: Node, rollouts: list[Rollout]) -> Stage:
        """The measured search's first stage, measured whole whatever the budget: the policy's
        own answer (the state its greedy episode ends in, followed without measuring and timed
        at once, so that a trained policy's answer is in hand after two measurements whatever
        the cap; the measured rollout then finds it in the memo), then its greedy rollout
        measured state by state (appended to ``rollouts``). ``untuned``: the context's root;
        the problem is the context's."""

        def propose(context):
            ahead = self.episode(context.problem)
            found = []
            if ahead.final_nest.key != untuned.state.nest.key:
                try:
                    node = context.visit(ahead.final_nest)
                except BudgetExhausted:
                    node = None
                if node is not None:
                    path = _applied(self.actions, untuned.state, ahead.final_actions)
                    found.append(replace(ahead.final, gflops=node.gflops, actions=path))
            rollout = self.episode(context.problem, context)
            rollouts.append(rollout)
            return found + [rollout.best]

        return Stage("rollout", propose, share=math.inf)

    def guided_stage(self, search: StagedSearch) -> Stage:
        """The policy-guided search (:func:`~looprl.policy.guided.guided_search`) from the best
        schedule so far; tiles may split by the target's register-tile rows (e.g. ``split_6``
        on AVX2) even where the policy has no such action."""

        def propose(context):
            best = search.best()
            rows = tuple(rows for rows, _ in search.target.register_tiles())
            return [guided_search(self.policy, context, start=(best.actions, best.gflops), tile_rows=rows).best]

        return Stage("guided", propose)


def tiles_stage(actions: ActionSet, lead, refinements: int, within: float = 1.0, most: int = 1) -> Stage:
    """The register tile ``lead`` (the rollout's), then the target's own register tiles (a
    rollout may build none, or a one-row tile on a decode GEMM), refined: canonical order,
    cache blocks, packed (:func:`~looprl.search.tiles.measure_tiles`); ``refinements`` new
    measurements whatever the stages before took; the stage's runners-up within ``within`` of
    its fastest too, ``most`` schedules in all (:func:`~looprl.search.tiles.tile_contenders`)."""

    def propose(context):
        found, _ = tile_contenders(context, actions, lead=tile_of(lead), within=within, most=most)
        return found

    return Stage("tiles", propose, refinements=refinements, from_best=True)


def _applied(actions: ActionSet, start: State, names) -> tuple[str, ...]:
    """``names`` (a greedy episode's actions from ``start``, the untuned nest with the cursor on
    loop 0) without those that did nothing where they were taken."""
    transitions = replay(actions, start, math.nan, names)
    return tuple(name for name, transition in zip(names, transitions) if transition.valid)


def _warn_if_made_for_another_target(policy: Policy, target: Target) -> None:
    made_for = policy.target
    if made_for is None or made_for.isa == target.isa:
        return
    pair = (made_for.isa, target.isa)
    if pair not in _warned_mismatch:
        _warned_mismatch.add(pair)
        warnings.warn(
            f"the policy was trained for {made_for.isa}, tuning for {target.isa}: its plans (if any) are mapped to {target.isa}'s "
            f"and its proposals refined by measurement (looprl-train --adapt fits it to this target)",
            RuntimeWarning,
            stacklevel=4,
        )
