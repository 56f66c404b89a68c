"""Expert iteration for a DQfD run (the agent's ``demonstrations`` section, its settings
checked by :mod:`looprl.train.schema`): each round's demonstrations written into the run folder.

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
from looprl.train.cloning import cloned_policy
from looprl.train.demonstration_files import save_demonstrations, summary_rounds
from looprl.train.demonstrations import gather_demonstrations
from looprl.train.run_folder import BEST_POLICY, DEMONSTRATIONS_CLONE, DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY, NEWEST_POLICY
from looprl.train.schema import section_settings
from looprl.train.validation import spread_over_datasets


def rounds(agent: dict) -> tuple[int, int | None]:
    """Expert iteration's rounds and the RL iterations of each but the last (1, None for an
    agent without a ``demonstrations`` section)."""
    if not agent.get("demonstrations"):
        return 1, None
    settings = section_settings(agent, "demonstrations")
    return settings["rounds"], settings["round_iterations"]


def expert(run_path: Path) -> Policy:
    """The next round's expert: the run's best validated policy (its newest one if none)."""
    best = Path(run_path) / BEST_POLICY
    return Policy.load(best if (best / JSON_NAME).exists() else Path(run_path) / NEWEST_POLICY)


def gather_round(agent: dict, run_path: Path, policy: Policy | None, seed: int, round_number: int = 1, log=print,
                 address: str | None = None) -> dict:
    """Round ``round_number``'s demonstrations from ``policy``'s measured search (None: the
    tile planner alone) into the run folder; returns the round's summary."""
    settings = section_settings(agent, "demonstrations")
    run_path = Path(run_path)
    problems = spread_over_datasets(agent, settings["problems_per_dataset"])
    budget = settings["search_budget_s"] if policy is not None else 0.0
    x, y, summary = gather_demonstrations(agent, problems, policy, budget, log=log, address=address)
    save_demonstrations(run_path / DEMONSTRATIONS_FILE, x, y)
    summary_path = run_path / DEMONSTRATIONS_SUMMARY
    earlier = summary_rounds(json.loads(summary_path.read_text(encoding="utf-8")))[: round_number - 1] if round_number > 1 else []
    record = {"settings": dict(agent["demonstrations"]), "rounds": [*earlier, {"round": round_number, **summary}]}
    summary_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if round_number == 1:
        extra = {"demonstrations_clone": {**summary, "note": "cross-entropy clone of the run's first demonstrations alone (no RL), to compare"}}
        cloned_policy(agent, x, y, seed, extra, log).save(run_path / DEMONSTRATIONS_CLONE)
    return summary
