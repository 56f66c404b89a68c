"""The training loop: iterations, progress line, CSV and TensorBoard records, atomic
checkpoints, exact resume and a final checkpoint on Ctrl-C.

A run directory holds::

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
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import numbers
import os
import pickle
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.interrupts import check_interrupt, terminate_as_interrupt
from looprl.train import metric_names as metrics

METRICS = [
    "iteration", "env_steps", "episodes", "episode_reward_mean", "speedup_mean", "speedup_geomean", "final_gflops_mean",
    "cache_hit_rate", "invalid_rate", "epsilon_mean", "env_steps_per_s", "iteration_s", "elapsed_s", "validation_speedup",
    "demonstration_agreement",
]
KEEP_CHECKPOINTS = 2
REPLAY_BUFFER_FILE = "replay_buffer.pkl"
BEST_POLICY = "policy-best"
PRETRAINED_POLICY = "pretrained"
DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY, DEMONSTRATIONS_CLONE = "demonstrations.npz", "demonstrations.json", "demonstrations-clone"


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
        self.checkpoints = self.path / "checkpoints"

    @property
    def agent_path(self) -> Path:
        return self.path / "agent.yaml"

    def exists(self) -> bool:
        return (self.path / "run.json").exists()

    def checkpointed(self) -> bool:
        """Whether the folder holds a run that reached a checkpoint: that run can only be
        resumed. A run folder without one (its start failed or was interrupted) can be started again."""
        if not self.exists():
            return False
        try:
            record = json.loads((self.path / "run.json").read_text(encoding="utf-8"))
            return record["state"].get("checkpoint") is not None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{self.path} holds an unreadable run.json ({error}); choose another --out") from None

    def discard_unstarted(self) -> None:
        """Remove what a start that reached no checkpoint left (this class's files only, and
        only in a run folder: an ``--out`` that holds no run.json is left as it is)."""
        if not self.exists():
            return
        if self.checkpointed():
            raise ValueError(f"{self.path} holds a run with a checkpoint; it can only be resumed")
        for name in ("run.json", "agent.yaml", "metrics.csv", DEMONSTRATIONS_FILE, DEMONSTRATIONS_SUMMARY):
            (self.path / name).unlink(missing_ok=True)
        for name in ("checkpoints", "tb", "policy", BEST_POLICY, PRETRAINED_POLICY, DEMONSTRATIONS_CLONE):
            shutil.rmtree(self.path / name, ignore_errors=True)

    def create(self, agent: dict, arguments: dict) -> None:
        import yaml  # the [train] extra, as everything that writes a run

        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        _atomic_write(self.agent_path, yaml.safe_dump(agent, sort_keys=False))
        self.save_state(RunState(), arguments)

    def load(self) -> tuple[dict, RunState, dict]:
        import yaml

        try:
            record = json.loads((self.path / "run.json").read_text(encoding="utf-8"))
            agent = yaml.safe_load(self.agent_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, yaml.YAMLError) as error:
            raise ValueError(f"cannot resume from {self.path}: {error}") from error
        return agent, RunState(**record["state"]), record["arguments"]

    def save_state(self, state: RunState, arguments: dict) -> None:
        record = {"arguments": arguments, "state": vars(state)}
        _atomic_write(self.path / "run.json", json.dumps(record, indent=1) + "\n")

    def save_checkpoint(self, algo, state: RunState, arguments: dict) -> Path:
        """Write the checkpoint to a temporary folder, rename it into place, then record it;
        a crash at any point leaves the previous checkpoint intact and referenced."""
        name = f"iter_{state.iteration:06d}"
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
        """Load the checkpoint ``state`` points to, replay buffer included when it was saved."""
        path = (self.checkpoints / state.checkpoint).resolve()
        algo.restore_from_path(str(path))
        saved_buffer = path / REPLAY_BUFFER_FILE
        buffer = getattr(algo, "local_replay_buffer", None)
        if buffer is not None and saved_buffer.exists():
            with saved_buffer.open("rb") as handle:
                buffer.set_state(pickle.load(handle))  # our own file, written by save_checkpoint

    def best_validation(self) -> float:
        """The validation score of the run's best policy so far (-inf before the first)."""
        from looprl.policy.numpy_policy import JSON_NAME

        try:  # the metadata is enough: no need to read the weights
            metadata = json.loads((self.path / BEST_POLICY / JSON_NAME).read_text(encoding="utf-8"))
            score = metadata.get("validation", {}).get("speedup_geomean")
        except (OSError, ValueError, AttributeError):
            return -math.inf
        return float(score) if isinstance(score, (int, float)) else -math.inf

    def trim_metrics(self, iteration: int) -> None:
        """Drop metric rows past ``iteration`` (written after the checkpoint we resume from)."""
        path = self.path / "metrics.csv"
        if not path.exists():
            return
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.DictReader(handle) if int(row["iteration"]) <= iteration]
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=METRICS)
            writer.writeheader()
            writer.writerows(rows)


