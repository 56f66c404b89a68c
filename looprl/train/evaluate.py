"""Evaluate a policy: one greedy episode per problem, speed-up over the untuned nest, and
(optionally) numpy's single-thread GFLOPS for the same problems."""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

from looprl.measurement.evaluator import Evaluator
from looprl.measurement.numpy_baseline import numpy_gflops
from looprl.policy.numpy_policy import JSON_NAME, Policy
from looprl.policy.rollout import greedy_rollout
from looprl.train.run_folder import BEST_POLICY, CHECKPOINTS, NEWEST_POLICY, RunDirectory

CHECKPOINT_POLICY = "looprl_policy"  # inside each checkpoint: the policy exported from it when it was saved
FIELDS = ["problem", "m", "n", "k", "initial_gflops", "final_gflops", "best_gflops", "speedup", "numpy_gflops", "final_vs_numpy", "failures", "stopped", "actions"]


def policy_folder(path: str | Path) -> Policy | None:
    """The policy in a policy folder or a run folder (its newest, ``policy/``); None when
    ``path`` is neither. Reads policy files only (JSON and numpy arrays, never a pickle)."""
    path = Path(path)
    for folder in (path, path / NEWEST_POLICY):
        if (folder / JSON_NAME).exists():
            return Policy.load(folder)
    return None


def resolve_policy(path: str | Path) -> Policy:
    """A policy from a policy folder, a training run folder (its ``policy/``) or an RLlib
    checkpoint of a run folder, ``RUN/checkpoints/iter_NNNNNN``. A checkpoint is read only
    through the policy exported from it when it was saved (its ``looprl_policy/``, or the
    run's ``policy/`` when that records this checkpoint): plain JSON and numpy arrays. RLlib's
    own files in a checkpoint are pickles, and unpickling runs whatever code they name, so
    they are never read here; a checkpoint with no export is refused."""
    path = Path(path)
    policy = policy_folder(path)
    if policy is not None:
        return policy
    if not (path / "rllib_checkpoint.json").exists() or path.parent.name != CHECKPOINTS:
        raise ValueError(f"no policy at {path}: expected a policy folder, a run folder or a checkpoint inside a run folder")
    run = RunDirectory(path.parent.parent)
    checkpoint = run.checkpoint_folder(path.name)  # inside the run folder, no symbolic link
    own = checkpoint / CHECKPOINT_POLICY
    if (own / JSON_NAME).is_file():
        return Policy.load(own)
    newest = run.path / NEWEST_POLICY
    if (newest / JSON_NAME).is_file():
        policy = Policy.load(newest)
        if policy.metadata.get("checkpoint") == path.name:
            return policy
    raise ValueError(f"{path}: no policy was exported from this checkpoint (its {CHECKPOINT_POLICY}/ is missing, and the run's "
                     f"{NEWEST_POLICY}/ is not this checkpoint's); looprl never unpickles RLlib's checkpoint files: give the run "
                     f"folder or one of its policy folders ({NEWEST_POLICY}/, {BEST_POLICY}/) instead")


def evaluate(policy: Policy, problems, evaluator: Evaluator, *, use_mask: bool = False, numpy: bool = False,
             csv_path: Path | None = None, out=None) -> dict:
    """Run one greedy episode per problem; print a table and a summary (to ``out``, by default
    ``sys.stdout`` at the call); write a CSV."""
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    numpy_values = [math.nan] * len(problems)
    if numpy:
        # numpy's kernels for the same ISA, on as many BLAS threads as the evaluator's kernels
        try:
            numpy_values = numpy_gflops(list(problems), 0.1, isa=evaluator.target.isa, threads=getattr(evaluator, "threads", 1))
        except RuntimeError as error:  # the baseline's child process failed: the episodes are still evaluated, numpy's column nan
            print(f"numpy baseline not measured ({error})", file=sys.stderr)
    rows = []
    table = _RowFile(csv_path)  # each row written (and flushed) when its episode ends: an interrupt keeps them
    try:
        print(f"{'problem':>14} {'untuned':>8} {'final':>8} {'speedup':>8} {'numpy':>8}  actions", file=out)
        for problem, numpy_value in zip(problems, numpy_values):
            episode = greedy_rollout(policy, problem, evaluator, use_mask=use_mask)
            sizes = dict(problem.sizes)
            row = {
                "problem": problem.name, "m": sizes.get("m", ""), "n": sizes.get("n", ""), "k": sizes.get("k", ""),
                "initial_gflops": episode.initial_gflops, "final_gflops": episode.final_gflops, "best_gflops": episode.best_gflops,
                "speedup": episode.speedup, "numpy_gflops": numpy_value,
                "final_vs_numpy": episode.final_gflops / numpy_value if numpy_value and not math.isnan(numpy_value) else math.nan,
                "failures": episode.failures, "stopped": episode.stopped, "actions": " ".join(episode.actions),
            }
            rows.append(row)
            table.write(row)
            label = "x".join(str(sizes.get(d, "?")) for d in ("m", "n", "k"))
            print(f"{label:>14} {episode.initial_gflops:8.1f} {episode.final_gflops:8.1f} {episode.speedup:8.2f} {numpy_value:8.1f}  {row['actions']}", file=out, flush=True)
    except KeyboardInterrupt:
        if csv_path is not None:
            print(f"interrupted: the {len(rows)} problems evaluated are in {csv_path}", file=out, flush=True)
        raise
    finally:
        table.close()
    summary = {
        "problems": len(rows),
        # Every episode counts: a failed schedule leaves its state as it was (the env's rule),
        # and an episode whose untuned nest failed scores as no speed-up.
        "speedup_geomean": statistics.geometric_mean([r["speedup"] if r["speedup"] > 0 else 1.0 for r in rows]),
        "failed_transitions": sum(r["failures"] for r in rows),
        "failed_episodes": sum(not r["speedup"] > 0 for r in rows),
        "initial_gflops_mean": statistics.fmean(r["initial_gflops"] for r in rows),
        "final_gflops_mean": statistics.fmean(r["final_gflops"] for r in rows),
    }
    if numpy:
        ratios = [r["final_vs_numpy"] for r in rows if r["final_vs_numpy"] > 0]
        summary["numpy_gflops_mean"] = statistics.fmean(numpy_values)
        summary["final_vs_numpy_geomean"] = statistics.geometric_mean(ratios) if ratios else math.nan
    print(
        f"{summary['problems']} problems: speed-up over untuned (geomean) {summary['speedup_geomean']:.2f}x, "
        f"mean GFLOPS {summary['initial_gflops_mean']:.1f} -> {summary['final_gflops_mean']:.1f}, "
        f"{summary['failed_transitions']} failed schedules, {summary['failed_episodes']} failed episodes"
        + (f", numpy {summary['numpy_gflops_mean']:.1f}, final/numpy (geomean) {summary['final_vs_numpy_geomean']:.2f}" if numpy else ""),
        file=out,
    )
    if csv_path is not None:
        print(f"wrote {csv_path}", file=out)
    return summary


class _RowFile:
    """The per-problem CSV, written a row at a time (nothing when ``path`` is None)."""

    def __init__(self, path: Path | None):
        self.handle = self.writer = None
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = path.open("w", newline="", encoding="utf-8")
            self.writer = csv.DictWriter(self.handle, fieldnames=FIELDS)
            self.writer.writeheader()
            self.handle.flush()

    def write(self, row: dict) -> None:
        if self.writer is not None:
            self.writer.writerow(row)
            self.handle.flush()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
