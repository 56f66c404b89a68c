"""``looprl-train`` (or ``python -m looprl train``): train an RLlib agent on LoopNest-v0, or evaluate a policy.

    looprl-train --algo apex-dqn --time-budget 1h --out checkpoints/apex-dqn
    looprl-train --resume --out checkpoints/apex-dqn --time-budget 2h
    looprl-train --layouts --init-from checkpoints/apex-dqn --time-budget 40m --out runs/layouts
    looprl-train --evaluate checkpoints/apex-dqn --split test --numpy
    looprl-train --adapt --time-budget 10m --out runs/adapted

Hyperparameters come from ``agents/<algo>.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from looprl import defaults
from looprl.backend.threads import check_threads
from looprl.cli.common import EXIT_INTERRUPTED, cache_path, run_command, writable_file, writable_folder
from looprl.interrupts import terminate_as_interrupt
from looprl.measurement.evaluator import Evaluator
from looprl.target import TARGET_CHOICES, Target
from looprl.train import run as training
from looprl.train.config import ALGORITHMS
from looprl.train.evaluate import evaluate, resolve_policy
from looprl.train.extra import require_training_extra
from looprl.train.loop import parse_duration
from looprl.workloads.datasets import SPLITS, dataset_problems


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="looprl-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=ALGORITHMS, default="apex-dqn")
    parser.add_argument("--config", type=Path, default=None, help="agent YAML (default agents/<algo>.yaml)")
    parser.add_argument("--iterations", type=int, default=None, help="total training iterations (default: the YAML's run.iterations)")
    parser.add_argument("--time-budget", default=None, help="total training time, e.g. 45m or 2h")
    parser.add_argument("--env-steps", type=int, default=None, help="total env steps to sample")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<algo>__s<seed>__<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint (a run that has none starts again)")
    parser.add_argument("--init-from", type=Path, default=None, metavar="POLICY",
                        help="start a new run from an exported policy's weights (policy folder or run folder)")
    parser.add_argument("--address", default=None, help="attach to an existing Ray cluster: its head node, HOST:PORT (GCS port, usually 6379)")
    parser.add_argument("--num-env-runners", type=int, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=None, help="iterations between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--validate-every", type=int, default=None,
                        help="iterations between greedy validations that keep the best policy (default: the YAML's run.validate_every or 25; 0: never)")
    parser.add_argument("--validation-problems", type=int, default=None,
                        help="training problems (evenly spread) in the validation set (default: run.validation_problems or 64)")
    parser.add_argument("--problems", default=None, help="train on these problems instead of the dataset (comma-separated MxNxK)")
    parser.add_argument("--evaluate", type=Path, default=None, metavar="POLICY", help="evaluate a policy folder, run folder or checkpoint")
    parser.add_argument("--adapt", nargs="?", const="default", default=None, metavar="POLICY",
                        help="adapt a policy (default: the shipped one for the target) to this CPU within --time-budget "
                             "(default 10m, at least 30s, the whole command): measured tune's answers here, fine-tuning, "
                             "before/after on held-out shapes; a slower result is kept aside, not written as OUT/policy")
    parser.add_argument("--held-out", type=int, default=12, help="--adapt: held-out problems compared before and after (default 12)")
    parser.add_argument("--split", choices=SPLITS, default="test", help="--evaluate: dataset split (default test)")
    parser.add_argument("--dataset", default=defaults.DATASET)
    parser.add_argument("--limit", type=int, default=None, help="--evaluate: first N problems")
    parser.add_argument("--numpy", action="store_true", help="--evaluate: also time numpy (single thread)")
    parser.add_argument("--mask", action="store_true", help="--evaluate: let the policy choose among valid actions only")
    parser.add_argument("--csv", type=Path, default=None, help="--evaluate: per-problem CSV")
    parser.add_argument("--cache", default=None, help="measurement cache path (default: the per-user cache)")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES,
                        help="generate and measure code for this target (default host; a narrower ISA than the host's is "
                             "cross-compiled, e.g. --target avx2 on an AVX-512 machine); --evaluate: default the policy's own")
    parser.add_argument("--layouts", action="store_true",
                        help="train with the data-layout actions pack and pad after the splits (LoopNest-v0's layouts=True); "
                             "--init-from a loops-only policy starts the new actions as its average action")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for parallel loops (LoopNest-v0's threads=: more than 1 adds the 'parallel' action and normalises "
                             "rewards by that many threads' peak; default 1); --evaluate: default the policy's own")
    return parser


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started
    return run_command("looprl-train", lambda: _interruptible(args, parser))


def _interruptible(args, parser: argparse.ArgumentParser) -> int:
    """The command, with SIGTERM handled as Ctrl-C: what was done is saved and the exit status is 130."""
    try:
        with terminate_as_interrupt():
            if args.adapt is not None:
                return _adapt(args, parser)
            return _evaluate(args) if args.evaluate is not None else _train(args)
    except KeyboardInterrupt as interrupt:
        hint = interrupt.hint if isinstance(interrupt, training.RunInterrupted) else None
        print(f"looprl-train: interrupted{'; ' + hint if hint else ''}", file=sys.stderr, flush=True)
        ray_was_running = training.shutdown_ray(quickly=True)  # stopped while Ray started
        if ray_was_running or isinstance(interrupt, training.RunInterrupted):
            _exit_now(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED


def _evaluate(args) -> int:
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    writable_file(args.csv, "--csv")
    cache = cache_path(args.cache)
    if args.threads is not None:
        check_threads(args.threads, "--threads")
    policy = resolve_policy(args.evaluate)
    problems = dataset_problems(args.dataset, args.split)
    if args.limit is not None:
        problems = problems[: args.limit]
    target = args.target if args.target is not None else _policy_target_or_host(policy)
    threads = args.threads if args.threads is not None else policy.metadata.get("threads", 1)
    evaluate(policy, problems, Evaluator(cache, target=target, threads=threads), use_mask=args.mask, numpy=args.numpy, csv_path=args.csv)
    return 0


ADAPT_FLAGS = ("adapt", "time_budget", "out", "cache", "target", "seed", "held_out")  # what --adapt reads; any other flag is refused


def _adapt(args, parser: argparse.ArgumentParser) -> int:
    from datetime import datetime, timezone

    from looprl.train.adapt import MIN_BUDGET_S, adapt, format_report, held_out_problems_for

    if args.evaluate is not None:
        raise ValueError("--adapt and --evaluate are two commands: give one")
    for action in parser._actions:
        if action.dest not in ADAPT_FLAGS and action.option_strings and action.dest != "help" \
                and getattr(args, action.dest) != action.default:
            raise ValueError(f"--adapt does not use {action.option_strings[-1]}: leave it out")
    budget_s = 600.0
    if args.time_budget is not None:
        try:
            budget_s = parse_duration(args.time_budget)
        except ValueError as error:
            raise ValueError(f"--time-budget: {error}") from None
    if budget_s < MIN_BUDGET_S:
        raise ValueError(f"--time-budget {args.time_budget}: --adapt needs at least {MIN_BUDGET_S:.0f} s (loading, importing torch, "
                         f"compiling and comparing on the held-out problems alone take about 10 s)")
    if args.held_out < 1:
        raise ValueError(f"--held-out must be positive, got {args.held_out}")
    from looprl.policy.loading import load_policy

    policy = load_policy(args.adapt, args.target)  # its own errors as they are
    try:
        held_out_problems_for(args.held_out, policy)
    except ValueError as error:
        raise ValueError(f"--{str(error).replace('_', '-', 1)}") from None
    require_training_extra("adapting", ("torch",))
    cache = cache_path(args.cache)
    out = args.out or Path("runs") / f"adapt__{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    writable_folder(out, "--out")
    left_s = budget_s - (time.perf_counter() - args.started)  # the budget counts from the command's start
    report = adapt(args.adapt, out=out, target=args.target, budget_s=left_s, held_out=args.held_out, cache=cache, seed=args.seed)
    print(format_report(report), flush=True)
    if report.kept_start:
        print(f"looprl-train: warning: the adapted policy was slower than the starting one on the held-out problems; "
              f"{out / 'policy'} is the starting policy", file=sys.stderr, flush=True)
    return 0


def _policy_target_or_host(policy):
    """The target a policy was trained for, or this machine's when it cannot run that code
    (an AVX-512 policy on an AVX2 host): the policy then acts on the host's kernels, with a warning."""
    made_for = policy.target
    if made_for is None or not made_for.missing_on_host():
        return made_for
    host = Target.default()
    print(f"looprl-train: warning: the policy was trained for {made_for.isa}, which this CPU cannot run "
          f"(it lacks {', '.join(made_for.missing_on_host())}); evaluating it on this machine's target {host.isa} "
          f"(--target chooses another)", file=sys.stderr, flush=True)
    return host


