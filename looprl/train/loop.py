"""The training loop: iterations, progress line, CSV and TensorBoard records, atomic
checkpoints, exact resume and a final checkpoint on Ctrl-C. The run folder it writes into is
:mod:`looprl.train.run_folder`'s.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import sys
import time
from typing import Any

from looprl.interrupts import check_interrupt, terminate_as_interrupt
from looprl.train import metric_names as metrics
from looprl.train.run_folder import BEST_POLICY, METRICS, METRICS_FILE, RunDirectory, RunState


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
          validate=None, validate_every: int = 0, out=None) -> RunState:
    """Iterate until ``iterations``, ``time_budget_s`` (total training time, validation
    included) or ``env_steps`` is reached (all totals across resumes); checkpoint every
    ``checkpoint_every`` iterations, at the end and on Ctrl-C or SIGTERM.
    ``export(checkpoint_path)`` writes the numpy policy of a checkpoint; after the one saved
    on an interrupt, KeyboardInterrupt is raised again. Every
    ``validate_every`` iterations ``validate()`` returns (score, numpy policy of the current
    weights); a policy that beats the run's best so far is saved in ``policy-best/``. Progress
    goes to ``out``, by default ``sys.stdout`` at the call."""
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    from tensorboardX import SummaryWriter  # the [train] extra

    metrics_path = run.path / METRICS_FILE
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
