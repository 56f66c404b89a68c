"""``python -m looprl.bench tune``: how fast and how good ``looprl.tune`` is on a dataset split.

For each problem: the wall-clock time of ``looprl.tune`` for ``--target`` (default this
machine; a narrower ISA is cross-compiled) from a cold cache (compile of the returned kernel
included); then, after tuning, the returned kernel, the untuned nest and the peers timed in
turn, round after round (:mod:`looprl.bench.peers`): numpy in a child process with the OpenBLAS
kernels of the target's ISA (``OPENBLAS_CORETYPE`` unset, native, for the host's own ISA;
``Haswell`` for AVX2 code on an AVX-512 host: see :mod:`looprl.measurement.numpy_baseline`),
and torch in another, ``torch.matmul``, ``F.linear`` and oneDNN's linear on a weight packed
once (``torch.ops.mkldnn._reorder_linear_weight`` then ``_linear_pointwise``, what Inductor's
freezing runs; :mod:`looprl.bench.torch_baseline`). Reports median and p95 tune time and the
geometric means of GFLOPS against numpy, torch, the better of the two, the untuned nest and
the measured peak; on a dataset whose rows name their model (``models``), also a table per
model.

The columns, per problem: ``tune ms`` (``looprl.tune``'s wall-clock time), ``untuned`` and
``tuned`` (GFLOPS of the initial nest, ``nan`` with ``--no-untuned``, and of tune's answer), ``numpy`` and ``torch`` (GFLOPS;
torch's is the best of its calls), ``tuned/numpy``, ``tuned/torch`` and ``tuned/best`` (the
tuned kernel against numpy, torch, and the better of the two: the headline), ``bound`` (the
roofline's GFLOPS bound, ``P`` peak, ``2`` L2, ``L`` last-level cache or ``D`` DRAM bandwidth),
``of bound`` and ``GB/s`` (the compulsory traffic's rate: a decode kernel's weight streaming);
with more thread counts each one's ``of bound`` too, from the roofline measured on as many threads. A peer whose child failed prints one warning line and ``nan`` in its columns; the
others are still printed.

``--threads 1,2`` tunes every problem once per thread count (``looprl.tune(threads=N)``, each
from a cold cache, every count before the peers time that problem), times the returned kernel on N threads and numpy on N BLAS threads, and
prints the figures side by side; for N > 1 also the returned schedule made serial, on one
thread (its one-thread counterpart). The first count's figures keep the one-count names in
the JSON rows and summary; the others get a ``_t<N>`` suffix.

Every figure is the best of :data:`~looprl.bench.peers.TIMING_ROUNDS` rounds, each timing
looprl's kernels, numpy and torch one after the other with ``--budget`` each (on this 2-vCPU VM
one bad moment, the host taking the second vCPU away, made a two-thread team time at one
thread's speed: 115 against 217 GFLOPS re-timed alone; in turn, such a moment lowers one
round of every figure, not one side of a ratio).

``--torch-float32`` also times torch's calls of a bfloat16 problem on float32 tensors
(:mod:`looprl.bench.torch_baseline`), counted in torch's best: where torch's bfloat16 is slow
(no AVX512_BF16, or torch held to AVX2) the float32 call is what a user would make.

``--repeat`` tunes every problem a second time, from another cold cache, at each thread count,
and re-times the two answers together (``REPEAT_ROUNDS`` interleaved rounds, best of each):
how far two ``tune`` calls on the same problem agree (``agreement`` = slower / faster), and how
many agree within 5%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from looprl import checks, defaults
from looprl.backend.host import cpu_model_name
from looprl.backend.kernel import compile
from looprl.backend.threads import available_cores, check_threads
from looprl.bench.neighbour import KINDS, Neighbour
from looprl.workloads.datasets import SPLITS, dataset_entries
from looprl.ir.dtypes import DTYPES, FLOAT32
from looprl.ir.nest import initial_nest
from looprl.ir.problem import parse_problems
from looprl.bench.peers import TIMING_ROUNDS, Peers
from looprl.bench.torch_baseline import best_torch
from looprl.measurement.numpy_baseline import baseline_label
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.peak import measure_peak_gflops
from looprl.measurement.roofline import roofline
from looprl.measurement.timing import time_kernel
from looprl.policy.loading import load_policy
from looprl.tune.api import TUNE_BUDGET_S, tune
from looprl.target import Target


def add_arguments(parser) -> None:
    parser.add_argument("--split", choices=SPLITS, default="test")
    parser.add_argument("--dataset", default=defaults.DATASET)
    parser.add_argument("--limit", type=int, default=None, help="first N problems of the split")
    parser.add_argument("--problems", default=None, help="these problems instead of the split: comma-separated MxNxK, or problem names (space-separated)")
    parser.add_argument("--target", default=None, help="host (default), avx512, avx2 or sse4")
    parser.add_argument("--tune-budget", type=float, default=TUNE_BUDGET_S,
                        help="looprl.tune's search budget in seconds (default: scaled to each problem, as looprl.tune does)")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--mode", choices=("measured", "policy"), default="measured")
    parser.add_argument("--budget", type=float, default=0.05, help="seconds to re-time each kernel (default 0.05)")
    parser.add_argument("--search", type=float, default=0.0, metavar="S",
                        help="also run beam4bfs for S seconds per problem (the paper's baseline: 60) and report its best, re-timed (default 0: no search)")
    parser.add_argument("--threads", default="1",
                        help="comma-separated thread counts, e.g. 1,2: tune and time for each, numpy with as many BLAS threads (default 1)")
    parser.add_argument("--untuned", action=argparse.BooleanOptionalAction, default=True,
                        help="time the untuned nest with the peers (default); --no-untuned: not (nan): on a large problem one "
                             "untuned call can take minutes (512 rows of a 4096->11008 linear layer: about 150 s at 0.3 GFLOPS)")
    parser.add_argument("--repeat", action="store_true",
                        help="tune every problem twice from cold caches and report how far the two answers agree (re-timed together)")
    parser.add_argument("--neighbour", choices=KINDS, default=None,
                        help="also tune every problem while another process does steady or bursty BLAS work, and re-time that "
                             "answer quietly together with the quiet one")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="tune every problem in this dtype (bfloat16: numpy has none, so torch is the only peer; the peak is the "
                             "bfloat16 one); default: each problem's own")
    parser.add_argument("--torch-float32", action="store_true",
                        help="also time torch's calls of a bfloat16 problem on float32 tensors (what a user of a CPU whose torch "
                             "bfloat16 is slow calls), counted in torch's best")
    parser.add_argument("--json", type=Path, default=None)


REPEAT_ROUNDS = 3
AGREEMENT = 0.95  # two answers within 5% of each other agree


def thread_counts(text: str) -> list[int]:
    """``"1,2"`` -> [1, 2]: distinct counts, each checked against the cores this process may use."""
    counts = []
    for item in str(text).split(","):
        item = item.strip()
        if not item.isdigit():
            raise ValueError(f"--threads {text!r}: expected comma-separated positive integers, e.g. 1,2")
        count = check_threads(int(item), "--threads")
        if count not in counts:
            counts.append(count)
    if not counts:
        raise ValueError("--threads needs at least one count")
    return counts


def _suffix(threads: int, first: int) -> str:
    return "" if threads == first else f"_t{threads}"


def _geomean(values) -> float:
    values = [v for v in values if v > 0]
    return statistics.geometric_mean(values) if values else math.nan


def _label(problem) -> str:
    """``MxNxK`` (other dimensions after them), the batch in front: ``b12:128x128x64``."""
    dims = [d for d in "mnk" if d in problem.dims] + [d for d in problem.dims if d not in "bmnk"]
    text = "x".join(str(problem.size(d)) for d in dims)
    return f"b{problem.size('b')}:{text}" if "b" in problem.dims else text


def per_model(rows: list[dict]) -> list[dict]:
    """One summary per model, in order of first appearance: problems, geomean tuned/numpy,
    tuned/best library and tuned/untuned, median and max tune seconds."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row.get("model") or "-", []).append(row)
    return [
        {
            "model": model,
            "problems": len(members),
            "tuned_vs_numpy_geomean": _geomean(r["tuned_gflops"] / r["numpy_gflops"] for r in members),
            "tuned_vs_best_library_geomean": _geomean(r["tuned_gflops"] / r["best_library_gflops"] for r in members),
            "tuned_vs_untuned_geomean": _geomean(r["tuned_gflops"] / r["untuned_gflops"] for r in members),
            "tune_s_median": statistics.median(r["tune_s"] for r in members),
            "tune_s_max": max(r["tune_s"] for r in members),
            "search_vs_numpy_geomean": _geomean(r["search_gflops"] / r["numpy_gflops"] for r in members if "search_gflops" in r),
        }
        for model, members in groups.items()
    ]


