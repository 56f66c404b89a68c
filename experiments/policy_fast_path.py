"""The policy alone against measured tune, on the linear layers of models as a model calls them:
what the fast path (``measure=False``: ``tune_module``, the backend, ``looprl-tune --no-measure``)
gives up against measured tuning, and what the policy's weights are worth there.

    python experiments/policy_fast_path.py --split test --threads 1,2 \
        --policy "shipped=default" --policy "called=checkpoints/clone-called/policy" \
        [--run RUN] [--limit N] [--out experiments/results/policy_fast_path_<cpu>]

Problems: the linear layers of the ``models`` dataset (its ``mk,kn->mn`` GEMMs that are not
convolutions), each as ``looprl.torch`` tunes it: ``looprl.linear(m, k, n)`` (weight ``[out,
in]`` constant), cold at up to 16 rows (``looprl.defaults.COLD_ROWS``: decode, every other
layer's weight read between two calls). ``--split test``: the models test split (smollm-360m,
vit-s16, mobilenet-v2) with its decode rows (1, 4, 16), plus the wide LLM layers 4096->4096,
4096->11008, 11008->4096 at 1 and 16 rows (weights of 64-180 MB, cold). ``--split validation``
(choosing which policy to ship): the layers of the ``models-called`` training problems that the
run ``--run``'s pretraining did not demonstrate (never the test split); ``--split
validation-rows``: ``models-called``'s validation split, the training models' linear layers
at 2, 8 and 256 rows, row counts no split holds (so no policy was trained on their labels,
whatever it demonstrated: ``looprl.workloads.datasets.validation_entries``).

``--dtype bfloat16``: every layer in bfloat16 (kernels checked against the exact layer on the
bfloat16 values within ``looprl.ir.dtypes.error_bound``); the output files end ``_bfloat16``.

``--timings 1,2``: each policy also as ``NAME-t1``, ``NAME-t2``: the fast path with at most that
many timings an episode (its proposals in order: the greedy episode's end state, then for a
paired bfloat16 weight the episode without dot-product tiles where the first used one, then
each of those packed into panels). ``t1`` is the issue's "policy alone": the greedy answer,
none of the fallbacks; on more than one thread it is still offered measured tune's teams. The
fast path itself times up to :data:`looprl.tune.policy_alone.POLICY_TIMINGS` (4).

``--weights-change``: every tune is told the weights change (``weights_change=True``, what
``tune_module``'s default path passes: a kernel that reads a copy of the weight pays for
comparing it, so in-place answers are preferred); without it the weights are constant (the
promise of ``frozen=True`` and Inductor's freezing).

On each thread count, for each layer: ``tune`` (measured, the shipped default policy, its
budget scaled to the problem, nothing remembered); for each ``--policy NAME=PATH`` the policy
alone (``tune(measure=False)``), and the same with that policy's network re-initialised at
random (``NAME-random``): the weights' worth where nothing measured corrects them. Every kernel
is checked against numpy, then all of a layer's kernels are re-timed together in interleaved
rounds (best kept; cold layers on rotating copies of the weight, as tune times them).
Writes ``<out>.csv`` (a row per layer, threads and method) and ``<out>.txt`` (the summary: per
method and thread count, the geomean of its GFLOPS over measured tune's, for all layers, the
decode layers and the rest, with the lowest).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np

from _names import cpu_slug

from looprl.backend.host import cpu_model_name, host_cpu

RESULTS = Path(__file__).resolve().parent / "results"
WIDE_LAYERS = ((4096, 4096), (4096, 11008), (11008, 4096))  # (in_features, out_features) of 7B-class decoders
WIDE_ROWS = (1, 16)
FIELDS = ["problem", "rows", "threads", "method", "gflops", "of_tune", "seconds", "measured", "actions"]


def layers(split: str, run: Path | None, limit: int | None) -> list:
    """The linear layers (Problems) of ``split``, as looprl.torch tunes them."""
    from looprl import defaults
    from looprl.ir.layers import linear
    from looprl.workloads.datasets import dataset_entries, dataset_problems

    if split == "test":
        shapes = [(dict(e.sizes)["m"], dict(e.sizes)["k"], dict(e.sizes)["n"]) for e in dataset_entries("models-called", "test")
                  if e.spec == "mk,kn->mn"]
        shapes += [(rows, k, n) for k, n in WIDE_LAYERS for rows in WIDE_ROWS]
    elif split == "validation-rows":  # models-called's validation split: the training models' layers at row counts no split holds
        from looprl.train.validation import spread

        shapes = [(dict(e.sizes)["m"], dict(e.sizes)["k"], dict(e.sizes)["n"]) for e in dataset_entries("models-called", "validation")
                  if e.spec == "mk,kn->mn"]
        shapes = spread(shapes, limit) if limit else shapes
    else:
        if run is None:
            raise SystemExit("--split validation needs --run (the run whose demonstrated problems are left out)")
        from looprl.train.config import read_agent
        from looprl.train.validation import spread_over_datasets

        agent = read_agent(run / "agent.yaml")
        demonstrated = {p.name for p in spread_over_datasets(agent, agent["pretrain"]["problems_per_dataset"])}
        shapes = [(p.size("m"), p.size("k"), p.size("n")) for p in dataset_problems("models-called", "train")
                  if p.spec == "mk,kn->mn" and p.name not in demonstrated]
    problems = []
    for m, k, n in dict.fromkeys(shapes):
        problem = linear(m, k, n, bias=False)
        problems.append(problem.with_cold() if m <= defaults.COLD_ROWS else problem)
    return problems[:limit] if limit and split != "validation-rows" else problems


def capped_fast_path(problem, policy, cache: str, threads: int, weights_change: bool, timings: int):
    """The fast path's answer with at most ``timings`` timings an episode (``--timings``): what
    ``tune(problem, policy, measure=False)`` runs, its proposals cut to the first ``timings``."""
    from looprl import defaults
    from looprl.target import Target
    from looprl.tune.api import _finish, as_tunable_problem
    from looprl.tune.measurer import Measurer
    from looprl.tune.policy_alone import policy_tune
    from looprl.tune.proposers import PolicyProposer
    from looprl.tune.searched import Searched

    started = time.perf_counter()
    target = Target.default()
    searched = Searched.read(as_tunable_problem(problem))
    proposer = PolicyProposer.prepared(policy, target, searched.problem, None)
    measurer = Measurer.open(cache, defaults.STATE_BUDGET_S, target, threads)
    answer, evaluator = policy_tune(proposer, searched, measurer, weights_change, timings=timings)
    return _finish(searched, answer, evaluator, threads, started)


def check_correct(kernel, problem) -> None:
    """Raise if ``kernel`` does not compute the layer as numpy does (float64 reference; a
    bfloat16 layer within the derived bound of its bfloat16 values)."""
    from looprl.ir.dtypes import as_float32, error_bound, storage

    rng = np.random.default_rng(0)
    x, w = (storage(rng.uniform(-1, 1, shape), problem.dtype) for shape in problem.input_shapes)
    xs, ws = as_float32(x, problem.dtype), as_float32(w, problem.dtype)
    expected = xs.astype(np.float64) @ ws.astype(np.float64).T
    error = np.abs(as_float32(kernel(x, w), problem.dtype) - expected)
    bound = error_bound("mk,nk->mn", xs, ws, problem.size("k"), problem.dtype) if problem.dtype != "float32" else 1e-5 * problem.size("k")
    if (error > bound).any():
        raise AssertionError(f"{problem.name}: kernel differs from numpy by {float(error.max())}")


def retime(kernels: dict[str, object], rounds: int) -> dict[str, float]:
    """Best GFLOPS of each kernel over ``rounds`` interleaved rounds."""
    from looprl.measurement.timing import time_kernel

    best = dict.fromkeys(kernels, 0.0)
    for _ in range(rounds):
        for method, kernel in kernels.items():
            best[method] = max(best[method], time_kernel(kernel, 0.05).gflops)
    return best


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def summary(rows: list[dict], title: str) -> str:
    lines = [title, f"{'method':>22} {'threads':>7} {'all':>6} {'decode':>7} {'64+ rows':>8} {'lowest':>7}  (GFLOPS / measured tune's, geomean)"]
    keys = dict.fromkeys((r["method"], r["threads"]) for r in rows if r["method"] != "tune")
    for method, threads in keys:
        mine = [r for r in rows if r["method"] == method and r["threads"] == threads]
        ratios = [float(r["of_tune"]) for r in mine]
        decode = [float(r["of_tune"]) for r in mine if int(r["rows"]) <= 16]
        rest = [float(r["of_tune"]) for r in mine if int(r["rows"]) > 16]
        lowest = min(mine, key=lambda r: float(r["of_tune"]))
        lines.append(f"{method:>22} {threads:>7} {geomean(ratios):>6.3f} {geomean(decode):>7.3f} {geomean(rest):>8.3f} "
                     f"{float(lowest['of_tune']):>7.2f}  ({lowest['problem']})")
    seconds = {}
    for r in rows:
        seconds.setdefault((r["method"], r["threads"]), []).append(float(r["seconds"]))
    lines.append("seconds per layer (median): " + ", ".join(f"{m}@{t} {np.median(s):.2f}" for (m, t), s in seconds.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=("test", "validation", "validation-rows"), default="test")
    parser.add_argument("--run", type=Path, default=None, help="--split validation: the training run (its agent.yaml)")
    parser.add_argument("--policy", action="append", default=None, metavar="NAME=PATH",
                        help="a policy to run alone (repeatable; PATH 'default' is the shipped one); default: shipped=default")
    parser.add_argument("--no-random", action="store_true", help="skip the random-weight twin of each policy")
    parser.add_argument("--weights-change", action="store_true",
                        help="tune every method with weights_change=True (tune_module's default path: a copy of the weight is compared "
                             "per call); default: the weights constant (frozen)")
    parser.add_argument("--timings", default="",
                        help="also each policy with at most N timings an episode (NAME-tN; 1: no bfloat16 fallbacks), e.g. 1,2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the layers' dtype (default float32)")
    parser.add_argument("--limit", type=int, default=None, help="first N layers (validation-rows: N spread over them)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved re-timing rounds")
    parser.add_argument("--cache", default=":memory:",
                        help="measurement cache of every tune (default: an empty one per tune; a file shares the host's measured "
                             "bandwidth, which --weights-change needs per tune, and every timing among the methods)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from looprl.policy.loading import load_policy
    from looprl.tune.api import tune
    from looprl.target import Target

    target = Target.default()  # the target tune compiles for (LOOPRL_TARGET, else the host)
    policies = {}
    for item in args.policy or ["shipped=default"]:
        name, _, path = item.partition("=")
        if not name or not path:
            raise SystemExit(f"--policy takes NAME=PATH, got {item!r}")
        policies[name] = load_policy(path, target, weights=True, dtype=args.dtype)  # every problem here is a linear layer: a weight on the right
        if not args.no_random:
            policies[f"{name}-random"] = policies[name].with_random_weights(seed=0)
    threads = [int(t) for t in args.threads.split(",")]
    caps = [int(t) for t in args.timings.split(",") if t]
    if any(cap < 1 for cap in caps):
        raise SystemExit(f"--timings takes positive counts, got {args.timings!r}")
    out = args.out or RESULTS / (f"policy_fast_path_{args.split}_{cpu_slug(host_cpu()[0])}" + ("_bfloat16" if args.dtype == "bfloat16" else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    problems = [problem.with_dtype(args.dtype) for problem in layers(args.split, args.run, args.limit)]
    command = "python experiments/policy_fast_path.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{len(problems)} layers, threads {threads}, policies {list(policies)}", flush=True)
    rows = []
    with open(out.with_suffix(".csv"), "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for count in threads:
            for index, problem in enumerate(problems):
                results = {}
                started = time.perf_counter()
                results["tune"] = (tune(problem, cache=args.cache, remember=False, threads=count, weights_change=args.weights_change),
                                   time.perf_counter() - started)
                for name, policy in policies.items():
                    started = time.perf_counter()
                    results[name] = (tune(problem, policy, measure=False, cache=args.cache, threads=count, weights_change=args.weights_change),
                                  time.perf_counter() - started)
                    for cap in caps:
                        started = time.perf_counter()
                        results[f"{name}-t{cap}"] = (capped_fast_path(problem, policy, args.cache, count, args.weights_change, cap),
                                                     time.perf_counter() - started)
                for result, _ in results.values():
                    check_correct(result.kernel, problem)
                best = retime({method: result.kernel for method, (result, _) in results.items()}, args.rounds)
                for method, (result, seconds) in results.items():
                    row = {"problem": problem.name, "rows": problem.size("m"), "threads": count, "method": method,
                           "gflops": round(best[method], 2), "of_tune": round(best[method] / best["tune"], 4), "seconds": round(seconds, 3),
                           "measured": result.measured, "actions": " ".join(result.actions)}
                    writer.writerow(row)
                    rows.append(row)
                handle.flush()
                print(f"[{count}t {index + 1}/{len(problems)}] {problem.name}: tune {best['tune']:.1f} GFLOPS; "
                      + ", ".join(f"{m} {best[m] / best['tune']:.2f}" for m in results if m != "tune"), flush=True)
    text = summary(rows, f"{command}\nweights {'change (compared per call)' if args.weights_change else 'constant'}; CPU: {cpu_model_name()} ({host_cpu()[0]}, {target.isa}); {len(problems)} layers ({args.split})")
    out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