def sampled_env_steps(algo) -> int | None:
    """The env steps an RLlib algorithm has counted so far (what a checkpoint of it holds and
    its next iteration continues from); None when it keeps no such count."""
    metrics_logger = getattr(algo, "metrics", None)
    if metrics_logger is None or not hasattr(metrics_logger, "peek"):
        return None
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    value = metrics_logger.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=None)
    return int(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


def metrics_row(result: dict[str, Any], state: RunState, iteration_s: float) -> dict[str, Any]:
    runners = result.get("env_runners", {})
    sampled = runners.get("num_env_steps_sampled", 0) or 0
    return {
        "iteration": state.iteration,
        "env_steps": state.env_steps,
        "episodes": runners.get("num_episodes", 0),
        "episode_reward_mean": runners.get("episode_return_mean", math.nan),
        "speedup_mean": runners.get(metrics.SPEEDUP, math.nan),
        "speedup_geomean": math.exp(runners[metrics.LOG_SPEEDUP]) if metrics.LOG_SPEEDUP in runners else math.nan,
        "final_gflops_mean": runners.get(metrics.FINAL_GFLOPS, math.nan),
        "cache_hit_rate": runners.get(metrics.CACHE_HIT_RATE, math.nan),
        "invalid_rate": runners.get(metrics.INVALID_RATE, math.nan),
        "epsilon_mean": runners.get(metrics.EPSILON, math.nan),
        "env_steps_per_s": sampled / iteration_s if iteration_s > 0 else math.nan,
        "iteration_s": iteration_s,
        "elapsed_s": state.elapsed_s,
        "validation_speedup": math.nan,
        # DQfD runs: the share of a demonstration minibatch whose greedy action is the demonstrated one
        "demonstration_agreement": result.get("learners", {}).get("default_policy", {}).get("demonstration_agreement", math.nan),
    }


def progress_line(row: dict[str, Any], iterations: int | None, time_budget_s: float | None) -> str:
    def number(value, spec):
        return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)

    left = []
    if iterations:
        per = row["elapsed_s"] / max(row["iteration"], 1)
        left.append(per * (iterations - row["iteration"]))
    if time_budget_s:
        left.append(time_budget_s - row["elapsed_s"])
    remaining = f"{_duration(max(min(left), 0))} left" if left else ""
    total = f"/{iterations}" if iterations else ""
    return (
        f"[iter {row['iteration']}{total}] reward {number(row['episode_reward_mean'], '.3f')}  "
        f"speedup {number(row['speedup_geomean'], '.2f')}x (geomean)  final {number(row['final_gflops_mean'], '.1f')} GFLOPS  "
        f"{number(row['env_steps_per_s'], '.0f')} steps/s  cache hits {number(row['cache_hit_rate'] * 100 if isinstance(row['cache_hit_rate'], float) else None, '.0f')}%  "
        f"steps {row['env_steps']}  elapsed {_duration(row['elapsed_s'])}  {remaining}"
        + (f"\n  validation: greedy speed-up {row['validation_speedup']:.3f}x (geomean)" if not math.isnan(row["validation_speedup"]) else "")
    ).rstrip()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"30m"``, ``"1.5h"`` -> seconds."""
    text = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text and text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text)
    except ValueError:
        raise ValueError(f"bad duration {text!r}; expected e.g. 90s, 30m or 1.5h") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"duration must be a positive, finite number of seconds, minutes (m) or hours (h), got {text!r}")
    return value


def train(algo, run: RunDirectory, state: RunState, arguments: dict, *, iterations: int | None,
          time_budget_s: float | None, checkpoint_every: int, export, env_steps: int | None = None,
          validate=None, validate_every: int = 0, out=sys.stdout) -> RunState:
    """Iterate until ``iterations``, ``time_budget_s`` (total training time, validation
    included) or ``env_steps`` is reached (all totals across resumes); checkpoint every
    ``checkpoint_every`` iterations, at the end and on Ctrl-C or SIGTERM.
    ``export(checkpoint_path)`` writes the numpy policy of a checkpoint; after the one saved
    on an interrupt, KeyboardInterrupt is raised again. Every
    ``validate_every`` iterations ``validate()`` returns (score, numpy policy of the current
    weights); a policy that beats the run's best so far is saved in ``policy-best/``."""
    from tensorboardX import SummaryWriter

    metrics_path = run.path / "metrics.csv"
    fresh = not metrics_path.exists()
    writer = SummaryWriter(str(run.path / "tb"), purge_step=state.iteration + 1)
    last_saved = state.iteration

    def checkpoint() -> None:
        nonlocal last_saved
        path = run.save_checkpoint(algo, state, arguments)
        export(path)
        last_saved = state.iteration
        print(f"  checkpoint {path}", file=out, flush=True)

    interrupted = False
    try:
        with terminate_as_interrupt(), metrics_path.open("a", newline="", encoding="utf-8") as handle:
            table = csv.DictWriter(handle, fieldnames=METRICS)
            if fresh:
                table.writeheader()
            while not _done(state, iterations, time_budget_s, env_steps):
                check_interrupt()  # a stop signal whose KeyboardInterrupt was lost
                started = time.perf_counter()
                result = algo.train()
                took = time.perf_counter() - started
                state.iteration += 1
                state.env_steps = int(result.get("num_env_steps_sampled_lifetime", state.env_steps) or state.env_steps)
                state.elapsed_s += took
                row = metrics_row(result, state, took)
                if validate is not None and validate_every and state.iteration % validate_every == 0:
                    started = time.perf_counter()
                    row["validation_speedup"] = _validate(validate, run, state)
                    state.elapsed_s += time.perf_counter() - started
                    row["elapsed_s"] = state.elapsed_s
                table.writerow(row)
                handle.flush()
                for key, value in row.items():
                    if key != "iteration" and isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                        writer.add_scalar(f"looprl/{key}", value, state.iteration)
                writer.flush()
                print(progress_line(row, iterations, time_budget_s), file=out, flush=True)
                if state.iteration % checkpoint_every == 0:
                    checkpoint()
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: saving a final checkpoint", file=out, flush=True)
    finally:
        writer.close()
    if state.iteration > last_saved or state.checkpoint is None:
        checkpoint()
    if interrupted:
        raise KeyboardInterrupt  # saved; the caller reports the interrupt (exit status 130)
    return state


def _validate(validate, run: RunDirectory, state: RunState) -> float:
    score, policy = validate()
    if score > run.best_validation():
        validation = {"speedup_geomean": score, "iteration": state.iteration, "env_steps": state.env_steps}
        best = dataclasses.replace(policy, metadata={**policy.metadata, "validation": validation})
        best.save(run.path / BEST_POLICY)
    return score


def _done(state: RunState, iterations: int | None, time_budget_s: float | None, env_steps: int | None) -> bool:
    if iterations is not None and state.iteration >= iterations:
        return True
    if env_steps is not None and state.env_steps >= env_steps:
        return True
    return time_budget_s is not None and state.elapsed_s >= time_budget_s