def print_per_model(models: list[dict], out) -> None:
    print(f"{'model':>16} {'problems':>8} {'tuned/numpy':>11} {'tuned/best':>10} {'tuned/untuned':>13} {'tune s median':>13} {'tune s max':>10} "
          f"{'search/numpy':>12}", file=out)
    for m in models:
        search = m.get("search_vs_numpy_geomean", math.nan)
        print(f"{m['model']:>16} {m['problems']:8d} {m['tuned_vs_numpy_geomean']:11.2f} {m['tuned_vs_best_library_geomean']:10.2f} "
              f"{m['tuned_vs_untuned_geomean']:13.2f} "
              f"{m['tune_s_median']:13.3f} {m['tune_s_max']:10.3f} {'-' if math.isnan(search) else f'{search:.2f}':>12}", file=out)


def _timed(kernel, budget_s: float, threads: int | None = None) -> float:
    """``kernel``'s GFLOPS: the best of :data:`TIMING_ROUNDS` timings of ``budget_s`` each."""
    return max(time_kernel(kernel, budget_s, threads=threads).gflops for _ in range(TIMING_ROUNDS))


def _best_library(numpy_value: float, torch_value: float) -> float:
    """The better of numpy and torch, NaN only when neither was timed."""
    timed = [v for v in (numpy_value, torch_value) if v == v]
    return max(timed) if timed else math.nan


