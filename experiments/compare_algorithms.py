"""Train every agent of ``agents/`` with the same env-step budget and plot mean episode reward
against env steps (LoopTune, Fig. 7).

    python experiments/compare_algorithms.py --env-steps 8000

Each algorithm trains with its YAML's hyperparameters into ``experiments/runs/compare/<algo>``
(an interrupted comparison resumes: finished runs are kept, a partial run continues), all
measuring through one private cache (so the runs see the same measured value for a
schedule, and later runs reuse earlier measurements: compare per env step, not per second); the
combined curves go to ``experiments/results/compare_algorithms.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from looprl.train.config import ALGORITHMS

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs" / "compare"
RESULTS = HERE / "results"


def train(algo: str, env_steps: int, seed: int, cache: str) -> Path:
    run = RUNS / algo
    command = [sys.executable, "-m", "looprl.train", "--env-steps", str(env_steps), "--out", str(run), "--checkpoint-every", "10"]
    if (run / "run.json").exists():
        state = json.loads((run / "run.json").read_text())["state"]
        if state["env_steps"] >= env_steps:
            return run
        command += ["--resume"] if state["checkpoint"] else []
        if not state["checkpoint"]:
            raise SystemExit(f"{run} has no checkpoint; delete it and run again")
    else:
        command += ["--algo", algo, "--seed", str(seed), "--cache", cache]
    subprocess.run(command, check=True)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-steps", type=int, default=8000)
    parser.add_argument("--algos", default=",".join(ALGORITHMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=str(RUNS / "measurements.sqlite"),
                        help="measurement cache shared by the compared runs (default: a private one under experiments/runs)")
    args = parser.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    rows = []
    for algo in algos:
        run = train(algo, args.env_steps, args.seed, args.cache)
        for row in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")):
            rows.append({"algorithm": algo, "iteration": row["iteration"], "env_steps": row["env_steps"],
                         "episode_reward_mean": row["episode_reward_mean"], "final_gflops_mean": row["final_gflops_mean"],
                         "elapsed_s": row["elapsed_s"]})
    RESULTS.mkdir(parents=True, exist_ok=True)
    table = RESULTS / "compare_algorithms.csv"
    with table.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for algo in algos:
        points = [r for r in rows if r["algorithm"] == algo and r["episode_reward_mean"] not in ("", "nan")]
        steps = [int(r["env_steps"]) for r in points]
        axes[0].plot(steps, [float(r["episode_reward_mean"]) for r in points], label=algo)
        axes[1].plot(steps, [float(r["final_gflops_mean"]) for r in points], label=algo)
    axes[0].set_ylabel("mean episode reward (GFLOPS gain / peak)")
    axes[1].set_ylabel("mean final GFLOPS of episodes")
    for axis in axes:
        axis.set_xlabel("env steps")
        axis.legend()
    figure.suptitle(f"Same budget of {args.env_steps} env steps per algorithm (mm64-256 train split)")
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
