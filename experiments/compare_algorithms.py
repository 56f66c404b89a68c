"""Train agents from scratch with the same budget and compare their learning (LoopTune, Fig. 7).

    python experiments/compare_algorithms.py --time-budget 35m --concurrent --validate-every 10
    python experiments/compare_algorithms.py --env-steps 8000

Each algorithm trains from scratch with its ``agents/<algo>.yaml`` into ``<runs>/<algo>``
(default ``experiments/runs/compare``; an interrupted comparison resumes: finished runs are
kept, a partial run continues from its checkpoint). Each run measures through a private cache
of its own (``<runs>/<algo>.sqlite``; ``--cache PATH`` shares one instead), so no run trains
on what another measured. Budgets:

- ``--env-steps N``: the same number of env steps each, the runs one after another;
- ``--time-budget 35m``: the same wall-clock training time each; with ``--concurrent`` the
  runs train side by side, each with the same share of the machine (their timings are
  serialised by the machine-wide timing lock, so no two kernels are timed at once).

Afterwards the reference the issue asks for: on the runs' validation problems, the tile
planner's demonstrations (the best register tile an episode can reach, measured) against one
greedy episode of each run's best validated policy (``policy-best/``, else ``policy/``),
measured through a cache of their own (``<runs>/final.sqlite``, best of three timings),
both as mean gain over the untuned nest in units of the peak (the reward's unit: an episode's
rewards sum to it) and as geometric-mean speed-up. Writes the curves to
``experiments/results/<name>.csv``, the final comparison to ``<name>_final.csv`` and the
plot to ``<name>.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from looprl.train.config import ALGORITHMS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# APPO's and IMPALA's iterations are time-boxed (``min_time_s_per_iteration: 2``, ~50 env steps
# on 2 cores) where the DQN family's and PPO's sample 400 steps: they validate and checkpoint
# every this many times as many iterations, so that validation (whose time counts in the
# budget) costs every algorithm about the same share.
ITERATION_SCALE = {"appo": 8, "impala": 8}
CURVE_FIELDS = ("episode_reward_mean", "speedup_geomean", "final_gflops_mean", "validation_speedup", "invalid_rate",
                "env_steps_per_s", "elapsed_s")


def _command(algo: str, run: Path, args) -> list[str] | None:
    """The ``looprl.train`` command that starts or continues ``run``; None when it is done."""
    scale = ITERATION_SCALE.get(algo, 1)
    command = [sys.executable, "-m", "looprl.train", "--out", str(run), "--checkpoint-every", str(args.checkpoint_every * scale),
               "--validate-every", str(args.validate_every * scale), "--validation-problems", str(args.validation_problems)]
    command += ["--time-budget", args.time_budget] if args.time_budget else ["--env-steps", str(args.env_steps)]
    if (run / "run.json").exists():
        state = json.loads((run / "run.json").read_text())["state"]
        if args.env_steps and state["env_steps"] >= args.env_steps:
            return None
        if args.time_budget and state.get("elapsed_s", 0) >= _seconds(args.time_budget) - 1:
            return None
        if not state["checkpoint"]:
            raise SystemExit(f"{run} has no checkpoint; delete it and run again")
        return command + ["--resume"]
    return command + ["--algo", algo, "--seed", str(args.seed), "--cache", args.cache or str(run.parent / f"{algo}.sqlite")]


def _seconds(duration: str) -> float:
    from looprl.train.loop import parse_duration

    return parse_duration(duration)


def train_all(algos: list[str], runs: Path, args) -> None:
    runs.mkdir(parents=True, exist_ok=True)
    pending = [(algo, _command(algo, runs / algo, args)) for algo in algos]
    pending = [(algo, command) for algo, command in pending if command is not None]
    if not args.concurrent:
        for algo, command in pending:
            print(f"[compare] training {algo}", flush=True)
            subprocess.run(command, check=True)
        return
    processes = []
    for algo, command in pending:
        log = (runs / f"{algo}.log").open("a", encoding="utf-8")
        processes.append((algo, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
        print(f"[compare] {algo} started (log {runs / f'{algo}.log'})", flush=True)
    try:
        while any(p.poll() is None for _, p, _ in processes):
            time.sleep(30)
            running = [algo for algo, p, _ in processes if p.poll() is None]
            print(f"[compare] {time.strftime('%H:%M:%S')} still training: {', '.join(running)}", flush=True)
    finally:
        for _, process, log in processes:
            if process.poll() is None:
                process.terminate()  # an interrupt: each run keeps its checkpoints and resumes
            process.wait()
            log.close()
    failed = [algo for algo, p, _ in processes if p.returncode != 0]
    if failed:
        raise SystemExit(f"training failed for {', '.join(failed)} (see their logs in {runs})")


def final_comparison(algos: list[str], runs: Path) -> list[dict]:
    """The planner's demonstrations and each run's best policy, greedy, on the runs' validation problems."""
    from looprl.measurement.evaluator import Evaluator
    from looprl.measurement.peak import peak_gflops
    from looprl.policy.numpy_policy import Policy
    from looprl.policy.rollout import greedy_rollout
    from looprl.train.config import agent_actions, agent_target
    from looprl.train.demonstrations import demonstrate
    from looprl.train.validation import spread_over_datasets

    import yaml

    first = runs / algos[0]
    agent = yaml.safe_load((first / "agent.yaml").read_text(encoding="utf-8"))
    count = json.loads((first / "run.json").read_text())["arguments"].get("validation_problems") or 64
    problems = spread_over_datasets(agent, count)
    env = agent.get("env", {})
    target = agent_target(agent)
    evaluator = Evaluator(str(runs / "final.sqlite"), env["measure_budget_s"], target=target)
    peak = peak_gflops(target=target, cache=evaluator.cache)
    actions = agent_actions(agent, target)

    def row(label: str, pairs: list[tuple[float, float]]) -> dict:
        return {"method": label, "problems": len(pairs),
                "mean_gain_of_peak": statistics.mean((final - start) / peak for start, final in pairs),
                "speedup_geomean": statistics.geometric_mean(final / start for start, final in pairs)}

    demos = [demonstrate(p, actions, evaluator, int(env.get("episode_length", 10))) for p in problems]
    rows = [row("planner demonstrations", [(d.initial_gflops, d.gflops) for d in demos])]
    for algo in algos:
        folder = runs / algo / "policy-best" if (runs / algo / "policy-best" / "policy.json").exists() else runs / algo / "policy"
        if not (folder / "policy.json").exists():
            continue
        policy = Policy.load(folder)
        episodes = [greedy_rollout(policy, p, evaluator) for p in problems]
        rows.append(row(f"{algo} ({folder.name}, greedy)", [(e.initial_gflops, e.final_gflops) for e in episodes]))
    reference = rows[0]["mean_gain_of_peak"]
    for r in rows:
        r["fraction_of_demonstrations_gain"] = r["mean_gain_of_peak"] / reference if reference > 0 else float("nan")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--env-steps", type=int, default=None, help="env steps per algorithm (default 8000 without --time-budget)")
    budget.add_argument("--time-budget", default=None, help="training time per algorithm, e.g. 35m")
    parser.add_argument("--concurrent", action="store_true", help="train the algorithms side by side (needs --time-budget)")
    parser.add_argument("--algos", default=",".join(ALGORITHMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=HERE / "runs" / "compare", help="folder of the run folders")
    parser.add_argument("--cache", default=None, help="one measurement cache shared by the runs (default: one per run, <runs>/<algo>.sqlite)")
    parser.add_argument("--validate-every", type=int, default=25)
    parser.add_argument("--validation-problems", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--name", default="compare_algorithms", help="results file name (default compare_algorithms)")
    args = parser.parse_args(argv)
    if args.time_budget is None and args.env_steps is None:
        args.env_steps = 8000
    if args.concurrent and not args.time_budget:
        parser.error("--concurrent needs --time-budget (an env-step budget is compared one run after another)")
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown or not algos:
        parser.error(f"unknown algorithms {unknown}; expected some of {', '.join(ALGORITHMS)}")

    train_all(algos, args.runs, args)
    rows = []
    for algo in algos:
        for row in csv.DictReader((args.runs / algo / "metrics.csv").open(encoding="utf-8")):
            rows.append({"algorithm": algo, "iteration": row["iteration"], "env_steps": row["env_steps"],
                         **{field: row.get(field, "") for field in CURVE_FIELDS}})
    RESULTS.mkdir(parents=True, exist_ok=True)
    table = RESULTS / f"{args.name}.csv"
    with table.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    final = final_comparison(algos, args.runs)
    with (RESULTS / f"{args.name}_final.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(final[0]))
        writer.writeheader()
        writer.writerows(final)
    from looprl.backend.host import cpu_model_name

    print(f"CPU {cpu_model_name()}")
    print(f"{'method':<40} {'mean gain (of peak)':>19} {'speed-up':>9} {'of demos gain':>13}")
    for r in final:
        print(f"{r['method']:<40} {r['mean_gain_of_peak']:>19.3f} {r['speedup_geomean']:>9.2f} {r['fraction_of_demonstrations_gain']:>13.2f}")
    _plot(rows, algos, final, table.with_suffix(".png"), args)
    print("wrote", table, RESULTS / f"{args.name}_final.csv", "and", table.with_suffix(".png"))
    return 0


def _plot(rows: list[dict], algos: list[str], final: list[dict], path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def number(value: str) -> float | None:
        return float(value) if value not in ("", "nan", None) else None

    figure, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for algo in algos:
        mine = [r for r in rows if r["algorithm"] == algo]
        rewards = [(int(r["env_steps"]), number(r["episode_reward_mean"])) for r in mine if number(r["episode_reward_mean"]) is not None]
        axes[0].plot([s for s, _ in rewards], [v for _, v in rewards], label=algo)
        timed = [(float(r["elapsed_s"]) / 60, number(r["episode_reward_mean"])) for r in mine if number(r["episode_reward_mean"]) is not None]
        axes[1].plot([t for t, _ in timed], [v for _, v in timed], label=algo)
        validated = [(float(r["elapsed_s"]) / 60, number(r["validation_speedup"])) for r in mine if number(r["validation_speedup"]) is not None]
        axes[2].plot([t for t, _ in validated], [v for _, v in validated], marker="o", label=algo)
    demos = final[0]
    for axis in axes[:2]:
        axis.axhline(demos["mean_gain_of_peak"], color="black", linestyle="--", label="planner demonstrations")
        axis.axhline(demos["mean_gain_of_peak"] / 2, color="grey", linestyle=":", label="half of that")
        axis.set_ylabel("mean episode reward (GFLOPS gain / peak)")
    axes[2].axhline(demos["speedup_geomean"], color="black", linestyle="--", label="planner demonstrations")
    axes[2].set_ylabel("greedy validation speed-up (geomean)")
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("minutes of training")
    axes[2].set_xlabel("minutes of training")
    for axis in axes:
        axis.legend(fontsize=8)
    budget = f"{args.time_budget} of training each" + (", side by side" if args.concurrent else "") if args.time_budget \
        else f"{args.env_steps} env steps each"
    figure.suptitle(f"From scratch on mm64-256 (train split): {budget}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
