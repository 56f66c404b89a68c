"""The tile planner's demonstrations: for one problem, the fastest of the register tiles (or,
with plan actions, the plans) an episode's actions can build, measured, as the env actions that
reach it; a searched schedule's path replayed in an agent's actions; and the (observation,
action) pairs along a demonstration's path.

What a demonstration is for, and how expert iteration gathers them, is
:mod:`looprl.train.demonstrations`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from looprl.actions import ActionSet, State, replay, step
from looprl.env.observation import observation
from looprl.ir.nest import initial_nest
from looprl.ir.plans import Plan
from looprl.ir.problem import Problem
from looprl.ir.register_tiles import tile_shapes, tile_steps, why_not_tile
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.pair_steps import with_pairs
from looprl.tune.winner import in_place_rows


@dataclass(frozen=True)
class Demonstration:
    """The schedule one problem's policy is taught: the env actions (indices into an
    :class:`~looprl.actions.ActionSet`) that reach it, and the GFLOPS measured of it and of the
    untuned nest."""

    problem: Problem
    actions: tuple[int, ...]  # the path to the best tile (empty: no tile beat the untuned nest)
    gflops: float  # of the state the path reaches
    initial_gflops: float


def candidate_tiles(problem: Problem, actions: ActionSet, target) -> list[tuple[int, int]]:
    """(rows, columns) tiles for ``problem`` that ``actions`` can build: the target's register
    tiles plus every pair of the action set's factors (rows up to 16, columns a multiple of
    the vector width) whose accumulators, input row and broadcast fit the register file."""
    lanes = target.vector_width
    out = problem.output
    if len(out) < 2 or not problem.reduction_dims:
        return []
    row_size, col_size = problem.size(out[-2]), problem.size(out[-1])
    factors = set(actions.split_factors)
    tiles = list(tile_shapes(problem, target))
    for rows in sorted(f for f in factors | {1} if f <= 16):
        for columns in sorted(f for f in factors if f % lanes == 0):
            vectors = columns // lanes
            if target.fits(rows, vectors):
                tiles.append((min(rows, row_size), min(columns, col_size)))
    return list(dict.fromkeys(tiles))


# With plan actions, a plan within this fraction of the fastest plan's GFLOPS counts as as fast:
# the demonstration is then the first such plan in the action set's order (the catalogue's: most
# accumulators first, flat before blocked, unpacked before packed), not the one that won a
# single noisy timing, so that neighbouring problems get the same label for the same reason.
PLAN_NEAR_TIE = 0.03


def _value(evaluator: Evaluator, nest):
    """The measurement of a state's schedule as compiled: its bfloat16 weight paired where the
    kernel for the evaluator's target can take pairs."""
    return evaluator(with_pairs(nest, evaluator.target))


def demonstrate(problem: Problem, actions: ActionSet, evaluator: Evaluator, episode_length: int) -> Demonstration:
    """Measure ``problem``'s candidate tiles that fit an episode and return the fastest. With
    plan actions (:mod:`looprl.ir.plans`), the candidates are the plans (one action each), and
    the first of those within :data:`PLAN_NEAR_TIE` of the fastest is returned."""
    if actions.plans:
        return _demonstrate_plan(problem, actions, evaluator)
    root = State(initial_nest(problem), 0)
    initial = _value(evaluator, root.nest).gflops
    best: tuple[float, tuple[int, ...]] = (initial, ())
    for rows, columns in candidate_tiles(problem, actions, evaluator.target):
        if why_not_tile(problem, rows, columns) is not None:
            continue
        planned = actions.path(root, tile_steps(problem, rows, columns))
        if planned is None or len(planned[0]) >= episode_length:
            continue  # a factor outside the action set, or too long to leave a step to stay
        path, state = planned
        measurement = _value(evaluator, state.nest)
        if measurement.ok and measurement.gflops > best[0]:
            best = (measurement.gflops, path)
    return Demonstration(problem, best[1], best[0], initial)


def reads_weight_as_stored(problem: Problem) -> bool:
    """Whether ``problem`` is a weight read where it lies: its right operand constant and
    stored with the reduction last, as ``nn.Linear`` holds it (the problem tune searches in
    place). Its demonstrations are plans that read it so, never one that packs it: a packed
    copy is what the twin is for, and a model whose weights change would have to keep such a
    copy in step (tune's in-place search packs nothing either)."""
    return "in1" in problem.constant and in_place_rows(problem, None)  # the layout tune searches in place, any rows


def plan_values(problem: Problem, actions: ActionSet, evaluator: Evaluator) -> dict[int, float]:
    """The measured GFLOPS of each plan action that applies to ``problem``'s untiled nest
    (action index -> GFLOPS; plans that make the same schedule are measured once); for a
    weight read as stored (:func:`reads_weight_as_stored`), the plans that do not pack it."""
    root = State(initial_nest(problem), 0)
    values: dict[int, float] = {}
    by_schedule: dict[str, float] = {}
    as_stored = reads_weight_as_stored(problem)
    for index in actions.applicable_plans(root):
        if as_stored and Plan.parse(actions.names[index]).packed:
            continue
        nest = actions.apply(root, index).nest
        if nest.key not in by_schedule:
            measurement = _value(evaluator, nest)
            by_schedule[nest.key] = measurement.gflops if measurement.ok else 0.0
        values[index] = by_schedule[nest.key]
    return values


def _demonstrate_plan(problem: Problem, actions: ActionSet, evaluator: Evaluator) -> Demonstration:
    initial = _value(evaluator, initial_nest(problem)).gflops
    values = plan_values(problem, actions, evaluator)
    fastest = max(values.values(), default=0.0)
    if not fastest > initial:
        return Demonstration(problem, (), initial, initial)
    chosen = next(index for index, gflops in values.items() if gflops >= (1 - PLAN_NEAR_TIE) * fastest)
    return Demonstration(problem, (chosen,), values[chosen], initial)


def replayed_path(problem: Problem, actions: ActionSet, names, episode_length: int, reaches: str) -> tuple[int, ...] | None:
    """``names`` (a path a search found) as indices of ``actions``, the actions that do nothing
    where they stand (a search's path may hold a no-op) left out; None when a name is not in
    the set, the path leaves no step of an episode to stay, or it does not reach the schedule
    whose key is ``reaches`` (an action the agent's loop bound refuses)."""
    if not all(name in actions.names for name in names):
        return None
    root = State(initial_nest(problem), 0)
    transitions = replay(actions, root, math.nan, names)
    path = tuple(actions.index(name) for name, transition in zip(names, transitions) if transition.valid)
    reached = transitions[-1].state if transitions else root
    return path if len(path) < episode_length and reached.nest.key == reaches else None


def demonstration_pairs(demo: Demonstration, actions: ActionSet, normalized: bool) -> tuple[np.ndarray, np.ndarray]:
    """(observations, actions) along ``demo``'s path, then at its last state an action that
    cannot apply there (the env's no-op: the greedy rollout stays)."""
    state = State(initial_nest(demo.problem), 0)
    observations, labels = [], []
    for action in demo.actions:
        observations.append(observation(state.nest, state.cursor, actions.max_loops, normalized))
        labels.append(action)
        state = step(actions, state, math.nan, action, None).state
    invalid = np.flatnonzero(actions.mask(state) == 0)
    if invalid.size:
        observations.append(observation(state.nest, state.cursor, actions.max_loops, normalized))
        labels.append(int(invalid[0]))
    return np.stack(observations), np.asarray(labels, dtype=np.int64)
