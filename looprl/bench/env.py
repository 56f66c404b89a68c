"""``python -m looprl.bench env``: structural steps per second of LoopNest-v0, cold and warm.

A random agent picks uniformly among the valid structural actions (swaps and splits: the
steps that need a compiled and measured schedule) for a number of steps on a cold cache (a
fresh temporary database: every new state is compiled and timed), then the same action
sequence is replayed on the now warm cache. Run on a mix of the dataset's training problems
and on 256^3 alone (the largest problem of the dataset).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from looprl import checks, defaults
from looprl.workloads.datasets import dataset_problems
from looprl.env.loopnest_env import LoopNestEnv
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.peak import peak_gflops
from looprl.backend.host import cpu_model_name
from looprl.target import Target


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="structural steps per workload (default 300)")
    parser.add_argument("--budget-ms", type=float, default=defaults.ENV_STATE_BUDGET_S * 1000,
                        help="timing budget per new state (default: LoopNest-v0's)")
    parser.add_argument("--target", default=None, help="host (default), avx512, avx2 or sse4: the code the env generates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")


def _action_sequence(env: LoopNestEnv, steps: int, seed: int) -> list[tuple]:
    """Run a random structural agent; return the (reset or action) events it produced."""
    rng = np.random.default_rng(seed)
    events = []
    env.reset(seed=seed)
    events.append(("reset", env.problem.name))
    done = 0
    while done < steps:
        mask = env.action_mask()
        structural = [a for a in range(len(mask)) if mask[a] and env.actions.is_structural(a)]
        if not structural:  # nothing left to change: start another problem
            env.reset()
            events.append(("reset", env.problem.name))
            continue
        action = int(rng.choice(structural))
        _, _, _, truncated, _ = env.step(action)
        events.append(("step", action))
        done += 1
        if truncated:
            env.reset()
            events.append(("reset", env.problem.name))
    return events


def _replay(env: LoopNestEnv, events: list[tuple]) -> None:
    for kind, value in events:
        if kind == "reset":
            env.reset(options={"problem": value})
        else:
            env.step(value)


def _workload(name: str, problems, args, peak: float, out, target=None) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        cache = MeasurementCache(Path(folder) / "bench.sqlite")
        env = LoopNestEnv(problems=problems, order="random", cache=cache, peak=peak, measure_budget_s=args.budget_ms / 1000, target=target)
        evaluator = env.evaluator
        started = time.perf_counter()
        events = _action_sequence(env, args.steps, args.seed)
        cold_s = time.perf_counter() - started
        compiled, compile_s, measure_s = evaluator.compiled, evaluator.compile_s, evaluator.measure_s
        started = time.perf_counter()
        _replay(env, events)
        warm_s = time.perf_counter() - started
        cache.close()
    steps = sum(1 for kind, _ in events if kind == "step")
    row = {
        "workload": name,
        "structural_steps": steps,
        "cold_steps_per_s": steps / cold_s,
        "warm_steps_per_s": steps / warm_s,
        "new_states": compiled,
        "failures": evaluator.failures,
        "mean_compile_ms": 1000 * compile_s / max(compiled, 1),
        "mean_measure_ms": 1000 * measure_s / max(compiled, 1),
    }
    print(
        f"{name:>14}  {steps:5d}  {row['cold_steps_per_s']:8.1f}  {row['warm_steps_per_s']:8.1f}  "
        f"{compiled:6d}  {row['mean_compile_ms']:7.2f}  {row['mean_measure_ms']:7.2f}",
        file=out,
        flush=True,
    )
    return row


def main(args, out=None) -> dict:
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    checks.positive_int(args.steps, "--steps")
    checks.positive_float(args.budget_ms, "--budget-ms", unit="milliseconds")
    target = Target.resolve(getattr(args, "target", None))
    target.check_runs_on_host()
    peak = peak_gflops(target=target)
    print(f"target {target.isa}; peak {peak:.1f} GFLOPS; timing budget {args.budget_ms:g} ms per new state; CPU {cpu_model_name()}", file=out)
    print("      workload  steps  cold/s    warm/s    new  compile  measure (ms/state)", file=out)
    rows = [
        _workload(f"{defaults.DATASET} train", dataset_problems(defaults.DATASET, "train"), args, peak, out, target),
        _workload("256x256x256", ["256x256x256"], args, peak, out, target),
    ]
    result = {"target": target.isa, "cpu": cpu_model_name(), "peak_gflops": peak, "budget_ms": args.budget_ms, "rows": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result
