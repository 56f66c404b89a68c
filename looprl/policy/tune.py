"""``looprl.tune``: schedule a contraction with a trained policy and compile it, in well
under a second, without Ray or torch.

Two modes, both one :func:`~looprl.policy.rollout.greedy_rollout` (the env's transition rules):

* measured (``measure=True``, the default): every new schedule on the policy's path is
  compiled and timed through the measurement cache, and the fastest one is returned;
* pure policy (``measure=False``): the policy's actions are followed without measuring; the
  state it ends in is compiled and timed once for the report.

The environment has no stop action: a trained policy that is content with a schedule picks an
action that cannot apply (a no-op there) and, being greedy, would pick it again and again.
The rollout sees that cycle (as any other) and stops.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from looprl import defaults
from looprl.backend.kernel import Kernel, compile
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem, as_problem, matmul
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.timing import check_budget
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout, policy_actions


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


def tune(
    problem: Any,
    policy: Policy | str | Path = "default",
    steps: int = defaults.EPISODE_LENGTH,
    measure: bool = True,
    *,
    cache=None,
    budget_s: float = defaults.STATE_BUDGET_S,
) -> TuneResult:
    """Schedule ``problem`` with ``policy`` for at most ``steps`` actions and compile it.

    ``problem``: a :class:`Problem`, ``"MxNxK"``, an ``(m, n, k)`` tuple or arrays ``(A, B)``.
    ``cache``: the measurement cache (a path, ``":memory:"`` or None for the per-user one)."""
    started = time.perf_counter()
    problem = as_tunable_problem(problem)
    if isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    budget_s = check_budget(budget_s, "budget_s")
    if not isinstance(policy, (Policy, str, os.PathLike)):
        raise ValueError(f"policy must be a Policy, 'default' or a path to a policy folder, got {type(policy).__name__}")
    loaded = load_policy(policy)
    policy_actions(loaded).check_fits(problem)  # before anything is measured
    evaluator = Evaluator(cache, budget_s)
    if measure:
        rollout = greedy_rollout(loaded, problem, evaluator, length=int(steps))
        nest, gflops, actions = rollout.best_nest, rollout.best_gflops, rollout.best_actions
        initial = rollout.initial_gflops
    else:
        rollout = greedy_rollout(loaded, problem, None, length=int(steps))
        nest, actions = rollout.final_nest, rollout.final_actions
        initial = evaluator(initial_nest(problem)).gflops
        gflops = evaluator(nest).gflops
    kernel = compile(nest)
    return TuneResult(problem, nest, kernel, tuple(actions), gflops, initial, time.perf_counter() - started, "measured" if measure else "policy")
