"""A training run's folder: what it holds, ``run.json`` checked as it is read, atomic
checkpoints, and nothing read from outside it.

A run folder holds::

    agent.yaml        the effective agent configuration (overrides applied)
    run.json          the run's arguments and, after each checkpoint, where it stands
    metrics.csv       one row per iteration
    tb/               TensorBoard event files
    checkpoints/iter_000010/   RLlib checkpoints (the two newest are kept), with the DQN
                      replay buffer when ``store_buffer_in_checkpoints`` is set
    policy/           the newest checkpoint exported as a numpy policy (policy.json + .npz)
    policy-best/      the policy that scored best in validation (see ``validation.py``)
    pretrained/       the policy the run started from: cloned from demonstrations (a ``pretrain``
                      section) or given (``--init-from``, ``pretrain.policy``)
    demonstrations.npz, demonstrations.json   expert iteration's demonstrations for the DQfD
                      learner and their summary (a ``demonstrations`` section)
    demonstrations-clone/   the policy cloned from those demonstrations alone, to compare with the RL

A folder whose run never reached a checkpoint (its start failed or was interrupted) holds no
training to lose: starting it again, with or without ``--resume``, starts over.

What a run folder's files name is only ever looked for inside the folder: ``run.json``'s
checkpoint must be the name of a folder ``checkpoints/iter_NNNNNN`` that is really there (no
``..``, no absolute path, no symbolic link out), and nothing is unpickled but that
checkpoint's own ``replay_buffer.pkl``, which this module wrote. Every file is checked as it
is read: a ``run.json`` that is not what this module writes is a ValueError naming the file
and the key, never a traceback.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.policy.numpy_policy import JSON_NAME, Policy
from looprl.train.config import ALGORITHMS, read_agent
from looprl.train.schema import COUNT, NON_NEGATIVE_NUMBER, POSITIVE, Choice, Integer, Rule, Section, Text, optional, shown

RUN_RECORD = "run.json"
AGENT_FILE = "agent.yaml"
METRICS_FILE = "metrics.csv"
CHECKPOINTS = "checkpoints"
REPLAY_BUFFER_FILE = "replay_buffer.pkl"
NEWEST_POLICY = "policy"
BEST_POLICY = "policy-best"
PRETRAINED_POLICY = "pretrained"
DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY, DEMONSTRATIONS_CLONE = "demonstrations.npz", "demonstrations.json", "demonstrations-clone"
KEEP_CHECKPOINTS = 2
CHECKPOINT_NAME = re.compile(r"iter_[0-9]{6,}")
METRICS = [
    "iteration", "env_steps", "episodes", "episode_reward_mean", "speedup_mean", "speedup_geomean", "final_gflops_mean",
    "cache_hit_rate", "invalid_rate", "epsilon_mean", "env_steps_per_s", "iteration_s", "elapsed_s", "validation_speedup",
    "demonstration_agreement",
]


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


@dataclass(frozen=True)
class CheckpointName(Rule):
    """The name of a checkpoint folder under ``checkpoints/``: ``iter_`` and six or more digits."""

    def describe(self) -> str:
        return "a checkpoint folder name iter_NNNNNN"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and CHECKPOINT_NAME.fullmatch(value) is not None


STATE_RULES = {"iteration": COUNT, "env_steps": COUNT, "elapsed_s": NON_NEGATIVE_NUMBER, "checkpoint": optional(CheckpointName())}
RECORD = Section({
    "arguments": Section({
        "algo": Choice(ALGORITHMS),
        "seed": Integer(None),
        "num_env_runners": optional(COUNT),
        "config": Text(),
        "init_from": Text(),
        "start_validation": NON_NEGATIVE_NUMBER,
        "demonstration_round": POSITIVE,
    }, required=("algo", "seed")),
    "state": Section(STATE_RULES, required=tuple(STATE_RULES)),
}, required=("arguments", "state"))


@dataclass
class RunState:
    """Where a run stands; saved in ``run.json`` with every checkpoint."""

    iteration: int = 0
    env_steps: int = 0
    elapsed_s: float = 0.0
    checkpoint: str | None = None  # folder name under checkpoints/


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


class RunDirectory:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS

    @property
    def agent_path(self) -> Path:
        return self.path / AGENT_FILE

    @property
    def record_path(self) -> Path:
        return self.path / RUN_RECORD

    def exists(self) -> bool:
        return self.record_path.exists()

    def record(self) -> tuple[RunState, dict]:
        """``run.json``'s state and arguments, checked; a ValueError naming the file otherwise."""
        try:
            record = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:
            raise ValueError(f"{self.record_path}: unreadable ({error})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{self.record_path}: expected an object with 'arguments' and 'state', got {shown(record)}")
        try:
            RECORD.check(record, "")
        except ValueError as error:
            raise ValueError(f"{self.record_path}: {error}") from None
        return RunState(**record["state"]), dict(record["arguments"])

    def checkpointed(self) -> bool:
        """Whether the folder holds a run that reached a checkpoint: that run can only be
        resumed. A run folder without one (its start failed or was interrupted) can be started again."""
        return self.exists() and self.record()[0].checkpoint is not None

    def load(self) -> tuple[dict, RunState, dict]:
        """The run's agent configuration, state and arguments, each file checked."""
        state, arguments = self.record()
        return read_agent(self.agent_path), state, arguments

    def discard_unstarted(self) -> None:
        """Remove what a start that reached no checkpoint left (this class's files only, and
        only in a run folder: an ``--out`` that holds no run.json is left as it is)."""
        if not self.exists():
            return
        if self.checkpointed():
            raise ValueError(f"{self.path} holds a run with a checkpoint; it can only be resumed")
        for name in (RUN_RECORD, AGENT_FILE, METRICS_FILE, DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY):
            (self.path / name).unlink(missing_ok=True)
        for name in (CHECKPOINTS, "tb", NEWEST_POLICY, BEST_POLICY, PRETRAINED_POLICY, DEMONSTRATIONS_CLONE):
            shutil.rmtree(self.path / name, ignore_errors=True)

    def create(self, agent: dict, arguments: dict) -> None:
        import yaml  # the [train] extra, as everything that writes a run

        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        _atomic_write(self.agent_path, yaml.safe_dump(agent, sort_keys=False))
        self.save_state(RunState(), arguments)

    def save_state(self, state: RunState, arguments: dict) -> None:
        record = {"arguments": arguments, "state": vars(state)}
        _atomic_write(self.record_path, json.dumps(record, indent=1) + "\n")

    def inside(self, relative: str | Path, what: str) -> Path:
        """``relative`` under the run folder, refused (ValueError naming ``what``) unless it
        resolves to that very place: no ``..``, no absolute path, no symbolic link on the way."""
        relative = Path(relative)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"{self.path}: {what} {str(relative)!r} is not a name inside the run folder")
        path = self.path / relative
        if path.resolve() != self.path.resolve() / relative:
            raise ValueError(f"{self.path}: {what} {relative} leads out of the run folder (a symbolic link)")
        return path

    def checkpoint_folder(self, name: Any) -> Path:
        """The folder of checkpoint ``name`` (run.json's ``state.checkpoint``), once it is
        known to be ``checkpoints/iter_NNNNNN`` inside this run folder, a real folder with no
        symbolic link anywhere in it (RLlib reads, and unpickles, what it holds), whose replay
        buffer (if any) is a file; a ValueError otherwise."""
        CheckpointName().check(name, f"{self.path}: checkpoint")
        folder = self.inside(Path(CHECKPOINTS) / name, "checkpoint")
        if not folder.is_dir():
            raise ValueError(f"{self.path}: checkpoint {name} is not in {self.checkpoints}")
        for parent, folders, files in os.walk(folder):  # os.walk does not follow links
            for entry in (*folders, *files):
                if os.path.islink(os.path.join(parent, entry)):
                    raise ValueError(f"{self.path}: checkpoint {name} holds a symbolic link, {Path(parent, entry)}")
        buffer = folder / REPLAY_BUFFER_FILE
        if os.path.lexists(buffer) and not buffer.is_file():
            raise ValueError(f"{self.path}: {buffer} is not a file")
        return folder

    def save_checkpoint(self, algo, state: RunState, arguments: dict) -> Path:
        """Write the checkpoint to a temporary folder, rename it into place, then record it;
        a crash at any point leaves the previous checkpoint intact and referenced."""
        name = checkpoint_name(state.iteration)
        final = self.checkpoints / name
        temporary = self.checkpoints / f".{name}.tmp"
        shutil.rmtree(temporary, ignore_errors=True)
        # run.json's count is the one this checkpoint holds: an interrupt inside an iteration
        # leaves the algorithm (and its replay buffer) past the last finished iteration's count.
        sampled = sampled_env_steps(algo)
        algo.save_to_path(str(temporary.resolve()))
        buffer = getattr(algo, "local_replay_buffer", None)
        if buffer is not None and getattr(algo.config, "store_buffer_in_checkpoints", False):
            # RLlib's new API stack leaves the replay buffer out of its checkpoints.
            with (temporary / REPLAY_BUFFER_FILE).open("wb") as handle:
                pickle.dump(buffer.get_state(), handle, protocol=pickle.HIGHEST_PROTOCOL)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
        state.checkpoint = name
        if sampled is not None:
            state.env_steps = sampled
        self.save_state(state, arguments)
        for old in sorted(p for p in self.checkpoints.iterdir() if p.name.startswith("iter_"))[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def restore(self, algo, state: RunState) -> None:
        """Load the checkpoint ``state`` points to (checked: :meth:`checkpoint_folder`),
        replay buffer included when it was saved."""
        path = self.checkpoint_folder(state.checkpoint).resolve()
        algo.restore_from_path(str(path))
        saved_buffer = path / REPLAY_BUFFER_FILE
        buffer = getattr(algo, "local_replay_buffer", None)
        if buffer is not None and saved_buffer.is_file():
            with saved_buffer.open("rb") as handle:
                buffer.set_state(pickle.load(handle))  # our own file, written by save_checkpoint, in our own checkpoint

    def pretrained_policy(self) -> Policy:
        """The policy the run started from (``pretrained/``, saved before run.json was first written)."""
        folder = self.inside(PRETRAINED_POLICY, "starting policy")
        if not (folder / JSON_NAME).is_file():
            raise ValueError(f"{self.path} holds no {PRETRAINED_POLICY}/ policy to start from; start a new run instead")
        return Policy.load(folder)

    def best_validation(self) -> float:
        """The validation score of the run's best policy so far (-inf before the first)."""
        try:  # the metadata is enough: no need to read the weights
            metadata = json.loads((self.path / BEST_POLICY / JSON_NAME).read_text(encoding="utf-8"))
            score = metadata.get("validation", {}).get("speedup_geomean")
        except (OSError, ValueError, AttributeError, RecursionError):
            return -math.inf
        return float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else -math.inf

    def trim_metrics(self, iteration: int) -> None:
        """Drop metric rows past ``iteration`` (written after the checkpoint we resume from)."""
        path = self.path / METRICS_FILE
        if not path.exists():
            return
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                rows = [row for row in csv.DictReader(handle) if int(row["iteration"]) <= iteration]
        except (OSError, ValueError, KeyError, TypeError, csv.Error) as error:
            raise ValueError(f"{path}: unreadable ({error})") from None
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=METRICS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


def sampled_env_steps(algo) -> int | None:
    """The env steps an RLlib algorithm has counted so far (what a checkpoint of it holds and
    its next iteration continues from); None when it keeps no such count."""
    metrics_logger = getattr(algo, "metrics", None)
    if metrics_logger is None or not hasattr(metrics_logger, "peek"):
        return None
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME  # Ray: only once an algorithm exists

    value = metrics_logger.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=None)
    return int(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