def _retimed_together(kernels, budget_s: float, threads: int) -> list[float]:
    """Each kernel's best GFLOPS over :data:`REPEAT_ROUNDS` rounds that time them in turn."""
    best = [0.0] * len(kernels)
    for _ in range(REPEAT_ROUNDS):
        for i, kernel in enumerate(kernels):
            best[i] = max(best[i], time_kernel(kernel, budget_s, threads=threads).gflops)
    return best


def agreement(first, problem, policy, args, target, threads: int) -> dict:
    """Tune ``problem`` again from a cold cache on ``threads`` threads and time the two answers
    (``first`` and the new one) in interleaved rounds: their GFLOPS and slower / faster."""
    again = tune(problem, policy, measure=args.mode == "measured", cache=":memory:", target=target, budget_s=args.tune_budget,
                 threads=threads)
    best = _retimed_together((first.kernel, again.kernel), args.budget, threads)
    return {"first_gflops": best[0], "second_gflops": best[1], "agreement": min(best) / max(best), "second_schedule": again.nest.key}


def beside_neighbour(quiet, problem, policy, args, target, threads: int) -> dict:
    """Tune ``problem`` again from a cold cache on ``threads`` threads while a neighbour process
    does ``args.neighbour`` BLAS work on the cores left over (at least one), then, the neighbour
    gone, time that answer and the quiet one (``quiet``) in interleaved rounds: their GFLOPS and
    ``ratio`` = the neighbour's answer / the quiet answer."""
    with Neighbour(args.neighbour, threads=max(1, available_cores() - threads)):
        disturbed = tune(problem, policy, measure=args.mode == "measured", cache=":memory:", target=target,
                         budget_s=args.tune_budget, threads=threads)
    best = _retimed_together((quiet.kernel, disturbed.kernel), args.budget, threads)
    return {"quiet_gflops": best[0], "neighbour_gflops": best[1], "ratio": best[1] / best[0], "tune_s": disturbed.seconds,
            "neighbour_schedule": disturbed.nest.key}


