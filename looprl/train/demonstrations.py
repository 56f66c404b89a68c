"""Demonstrations before reinforcement: the measured best register tile of each training
problem, as the env actions that build it, and a policy cloned from them.

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
(:func:`~looprl.policy.tuner.measured_search`, what ``looprl.tune`` runs: its rollout, the
tile refined, the policy-guided search) finds schedules better than its greedy rollout; on
each training problem the better of that and the planner's tile, when its path fits an
episode in the agent's actions, is the demonstration that DQfD's margin loss
(:mod:`looprl.train.dqfd`) keeps in front while DQN learns.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from looprl import defaults
from looprl.actions import ActionSet, State, replay, step
from looprl.env.observation import observation
from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem, parse_problem
from looprl.ir.plans import Plan
from looprl.ir.register_tiles import tile_shapes, tile_steps, why_not_tile
from looprl.measurement.evaluator import Evaluator
from looprl.tune import measured as tuner
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.resources import shipped_path
from looprl.tune.winner import in_place_rows
from looprl.train.config import agent_actions, agent_measure_budget_s, agent_target, hidden_layers, validate_agent
from looprl.train.evaluate import policy_folder
from looprl.train.export import policy_metadata
from looprl.train.run_folder import DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY
from looprl.train.schema import section_settings
from looprl.train.validation import spread_over_datasets
from looprl.train.warm_start import check_compatible


@dataclass(frozen=True)
class Demonstration:
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


def demonstrate(problem: Problem, actions: ActionSet, evaluator: Evaluator, episode_length: int) -> Demonstration:
    """Measure ``problem``'s candidate tiles that fit an episode and return the fastest. With
    plan actions (:mod:`looprl.ir.plans`), the candidates are the plans (one action each), and
    the first of those within :data:`PLAN_NEAR_TIE` of the fastest is returned."""
    if actions.plans:
        return _demonstrate_plan(problem, actions, evaluator)
    root = State(initial_nest(problem), 0)
    initial = evaluator(root.nest).gflops
    best: tuple[float, tuple[int, ...]] = (initial, ())
    for rows, columns in candidate_tiles(problem, actions, evaluator.target):
        if why_not_tile(problem, rows, columns) is not None:
            continue
        planned = actions.path(root, tile_steps(problem, rows, columns))
        if planned is None or len(planned[0]) >= episode_length:
            continue  # a factor outside the action set, or too long to leave a step to stay
        path, state = planned
        measurement = evaluator(state.nest)
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
            measurement = evaluator(nest)
            by_schedule[nest.key] = measurement.gflops if measurement.ok else 0.0
        values[index] = by_schedule[nest.key]
    return values


def _demonstrate_plan(problem: Problem, actions: ActionSet, evaluator: Evaluator) -> Demonstration:
    initial = evaluator(initial_nest(problem)).gflops
    values = plan_values(problem, actions, evaluator)
    fastest = max(values.values(), default=0.0)
    if not fastest > initial:
        return Demonstration(problem, (), initial, initial)
    chosen = next(index for index, gflops in values.items() if gflops >= (1 - PLAN_NEAR_TIE) * fastest)
    return Demonstration(problem, (chosen,), values[chosen], initial)


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


def clone(observations: np.ndarray, labels: np.ndarray, hidden: list[int], action_count: int, *, epochs: int = 200,
          lr: float = 1e-3, seed: int = 0, margin: float = 0.05) -> dict[str, np.ndarray]:
    """Fit an MLP (``hidden`` ReLU layers, then an advantage head of ``action_count`` and a
    value head of 1, as DQN's dueling module) to predict ``labels`` from ``observations`` by
    cross-entropy. Returns the arrays named as an exported DQN policy's. The advantage head
    is then scaled so that the demonstrated action leads the next by about ``margin`` on
    average: rewards are a fraction of the peak, and Q-values of a much larger scale would
    take reinforcement learning long to unlearn."""
    import torch  # the [train] extra: only to fit a clone

    torch.manual_seed(seed)
    x = torch.as_tensor(observations.reshape(len(observations), -1), dtype=torch.float32)
    y = torch.as_tensor(labels)
    layers, width = [], x.shape[1]
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    trunk = torch.nn.Sequential(*layers)
    head = torch.nn.Linear(width, action_count)
    optimizer = torch.optim.Adam(list(trunk.parameters()) + list(head.parameters()), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 256):
            batch = order[start:start + 256]
            loss = torch.nn.functional.cross_entropy(head(trunk(x[batch])), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        logits = head(trunk(x))
        top2 = torch.topk(logits, 2, dim=1).values
        gap = float((top2[:, 0] - top2[:, 1]).mean())
        scale = margin / gap if gap > 0 else 1.0
    arrays = {}
    linear = [m for m in trunk if isinstance(m, torch.nn.Linear)]
    for i, layer in enumerate(linear):
        arrays[f"trunk.{i}.weight"] = layer.weight.detach().numpy().astype(np.float32)
        arrays[f"trunk.{i}.bias"] = layer.bias.detach().numpy().astype(np.float32)
    arrays["advantages.0.weight"] = (head.weight.detach().numpy() * scale).astype(np.float32)
    arrays["advantages.0.bias"] = (head.bias.detach().numpy() * scale).astype(np.float32)
    arrays["value.0.weight"] = np.zeros((1, width), dtype=np.float32)
    arrays["value.0.bias"] = np.zeros(1, dtype=np.float32)
    return arrays


def margin_loss(q_values, actions, margin: float):
    """DQfD's large-margin loss, the mean over the batch of ``max_a [Q(s,a) + l(a_E,a)] -
    Q(s,a_E)`` (torch tensors; ``l`` = ``margin`` for every action but the demonstrated one):
    DQfD's learner (:mod:`looprl.train.dqfd`) and ``--adapt``'s fine-tuning."""
    import torch  # the [train] extra

    margins = torch.full_like(q_values, float(margin))
    margins.scatter_(1, actions.view(-1, 1), 0.0)
    demonstrated = q_values.gather(1, actions.view(-1, 1)).squeeze(1)
    return ((q_values + margins).max(dim=1).values - demonstrated).mean()


def accuracy(arrays: dict[str, np.ndarray], observations: np.ndarray, labels: np.ndarray, hidden_layers: int) -> float:
    """Share of ``labels`` the cloned network's greedy action reproduces."""
    x = observations.reshape(len(observations), -1)
    for i in range(hidden_layers):
        x = np.maximum(x @ arrays[f"trunk.{i}.weight"].T + arrays[f"trunk.{i}.bias"], 0.0)
    chosen = np.argmax(x @ arrays["advantages.0.weight"].T + arrays["advantages.0.bias"], axis=1)
    return float(np.mean(chosen == labels)) if len(labels) else math.nan


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
    items = [{"problem": name, "actions": [actions.names[a] for a in demo.actions], "gflops": demo.gflops,
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


def summary_rounds(record: dict) -> list[dict]:
    """The per-round summaries of a run's ``demonstrations.json`` (a file of one round, as the
    first DQfD runs wrote it, holds its summary at the top level)."""
    if "rounds" in record:
        return list(record["rounds"])
    return [{"round": 1, **{key: value for key, value in record.items() if key != "settings"}}]


def save_demonstrations(path: Path, observations: np.ndarray, actions: np.ndarray) -> None:
    """Write the state-action pairs (observations flattened per state) atomically."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp.npz")
    flat = np.asarray(observations, dtype=np.float32).reshape(len(observations), -1)
    np.savez(temporary, observations=flat, actions=np.asarray(actions, dtype=np.int64))
    temporary.replace(path)


def load_demonstrations(path: Path, action_count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (observations, actions) of a demonstrations file (numpy arrays, never a pickle);
    ValueError naming what is wrong."""
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            observations, actions = data["observations"], data["actions"]
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"unreadable demonstrations {path}: {error}") from None
    if observations.ndim != 2 or actions.shape != (len(observations),) or not len(actions):
        raise ValueError(f"demonstrations {path}: expected N flat observations and N actions, got {observations.shape} and {actions.shape}")
    if action_count is not None and (actions.min() < 0 or actions.max() >= action_count):
        raise ValueError(f"demonstrations {path}: action indices outside 0..{action_count - 1}")
    return observations, actions


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
        extra = {"pretrained": {"expert": "measured tune (looprl.policy.tuner.measured_search, one thread, its scaled budget)",
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


def cloned_policy(agent: dict, x: np.ndarray, y: np.ndarray, seed: int, extra: dict, log=print) -> Policy:
    """A policy of ``agent``'s network cloned from the pairs ``(x, y)`` (:func:`clone` with the
    ``epochs``, ``lr`` and ``margin`` of the agent's ``pretrain`` section), its metadata holding ``extra``."""
    settings = section_settings(agent, "pretrain")
    hidden = hidden_layers(agent)
    arrays = clone(x, y, hidden, len(agent_actions(agent)), epochs=settings["epochs"], lr=float(settings["lr"]),
                   seed=seed, margin=float(settings["margin"]))
    log(f"[clone] {len(y)} state-action pairs; greedy action matches the demonstration on {accuracy(arrays, x, y, len(hidden)):.1%}")
    network = {
        "trunk": [{"weight": f"trunk.{i}.weight", "bias": f"trunk.{i}.bias", "activation": "relu"} for i in range(len(hidden))],
        "heads": {"advantages": [{"weight": "advantages.0.weight", "bias": "advantages.0.bias", "activation": "linear"}],
                  "value": [{"weight": "value.0.weight", "bias": "value.0.bias", "activation": "linear"}]},
        "greedy": "advantages",
    }
    return Policy.from_arrays(policy_metadata(agent, network, extra), arrays)
