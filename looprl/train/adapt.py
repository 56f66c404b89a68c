"""Adapt a policy to the CPU it runs on, in minutes (``looprl-train --adapt``).

A shipped policy was trained on one machine; on another CPU kind its greedy choices (which
register tile, whether to block for the caches) can be wrong, and ``looprl.tune`` then spends
its measurements correcting them. Adapting is expert iteration on this machine, with measured
tune as the expert, at a scale that fits a coffee break:

0. **Plans of this target**: a plan policy trained for another ISA (whose register tiles do
   not fit this one's registers) is given this target's plans first
   (:func:`looprl.policy.retarget.retargeted`: each new plan starts from the old plan of the
   same role).
1. **Demonstrations** (``GATHER_SHARE`` of the budget): training problems of the policy's own
   kind, taken in turn from each dataset, are tuned by measured tune with the policy
   (:func:`looprl.train.demonstrations.expert_demonstration`: tune's own budget, one thread;
   for a plan policy the planner: every plan measured, the first within 3% of the fastest);
   each answer whose path replays in the policy's actions is a demonstration. Each one is
   written to ``OUT/demonstrations.json`` as it is found, so an interrupted adaptation run
   again with the same ``OUT`` goes on from there.
2. **Fine-tuning**: the policy's own weights are trained towards the demonstrated actions by
   DQfD's large-margin loss (:func:`fine_tune`). This is supervised fine-tuning, not RL: the
   result's metadata says so (``adapted``), and keeps the algorithm and the RL steps of the
   policy it started from.
3. **Before and after**, on held-out shapes (the validation split of the policy's datasets,
   ``models-called``'s for a weights policy, else ``models``': the training models' layers at
   row counts no split holds; never a test split, as keeping or rejecting the adapted policy
   is a choice made on them): one greedy episode of each policy per problem, its final state
   timed, both re-timed together in interleaved rounds (best kept), and with them the
   retargeted policy before fine-tuning (step 0), when there was one. The figures are printed
   and written to ``OUT/adapt.json``; the adapted policy is ``OUT/policy``
   (``looprl.tune(problem, policy="OUT/policy")``), unless it is slower than the starting
   policy (geomean of after / before below 1): then ``OUT/policy`` is the starting policy
   (its metadata's ``adaptation`` says so), the adapted one is ``OUT/policy-rejected``, a
   warning is printed, and ``adapt.json``'s ``written`` names which was written.

The budget bounds the whole adaptation: the starting policy's held-out schedules are
compiled and torch imported first, the demonstrations gathered until what the end needs is
left (at most ``GATHER_SHARE`` of the budget; a demonstration that would not end in time is
not begun), fine-tuning stops after the epoch that passes its share, and the re-timing takes
what is left (each timing at least ``MIN_RETIME_S`` and one call). What can run past it: the
demonstration in progress when the gathering's time was misjudged (at most the longest one
seen, about a second on a small problem), one fine-tuning epoch, compiling the adapted
policy's schedules, and a timing's single call (tens of milliseconds on a large problem):
a few seconds at most.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from looprl import checks, defaults
from looprl.backend.kernel import compile
from looprl.ir.problem import Problem, as_problem, parse_problem
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import Workspace, time_kernel
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Dense, Policy
from looprl.policy.retarget import retargeted
from looprl.policy.rollout import greedy_rollout, policy_actions
from looprl.target import Target
from looprl.train.cloning import margin_loss
from looprl.train.demonstrations import demonstration_arrays, expert_demonstration
from looprl.train.tile_planner import Demonstration
from looprl.train.validation import spread, training_groups
from looprl.workloads.datasets import dataset_names, dataset_problems

TRAINING_DATASETS = ("models", "gemm-shapes", "mm64-256")  # a policy whose file names none of its own
VALIDATION_DATASETS = ("models-called", "models")  # the datasets with a validation split, the more specific first
GATHER_SHARE = 0.75  # of the budget: demonstrations; the rest fine-tunes and compares
RETIME_ROUNDS = 5
RETIME_S = 0.05  # per kernel and round (a large problem's single call can take 30 ms), when the budget leaves room
MIN_RETIME_S = 0.002  # per kernel and round when it does not (a timing still makes at least one call)
MIN_BUDGET_S = 30.0  # looprl-train --adapt's least --time-budget: loading, torch, compiling and comparing alone take ~10 s
FINE_TUNE_SHARE = 0.1  # of the budget: the most fine-tuning may take (its first epoch always runs)
DEMONSTRATIONS_NAME = "demonstrations.json"
REPORT_NAME = "adapt.json"
REJECTED_POLICY = "policy-rejected"  # the adapted policy, when it was slower than the starting one
ACTIVATIONS = ("relu", "tanh", "linear")


@dataclass(frozen=True)
class AdaptReport:
    """What an adaptation did and measured."""

    problems: tuple[str, ...]  # the held-out problems
    before_gflops: tuple[float, ...]  # the starting policy's greedy final state, re-timed
    after_gflops: tuple[float, ...]  # the adapted policy's
    retargeted_gflops: tuple[float, ...] | None  # the starting policy given the target's plans, not fine-tuned (None: it had them)
    demonstrations: int
    pairs: int
    agreement_before: float  # share of demonstrated actions the starting policy already chose
    agreement_after: float
    seconds: float
    out: Path
    kept_start: bool = False  # the adapted policy was slower on the held-out problems: OUT/policy is the starting policy

    @property
    def ratio(self) -> float:
        """Geometric mean of after / before over the held-out problems."""
        return geomean_ratio(self.after_gflops, self.before_gflops)

    @property
    def ratio_over_retargeted(self) -> float:
        """Geometric mean of after / retargeted (what the measurements and fine-tuning added to
        the plans' mapping), NaN when the policy needed no retargeting."""
        return math.nan if self.retargeted_gflops is None else geomean_ratio(self.after_gflops, self.retargeted_gflops)


def geomean_ratio(numerators, denominators) -> float:
    """Geometric mean of the ratios of the pairs both positive (NaN when none is)."""
    pairs = [a / b for a, b in zip(numerators, denominators) if a > 0 and b > 0]
    return math.exp(sum(map(math.log, pairs)) / len(pairs)) if pairs else math.nan


def policy_datasets(policy: Policy) -> tuple[str, ...]:
    """The datasets ``policy`` was trained on (its file's ``training_problems``; those this
    looprl knows), else :data:`TRAINING_DATASETS`: a weights policy adapts on the layers it was
    made for, not on general GEMMs."""
    names = policy.env_kwargs.get("dataset")
    names = [names] if isinstance(names, str) else list(names or ())
    known = tuple(name for name in names if name in dataset_names())
    return known or TRAINING_DATASETS


def held_out_split(datasets) -> str:
    """The dataset whose validation split judges an adaptation on ``datasets``: the first of
    :data:`VALIDATION_DATASETS` among them (``models-called`` for a weights policy), else
    ``models``. Never a test split: whether the adapted policy is kept is a choice between
    two policies, made on validation (the test splits give the published figures)."""
    return next((name for name in VALIDATION_DATASETS if name in datasets), "models")


def held_out_problems_for(count: int, policy: Policy) -> list[Problem]:
    """``count`` problems spread over ``policy``'s held-out split (:func:`held_out_split`), in
    its dtype where its file names one; a ValueError when the split has fewer."""
    name = held_out_split(policy_datasets(policy))
    available = dataset_problems(name, "validation")
    if count > len(available):
        raise ValueError(f"held_out must be at most {len(available)} (the held-out split {name}/validation has "
                         f"{len(available)} problems), got {count}")
    dtype = policy.env_kwargs.get("dtype")
    return [p.with_dtype(dtype) if dtype is not None else p for p in spread(available, count)]


def adaptation_agent(policy: Policy, target: Target) -> dict:
    """The agent configuration a policy was trained as (its actions, episode, observation,
    datasets and dtype: :func:`policy_datasets`), on their training splits, measuring for
    ``target``."""
    meta = policy.metadata
    return {
        "algorithm": "dqn",
        "env": {
            **({"dtype": policy.env_kwargs["dtype"]} if "dtype" in policy.env_kwargs else {}),
            "dataset": list(policy_datasets(policy)), "split": "train", "observation": meta["observation"],
            "split_factors": list(meta["split_factors"]), "layouts": bool(meta.get("layouts", False)),
            "plans": list(meta.get("plans", [])),  # the policy's own plans: a plan names the same tile on any target
            "max_loops": int(meta["observation_shape"][0]), "episode_length": int(meta["episode_length"]),
            "measure_budget_s": defaults.STATE_BUDGET_S, "target": target.isa,
        },
    }


def in_turn(groups) -> list[Problem]:
    """The problems of ``groups`` taken one from each group in turn, each group spread evenly
    (so that however soon the budget ends, every dataset had its share)."""
    ordered = [list(group) for group in groups]
    orders = [_spread_order(len(group)) for group in ordered]
    out = []
    for i in range(max(len(g) for g in ordered)):
        out += [group[order[i]] for group, order in zip(ordered, orders) if i < len(group)]
    return out


def _spread_order(n: int) -> list[int]:
    """0..n-1 in an order whose every prefix is spread over the range (bit-reversed halving)."""
    order, seen, step = [], set(), n
    while len(order) < n:
        for i in range(0, n, max(step, 1)):
            if i not in seen:
                seen.add(i)
                order.append(i)
        if step == 1:
            break
        step = max(step // 2, 1)
    return order


def fine_tune(policy: Policy, observations: np.ndarray, labels: np.ndarray, *, epochs: int = 200, lr: float = 1e-3,
              margin: float = 0.05, seed: int = 0, until: float | None = None) -> Policy:
    """``policy`` with its trunk and greedy head trained to choose ``labels`` on
    ``observations`` (flattened), starting from its own weights, by DQfD's large-margin loss
    ``max_a [Q(s, a) + l(a_E, a)] - Q(s, a_E)`` (``l`` = ``margin`` for every action but the
    demonstrated one): it is zero where the policy already prefers the demonstrated action by
    the margin, so what the policy does right is left alone, and its scores keep their scale
    (a DQN's Q-values, on the scale of rewards). Stops early once every demonstrated action
    leads, or after the epoch that ends past ``until`` (a ``time.perf_counter()`` value).
    Its other heads (a DQN's value head) stay as they were."""
    import torch  # the [train] extra

    network = policy.metadata["network"]
    greedy = network["greedy"]
    layers = list(policy.trunk) + list(policy.heads[greedy])
    if any(layer.activation not in ACTIVATIONS for layer in layers):
        raise ValueError(f"fine_tune supports {', '.join(ACTIVATIONS)} layers, the policy has "
                         f"{sorted({layer.activation for layer in layers})}")
    torch.manual_seed(seed)
    linears = [torch.nn.Linear(layer.weight.shape[1], layer.weight.shape[0]) for layer in layers]
    with torch.no_grad():
        for linear, layer in zip(linears, layers):
            linear.weight.copy_(torch.as_tensor(layer.weight))
            linear.bias.copy_(torch.as_tensor(layer.bias))
    activation = {"relu": torch.relu, "tanh": torch.tanh, "linear": lambda t: t}

    def forward(x):
        for linear, layer in zip(linears, layers):
            x = activation[layer.activation](linear(x))
        return x

    x = torch.as_tensor(observations.reshape(len(observations), -1), dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.int64)
    optimizer = torch.optim.Adam([p for linear in linears for p in linear.parameters()], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 128):
            batch = order[start:start + 128]
            loss = margin_loss(forward(x[batch]), y[batch], margin)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            if margin_loss(forward(x), y, margin).item() == 0.0:
                break
        if until is not None and time.perf_counter() >= until:
            break
    tuned = [Dense(linear.weight.detach().numpy().astype(np.float32), linear.bias.detach().numpy().astype(np.float32), layer.activation)
             for linear, layer in zip(linears, layers)]
    trunk = tuple(tuned[: len(policy.trunk)])
    heads = dict(policy.heads, **{greedy: tuple(tuned[len(policy.trunk):])})
    return Policy(dict(policy.metadata), trunk, heads)


def agreement(policy: Policy, observations: np.ndarray, labels: np.ndarray) -> float:
    """Share of ``labels`` that ``policy``'s greedy action matches."""
    if not len(labels):
        return math.nan
    scores = policy.scores(np.asarray(observations, dtype=np.float32).reshape(len(observations), *policy.observation_shape))
    return float(np.mean(np.argmax(scores, axis=-1) == labels))


def _load_progress(path: Path, source: str, target: Target) -> list[dict]:
    """The demonstrations an earlier, interrupted adaptation into the same folder found (for
    the same policy and target), else none."""
    if not path.exists():
        return []
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"unreadable {path}: {error} (remove it, or give another --out)") from None
    if not isinstance(record, dict) or record.get("policy") != source or record.get("target") != target.isa:
        raise ValueError(f"{path} holds demonstrations of another policy or target: give another --out")
    items = record.get("demonstrations")
    if not isinstance(items, list):
        raise ValueError(f"{path}: 'demonstrations' must be a list")
    return items


def _save_progress(path: Path, source: str, target: Target, items: list[dict]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"policy": source, "target": target.isa, "demonstrations": items}, indent=0) + "\n",
                         encoding="utf-8")
    temporary.replace(path)