def summarise_neighbour(rows: list[dict], key: str) -> dict:
    values = [r[key]["ratio"] for r in rows]
    return {"ratio_geomean": _geomean(values), "ratio_min": min(values), "below_0.9": sum(v < 0.9 for v in values),
            "problems": len(values)}


def summarise_agreement(rows: list[dict], key: str) -> dict:
    values = [r[key]["agreement"] for r in rows]
    return {"agreement_geomean": _geomean(values), "agreement_min": min(values), "within_5pct": sum(v >= AGREEMENT for v in values),
            "problems": len(values)}


def main(args, out=None) -> dict:
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    if args.limit is not None:
        checks.positive_int(args.limit, "--limit")
    checks.seconds(args.budget, "--budget")
    checks.seconds(args.search, "--search", allow_zero=True)
    if args.tune_budget is not None:  # None: scaled to each problem
        checks.seconds(args.tune_budget, "--tune-budget", allow_zero=True)
    counts = thread_counts(getattr(args, "threads", "1"))
    first = counts[0]
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    policy = load_policy(args.policy if args.policy == "default" else Path(args.policy), target)
    if args.problems:
        problems = parse_problems(args.problems)
        entries = [None] * len(problems)
        source = "given problems"
    else:
        entries = list(dataset_entries(args.dataset, args.split))[: args.limit]
        problems = [entry.problem for entry in entries]
        source = f"{args.dataset}/{args.split}"
    dtype = getattr(args, "dtype", None)
    if dtype is not None:
        problems = [problem.with_dtype(dtype) for problem in problems]
        source += f" in {dtype}"
    dtype = dtype or (problems[0].dtype if len({p.dtype for p in problems}) == 1 else FLOAT32)  # the peak's (mixed: float32's)
    peak = measure_peak_gflops(target, threads=first, dtype=dtype)
    ceilings = roofline(peak, target, ":memory:", threads=first, fresh=True)
    numpy_label = baseline_label(target.isa, threads=first)
    peaks = {n: measure_peak_gflops(target, threads=n, dtype=dtype) for n in counts[1:]}
    team_ceilings = {n: roofline(peaks[n], target, ":memory:", threads=n, fresh=True) for n in counts[1:]}
    peers = Peers(target.isa, counts, torch_float32=getattr(args, "torch_float32", False))  # numpy and torch (torch.matmul, F.linear, oneDNN packed), timed with each problem's kernels
    try:
        return _run(args, out, target, policy, problems, entries, source, counts, peak, ceilings, numpy_label, peaks, peers, team_ceilings)
    finally:
        peers.close()


