"""``looprl-search`` (or ``python -m looprl search``): run search baselines on one problem or on part of a dataset.

One problem (prints a summary, writes JSON)::

    looprl-search --algo greedy2 --problem 128x256x64 --budget 60

Part of a dataset (one CSV row per problem and algorithm, appended as each search ends; an
existing CSV is resumed: pairs already in it are skipped)::

    looprl-search --algo greedy1,beam4dfs,random --split test --limit 25 --csv out.csv

``--cold`` starts every search from an empty cache, as the paper's timed searches did; by
default all searches share the persistent measurement cache (fast, but later searches then
reuse earlier measurements). Ctrl-C stops the running search; what it found so far is still written.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import math
import os
import sys
import time
from pathlib import Path

from looprl import checks, defaults
from looprl.cli.common import EXIT_INTERRUPTED, cache_path, run_command, writable_file, writable_folder
from looprl.costmodel.model import import_xgboost
from looprl.workloads.datasets import SPLITS, dataset_problems
from looprl.ir.problem import as_problem
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.lock import locked_descriptor
from looprl.search.algorithms import PAPER_ALGORITHMS, parse_algorithm
from looprl.search.runner import DEFAULT_BUDGET_S, DEFAULT_DEPTH, SearchResult, run
from looprl.target import TARGET_CHOICES

# Another search holds the CSV's lock only while it appends a row: waiting this long means it is stopped or hung.
CSV_LOCK_WAIT_S = 30.0
CSV_FIELDS = [
    "problem", "m", "n", "k", "algorithm", "initial_gflops", "best_gflops", "speedup", "evaluations",
    "new_measurements", "elapsed_s", "stopped", "verified_gflops", "best_schedule", "actions",
]


def _factors(text: str):
    if text.strip() == "target":
        return "target"
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"split factors must be integers separated by commas, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="looprl-search", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="greedy1", help=f"comma-separated algorithms, or 'paper' for {','.join(PAPER_ALGORITHMS)}")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--problem", help="one problem: MxNxK (a matmul) or 'spec:m=..,k=..,n=..'")
    target.add_argument("--split", choices=SPLITS, help="a split of --dataset")
    parser.add_argument("--dataset", default=defaults.DATASET)
    parser.add_argument("--limit", type=int, default=None, help="first N problems of the split (after --offset)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds per search (default 60; inf or 0 = no limit)")
    parser.add_argument("--evaluations", type=int, default=None, help="distinct schedules per search (default: no limit)")
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help="actions from the initial nest (default 10)")
    parser.add_argument("--split-factors", type=_factors, default=defaults.SPLIT_FACTORS, help="comma-separated, default 4,8,16; 'target': also those forming the target's register tiles")
    parser.add_argument("--max-loops", type=int, default=defaults.MAX_LOOPS)
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES, help="generate code for this target (default: this machine)")
    parser.add_argument("--measure-budget-ms", type=float, default=defaults.STATE_BUDGET_S * 1000)
    parser.add_argument("--cache", default=None, help="measurement cache path (':memory:' for a private one; default: the per-user cache)")
    parser.add_argument("--cold", action="store_true", help="give every search its own empty in-memory cache (comparable search times)")
    parser.add_argument("--verify-ms", type=float, default=100.0, help="re-measure the best schedule this long (0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", action="store_true", help="search data layouts (pack, pad) jointly with the loops")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for parallel loops (default 1; more adds the 'parallel' action; at most the cores this process may use)")
    parser.add_argument("--layout-stage", type=float, default=None, help="with --layouts: share of the budget for the joint stage, then loops only (ALT: 0.3)")
    parser.add_argument("--json", type=Path, default=None, help="single problem: result JSON (default search_<problem>_<algo>.json)")
    parser.add_argument("--csv", type=Path, default=None, help="dataset: results CSV (default search_<dataset>_<split>.csv)")
    parser.add_argument("--graph-dir", type=Path, default=None, help="also save each search graph here (node-link JSON)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def _algorithms(text: str) -> list[str]:
    names = list(PAPER_ALGORITHMS) if text.strip() == "paper" else [a.strip().lower() for a in text.split(",") if a.strip()]
    if not names:
        raise ValueError("--algo is empty")
    for name in names:
        parse_algorithm(name)
    if any(name.startswith("autotvm") for name in names):
        try:  # its cost model is XGBoost: say so now, not in a traceback after the first measurements
            import_xgboost()
        except ImportError as error:
            raise ValueError(f"--algo autotvm: {error}") from None
    return names


def _slug(result: SearchResult) -> str:
    sizes = "x".join(str(result.problem.size(d)) for d in ("m", "n", "k")) if result.problem.spec == "mk,kn->mn" else "_".join(f"{d}{s}" for d, s in result.problem.sizes)
    return f"{sizes}_{result.algorithm}"


def _summary(result: SearchResult) -> str:
    return (
        f"{result.algorithm:>9} {result.problem.name}: {result.initial_gflops:.1f} -> {result.best_gflops:.1f} GFLOPS "
        f"({result.speedup:.2f}x) in {result.elapsed_s:.1f} s, {result.evaluations} states "
        f"({result.new_measurements} measured), {result.stopped}"
        + ("" if result.verified_gflops is None else f"; best re-measured: {result.verified_gflops:.1f} GFLOPS")
    )


def _progress_printer(quiet: bool, label: str):
    if quiet:
        return None

    def show(context) -> None:
        best = context.best.gflops if context.best else 0.0
        print(f"  [{label}] {context.elapsed_s:6.1f} s  {context.evaluations:5d} states  best {best:.1f} GFLOPS", file=sys.stderr, flush=True)

    return show


def _csv_row(result: SearchResult) -> dict:
    sizes = dict(result.problem.sizes)
    return {
        "problem": result.problem.name,
        "m": sizes.get("m", ""),
        "n": sizes.get("n", ""),
        "k": sizes.get("k", ""),
        "algorithm": result.algorithm,
        "initial_gflops": f"{result.initial_gflops:.3f}",
        "best_gflops": f"{result.best_gflops:.3f}",
        "speedup": f"{result.speedup:.4f}",
        "evaluations": result.evaluations,
        "new_measurements": result.new_measurements,
        "elapsed_s": f"{result.elapsed_s:.3f}",
        "stopped": result.stopped,
        "verified_gflops": "" if result.verified_gflops is None else f"{result.verified_gflops:.3f}",
        "best_schedule": result.best_nest.key,
        "actions": " ".join(result.actions),
    }


def _locked_csv(path: Path, mode: str):
    """The CSV opened for reading (``mode`` "r", under a shared ``flock``) or appending ("a",
    exclusive), the lock waited for at most :data:`CSV_LOCK_WAIT_S`; released when it closes."""
    flags, operation = (os.O_RDONLY, fcntl.LOCK_SH) if mode == "r" else (os.O_WRONLY | os.O_APPEND | os.O_CREAT, fcntl.LOCK_EX)
    descriptor = locked_descriptor(path, flags, operation, CSV_LOCK_WAIT_S, f"the lock on --csv {path}")
    return os.fdopen(descriptor, mode, newline="", encoding="utf-8")


def _done_pairs(path: Path) -> set[tuple[str, str]]:
    """(problem, algorithm) pairs already in an existing CSV; interrupted rows are redone."""
    if not path.exists():
        return set()
    try:  # read not while another process appends a row
        with _locked_csv(path, "r") as handle:
            if not handle.read(1):
                return set()  # created by another search that has not written its first row yet
            handle.seek(0)
            reader = csv.DictReader(handle)
            if reader.fieldnames != CSV_FIELDS:
                raise ValueError(f"{path} exists but is not a looprl.search CSV (columns differ); choose another --csv")
            return {(row["problem"], row["algorithm"]) for row in reader if row["stopped"] != "interrupted"}
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"--csv {path} exists but cannot be read as a looprl.search CSV: {error}") from error


def append_row(path: Path, row: dict) -> None:
    """Append one row to the CSV at ``path``, and the header first if the file is empty. Under
    an exclusive lock, so that several searches may share one CSV: the header stays the first
    line and no two rows mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked_csv(path, "a") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        if handle.seek(0, 2) == 0:
            writer.writeheader()
        writer.writerow(row)
        handle.flush()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM stops it as Ctrl-C does (run_command): a running search returns what it found
    # and its result is written; elsewhere nothing is lost.
    return run_command("looprl-search", lambda: _main(args))


