"""A training run made a shipped one: ``python -m looprl.train.ship RUN --to checkpoints/NAME``.

Copies what a user of the policy needs and what reproduces and judges it, never the RLlib
checkpoints (hundreds of MB of replay buffer): ``agent.yaml``, ``run.json``, ``metrics.csv``,
the best validated policy as ``policy/`` (the newest one when the run never validated),
``pretrained/`` (the policy the run started from), and, for a DQfD run,
``demonstrations.json`` and ``demonstrations-clone/`` (and, for a run pretrained on measured
tune's answers, each round's demonstrations by problem, ``pretrain-round<N>.json``). The shipped ``policy.json`` gets a
``training`` record written from the run's own files, so that its name is honest: the
algorithm that trained it, the policy it started from (and where that came from), the RL
iterations and env steps of the snapshot shipped, and the demonstrations it was fine-tuned
with. ``--snapshot pretrained`` ships the clone the run started from as ``policy/`` instead
(when held-out figures say it generalises better than what RL validated best); its record
then says it is a clone with no RL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from looprl.policy.numpy_policy import JSON_NAME, Policy
from looprl.train.demonstration_files import summary_rounds
from looprl.train.run_folder import BEST_POLICY, DEMONSTRATIONS_CLONE, DEMONSTRATIONS_SUMMARY, PRETRAINED_POLICY, RunDirectory

_FILES = ("agent.yaml", "run.json", "metrics.csv", DEMONSTRATIONS_SUMMARY, "learning_curve.png")


def training_record(run: Path, policy: Policy, config: str | None = None) -> dict:
    """What trained ``policy`` (a snapshot of ``run``), from the run's files (each checked)."""
    agent, _, arguments = RunDirectory(run).load()
    snapshot = policy.metadata.get("validation") or policy.metadata.get("metrics") or {}
    algorithm = _algorithm(agent) + (" (RLlib DQN with Ape-X per-runner epsilons)" if agent.get("apex") else "")
    record = {
        "algorithm": algorithm,
        "rl_iterations": snapshot.get("iteration"),
        "rl_env_steps": snapshot.get("env_steps"),
        "started_from": (agent.get("pretrain") or {}).get("policy") or arguments.get("init_from"),
        "starting_validation": arguments.get("start_validation"),
        "validation": snapshot.get("speedup_geomean"),
        "reproduce": f"python -m looprl.train --config {config or arguments.get('config') or 'agent.yaml'} --seed {arguments.get('seed', 0)}"
                     + (f" --iterations {snapshot['iteration']}" if snapshot.get("iteration") else ""),
    }
    if agent.get("demonstrations"):
        summary = json.loads((run / DEMONSTRATIONS_SUMMARY).read_text(encoding="utf-8"))
        record["loss"] = "n-step double-Q TD (dueling) + DQfD large-margin loss on demonstrations"
        rounds = summary_rounds(summary)
        per_round = agent["demonstrations"].get("round_iterations")
        iteration = snapshot.get("iteration") or 0
        tune_expert = (agent.get("pretrain") or {}).get("expert") == "tune"
        # A tune-expert run's rounds all ran before RL (its pretraining); DQfD's later rounds replace demonstrations during it.
        used = rounds if tune_expert else [r for r in rounds if r["round"] == 1 or (per_round and iteration > per_round * (r["round"] - 1))]
        record["demonstrations"] = {
            "expert": ("per problem the faster of the tile planner's tile and measured tune's answer (looprl.tune.measured."
                       "measured_search, its scaled budget) with the pretraining's expert policy, then with each round's clone: "
                       "the pretraining's last round" if tune_expert else
                       "per problem the better of the tile planner's tile and the measured search of the starting policy "
                       "(round 1) or of the best validated policy so far (later rounds)"),
            "settings": summary.get("settings"),
            "rounds": used,  # the rounds this snapshot was trained with
        }
        if len(used) < len(rounds):
            record["demonstrations"]["later_rounds"] = f"{len(rounds) - len(used)} later round(s) ran and validated no higher"
    pretrain = agent.get("pretrain") or {}
    if pretrain.get("expert") == "tune":
        record["started_from"] = (f"a clone of measured tune's answers on the training problems ({pretrain.get('rounds', 1)} round(s) "
                                  f"of expert iteration from {pretrain.get('expert_policy') or 'the shipped default'}): pretrained/")
    if snapshot.get("iteration") == 0:
        record["note"] = "no RL snapshot validated above the starting policy: this is the starting policy"
    return record