def _run(args, out, target, policy, problems, entries, source, counts, peak, ceilings, numpy_label, peaks, peers, team_ceilings) -> dict:
    repeat = getattr(args, "repeat", False)
    neighbour = getattr(args, "neighbour", None)
    first = counts[0]
    torch_label = peers.label("torch", first)
    made_for = policy.target.isa if policy.target is not None else "unknown"
    print(f"target {target}; peak {peak:.1f} GFLOPS; policy made for {made_for}; {len(problems)} problems ({source}); "
          f"{args.mode} mode, search budget {'scaled to the problem' if args.tune_budget is None else f'{args.tune_budget} s'}; CPU {cpu_model_name()}", file=out)
    print(ceilings.describe(), file=out)
    print(f"compared with {numpy_label} and {torch_label} (best of torch.matmul, F.linear and oneDNN's prepacked linear, {first} thread"
          f"{'s' if first > 1 else ''}); best = the better of numpy and torch" + "".join(f"; on {n} threads with {baseline_label(target.isa, threads=n)} "
                                                    f"(peak {peaks[n]:.1f})" for n in counts[1:]), file=out)
    print(f"{'problem':>14} {'tune ms':>8} {'untuned':>8} {'tuned':>8} {'numpy':>8} {'torch':>8} {'tuned/numpy':>11} {'tuned/torch':>11} "
          f"{'tuned/best':>10} {'bound':>7} {'of bound':>8} {'GB/s':>6}"
          + (f" {'search':>8}" if args.search else "")
          + "".join(f" {f'tuned@{n}':>9} {f'numpy@{n}':>9} {f'torch@{n}':>9} {f'@{n}/best':>9} {f'@{n}/@1':>7} {f'serial@{n}':>9} {f'bound@{n}':>8}"
                    for n in counts[1:]),
          file=out)
    rows = []
    for problem, entry in zip(problems, entries):
        result = tune(problem, policy, measure=args.mode == "measured", cache=":memory:", target=target, budget_s=args.tune_budget,
                      threads=first)
        # Every thread count tuned before the peers run for this problem: a team is measured on
        # cores that the peers' processes (whose threads had just timed numpy and torch) leave
        # alone, as a user's tune would be.
        threaded_results = {n: tune(problem, policy, measure=args.mode == "measured", cache=":memory:", target=target,
                                    budget_s=args.tune_budget, threads=n) for n in counts[1:]}
        # After tuning, the answer, the untuned nest, numpy and torch timed in turn, round after round.
        kernels = {"tuned": result.kernel}
        if getattr(args, "untuned", True):
            kernels["untuned"] = compile(with_pairs(initial_nest(problem), target), target=target)
        timed = peers.timed_with(kernels, problem, args.budget, first)
        tuned, untuned, numpy_value = timed["tuned"], timed.get("untuned", math.nan), timed["numpy"]
        bound = ceilings.bound(problem)
        torch_value = best_torch(timed["torch"])
        best_value = _best_library(numpy_value, torch_value)
        row = {"problem": problem.name, "tune_s": result.seconds, "waited_s": result.waited_s, "untuned_gflops": untuned, "tuned_gflops": tuned,
               "numpy_gflops": numpy_value, "torch_gflops": torch_value, "torch_calls_gflops": timed["torch"], "best_library_gflops": best_value,
               "bound_gflops": bound.gflops, "bound": bound.limit, "gbs": ceilings.gbs(problem, tuned), "actions": list(result.actions),
               "schedule": result.nest.key}
        if entry is not None and entry.model is not None:
            row.update(model=entry.model, layer=entry.layer)
        if repeat:
            row["repeat"] = agreement(result, problem, policy, args, target, first)
        if neighbour:
            row["neighbour"] = beside_neighbour(result, problem, policy, args, target, first)
        if args.search:
            from looprl.search import run

            found = run(problem, "beam4bfs", budget_s=args.search, cache=":memory:", target=target, verify_s=None)
            row["search_gflops"] = _timed(compile(found.best_nest, target=target), args.budget)
        columns = ""
        for n in counts[1:]:
            threaded = threaded_results[n]
            kernels = {"tuned": threaded.kernel}
            if threaded.nest.is_parallel:
                kernels["serial"] = compile(threaded.nest.serial(), target=target)
            timed_n = peers.timed_with(kernels, problem, args.budget, n)
            gflops = timed_n["tuned"]
            serial = timed_n.get("serial", gflops)
            numpy_n = timed_n["numpy"]
            suffix = _suffix(n, first)
            torch_n = best_torch(timed_n["torch"])
            best_n = _best_library(numpy_n, torch_n)
            bound_n = team_ceilings[n].bound(problem)
            row.update({f"bound_gflops{suffix}": bound_n.gflops, f"bound{suffix}": bound_n.limit})
            row.update({f"tune_s{suffix}": threaded.seconds, f"tuned_gflops{suffix}": gflops, f"numpy_gflops{suffix}": numpy_n,
                        f"torch_gflops{suffix}": torch_n, f"best_library_gflops{suffix}": best_n,
                        f"serial_counterpart_gflops{suffix}": serial, f"actions{suffix}": list(threaded.actions),
                        f"schedule{suffix}": threaded.nest.key})
            if repeat:
                row[f"repeat{suffix}"] = agreement(threaded, problem, policy, args, target, n)
            if neighbour:
                row[f"neighbour{suffix}"] = beside_neighbour(threaded, problem, policy, args, target, n)
            columns += (f" {gflops:9.1f} {numpy_n:9.1f} {torch_n:9.1f} {gflops / best_n:9.2f} {gflops / tuned:7.2f} {serial:9.1f}"
                        f" {gflops / bound_n.gflops:8.2f}")
        rows.append(row)
        label = _label(problem)
        print(f"{label:>14} {1000 * result.seconds:8.0f} {untuned:8.1f} {tuned:8.1f} {numpy_value:8.1f} {torch_value:8.1f} {tuned / numpy_value:11.2f}"
              f" {tuned / torch_value:11.2f} {tuned / best_value:10.2f}"
              f" {bound.gflops:6.1f}{bound.letter} {tuned / bound.gflops:8.2f} {ceilings.gbs(problem, tuned):6.1f}"
              + (f" {row['search_gflops']:8.1f}" if args.search else "") + columns, file=out, flush=True)
    times = sorted(r["tune_s"] for r in rows)
    summary = {
        "problems": len(rows),
        "peak_gflops": peak,
        "tune_s_median": statistics.median(times),
        "tune_s_p95": times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)],
        "tuned_vs_numpy_geomean": _geomean(r["tuned_gflops"] / r["numpy_gflops"] for r in rows),
        "tuned_vs_torch_geomean": _geomean(r["tuned_gflops"] / r["torch_gflops"] for r in rows),
        "tuned_vs_best_library_geomean": _geomean(r["tuned_gflops"] / r["best_library_gflops"] for r in rows),
        "tuned_vs_best_library_min": min(r["tuned_gflops"] / r["best_library_gflops"] for r in rows),
        "tuned_vs_untuned_geomean": _geomean(r["tuned_gflops"] / r["untuned_gflops"] for r in rows),
        "tuned_vs_peak_geomean": _geomean(r["tuned_gflops"] / peak for r in rows),
        "tuned_vs_bound_geomean": _geomean(r["tuned_gflops"] / r["bound_gflops"] for r in rows),
        "roofline": {"llc_gbs": ceilings.llc_gbs, "dram_gbs": ceilings.dram_gbs, "l2_bytes": ceilings.l2_bytes, "llc_bytes": ceilings.llc_bytes},
        "tuned_gflops_mean": statistics.fmean(r["tuned_gflops"] for r in rows),
        "numpy_gflops_mean": statistics.fmean(r["numpy_gflops"] for r in rows),
        "untuned_gflops_mean": statistics.fmean(r["untuned_gflops"] for r in rows),
    }
    if args.search:
        summary["search_vs_numpy_geomean"] = _geomean(r["search_gflops"] / r["numpy_gflops"] for r in rows)
        summary["tuned_vs_search_geomean"] = _geomean(r["tuned_gflops"] / r["search_gflops"] for r in rows)
    summary["threads"] = counts
    print(
        f"tune time: median {1000 * summary['tune_s_median']:.0f} ms, p95 {1000 * summary['tune_s_p95']:.0f} ms; "
        f"geomean tuned/numpy {summary['tuned_vs_numpy_geomean']:.2f}, tuned/torch {summary['tuned_vs_torch_geomean']:.2f}, "
        f"tuned/best library {summary['tuned_vs_best_library_geomean']:.2f} (lowest {summary['tuned_vs_best_library_min']:.2f}), tuned/untuned {summary['tuned_vs_untuned_geomean']:.2f}, "
        f"tuned/peak {summary['tuned_vs_peak_geomean']:.2f}, tuned/bound {summary['tuned_vs_bound_geomean']:.2f} "
        f"(bound: P peak, 2 L2, L last-level cache or D DRAM bandwidth x flops per byte)" + (f" ({first} thread{'s' if first > 1 else ''})" if len(counts) > 1 else ""),
        file=out,
    )
    for n in counts[1:]:
        s = _suffix(n, first)
        summary[f"peak_gflops{s}"] = peaks[n]
        summary[f"tuned_vs_numpy_geomean{s}"] = _geomean(r[f"tuned_gflops{s}"] / r[f"numpy_gflops{s}"] for r in rows)
        summary[f"tuned_vs_best_library_geomean{s}"] = _geomean(r[f"tuned_gflops{s}"] / r[f"best_library_gflops{s}"] for r in rows)
        summary[f"tuned_vs_best_library_min{s}"] = min(r[f"tuned_gflops{s}"] / r[f"best_library_gflops{s}"] for r in rows)
        summary[f"vs_first_threads_geomean{s}"] = _geomean(r[f"tuned_gflops{s}"] / r["tuned_gflops"] for r in rows)
        summary[f"vs_serial_counterpart_geomean{s}"] = _geomean(r[f"tuned_gflops{s}"] / r[f"serial_counterpart_gflops{s}"] for r in rows)
        summary[f"not_slower_than_first{s}"] = sum(r[f"tuned_gflops{s}"] >= r["tuned_gflops"] for r in rows)
        summary[f"tune_s_median{s}"] = statistics.median(r[f"tune_s{s}"] for r in rows)
        print(
            f"{n} threads: geomean tuned@{n}/numpy@{n} {summary[f'tuned_vs_numpy_geomean{s}']:.2f}, tuned@{n}/best library@{n} "
            f"{summary[f'tuned_vs_best_library_geomean{s}']:.2f} (lowest {summary[f'tuned_vs_best_library_min{s}']:.2f}), tuned@{n}/tuned@{first} "
            f"{summary[f'vs_first_threads_geomean{s}']:.2f} ({summary[f'not_slower_than_first{s}']} of {len(rows)} not slower), "
            f"over its serial counterpart {summary[f'vs_serial_counterpart_geomean{s}']:.2f}; "
            f"tune time median {1000 * summary[f'tune_s_median{s}']:.0f} ms",
            file=out,
        )
    result = {"mode": args.mode, "split": None if args.problems else args.split, "target": target.to_dict(), "cpu": cpu_model_name(),
              "tune_budget_s": args.tune_budget, "policy_target": made_for, "numpy": numpy_label, "torch": torch_label, "summary": summary, "rows": rows}
    if repeat:
        for n in counts:
            s = _suffix(n, first)
            summary[f"repeat{s}"] = agreed = summarise_agreement(rows, f"repeat{s}")
            print(f"two tune calls on {n} thread{'s' if n > 1 else ''}, re-timed together: {agreed['within_5pct']} of "
                  f"{agreed['problems']} agree within 5%; slower/faster geomean {agreed['agreement_geomean']:.3f}, "
                  f"worst {agreed['agreement_min']:.3f}", file=out)
    if neighbour:
        summary["neighbour_kind"] = neighbour
        for n in counts:
            s = _suffix(n, first)
            summary[f"neighbour{s}"] = beside = summarise_neighbour(rows, f"neighbour{s}")
            print(f"tuned on {n} thread{'s' if n > 1 else ''} beside a {neighbour} BLAS neighbour on "
                  f"{max(1, available_cores() - n)} thread(s), re-timed quietly against the quiet answer: geomean "
                  f"{beside['ratio_geomean']:.3f}, worst {beside['ratio_min']:.3f}, {beside['below_0.9']} of "
                  f"{beside['problems']} below 0.9", file=out)
    if any("model" in row for row in rows):
        result["models"] = per_model(rows)
        print_per_model(result["models"], out)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result