def _final_nests(policy: Policy, problems: list[Problem]):
    return [greedy_rollout(policy, problem, None).final_nest for problem in problems]


def compiled(nests, target: Target, kernels: dict) -> None:
    """Compile each schedule of ``nests`` not in ``kernels`` (schedule key -> kernel) into it."""
    for nest in nests:
        if nest.key not in kernels:
            kernels[nest.key] = compile(nest, target=target)


def retimed(nests_by_method: dict[str, list], target: Target, rounds: int = RETIME_ROUNDS, *, budget_s: float | None = None,
            kernels: dict | None = None) -> dict[str, list[float]]:
    """GFLOPS of each schedule, the distinct ones timed in interleaved rounds (best kept), so
    that two methods that reach one schedule get one figure. Each timing takes ``RETIME_S``;
    with ``budget_s`` (seconds for all the timings) less where the budget is short (its share,
    at least ``MIN_RETIME_S`` and one call), and the rounds after the first stop when it is
    spent. ``kernels``: schedules compiled already (:func:`compiled`). The machine-wide lock
    is held once, over all the rounds."""
    kernels = {} if kernels is None else kernels
    for nests in nests_by_method.values():
        compiled(nests, target, kernels)
    keys = list(dict.fromkeys(n.key for nests in nests_by_method.values() for n in nests))
    per_timing = RETIME_S if budget_s is None else min(RETIME_S, max(MIN_RETIME_S, budget_s / (rounds * max(len(keys), 1))))
    workspaces = {}
    for key in keys:
        workspaces.setdefault(kernels[key].problem.name, Workspace(kernels[key].problem))  # one buffer set per problem, kept warm
    best = dict.fromkeys(keys, 0.0)
    with machine_lock():
        until = None if budget_s is None else time.perf_counter() + budget_s
        for round_number in range(rounds):
            if round_number and until is not None and time.perf_counter() >= until:
                break
            for key in keys:
                kernel = kernels[key]
                timing = time_kernel(kernel, per_timing, min_runs=1, workspace=workspaces[kernel.problem.name],
                                     lock=contextlib.nullcontext())
                best[key] = max(best[key], timing.gflops)
    return {method: [best[n.key] for n in nests] for method, nests in nests_by_method.items()}


