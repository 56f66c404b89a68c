"""``looprl.tune``: schedule a contraction with a trained policy and compile it, in well
under a second, without Ray or torch.

Two modes:

* measured (``measure=True``, the default): every new schedule on the policy's path is
  compiled and timed through the measurement cache, and the fastest one is returned;
* pure policy (``measure=False``): the policy's actions are followed without measuring,
  stopping early once it cycles back to a state it has already been in (it oscillates, e.g.
  moving the cursor up and down); the final schedule is compiled and timed once for the report.

The environment has no stop action: a trained policy that is content with a schedule picks an
action that cannot apply (a no-op there) and, being greedy, would pick it again and again.
``tune`` stops at that point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .actions import State
from .evaluator import DEFAULT_STATE_BUDGET_S, Evaluator
from .features import FEATURES_PER_LOOP, OBSERVATION_LAYOUT_VERSION, observation
from .kernel import Kernel, compile
from .nest import LoopNest
from .policy import Policy
from .problem import Problem, as_problem, matmul
from .rollout import policy_actions

DEFAULT_POLICY_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "apex-dqn" / "policy"


@dataclass(frozen=True)
class TuneResult:
    """A tuned schedule and its compiled kernel."""

    problem: Problem
    nest: LoopNest
    kernel: Kernel  # callable: kernel(a, b) -> output array
    actions: tuple[str, ...]
    gflops: float
    initial_gflops: float
    seconds: float  # wall clock of the whole call, compile of the returned kernel included
    mode: str  # "measured" or "policy"

    @property
    def speedup(self) -> float:
        return self.gflops / self.initial_gflops if self.initial_gflops > 0 else float("nan")

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.kernel(a, b)


def as_tunable_problem(problem: Any) -> Problem:
    """A Problem from a Problem, a string, an (m, n, k) tuple or a pair of 2-D arrays (A, B)."""
    if isinstance(problem, (Problem, str)):
        return as_problem(problem)
    if isinstance(problem, (tuple, list)) and len(problem) == 2 and all(isinstance(x, np.ndarray) for x in problem):
        a, b = problem
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"arrays of shapes {a.shape} and {b.shape} do not form a matmul A[m,k] @ B[k,n]")
        return matmul(m=a.shape[0], n=b.shape[1], k=a.shape[1])
    if isinstance(problem, (tuple, list)) and len(problem) == 3 and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in problem):
        m, n, k = (int(x) for x in problem)
        return matmul(m=m, n=n, k=k)
    raise ValueError(f"cannot tune {problem!r}: expected a Problem, 'MxNxK', an (m, n, k) tuple or arrays (A, B)")


def load_policy(policy: Policy | str | Path) -> Policy:
    """The shipped default policy, a policy folder or file, or a Policy; checked for the
    observation layout and action set this version of looprl produces."""
    if isinstance(policy, Policy):
        loaded, where = policy, "the given policy"
    else:
        path = DEFAULT_POLICY_DIR if policy == "default" else Path(policy)
        if policy == "default" and not path.exists():
            raise ValueError(f"the default policy is missing ({path}); pass policy=PATH to a policy folder")
        loaded, where = Policy.load(path), str(path)
    meta = loaded.metadata
    if meta.get("observation_layout_version") != OBSERVATION_LAYOUT_VERSION:
        raise ValueError(
            f"{where}: observation layout version {meta.get('observation_layout_version')} does not match "
            f"this looprl's {OBSERVATION_LAYOUT_VERSION}"
        )
    if meta.get("observation") not in ("raw", "normalized"):
        raise ValueError(f"{where}: unknown observation kind {meta.get('observation')!r}")
    if len(loaded.observation_shape) != 2 or loaded.observation_shape[1] != FEATURES_PER_LOOP:
        raise ValueError(f"{where}: observation shape {loaded.observation_shape} is not (max_loops, {FEATURES_PER_LOOP})")
    try:
        policy_actions(loaded)
    except (KeyError, ValueError) as error:
        raise ValueError(f"{where}: incompatible action set: {error}") from error
    return loaded


def tune(
    problem: Any,
    policy: Policy | str | Path = "default",
    steps: int = 10,
    measure: bool = True,
    *,
    cache=None,
    budget_s: float = DEFAULT_STATE_BUDGET_S,
) -> TuneResult:
    """Schedule ``problem`` with ``policy`` for at most ``steps`` actions and compile it.

    ``problem``: a :class:`Problem`, ``"MxNxK"``, an ``(m, n, k)`` tuple or arrays ``(A, B)``.
    ``cache``: the measurement cache (a path, ``":memory:"`` or None for the per-user one)."""
    started = time.perf_counter()
    problem = as_tunable_problem(problem)
    loaded = load_policy(policy)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    actions = policy_actions(loaded)
    actions.check_fits(problem)
    normalized = loaded.metadata["observation"] == "normalized"
    evaluator = Evaluator(cache, budget_s)

    state = State(problem.initial_nest(), 0)
    initial = evaluator(state.nest).gflops
    best_nest, best, best_length = state.nest, initial, 0
    seen = {state.key}
    taken = []
    for _ in range(int(steps)):
        obs = observation(state.nest, state.cursor, actions.max_loops, normalized)
        action = loaded.act(obs)
        following = actions.apply(state, action)
        if following is None:
            break  # the policy's way of stopping: in the env an invalid action changes nothing
        moved_cursor_only = following.nest is state.nest
        state = following
        taken.append(actions.names[action])
        if measure:
            value = best if moved_cursor_only else evaluator(state.nest).gflops
            if value > best:
                best_nest, best, best_length = state.nest, value, len(taken)
        elif state.key in seen:
            break  # back in a state already visited: the policy oscillates
        seen.add(state.key)
    if measure:
        nest, gflops = best_nest, best
        del taken[best_length:]  # the actions up to the best state only
    else:
        nest = state.nest
        gflops = evaluator(nest).gflops
    kernel = compile(nest)
    return TuneResult(problem, nest, kernel, tuple(taken), gflops, initial, time.perf_counter() - started, "measured" if measure else "policy")

