"""Demonstrations before reinforcement: for each training problem, the schedule a policy is
taught (the planner's tile, or measured tune's answer), gathered and kept as found, and the
policy a run starts from (the agent's ``pretrain`` section).

Reaching a two-dimensional register tile takes nine actions in the right order (move to the
column loop, split it by the tile's width, lift it out twice, move back, split the rows, sink
their inner loop under the reduction), and only the last of them pays: epsilon-greedy
exploration almost never finds such a sequence on problems where each measurement is costly.
So training may start, like DQfD or AlphaGo's supervised stage, from a policy that imitates
measured demonstrations: for each training problem, the fastest of the target's register
tiles (:func:`~looprl.ir.register_tiles.tile_shapes`, and the tiles the action set's split
factors can form) whose path fits in an episode, then a no-op (an invalid action) to stay.
Reinforcement learning then continues from that policy with measured rewards.

Expert iteration (:func:`expert_demonstrations`): a policy's own measured search
(:func:`~looprl.tune.measured.measured_search`, what ``looprl.tune`` runs: its rollout, the
tile refined, the policy-guided search) finds schedules better than its greedy rollout; on
each training problem the better of that and the planner's tile, when its path fits an
episode in the agent's actions, is the demonstration that DQfD's margin loss
(:mod:`looprl.train.dqfd`) keeps in front while DQN learns.

The parts have modules of their own: the planner's demonstrations and the pairs along a path
(:mod:`looprl.train.tile_planner`), behaviour cloning and the margin loss
(:mod:`looprl.train.cloning`), a run's demonstration files (:mod:`looprl.train.demonstration_files`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from looprl import defaults
from looprl.actions import ActionSet
from looprl.ir.problem import Problem, parse_problem
from looprl.measurement.evaluator import Evaluator
from looprl.tune import measured as tuner
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.resources import shipped_path
from looprl.train.cloning import cloned_policy
from looprl.train.config import agent_actions, agent_measure_budget_s, agent_target, validate_agent
from looprl.train.evaluate import policy_folder
from looprl.train.run_folder import DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY
from looprl.train.schema import section_settings
from looprl.train.validation import spread_over_datasets
from looprl.train.warm_start import check_compatible

# The planner's demonstrations and the run's demonstration files are modules of their own; their
# names stay importable from here, where they were first.
from looprl.train.demonstration_files import load_demonstrations, save_demonstrations, summary_rounds  # noqa: F401
from looprl.train.tile_planner import (  # noqa: F401
    Demonstration, candidate_tiles, demonstrate, demonstration_pairs, plan_values, reads_weight_as_stored, replayed_path)


def expert_demonstration(problem: Problem, actions: ActionSet, evaluator: Evaluator, episode_length: int, policy=None,
                         search_budget_s: float | None = 0.0) -> tuple[Demonstration, bool]:
    """The planner's demonstration, or the schedule ``policy``'s measured search finds (what
    ``looprl.tune`` runs on one thread) when that is faster and its path replays in ``actions``
    within an episode that leaves a step to stay. ``search_budget_s``: the search's seconds
    (None: tune's own budget, scaled to the problem; 0 or no policy: the planner alone).
    Returns the demonstration and whether the search's schedule was taken."""
    planned = demonstrate(problem, actions, evaluator, episode_length)
    if policy is None or (search_budget_s is not None and not search_budget_s > 0):
        return planned, False
    found = tuner.measured_search(policy, problem, evaluator, None, search_budget_s, 1, time.perf_counter())
    if not found.gflops > planned.gflops:
        return planned, False
    path = replayed_path(problem, actions, found.actions, episode_length, found.nest.key)
    if path is None:
        return planned, False
    return Demonstration(problem, path, found.gflops, planned.initial_gflops), True


def gather_demonstrations(agent: dict, problems: list[Problem], policy=None, search_budget_s: float | None = 0.0,
                          log=print, earlier: list[Demonstration] | None = None,
                          address: str | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Demonstrations on ``problems`` (:func:`expert_demonstration`), measured with the env's
    target, cache and per-state budget, as (observations, actions, summary). ``earlier``: an
    earlier round's demonstrations of the same problems; each problem keeps the faster.
    ``address``: gathered as tasks on that Ray cluster."""
    demos, summary = expert_demonstrations(agent, problems, policy, search_budget_s, log, earlier, address=address)
    observations, labels = demonstration_arrays(agent, demos)
    return observations, labels, {**summary, "pairs": int(len(labels))}


def expert_demonstrations(agent: dict, problems: list[Problem], policy=None, search_budget_s: float | None = 0.0, log=print,
                          earlier: list[Demonstration] | None = None, progress: Path | None = None,
                          address: str | None = None) -> tuple[list[Demonstration], dict]:
    """One demonstration per problem (:func:`expert_demonstration`) and a summary; with
    ``earlier`` (the demonstrations of an earlier round, same problems), the faster of the two.
    ``progress``: a JSON file each demonstration is written to as it is found; the problems it
    already holds (from an interrupted gathering) are not searched again. ``address``: a Ray
    cluster whose nodes gather them as tasks, each measuring on its own CPU
    (:mod:`looprl.train.cluster`; the summary counts the demonstrations per CPU)."""
    env = agent.get("env", {})
    target = agent_target(agent)
    actions = agent_actions(agent, target)
    episode_length = int(env.get("episode_length", defaults.EPISODE_LENGTH))
    if earlier is not None and [d.problem for d in earlier] != list(problems):
        raise ValueError("earlier demonstrations are of other problems")
    found = _read_progress(progress, actions) if progress is not None else {}
    if found:
        log(f"[demonstrations] {len(found)} found before an interruption ({progress}): going on")
    todo = [p for p in problems if p.name not in found]
    hosts: dict[str, int] = {}

    def keep(problem: Problem, demo: Demonstration, from_search: bool) -> None:
        found[problem.name] = (demo, from_search)
        if progress is not None:
            _write_progress(progress, actions, found)
        if len(found) % 25 == 0 or len(found) == len(problems):
            speedups = [d.gflops / d.initial_gflops for d, _ in found.values() if d.initial_gflops > 0]
            log(f"[demonstrations] {len(found)}/{len(problems)} problems, over untuned {math.exp(np.mean(np.log(speedups))):.2f}x "
                f"(geomean); the search's schedule taken on {sum(s for _, s in found.values())}")

    if address is not None and todo:
        from looprl.train import cluster  # Ray only when a cluster is named

        cluster.attach(address)
        by_name = {p.name: p for p in todo}
        for item in cluster.demonstrations_on_cluster(agent, list(by_name), policy, search_budget_s, expert_demonstration):
            problem = by_name[item["problem"]]
            hosts[item["host_cpu"]] = hosts.get(item["host_cpu"], 0) + 1
            demo = Demonstration(problem, tuple(actions.index(a) for a in item["actions"]), float(item["gflops"]),
                                 float(item["initial_gflops"]))
            keep(problem, demo, bool(item["from_search"]))
    else:
        evaluator = Evaluator(env.get("cache"), agent_measure_budget_s(agent), target=target, samples=1)
        for problem in todo:
            keep(problem, *expert_demonstration(problem, actions, evaluator, episode_length, policy, search_budget_s))
    demos, kept = [], 0
    for index, problem in enumerate(problems):
        demo = found[problem.name][0]
        if earlier is not None and earlier[index].gflops > demo.gflops:
            demo, kept = earlier[index], kept + 1
        demos.append(demo)
    speedups = [d.gflops / d.initial_gflops for d in demos if d.initial_gflops > 0]
    summary = {"problems": len(problems), "from_search": sum(found[p.name][1] for p in problems),
               "speedup_geomean": round(math.exp(float(np.mean(np.log(speedups)))), 3) if speedups else None}
    if earlier is not None:
        summary["earlier_kept"] = kept
        log(f"[demonstrations] the earlier round's demonstration kept on {kept} of {len(problems)} (faster)")
    if hosts:
        summary["measured_on"] = hosts
    return demos, summary


def _read_progress(path: Path, actions: ActionSet) -> dict[str, tuple[Demonstration, bool]]:
    """The demonstrations a gathering wrote to ``path`` so far (none if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("actions") != list(actions.names):
            raise ValueError(f"its demonstrations are in other actions than the agent's {list(actions.names)}")
        found = {}
        for item in record["demonstrations"]:
            problem = parse_problem(item["problem"])
            demo = Demonstration(problem, tuple(actions.index(a) for a in item["actions"]), float(item["gflops"]),
                                 float(item["initial_gflops"]))
            found[problem.name] = (demo, bool(item["from_search"]))
        return found
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"unreadable demonstrations in progress {path}: {error} (remove it to gather again)") from None


def _write_progress(path: Path, actions: ActionSet, found: dict[str, tuple[Demonstration, bool]]) -> None:
    items = [{"problem": name, "actions": list(actions.named(demo.actions)), "gflops": demo.gflops,
              "initial_gflops": demo.initial_gflops, "from_search": from_search} for name, (demo, from_search) in found.items()]
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    temporary.write_text(json.dumps({"actions": list(actions.names), "demonstrations": items}) + "\n", encoding="utf-8")
    temporary.replace(path)


def demonstration_arrays(agent: dict, demos: list[Demonstration]) -> tuple[np.ndarray, np.ndarray]:
    """The (observations, actions) pairs of ``demos`` (:func:`demonstration_pairs`) in ``agent``'s
    actions and observation."""
    actions = agent_actions(agent)
    normalized = agent.get("env", {}).get("observation", defaults.TRAINING_OBSERVATION) == "normalized"
    pairs = [demonstration_pairs(demo, actions, normalized) for demo in demos]
    return np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


def starting_policy(name: str, agent: dict) -> Policy:
    """The policy folder ``pretrain.policy`` names (a relative ``checkpoints/...`` that is not
    here is the shipped one, wherever the package is installed), checked against ``agent``.
    Only a policy folder or a run folder's ``policy/``: never an RLlib checkpoint."""
    where = Path(name)
    if not where.exists() and not where.is_absolute() and where.parts and where.parts[0] == "checkpoints":
        where = shipped_path(*where.parts)
    policy = policy_folder(where)
    if policy is None:
        raise ValueError(f"pretrain.policy {name}: no policy folder there (policy.json and policy.npz)")
    check_compatible(policy, agent, f"pretrain.policy {name}")
    return policy


PRETRAIN_PROGRESS = "pretrain-round{round}.json"


def pretrain_policy(agent: dict, seed: int = 0, log=print, run_path: Path | None = None, address: str | None = None) -> Policy:
    """The policy a run starts from, as the agent's ``pretrain`` section says:

    * ``policy``: that policy folder (e.g. a shipped clone), as it is;
    * ``expert: planner`` (the default): a clone of the tile planner's demonstrations on
      ``problems_per_dataset`` training problems of each dataset;
    * ``expert: tune``: expert iteration with measured tune as the expert. Round 1's
      demonstrations are the schedules ``looprl.tune``'s measured search finds with
      ``expert_policy`` (default: the shipped policy for the target) on one thread with its
      own budget, or the planner's tile where that is faster or the search's path does not
      replay in the agent's actions within an episode; a policy is cloned from them. Each
      further round (``rounds``) tunes the same problems with the last clone as tune's policy,
      keeps the faster schedule of each problem and clones again. With ``run_path``, the last
      round's demonstrations and a summary per round are written there
      (``demonstrations.npz``, ``demonstrations.json``: DQfD's first demonstrations).

    Each round's demonstrations are written to ``pretrain-round<N>.json`` in ``run_path`` as they
    are found: a run started again after an interruption goes on from there (round 2's
    expert, the clone of round 1, is cloned again from them: the same seed gives the same clone).

    Every measurement uses the env's target, cache and per-state budget. ``address``: the
    demonstrations are gathered as tasks on that Ray cluster (:mod:`looprl.train.cluster`)."""
    agent = validate_agent(agent)
    settings = section_settings(agent, "pretrain")
    if settings["policy"] is not None:  # an earlier clone, shipped: start from it as it is
        policy = starting_policy(settings["policy"], agent)
        log(f"[pretrain] starting from {settings['policy']} ({policy.metadata.get('algorithm', '?')}, "
            f"{'a clone' if 'pretrained' in policy.metadata else 'trained'})")
        return policy
    problems = spread_over_datasets(agent, settings["problems_per_dataset"])
    if settings["expert"] == "planner":
        x, y, _ = gather_demonstrations(agent, problems, log=log, address=address)
        extra = {"pretrained": {"problems": len(problems), "pairs": int(len(y)), "settings": dict(agent.get("pretrain") or {})}}
        return cloned_policy(agent, x, y, seed, extra, log)
    expert_name = settings["expert_policy"] or "default"
    expert = load_policy(_shipped_or_given(expert_name), agent_target(agent))
    demos, rounds, policy = None, [], None
    for round_number in range(1, settings["rounds"] + 1):
        log(f"[pretrain] round {round_number} of {settings['rounds']}: measured tune with "
            f"{expert_name if round_number == 1 else 'the last clone'} on {len(problems)} problems")
        progress = None
        if run_path is not None:
            Path(run_path).mkdir(parents=True, exist_ok=True)
            progress = Path(run_path) / PRETRAIN_PROGRESS.format(round=round_number)
        demos, summary = expert_demonstrations(agent, problems, expert, None, log, earlier=demos, progress=progress, address=address)
        x, y = demonstration_arrays(agent, demos)
        rounds.append({"round": round_number, "expert": expert_name if round_number == 1 else "clone of the round before",
                       **summary, "pairs": int(len(y))})
        extra = {"pretrained": {"expert": "measured tune (looprl.tune.measured.measured_search, one thread, its scaled budget)",
                                "expert_policy": expert_name, "rounds": rounds, "settings": dict(agent.get("pretrain") or {})}}
        policy = cloned_policy(agent, x, y, seed, extra, log)
        expert = policy
        if run_path is not None:
            save_demonstrations(Path(run_path) / DEMONSTRATIONS_FILE, x, y)
            record = {"settings": {"expert": "tune", **dict(agent.get("pretrain") or {})}, "rounds": rounds}
            (Path(run_path) / DEMONSTRATIONS_SUMMARY).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return policy


def _shipped_or_given(name: str):
    """A policy name as :func:`load_policy` takes it: ``default``, a folder here, or a relative
    ``checkpoints/...`` of the installed package."""
    where = Path(name)
    if name != "default" and not where.exists() and not where.is_absolute() and where.parts and where.parts[0] == "checkpoints":
        return shipped_path(*where.parts)
    return name