def adapt(policy: Policy | str | Path = "default", *, out: str | Path, target: Target | str | None = None, budget_s: float = 600.0,
          held_out: int = 12, cache=None, seed: int = 0, log=print, training_problems=None, held_out_problems=None) -> AdaptReport:
    """Adapt ``policy`` (``"default"``: the shipped one for ``target``) to this machine within
    ``budget_s`` seconds (module docstring: what may run past it) and write it to
    ``out/policy``, unless it is slower than the starting policy on the held-out problems:
    then ``out/policy`` is the starting policy and the adapted one ``out/policy-rejected``
    (the report's ``kept_start``). Returns the before/after figures on ``held_out`` problems
    of the held-out split. ``training_problems`` and ``held_out_problems`` (lists of
    problems) replace the datasets' when given."""
    started = time.perf_counter()
    budget_s = checks.seconds(budget_s, "budget_s")
    deadline = started + budget_s
    held_out = checks.positive_int(held_out, "held_out")
    target = Target.resolve(target)
    target.check_runs_on_host()
    source = str(policy) if not isinstance(policy, Policy) else "the given policy"
    loaded = load_policy(policy, target)
    if held_out_problems is None:
        problems_held_out = held_out_problems_for(held_out, loaded)
    else:
        problems_held_out = [as_problem(p) for p in held_out_problems]
    start = retargeted(loaded, target)  # another target's plans replaced by this one's
    if start is not loaded:
        log(f"[adapt] the policy's plans are {loaded.target.isa if loaded.target else 'another target'}'s: given {target.isa}'s "
            f"(each from the plan of as many vectors per row), then fine-tuned")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    agent = adaptation_agent(start, target)
    actions = policy_actions(start, target)
    evaluator = Evaluator(cache, defaults.STATE_BUDGET_S, target=target, samples=1)
    episode_length = int(loaded.metadata["episode_length"])
    progress_path = out / DEMONSTRATIONS_NAME
    items = _load_progress(progress_path, source, target)
    done = {item["problem"] for item in items}
    pool = in_turn(training_groups(agent)) if training_problems is None else [as_problem(p) for p in training_problems]
    problems = [p for p in pool if p.name not in done]
    if items:
        log(f"[adapt] {len(items)} demonstrations from the interrupted run in {out}: going on")
    # What the end costs, paid first where it can be: the starting policy's held-out schedules
    # compiled (the adapted policy's take about as long again), and torch imported.
    nests = {"before": _final_nests(loaded, problems_held_out)}
    if start is not loaded:
        nests["retargeted"] = _final_nests(start, problems_held_out)
    kernels: dict = {}
    compiling = time.perf_counter()
    for method_nests in nests.values():
        compiled(method_nests, target, kernels)
    compile_s = time.perf_counter() - compiling
    import torch  # noqa: F401  (the [train] extra: fine_tune's, imported now so that its cost counts before the gathering)

    end_s = compile_s + FINE_TUNE_SHARE * budget_s + RETIME_ROUNDS * MIN_RETIME_S * 2 * len(kernels)
    gather_until = min(started + GATHER_SHARE * budget_s, deadline - end_s)
    gathering = time.perf_counter()
    demo_s = 0.0  # the longest demonstration so far: one that would end past gather_until is not begun
    for problem in problems:
        if time.perf_counter() + demo_s >= gather_until:
            break
        began = time.perf_counter()
        # a plan policy's expert is the planner (every plan measured, what tune's tile stage
        # measures): more problems in the budget than a search each; others: measured tune
        demo, from_search = expert_demonstration(problem, actions, evaluator, episode_length, start, 0.0 if actions.plans else None)
        demo_s = max(demo_s, time.perf_counter() - began)
        items.append({"problem": problem.name, "actions": list(actions.named(demo.actions)), "gflops": demo.gflops,
                      "initial_gflops": demo.initial_gflops, "from_search": bool(from_search)})
        _save_progress(progress_path, source, target, items)
        if len(items) % 10 == 0:
            log(f"[adapt] {len(items)} demonstrations, {time.perf_counter() - started:.0f} s of {budget_s:.0f}")
    demos = [Demonstration(parse_problem(item["problem"]), tuple(actions.index(a) for a in item["actions"]), float(item["gflops"]),
                           float(item["initial_gflops"])) for item in items]
    if not demos:
        raise ValueError(f"no demonstration fitted in the {budget_s:.0f} s budget (loading, compiling the held-out schedules and "
                         f"importing torch took {gathering - started:.0f} s, comparing needs about {end_s:.0f} s): give a larger budget")
    x, y = demonstration_arrays(agent, demos)
    before_agreement = agreement(start, x, y)
    adapted = fine_tune(start, x, y, seed=seed, until=min(time.perf_counter() + FINE_TUNE_SHARE * budget_s, deadline - compile_s))
    after_agreement = agreement(adapted, x, y)
    log(f"[adapt] fine-tuned on {len(demos)} demonstrations ({len(y)} state-action pairs): the greedy action matches "
        f"{before_agreement:.1%} of them before, {after_agreement:.1%} after")
    training = loaded.metadata.get("training")
    adapted = Policy(dict(adapted.metadata, adapted={
        "from": source, "how": "supervised fine-tuning (DQfD's large-margin loss) towards measured tune's answers on this machine; no RL",
        "host_cpu": Target.host().cpu, "target": target.isa, "demonstrations": len(demos), "pairs": int(len(y)),
        "training_of_the_starting_policy": training,
    }), adapted.trunk, adapted.heads)
    nests["after"] = _final_nests(adapted, problems_held_out)
    compiled(nests["after"], target, kernels)
    gflops = retimed(nests, target, budget_s=max(deadline - time.perf_counter(), 0.0), kernels=kernels)
    ratio = geomean_ratio(gflops["after"], gflops["before"])
    kept_start = not ratio >= 1.0  # slower (or not comparable): the starting policy stays OUT/policy
    comparison = {"after_over_before_geomean": round(ratio, 4), "held_out": len(problems_held_out)}
    if kept_start:
        Policy(dict(adapted.metadata, adaptation_rejected={**comparison, "why": "slower than the starting policy"}),
               adapted.trunk, adapted.heads).save(out / REJECTED_POLICY)
        Policy(dict(loaded.metadata, adaptation={**comparison, "kept": "the starting policy", "from": source,
                                                  "rejected": REJECTED_POLICY}), loaded.trunk, loaded.heads).save(out / "policy")
        log(f"[adapt] warning: the adapted policy is slower than the starting one on the held-out problems (geomean "
            f"{ratio:.3f}): {out / 'policy'} is the starting policy; the adapted one is in {out / REJECTED_POLICY}")
    else:
        adapted.save(out / "policy")
        shutil.rmtree(out / REJECTED_POLICY, ignore_errors=True)  # an earlier run's, into the same folder
    report = AdaptReport(tuple(p.name for p in problems_held_out), tuple(gflops["before"]), tuple(gflops["after"]),
                         tuple(gflops["retargeted"]) if "retargeted" in gflops else None, len(demos),
                         int(len(y)), before_agreement, after_agreement, time.perf_counter() - started, out, kept_start)
    (out / REPORT_NAME).write_text(json.dumps({
        "policy": source, "target": target.isa, "host_cpu": Target.host().cpu, "seconds": round(report.seconds, 1),
        "budget_s": budget_s, "written": "the starting policy" if kept_start else "the adapted policy",
        **({"rejected": REJECTED_POLICY} if kept_start else {}),
        "demonstrations": report.demonstrations, "pairs": report.pairs, "agreement_before": round(before_agreement, 4),
        "agreement_after": round(after_agreement, 4), "held_out": list(report.problems),
        "before_gflops": [round(g, 2) for g in report.before_gflops], "after_gflops": [round(g, 2) for g in report.after_gflops],
        "after_over_before_geomean": round(report.ratio, 4),
        **({} if report.retargeted_gflops is None else {
            "retargeted_gflops": [round(g, 2) for g in report.retargeted_gflops],
            "after_over_retargeted_geomean": round(report.ratio_over_retargeted, 4),
            "retargeted_plans": start.metadata["retargeted"]["plans"],
        }),
    }, indent=1) + "\n", encoding="utf-8")
    return report


