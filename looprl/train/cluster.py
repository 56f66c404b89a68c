"""Demonstrations and validation as Ray tasks on a cluster (``looprl-train --address``).

Gathering demonstrations is the slow part of expert iteration: every problem is a measured
tune (about a second each, hundreds of problems a round). With ``--address``, the problems are
sent as Ray tasks, a few per task, spread over the cluster's nodes; each task measures on the
node it runs on, with that node's own measurement cache (the per-user cache, or the agent's
``cache`` path: its rows are keyed by the host that measured them, so a value measured on one
CPU kind never answers for another). Each result says which node and which CPU measured it,
and the summary counts them per CPU. Greedy validation is sent the same way, one task per few
problems.

Ray is imported only here, and only when a cluster is named.
"""

from __future__ import annotations

import os
from typing import Iterator

from looprl.ir.problem import parse_problem
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout
from looprl.target import Target

PROBLEMS_PER_TASK = 4


def attach(address: str) -> None:
    """Connect this process to the Ray cluster at ``address`` (once); a cluster that cannot be
    reached (``auto`` with none running, a ``ray://`` address Ray cannot use, a head node that
    does not answer) is a ValueError naming ``--address``."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, include_dashboard=False, logging_level="warning")
    except (ConnectionError, TimeoutError, ValueError) as error:
        raise ValueError(f"--address {address}: cannot attach to the Ray cluster: {' '.join(str(error).split())}") from None


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _node() -> dict:
    """Which node and CPU a task ran on."""
    import ray

    host = Target.host()
    return {"node": ray.get_runtime_context().get_node_id(), "host_cpu": host.cpu, "host_isa": host.isa}


def _demonstrate_chunk(agent: dict, names: list[str], policy: Policy | None, search_budget_s: float | None, demonstrate) -> list[dict]:
    """One task: the demonstrations of ``names`` measured on this node by ``demonstrate``
    (:func:`looprl.train.demonstrations.expert_demonstration`)."""
    from looprl.defaults import EPISODE_LENGTH
    from looprl.train.config import agent_actions, agent_measure_budget_s, agent_target

    env = agent.get("env", {})
    target = agent_target(agent)
    actions = agent_actions(agent, target)
    evaluator = Evaluator(env.get("cache"), agent_measure_budget_s(agent), target=target, samples=1)
    where = _node()
    found = []
    for name in names:
        demo, from_search = demonstrate(parse_problem(name), actions, evaluator, int(env.get("episode_length", EPISODE_LENGTH)),
                                                 policy, search_budget_s)
        found.append({"problem": name, "actions": list(actions.named(demo.actions)), "gflops": demo.gflops,
                      "initial_gflops": demo.initial_gflops, "from_search": bool(from_search), **where})
    return found


def demonstrations_on_cluster(agent: dict, names: list[str], policy: Policy | None, search_budget_s: float | None, demonstrate,
                              per_task: int = PROBLEMS_PER_TASK) -> Iterator[dict]:
    """The demonstrations of the problems ``names`` (each by ``demonstrate``, the caller's
    :func:`~looprl.train.demonstrations.expert_demonstration`), gathered as Ray tasks spread over the
    cluster this process is attached to (:func:`attach`), yielded as each task finishes (a
    dict per problem: its actions by name, GFLOPS, and the node and CPU that measured it)."""
    import ray

    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_demonstrate_chunk)
    pending = [task.remote(agent, chunk, policy, search_budget_s, demonstrate) for chunk in _chunks(list(names), per_task)]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield from ray.get(done[0])


def _rollout_chunk(policy: Policy, names: list[str], cache, budget_s: float, target: str | None, threads: int) -> list[dict]:
    evaluator = Evaluator(cache, budget_s, target=target, threads=threads)
    where = _node()
    out = []
    for name in names:
        episode = greedy_rollout(policy, parse_problem(name), evaluator)
        out.append({"problem": name, "speedup": episode.speedup, "failures": episode.failures, **where})
    return out


def rollouts_on_cluster(policy: Policy, names: list[str], cache, budget_s: float, target: str | None, threads: int,
                        per_task: int = PROBLEMS_PER_TASK) -> list[dict]:
    """One greedy episode of ``policy`` per problem, as Ray tasks over the cluster; in the
    order of ``names``."""
    import ray

    task = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_rollout_chunk)
    results = ray.get([task.remote(policy, chunk, cache, budget_s, target, threads) for chunk in _chunks(list(names), per_task)])
    by_name = {item["problem"]: item for chunk in results for item in chunk}
    return [by_name[name] for name in names]
