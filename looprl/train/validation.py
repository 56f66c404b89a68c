"""Validation during training: the greedy policy's speed-up on a fixed set of problems.

The set is spread evenly over each training dataset in equal numbers
(:func:`spread_over_datasets`), as the env draws its datasets equally often: spread over
the concatenation, a mix of ``models`` (150 training problems) and ``mm64-256`` (1757) would
validate almost only on the grid.

DQN's greedy policy swings from one snapshot to the next (the final schedule of a greedy
episode depends on a few close Q-values), so the newest checkpoint is not always the best
one. Every few iterations the training loop runs one greedy episode (the evaluation protocol:
final state, invalid actions are no-ops) on each validation problem and keeps the policy with
the best geometric-mean speed-up over the untuned nest in the run's ``policy-best/``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from looprl import defaults
from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout
from looprl.workloads.datasets import dataset_groups, env_problems


def spread(problems: Sequence[Problem], count: int) -> list[Problem]:
    """``count`` problems evenly spaced over ``problems`` (all of them if fewer)."""
    if count < 1:
        raise ValueError(f"validation problem count must be positive, got {count}")
    if count >= len(problems):
        return list(problems)
    return [problems[int(i * len(problems) / count)] for i in range(count)]


def training_groups(agent: dict) -> tuple[tuple[Problem, ...], ...]:
    """The agent's training problems, one group per dataset (or its own ``problems`` as one), in
    the env's ``dtype`` where it sets one (as the env makes every problem it draws): what the
    demonstrations, validation and adaptation measure is what the agent trains on."""
    env = agent.get("env", {})
    if env.get("problems"):
        groups = (env_problems(problems=env["problems"]),)
    else:
        groups = dataset_groups(env.get("dataset", defaults.DATASET), env.get("split", "train"))
    if env.get("dtype") is None:
        return groups
    return tuple(tuple(problem.with_dtype(env["dtype"]) for problem in group) for group in groups)


def spread_over_datasets(agent: dict, per_dataset: int) -> list[Problem]:
    """``per_dataset`` problems spread over each of the agent's training datasets (or over its
    own ``problems``): the validation set, and the problems demonstrations are gathered on."""
    return [p for group in training_groups(agent) for p in spread(group, min(per_dataset, len(group)))]


class Validator:
    """``validator(policy)`` -> geometric-mean speed-up of its greedy episodes' final states."""

    def __init__(self, problems: Sequence[Problem], evaluator: Evaluator, address: str | None = None, node_cache=None):
        if not problems:
            raise ValueError("no validation problems")
        self.problems = list(problems)
        self.evaluator = evaluator
        self.address = address  # a Ray cluster: the episodes run there as tasks (looprl.train.cluster)
        self.node_cache = node_cache  # the cache each node measures with there (None: its own per-user cache)
        self.last_failures = 0  # failed schedules in the last validation

    def __call__(self, policy: Policy) -> float:
        if self.address is not None:
            from looprl.train import cluster

            cluster.attach(self.address)
            evaluator = self.evaluator
            episodes = cluster.rollouts_on_cluster(policy, [p.name for p in self.problems], self.node_cache,
                                                   evaluator.budget_s, evaluator.target.isa, evaluator.threads)
            speedups = [e["speedup"] for e in episodes]
            self.last_failures = sum(e["failures"] for e in episodes)
        else:
            local = [greedy_rollout(policy, problem, self.evaluator) for problem in self.problems]
            speedups = [e.speedup for e in local]
            self.last_failures = sum(e.failures for e in local)
        # Every episode counts (no survivors' bias): a failed schedule leaves the state as it
        # was, and an episode whose untuned nest failed counts as no speed-up.
        return statistics.geometric_mean([s if s > 0 else 1.0 for s in speedups])
