"""``python -m looprl.train``: train an RLlib agent on LoopNest-v0, or evaluate a policy.

    python -m looprl.train --algo apex-dqn --time-budget 1h --out checkpoints/apex-dqn
    python -m looprl.train --resume --out checkpoints/apex-dqn --time-budget 2h
    python -m looprl.train --layouts --init-from checkpoints/apex-dqn --time-budget 40m --out runs/layouts
    python -m looprl.train --evaluate checkpoints/apex-dqn --split test --numpy

Hyperparameters come from ``agents/<algo>.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
from pathlib import Path

from looprl import defaults
from looprl.backend.threads import check_threads
from looprl.cli.common import cache_path, run_command, writable_file, writable_folder
from looprl.workloads.datasets import SPLITS, dataset_problems
from looprl.measurement.evaluator import Evaluator
from looprl.target import TARGET_CHOICES, Target
from looprl.train.config import ALGORITHMS, load_agent, validate_agent
from looprl.train.loop import BEST_POLICY, RunDirectory, RunState, parse_duration, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m looprl.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=ALGORITHMS, default="apex-dqn")
    parser.add_argument("--config", type=Path, default=None, help="agent YAML (default agents/<algo>.yaml)")
    parser.add_argument("--iterations", type=int, default=None, help="total training iterations (default: the YAML's run.iterations)")
    parser.add_argument("--time-budget", default=None, help="total training time, e.g. 45m or 2h")
    parser.add_argument("--env-steps", type=int, default=None, help="total env steps to sample")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/<algo>__s<seed>__<time>)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
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
    args = build_parser().parse_args(argv)
    return run_command("looprl-train", lambda: _evaluate(args) if args.evaluate is not None else _train(args))


def _evaluate(args) -> int:
    from looprl.train.evaluate import evaluate, resolve_policy

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    writable_file(args.csv, "--csv")
    cache = cache_path(args.cache)
    policy = resolve_policy(args.evaluate)
    problems = dataset_problems(args.dataset, args.split)
    if args.limit is not None:
        problems = problems[: args.limit]
    try:
        target = args.target if args.target is not None else policy.target
        threads = args.threads if args.threads is not None else policy.metadata.get("threads", 1)
        evaluate(policy, problems, Evaluator(cache, target=target, threads=threads), use_mask=args.mask, numpy=args.numpy, csv_path=args.csv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def _train(args) -> int:
    if args.iterations is not None and args.iterations < 1:
        raise ValueError(f"--iterations must be positive, got {args.iterations}")
    time_budget_s = parse_duration(args.time_budget) if args.time_budget is not None else None
    if args.env_steps is not None and args.env_steps < 1:
        raise ValueError(f"--env-steps must be positive, got {args.env_steps}")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be positive, got {args.checkpoint_every}")
    if args.validate_every is not None and args.validate_every < 0:
        raise ValueError(f"--validate-every must be >= 0, got {args.validate_every}")
    if args.validation_problems is not None and args.validation_problems < 1:
        raise ValueError(f"--validation-problems must be positive, got {args.validation_problems}")
    if args.num_env_runners is not None and args.num_env_runners < 0:
        raise ValueError(f"--num-env-runners must be >= 0, got {args.num_env_runners}")

    if args.resume and args.init_from is not None:
        raise ValueError("--init-from starts a new run; it cannot be combined with --resume")
    if args.resume and args.layouts:
        raise ValueError("--layouts chooses a new run's actions; a resumed run keeps its own")
    if args.resume and args.threads is not None:
        raise ValueError("--threads chooses a new run's actions; a resumed run keeps its own")
    if args.threads is not None:
        check_threads(args.threads, "--threads")
    cache_path(args.cache)
    writable_folder(args.out, "--out")
    if args.resume:
        if args.out is None:
            raise ValueError("--resume needs --out RUN_FOLDER")
        run = RunDirectory(args.out)
        if not run.exists():
            raise ValueError(f"nothing to resume in {args.out}")
        agent, state, arguments = run.load()
        agent = validate_agent(agent, str(run.agent_path))
        if state.checkpoint is None:
            raise ValueError(f"{args.out} has no checkpoint yet; start it again without --resume")
        run.trim_metrics(state.iteration)
    else:
        agent = load_agent(args.algo, args.config)
        if args.problems:
            agent["env"]["problems"] = [p.strip() for p in args.problems.split(",") if p.strip()]
            agent["env"].pop("dataset", None)
            agent["env"].pop("split", None)
        if args.cache is not None:
            agent["env"]["cache"] = args.cache
        if args.target is not None:
            agent["env"]["target"] = args.target
        if args.layouts:
            agent["env"]["layouts"] = True
        if args.threads is not None and args.threads > 1:
            agent["env"]["threads"] = args.threads
        Target.resolve(agent["env"].get("target")).check_runs_on_host()
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run = RunDirectory(args.out if args.out is not None else Path("runs") / f"{args.algo}__s{args.seed}__{stamp}")
        if run.exists():
            raise ValueError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
        arguments = {"algo": args.algo, "seed": args.seed, "num_env_runners": args.num_env_runners}
        if args.init_from is not None:
            from looprl.train.evaluate import resolve_policy
            from looprl.train.warm_start import check_compatible

            initial_policy = resolve_policy(args.init_from)
            check_compatible(initial_policy, agent, str(args.init_from))
            arguments["init_from"] = str(args.init_from)
        elif agent.get("pretrain"):
            from looprl.train.demonstrations import pretrain_policy

            initial_policy = pretrain_policy(agent, seed=args.seed, log=lambda line: print(line, flush=True))
            initial_policy.save(run.path / "pretrained")
            args.init_from = run.path / "pretrained"
            arguments["init_from"] = str(args.init_from)
        run.create(agent, arguments)
        state = RunState()
    limited = time_budget_s is not None or args.env_steps is not None
    iterations = args.iterations if args.iterations is not None else (None if limited else agent.get("run", {}).get("iterations", 100))
    checkpoint_every = args.checkpoint_every or agent.get("run", {}).get("checkpoint_every", 5)
    validate_every = args.validate_every if args.validate_every is not None else agent.get("run", {}).get("validate_every", 25)
    validation_count = args.validation_problems if args.validation_problems is not None else agent.get("run", {}).get("validation_problems", 64)
    if not isinstance(validate_every, int) or validate_every < 0:
        raise ValueError(f"run.validate_every must be an integer >= 0, got {validate_every!r}")
    validator = _validator(agent, validation_count) if validate_every else None
    num_env_runners = args.num_env_runners if args.num_env_runners is not None else arguments.get("num_env_runners")

    algo = _start(agent, arguments["seed"], num_env_runners, args.address)
    if args.resume:
        run.restore(algo, state)
        buffer = getattr(algo, "local_replay_buffer", None)
        held = f"; replay buffer: {buffer.get_num_timesteps()} timesteps" if buffer is not None else ""
        print(f"resumed {run.path} at iteration {state.iteration} ({state.env_steps} env steps{held})", flush=True)
    elif args.init_from is not None:
        from looprl.train.warm_start import warm_start

        copied = warm_start(algo, initial_policy)
        print(f"training {args.algo} into {run.path}, starting from {args.init_from} ({copied} weight arrays)", flush=True)
    else:
        print(f"training {args.algo} into {run.path}", flush=True)

    from looprl.train.export import export_policy, policy_from_module

    def metrics() -> dict:
        extra = {"metrics": {"iteration": state.iteration, "env_steps": state.env_steps, "elapsed_s": round(state.elapsed_s, 1)}}
        if arguments.get("init_from"):
            extra["init_from"] = arguments["init_from"]  # where the weights started
        return extra

    def export(checkpoint: Path) -> None:
        export_policy(checkpoint, run.path / "policy", agent, metrics())

    def validate():
        # The local env runner's module, brought up to the learner's weights.
        algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
        policy = policy_from_module(algo.get_module(), agent, metrics())
        return validator(policy), policy

    if validator is not None and args.init_from is not None and not args.resume:
        # The starting policy competes too: RL keeps it unless a later snapshot validates better.
        score = validator(initial_policy)
        if score > run.best_validation():
            validation = {"speedup_geomean": score, "iteration": 0, "env_steps": 0, "policy": "the starting policy"}
            dataclasses.replace(initial_policy, metadata={**initial_policy.metadata, "validation": validation}).save(run.path / BEST_POLICY)
        print(f"  validation of the starting policy: greedy speed-up {score:.3f}x (geomean)", flush=True)
    try:
        train(algo, run, state, arguments, iterations=iterations, time_budget_s=time_budget_s, checkpoint_every=checkpoint_every,
              export=export, env_steps=args.env_steps, validate=validate if validator else None, validate_every=validate_every)
    finally:
        algo.stop()
    best = run.best_validation()
    kept = f"; best validated policy ({best:.3f}x) in {run.path / 'policy-best'}" if best > 0 else ""
    print(f"done: {state.iteration} iterations, {state.env_steps} env steps; newest policy in {run.path / 'policy'}{kept}")
    return 0


def _validator(agent: dict, count: int):
    """Greedy validation on ``count`` of the agent's training problems, measured like the env."""
    from looprl.workloads.datasets import env_problems
    from looprl.train.validation import Validator, spread

    env = agent.get("env", {})
    problems = env_problems(env.get("dataset", defaults.DATASET), env.get("split", "train"), env.get("problems"))
    evaluator = Evaluator(env.get("cache"), env.get("measure_budget_s", defaults.STATE_BUDGET_S), target=env.get("target"),
                          threads=env.get("threads", 1))
    return Validator(spread(problems, count), evaluator)


def _start(agent: dict, seed: int, num_env_runners: int | None, address: str | None):
    """Start (or attach to) Ray and build the algorithm."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    torch.set_num_threads(1)  # on 2 cores torch's own threads make iterations swing wildly
    import ray

    from looprl.measurement.evaluator import open_cache
    from looprl.measurement.peak import peak_gflops
    from looprl.train.config import build_config

    env = agent.get("env", {})
    # measured once, before the env runners start
    peak_gflops(target=env.get("target"), cache=open_cache(env.get("cache")), threads=env.get("threads", 1))
    if address:
        ray.init(address=address, include_dashboard=False)
    else:
        ray.init(include_dashboard=False, configure_logging=True, logging_level="warning")
    return build_config(agent, seed=seed, num_env_runners=num_env_runners).build_algo()


if __name__ == "__main__":
    sys.exit(main())