def _train(args) -> int:
    options = _options(args)
    plan = training.prepare(options)  # everything checked; nothing written yet
    training.execute(plan)
    return 0


def _options(args) -> training.TrainOptions:
    """The training flags checked (each alone and in combination) as :class:`~looprl.train.run.TrainOptions`."""
    for flag, value, least in (("--iterations", args.iterations, 1), ("--env-steps", args.env_steps, 1),
                               ("--checkpoint-every", args.checkpoint_every, 1), ("--validate-every", args.validate_every, 0),
                               ("--validation-problems", args.validation_problems, 1), ("--num-env-runners", args.num_env_runners, 0)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be {'positive' if least else '>= 0'}, got {value}")
    time_budget_s = None
    if args.time_budget is not None:
        try:
            time_budget_s = parse_duration(args.time_budget)
        except ValueError as error:
            raise ValueError(f"--time-budget: {error}") from None
    if args.resume and args.init_from is not None:
        raise ValueError("--init-from starts a new run; it cannot be combined with --resume")
    if args.resume and args.layouts:
        raise ValueError("--layouts chooses a new run's actions; a resumed run keeps its own")
    if args.resume and args.threads is not None:
        raise ValueError("--threads chooses a new run's actions; a resumed run keeps its own")
    if args.resume and args.out is None:
        raise ValueError("--resume needs --out RUN_FOLDER")
    if args.threads is not None:
        check_threads(args.threads, "--threads")
    require_training_extra("training")
    cache_path(args.cache)
    writable_folder(args.out, "--out")
    problems = None if args.problems is None else tuple(p.strip() for p in args.problems.split(",") if p.strip())
    return training.TrainOptions(
        algo=args.algo, config=args.config, out=args.out, resume=args.resume, init_from=args.init_from, iterations=args.iterations,
        time_budget_s=time_budget_s, env_steps=args.env_steps, checkpoint_every=args.checkpoint_every,
        validate_every=args.validate_every, validation_problems=args.validation_problems, num_env_runners=args.num_env_runners,
        seed=args.seed, address=args.address, problems=problems, cache=args.cache, target=args.target, layouts=args.layouts,
        threads=args.threads,
    )


def _exit_now(status: int) -> None:
    """Exit with ``status`` without Ray's exit handlers, which wait for a GCS that a signal to
    the process group has stopped (what matters is saved, and the output flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
