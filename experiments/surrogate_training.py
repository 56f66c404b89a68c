"""Training with measured rewards against training with the cost model as a surrogate reward
(``LoopNest-v0(reward="model")``, beyond the paper), for the same wall-clock time.

    python experiments/surrogate_training.py --algo ppo --time-budget 30m --measure-fraction 0.1

(about twice ``--time-budget`` plus validation; tiny check: ``--iterations 1 --validation 4
--out /tmp/surrogate``.)

Each setting trains a fresh agent (``agents/<algo>.yaml`` with the env section extended) by
``python -m looprl.train`` for ``--time-budget`` (or ``--iterations``), each with its own empty
measurement cache in its run folder, so neither starts from the other's measurements:

* ``measured``: the paper's env, every new state measured;
* ``model``: ``reward="model"``, ``measure_fraction`` of the new states measured, the others
  predicted by the cost model (``--model PATH``: start from a saved cost model; default: fit
  one from scratch on the first measurements), refitted every ``--refit-every`` measurements.

Then both final policies (``<run>/policy``) are validated the same way, with measurements: one
greedy episode on each of ``--validation`` test-split problems, speed-up over the untuned
nest (geometric mean). Writes, appending (a finished setting is skipped on a rerun),
``<out>.csv`` (one row per setting and seed: iterations, env steps, measurements made during
training, validation speed-up) and ``<out>.png`` (the in-training validation curves from each
run's ``metrics.csv`` where there are any, and the final validation speed-ups).

It prints, per run, the training time to a validation speed-up (``--level``; default 95% of the
best in-training validation any run reached), with the env steps and real measurements made
by then. Measurements are counted from the run's private cache by their timestamps, from its
first one; they include the in-training validations' (the same for both settings).
"""

from __future__ import annotations

import argparse
import csv
import math
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import yaml

from looprl import defaults
from looprl.workloads.datasets import dataset_problems
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.train.config import load_agent
from looprl.train.evaluate import resolve_policy
from looprl.train.validation import Validator, spread

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["setting", "seed", "time_budget", "iterations", "env_steps", "elapsed_s", "measurements", "validation_speedup", "run"]
SETTINGS = ("measured", "model")


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.csv"
    return list(csv.DictReader(path.open(encoding="utf-8"))) if path.exists() else []


def train(args, setting: str, seed: int, run: Path) -> None:
    agent = load_agent(args.algo)
    env = agent.setdefault("env", {})
    env["cache"] = str(run.with_name(run.name + ".cache.sqlite"))  # private and cold
    if setting == "model":
        env.update({"reward": "model", "measure_fraction": args.measure_fraction, "refit_every": args.refit_every})
        if args.model:
            env["model"] = str(Path(args.model).resolve())
    config = run.with_name(run.name + ".yaml")
    config.write_text(yaml.safe_dump(agent, sort_keys=False), encoding="utf-8")
    command = [sys.executable, "-m", "looprl.train", "--algo", args.algo, "--config", str(config), "--out", str(run), "--seed", str(seed)]
    if args.iterations:
        command += ["--iterations", str(args.iterations)]
    if args.time_budget:
        command += ["--time-budget", args.time_budget]
    if args.num_env_runners is not None:
        command += ["--num-env-runners", str(args.num_env_runners)]
    if args.validate_every is not None:
        command += ["--validate-every", str(args.validate_every)]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--time-budget", default=None, help="training time per setting, e.g. 30m (default: --iterations)")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--measure-fraction", type=float, default=0.1)
    parser.add_argument("--refit-every", type=int, default=32)
    parser.add_argument("--model", default=None, help="a saved cost model to start the surrogate from")
    parser.add_argument("--validation", type=int, default=32, help="test-split problems of the final validation")
    parser.add_argument("--validate-every", type=int, default=None, help="passed to looprl.train")
    parser.add_argument("--num-env-runners", type=int, default=None, help="passed to looprl.train")
    parser.add_argument("--level", type=float, default=None,
                        help="validation speed-up whose training time is reported (default: 95%% of the best any run reached)")
    parser.add_argument("--out", default=str(RESULTS / "surrogate_training"), help="path prefix of the CSV, PNG and run folders")
    args = parser.parse_args(argv)
    if not (args.time_budget or args.iterations):
        parser.error("give --time-budget or --iterations")
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    table = Path(args.out + ".csv")
    runs = Path(args.out + "_runs")
    runs.mkdir(parents=True, exist_ok=True)
    done = set()
    if table.exists():
        done = {(r["setting"], int(r["seed"])) for r in csv.DictReader(table.open(encoding="utf-8"))}
    fresh = not table.exists()
    problems = spread(dataset_problems(defaults.DATASET, "test"), args.validation)
    with table.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for seed in range(args.seeds):
            for setting in settings:
                if (setting, seed) in done:
                    continue
                run = runs / f"{setting}_s{seed}"
                if not (run / "policy").exists():
                    train(args, setting, seed, run)
                # Measurements made during training: the rows of the run's private cache.
                cache_path = run.with_name(run.name + ".cache.sqlite")
                with MeasurementCache(cache_path) as cache:
                    measurements = len(cache)
                score = Validator(problems, Evaluator(":memory:"))(resolve_policy(run))
                last = (read_metrics(run) or [{}])[-1]
                writer.writerow({"setting": setting, "seed": seed, "time_budget": args.time_budget or "", "iterations": last.get("iteration", ""),
                                 "env_steps": last.get("env_steps", ""), "elapsed_s": last.get("elapsed_s", ""), "measurements": measurements,
                                 "validation_speedup": f"{score:.4f}", "run": str(run)})
                handle.flush()
                print(f"{setting:>8} seed {seed}: validation speed-up {score:.3f}x on {len(problems)} test problems, "
                      f"{last.get('env_steps', '?')} env steps, {measurements} measurements", flush=True)
    summarise(table, args.level)
    return 0


