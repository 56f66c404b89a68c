"""Helpers of the experiments that draw best-so-far curves of searches (autotvm_trials,
autotvm_transfer, search_curves): reading a curve, the CSV of runs, and the transfer source."""

from __future__ import annotations

import csv
import json
import math
import sqlite3
from pathlib import Path

from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.search import run

SOURCE_ALGORITHMS = ("random", "autotvm")


def best_at(curve, trials: int) -> float:
    """Best GFLOPS after ``trials`` trials of a curve of (seconds, trials, best) points."""
    value = 0.0
    for _, count, gflops in curve:
        if count > trials:
            break
        value = max(value, gflops)
    return value


def load_rows(table: Path) -> list[dict]:
    """The rows of a runs CSV, each ``curve`` column parsed from JSON ([] when no file)."""
    if not table.exists():
        return []
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    for row in rows:
        row["curve"] = json.loads(row["curve"])
    return rows


def copy_cache(source: Path, destination: Path) -> None:
    """A consistent copy of an SQLite cache (its write-ahead log included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(destination) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def fill_source(path: Path, problems, trials: int, target=None) -> int:
    """Run the transfer source's searches not done yet (random search and AutoTVM, ``trials``
    each, for ``target``: None the host) into the cache at ``path``, resumably (finished ones
    are listed in ``<path>.done.json``); the number of records the source holds."""
    done_file = path.with_name(path.name + ".done.json")
    done = set(json.loads(done_file.read_text(encoding="utf-8"))) if done_file.exists() else set()
    with MeasurementCache(path) as cache:
        evaluator = Evaluator(cache, target=target)
        for problem in problems:
            for algo in SOURCE_ALGORITHMS:
                name = f"{problem.name}/{algo}/{trials}" + ("" if target is None else f"/{target.isa}")
                if name in done:
                    continue
                result = run(problem, algo, budget_s=math.inf, max_evaluations=trials, seed=0, evaluator=evaluator, verify_s=None)
                if result.stopped == "interrupted":
                    raise KeyboardInterrupt
                done.add(name)
                done_file.write_text(json.dumps(sorted(done)) + "\n", encoding="utf-8")
                print(f"source: {algo:>8} {problem.name}: {result.best_gflops:.1f} GFLOPS, {result.new_measurements} new measurements", flush=True)
        return len(cache.records(evaluator.target, evaluator.budget_s))
