"""Expert iteration for a DQfD run (the agent's ``demonstrations`` section): its settings,
checked before anything runs, and each round's demonstrations written into the run folder.

Round 1: the starting policy's measured search (and the tile planner) make the
demonstrations; with ``rounds > 1``, after every ``round_iterations`` RL iterations the best
validated policy so far becomes the expert and its finds replace them (the learner reloads the
file: :meth:`looprl.train.dqfd.DQfDTorchLearner.reload_demonstrations`). The run folder keeps
the pairs of the current round (``demonstrations.npz``), a summary per round
(``demonstrations.json``) and, from round 1, the policy cloned from the demonstrations alone
(``demonstrations-clone/``), to tell what RL adds to them.
"""

from __future__ import annotations

import json
from pathlib import Path

from looprl.policy.numpy_policy import JSON_NAME, Policy
from looprl.train.loop import BEST_POLICY, DEMONSTRATIONS_CLONE, DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY

LOSS_SETTINGS = {"margin": 0.05, "weight": 1.0, "batch_size": 64}
GATHER_SETTINGS = {"problems_per_dataset": 200, "search_budget_s": 0.5, "rounds": 1, "round_iterations": None}


def _positive_int(value, name: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"demonstrations.{name} must be a positive integer, got {value!r}")


def loss_settings(section: dict) -> dict:
    """The margin-loss settings of a ``demonstrations`` section, defaults filled in and checked."""
    settings = {name: section.get(name, default) for name, default in LOSS_SETTINGS.items()}
    if isinstance(settings["margin"], bool) or not (isinstance(settings["margin"], (int, float)) and settings["margin"] > 0):
        raise ValueError(f"demonstrations.margin must be a positive number, got {settings['margin']!r}")
    if isinstance(settings["weight"], bool) or not (isinstance(settings["weight"], (int, float)) and settings["weight"] >= 0):
        raise ValueError(f"demonstrations.weight must be a non-negative number, got {settings['weight']!r}")
    _positive_int(settings["batch_size"], "batch_size")
    return settings


def settings(agent: dict) -> dict:
    """The agent's ``demonstrations`` section, every setting checked and defaults filled in."""
    section = dict(agent.get("demonstrations") or {})
    allowed = set(LOSS_SETTINGS) | set(GATHER_SETTINGS)
    unknown = set(section) - allowed
    if unknown:
        raise ValueError(f"demonstrations: unknown settings {sorted(unknown)}; expected {', '.join(sorted(allowed))}")
    checked = {**{name: section.get(name, default) for name, default in GATHER_SETTINGS.items()}, **loss_settings(section)}
    _positive_int(checked["problems_per_dataset"], "problems_per_dataset")
    _positive_int(checked["rounds"], "rounds")
    _positive_int(checked["round_iterations"], "round_iterations", allow_none=checked["rounds"] == 1)
    budget = checked["search_budget_s"]
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget < float("inf"):
        raise ValueError(f"demonstrations.search_budget_s must be a non-negative number of seconds, got {budget!r}")
    return checked


def rounds(agent: dict) -> tuple[int, int | None]:
    """Expert iteration's rounds and the RL iterations of each but the last (1, None for an
    agent without a ``demonstrations`` section)."""
    if not agent.get("demonstrations"):
        return 1, None
    checked = settings(agent)
    return checked["rounds"], checked["round_iterations"]


def expert(run_path: Path) -> Policy:
    """The next round's expert: the run's best validated policy (its newest one if none)."""
    best = Path(run_path) / BEST_POLICY
    return Policy.load(best if (best / JSON_NAME).exists() else Path(run_path) / "policy")


def gather_round(agent: dict, run_path: Path, policy: Policy | None, seed: int, round_number: int = 1, log=print) -> dict:
    """Round ``round_number``'s demonstrations from ``policy``'s measured search (None: the
    tile planner alone) into the run folder; returns the round's summary."""
    from looprl.train.demonstrations import cloned_policy, gather_demonstrations, summary_rounds
    from looprl.train.validation import spread_over_datasets
    from looprl.train.dqfd import save_demonstrations

    checked = settings(agent)
    run_path = Path(run_path)
    problems = spread_over_datasets(agent, checked["problems_per_dataset"])
    budget = checked["search_budget_s"] if policy is not None else 0.0
    x, y, summary = gather_demonstrations(agent, problems, policy, budget, log=log)
    save_demonstrations(run_path / DEMONSTRATIONS_FILE, x, y)
    summary_path = run_path / DEMONSTRATIONS_SUMMARY
    earlier = summary_rounds(json.loads(summary_path.read_text(encoding="utf-8")))[: round_number - 1] if round_number > 1 else []
    record = {"settings": dict(agent["demonstrations"]), "rounds": [*earlier, {"round": round_number, **summary}]}
    summary_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if round_number == 1:
        extra = {"demonstrations_clone": {**summary, "note": "cross-entropy clone of the run's first demonstrations alone (no RL), to compare"}}
        cloned_policy(agent, x, y, dict(agent.get("pretrain") or {}), seed, extra, log).save(run_path / DEMONSTRATIONS_CLONE)
    return summary