def _algorithm(agent: dict) -> str:
    """The RL algorithm of ``agent``'s run, as a record names it."""
    return "APEX-DQN" if agent.get("apex") else str(agent["algorithm"]).upper()


def clone_record(run: Path, policy: Policy, config: str | None = None) -> dict:
    """What made ``policy``, the clone ``run`` started from: behaviour cloning, no RL."""
    agent, _, arguments = RunDirectory(run).load()
    pretrained = policy.metadata.get("pretrained") or {}
    return {
        "algorithm": "behaviour cloning (cross-entropy on measured demonstrations); no RL",
        "rl_iterations": 0,
        "rl_env_steps": 0,
        "demonstrations": {"expert": (pretrained.get("settings") or {}).get("expert"), "problems": pretrained.get("problems"),
                           "pairs": pretrained.get("pairs")},
        "starting_validation": arguments.get("start_validation"),
        "reproduce": f"python -m looprl.train --config {config or arguments.get('config') or 'agent.yaml'} --seed {arguments.get('seed', 0)}"
                     " (the run's pretrained/ policy)",
        "note": f"the clone the {_algorithm(agent)} run started from, "
                "shipped instead of its best validated snapshot",
    }


SNAPSHOTS = ("best", "pretrained")


def _warn(line: str) -> None:
    print(f"python -m looprl.train.ship: warning: {line}", file=sys.stderr, flush=True)


def ship(run: Path, to: Path, config: str | None = None, snapshot: str = "best", warn=_warn) -> Path:
    """Ship ``run`` into ``to`` (module docstring). A run that never validated ships its newest
    snapshot, which nothing compared with the policy the run started from: ``warn`` says so,
    and the record's ``note`` too."""
    run, to = Path(run), Path(to)
    if snapshot not in SNAPSHOTS:
        raise ValueError(f"snapshot must be one of {', '.join(SNAPSHOTS)}, got {snapshot!r}")
    if snapshot == "pretrained":
        source = run / PRETRAINED_POLICY
        if not (source / JSON_NAME).exists():
            raise ValueError(f"{run} has no {PRETRAINED_POLICY}/ policy to ship")
    else:
        source = run / BEST_POLICY if (run / BEST_POLICY / JSON_NAME).exists() else run / "policy"
    policy = Policy.load(source)
    if to.exists():
        shutil.rmtree(to)
    to.mkdir(parents=True)
    for name in _FILES:
        if (run / name).exists():
            shutil.copy2(run / name, to / name)
    for rounds in sorted(run.glob("pretrain-round*.json")):  # tune-expert pretraining's demonstrations, by problem
        shutil.copy2(rounds, to / rounds.name)
    for name in (PRETRAINED_POLICY, DEMONSTRATIONS_CLONE):
        if snapshot == "pretrained" and name == PRETRAINED_POLICY:
            continue  # it is policy/
        if (run / name).exists():
            Policy.load(run / name).save(to / name)
    record = clone_record(run, policy, config) if snapshot == "pretrained" else training_record(run, policy, config)
    if snapshot == "best" and source.name != BEST_POLICY and (run / PRETRAINED_POLICY / JSON_NAME).exists():
        record["note"] = (f"never validated: this newest snapshot was not compared with the policy the run started from "
                          f"({PRETRAINED_POLICY}/), which may be faster; --snapshot pretrained ships that one")
        warn(f"{run} never validated: shipping its newest snapshot, not compared with the policy it started from "
             f"({run / PRETRAINED_POLICY}); --snapshot pretrained ships that one instead")
    metadata = {**policy.metadata, "training": record}
    dataclasses.replace(policy, metadata=metadata).save(to / "policy")
    return to


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m looprl.train.ship", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--to", type=Path, required=True)
    parser.add_argument("--config", default=None, help="the agent YAML the run was started with (default: the one run.json names)")
    parser.add_argument("--snapshot", default="best", choices=SNAPSHOTS,
                        help="best: the best validated policy (default); pretrained: the clone the run started from")
    args = parser.parse_args(argv)
    try:
        print("shipped", ship(args.run, args.to, args.config, args.snapshot))
    except (OSError, ValueError, KeyError) as error:
        print(f"python -m looprl.train.ship: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
