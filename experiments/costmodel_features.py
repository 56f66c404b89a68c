"""Two representations of a schedule as the cost model's input, compared on the same
measurements: AutoTVM's loop-context + relation features (``looprl.costmodel.schedule_features``, what
the tuner uses) against the environment's observation (per loop: trip count, tail, compute
flag and the 16-bin stride histogram, flattened; what the RL policies see).

    python experiments/costmodel_features.py --cache experiments/results/autotvm_transfer_large_source.sqlite

(seconds to a few minutes; no kernel is run.) The data are a measurement cache's records for
one target (``--cache``, default the per-user cache; ``--target``, default the host's),
problems with at least ``--min-records`` measured schedules, at most ``--problems`` of them.
The tuner's cost-model fit (``looprl.costmodel.model.fit_booster``) scores both representations:

* ``transfer``: leave one problem out, fit on the others, score the held-out one's schedules;
* ``local``: per problem, fit on a random half of its schedules, score the other half.

Per held-out set: Spearman's rank correlation between scores and measured GFLOPS, and
``top-32``: the best measured GFLOPS among the 32 best-scored schedules over the best of the
set (what one batch picked by the model would hold). Prints the means and writes
``<out>.csv`` (one row per representation, protocol and problem).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from looprl import defaults
from looprl.costmodel.schedule_features import features_batch
from looprl.costmodel.model import OBJECTIVES, fit_booster, predict_booster
from looprl.env.observation import observation
from looprl.ir.nest import LoopNest
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.records import measured_nests
from looprl.target import Target

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 32
FIELDS = ["representation", "protocol", "problem", "schedules", "spearman", "top32"]


def load(cache_path: str | None, target: Target, min_records: int, limit: int) -> dict[str, list[tuple[LoopNest, float]]]:
    """Measured schedules per problem (the problems with the most records first)."""
    by_problem: dict[str, list[tuple[LoopNest, float]]] = defaultdict(list)
    with MeasurementCache(cache_path) as cache:
        measured = measured_nests(cache.records(target))
    for nest, gflops in measured:
        if len(nest) <= defaults.MAX_LOOPS and gflops > 0:
            by_problem[nest.problem.name].append((nest, gflops))
    kept = sorted((n for n, rows in by_problem.items() if len(rows) >= min_records), key=lambda n: -len(by_problem[n]))[:limit]
    return {name: by_problem[name] for name in sorted(kept)}


def representations(nests: list[LoopNest], isa: str) -> dict[str, np.ndarray]:
    return {
        "autotvm": features_batch(nests, defaults.MAX_LOOPS, target=Target.named(isa)),
        "observation": np.stack([observation(n, 0, defaults.MAX_LOOPS, normalized=True).reshape(-1) for n in nests]),
    }


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def top_batch(scores, gflops) -> float:
    chosen = np.argsort(-np.asarray(scores), kind="stable")[:BATCH]
    return float(np.max(np.asarray(gflops)[chosen]) / np.max(gflops))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=None, help="the measurement cache (default: the per-user cache)")
    parser.add_argument("--target", default=None, help="whose measurements: host (default), avx512, avx2 or sse4")
    parser.add_argument("--problems", type=int, default=12, help="at most this many problems (those with the most records)")
    parser.add_argument("--min-records", type=int, default=100, help="problems with fewer measured schedules are left out")
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), default="rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "costmodel_features"), help="path prefix of the CSV")
    args = parser.parse_args(argv)
    if args.cache is not None and not Path(args.cache).exists():
        raise SystemExit(f"--cache {args.cache} does not exist")
    target = Target.resolve(args.target)
    data = load(args.cache, target, args.min_records, args.problems)
    if len(data) < 2:
        raise SystemExit(f"need measurements of at least 2 problems with >= {args.min_records} schedules each for {target.isa}; found {len(data)}")
    print(f"{sum(len(v) for v in data.values())} measured schedules of {len(data)} problems ({target.isa})")
    rng = np.random.default_rng(args.seed)
    names = list(data)
    x = {name: representations([n for n, _ in data[name]], target.isa) for name in names}
    y = {name: np.array([g for _, g in data[name]]) for name in names}
    rows = []
    for kind in ("autotvm", "observation"):
        for held_out in names:  # transfer: the other problems only
            train = [n for n in names if n != held_out]
            booster = fit_booster(np.concatenate([x[n][kind] for n in train]), np.concatenate([y[n] for n in train]),
                                  np.concatenate([[i] * len(y[n]) for i, n in enumerate(train)]), args.objective, seed=args.seed)
            scores = predict_booster(booster, x[held_out][kind])
            rows.append({"representation": kind, "protocol": "transfer", "problem": held_out, "schedules": len(y[held_out]),
                         "spearman": spearman(scores, y[held_out]), "top32": top_batch(scores, y[held_out])})
        for name in names:  # local: half of the problem's own schedules
            order = rng.permutation(len(y[name]))
            fit, test = order[: len(order) // 2], order[len(order) // 2 :]
            booster = fit_booster(x[name][kind][fit], y[name][fit], None, args.objective, seed=args.seed)
            scores = predict_booster(booster, x[name][kind][test])
            rows.append({"representation": kind, "protocol": "local", "problem": name, "schedules": len(test),
                         "spearman": spearman(scores, y[name][test]), "top32": top_batch(scores, y[name][test])})
    table = Path(args.out + ".csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    with table.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)
    print(f"{'representation':>14} {'protocol':>9} {'spearman':>9} {'top-32':>7}   (means over {len(names)} problems; {args.objective} objective)")
    for kind in ("autotvm", "observation"):
        for protocol in ("transfer", "local"):
            chosen = [r for r in rows if r["representation"] == kind and r["protocol"] == protocol]
            print(f"{kind:>14} {protocol:>9} {statistics.fmean(r['spearman'] for r in chosen):9.3f} {statistics.fmean(r['top32'] for r in chosen):7.3f}")
    print("wrote", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
