"""The demonstrations a run keeps: the (observation, action) pairs of ``demonstrations.npz``, and
the per-round summaries of ``demonstrations.json`` (:mod:`looprl.train.run_folder`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