def validations(run: Path) -> list[dict]:
    """The in-training validations of a run: its metrics rows that have one."""
    return [m for m in read_metrics(run) if m.get("validation_speedup") and not math.isnan(float(m["validation_speedup"]))]


def measurements_within(run: Path, seconds: float) -> int:
    """Real measurements in the run's private cache made within ``seconds`` of its first one."""
    path = run.with_name(run.name + ".cache.sqlite")
    if not path.exists():
        return -1
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
        first = connection.execute("SELECT MIN(created) FROM measurements").fetchone()[0]
        if first is None:
            return 0
        return connection.execute("SELECT COUNT(*) FROM measurements WHERE created <= ?", (first + seconds,)).fetchone()[0]


def summarise(table: Path, level: float | None = None) -> None:
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    print(f"{'setting':>8} {'seed':>4} {'env steps':>10} {'measured':>9} {'speed-up':>9}")
    for row in rows:
        print(f"{row['setting']:>8} {row['seed']:>4} {row['env_steps']:>10} {row['measurements']:>9} {float(row['validation_speedup']):9.3f}")
    curves = {(r["setting"], r["seed"]): validations(Path(r["run"])) for r in rows}
    reached = [float(m["validation_speedup"]) for points in curves.values() for m in points]
    if reached:
        level = level if level is not None else 0.95 * max(reached)
        print(f"training time to an in-training validation speed-up of {level:.3f}x:")
        for row in rows:
            first = next((m for m in curves[(row["setting"], row["seed"])] if float(m["validation_speedup"]) >= level), None)
            if first is None:
                print(f"{row['setting']:>8} {row['seed']:>4}: not reached")
                continue
            seconds = float(first["elapsed_s"])
            print(f"{row['setting']:>8} {row['seed']:>4}: {seconds:7.0f} s, iteration {first['iteration']}, {first['env_steps']} env steps, "
                  f"{measurements_within(Path(row['run']), seconds)} measurements")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curves, bars) = plt.subplots(1, 2, figsize=(8, 3.2))
    for i, row in enumerate(rows):
        points = [(float(m["elapsed_s"]), float(m["validation_speedup"])) for m in read_metrics(Path(row["run"]))
                  if m.get("validation_speedup") and not math.isnan(float(m["validation_speedup"]))]
        if points:
            curves.plot(*zip(*points), marker="o", markersize=3, label=f"{row['setting']} s{row['seed']}", color=f"C{SETTINGS.index(row['setting']) if row['setting'] in SETTINGS else i}")
    curves.set_xlabel("training seconds")
    curves.set_ylabel("validation speed-up (in training)")
    if curves.has_data():
        curves.legend(fontsize=7)
    labels = [f"{r['setting']} s{r['seed']}" for r in rows]
    bars.bar(labels, [float(r["validation_speedup"]) for r in rows], color=[f"C{SETTINGS.index(r['setting'])}" if r["setting"] in SETTINGS else "gray" for r in rows])
    bars.set_ylabel("final validation speed-up (test problems)")
    bars.tick_params(axis="x", labelsize=7)
    figure.tight_layout()
    figure.savefig(table.with_suffix(".png"), dpi=120)
    print("wrote", table, "and", table.with_suffix(".png"))


if __name__ == "__main__":
    sys.exit(main())