def format_report(report: AdaptReport) -> str:
    """The before/after table an adaptation prints."""
    mapped = report.retargeted_gflops
    lines = [f"{'held-out problem':44s} {'before':>9s}" + (f" {'mapped':>9s}" if mapped else "") + f" {'after':>9s} {'ratio':>6s}"]
    for i, (name, before, after) in enumerate(zip(report.problems, report.before_gflops, report.after_gflops)):
        lines.append(f"{name:44s} {before:9.1f}" + (f" {mapped[i]:9.1f}" if mapped else "")
                     + f" {after:9.1f} {after / before if before > 0 else math.nan:6.2f}")
    lines.append(f"adapted / starting policy, one greedy episode each: geomean {report.ratio:.3f} over {len(report.problems)} "
                 f"held-out problems ({report.seconds:.0f} s)")
    if report.kept_start:
        lines.append(f"WARNING: the adapted policy is slower than the starting one: kept the STARTING policy as "
                     f"{report.out / 'policy'}; the adapted one is in {report.out / REJECTED_POLICY}")
    else:
        lines.append(f"written: the adapted policy, {report.out / 'policy'}")
    if mapped:
        lines.append(f"adapted / starting policy with this target's plans mapped in ('mapped', no measurement): geomean "
                     f"{report.ratio_over_retargeted:.3f}")
    return "\n".join(lines)