def _main(args) -> int:
    algorithms = _algorithms(args.algo)
    checks.seconds(args.budget, "--budget", allow_zero=True, allow_inf=True)
    checks.positive_float(args.verify_ms, "--verify-ms", unit="milliseconds", allow_zero=True)
    checks.positive_float(args.measure_budget_ms, "--measure-budget-ms", unit="milliseconds")
    if args.limit is not None:
        checks.positive_int(args.limit, "--limit")
    checks.count(args.offset, "--offset")
    settings = dict(
        budget_s=args.budget or math.inf,
        max_evaluations=args.evaluations,
        depth=args.depth,
        split_factors=args.split_factors,
        max_loops=args.max_loops,
        seed=args.seed,
        verify_s=args.verify_ms / 1000 if args.verify_ms > 0 else None,
    )
    if args.layouts or args.layout_stage is not None:
        settings.update(layouts=args.layouts, layout_stage=args.layout_stage)
    if args.cold and args.cache is not None:
        raise ValueError("--cold and --cache exclude each other")
    cache = cache_path(args.cache)
    writable_folder(args.graph_dir, "--graph-dir")
    if args.problem is not None:
        problem = as_problem(args.problem)
        if args.json is not None and len(algorithms) == 1:
            writable_file(args.json, "--json")
        else:
            writable_folder(Path.cwd(), "the current folder (for the result JSON)")
    else:
        path = writable_file(args.csv if args.csv is not None else Path(f"search_{args.dataset}_{args.split}.csv"), "--csv")
        done = _done_pairs(path)
    shared = None if args.cold else Evaluator(cache, args.measure_budget_ms / 1000, target=args.target, threads=args.threads)

    def evaluator() -> Evaluator:
        return shared if shared is not None else Evaluator(":memory:", args.measure_budget_ms / 1000, target=args.target, threads=args.threads)

    if args.problem is not None:
        interrupted = False
        for algo in algorithms:
            result = run(problem, algo, evaluator=evaluator(), progress=_progress_printer(args.quiet, algo), **settings)
            print(_summary(result))
            print("  actions:", " ".join(result.actions) or "(none)")
            print("  " + result.best_nest.to_text().replace("\n", "\n  "))
            path = args.json if args.json is not None and len(algorithms) == 1 else Path(f"search_{_slug(result)}.json")
            print("  wrote", result.save_json(path))
            if args.graph_dir is not None:
                print("  wrote", result.save_graph(args.graph_dir / f"{_slug(result)}.json"))
            if result.stopped == "interrupted":
                interrupted = True
                break
        return EXIT_INTERRUPTED if interrupted else 0

    problems = dataset_problems(args.dataset, args.split)[args.offset:]
    if args.limit is not None:
        problems = problems[: args.limit]
    total = len(problems) * len(algorithms)
    started = time.perf_counter()
    finished = 0
    for problem in problems:
        for algo in algorithms:
            finished += 1
            if (problem.name, algo) in done:
                continue
            label = f"{finished}/{total} {algo} {problem.name}"
            result = run(problem, algo, evaluator=evaluator(), progress=_progress_printer(args.quiet, label), **settings)
            append_row(path, _csv_row(result))
            if args.graph_dir is not None:
                result.save_graph(args.graph_dir / f"{_slug(result)}.json")
            print(f"[{finished}/{total}, {time.perf_counter() - started:.0f} s] {_summary(result)}", flush=True)
            if result.stopped == "interrupted":
                print(f"interrupted; results so far are in {path} (run again to resume)", file=sys.stderr)
                return EXIT_INTERRUPTED
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
