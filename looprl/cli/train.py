"""``looprl-train`` (or ``python -m looprl train``): train an RLlib agent on LoopNest-v0, or evaluate a policy.

    looprl-train --algo apex-dqn --time-budget 1h --out checkpoints/apex-dqn
    looprl-train --resume --out checkpoints/apex-dqn --time-budget 2h
    looprl-train --layouts --init-from checkpoints/apex-dqn --time-budget 40m --out runs/layouts
    looprl-train --evaluate checkpoints/apex-dqn --split test --numpy

Hyperparameters come from ``agents/<algo>.yaml`` (or ``--config``); flags override them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from looprl import defaults
from looprl.backend.threads import check_threads
from looprl.cli.common import EXIT_INTERRUPTED, cache_path, one_line, run_command, writable_file, writable_folder
from looprl.workloads.datasets import SPLITS, dataset_problems
from looprl.interrupts import terminate_as_interrupt
from looprl.measurement.evaluator import Evaluator
from looprl.target import TARGET_CHOICES, Target
from looprl.train.config import ALGORITHMS
from looprl.train.extra import require_training_extra
from looprl.train.loop import parse_duration

ADDRESS_TIMEOUT_S = 5.0
RAY_STOP_WAIT_S = 10.0


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
    return run_command("looprl-train", lambda: _interruptible(args))


def _interruptible(args) -> int:
    """The command, with SIGTERM handled as Ctrl-C: what was done is saved and the exit status is 130."""
    try:
        with terminate_as_interrupt():
            return _evaluate(args) if args.evaluate is not None else _train(args)
    except KeyboardInterrupt:
        print("looprl-train: interrupted", file=sys.stderr, flush=True)
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():  # stopped while Ray started
            _shutdown_ray(quickly=True)
            _exit_now(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED


def _evaluate(args) -> int:
    from looprl.train.evaluate import evaluate, resolve_policy

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


def _policy_target_or_host(policy):
    """The target a policy was trained for, or this machine's when it cannot run that code
    (an AVX-512 policy on an AVX2 host): the policy then acts on the host's kernels, with a warning."""
    made_for = policy.target
    if made_for is None or not made_for.missing_on_host():
        return made_for
    host = Target.host()
    print(f"looprl-train: warning: the policy was trained for {made_for.isa}, which this CPU cannot run "
          f"(it lacks {', '.join(made_for.missing_on_host())}); evaluating it on this machine's target {host.isa} "
          f"(--target chooses another)", file=sys.stderr, flush=True)
    return host


def _check_numbers(args) -> float | None:
    """The numeric flags checked; returns the time budget in seconds (None: none)."""
    for flag, value, least in (("--iterations", args.iterations, 1), ("--env-steps", args.env_steps, 1),
                               ("--checkpoint-every", args.checkpoint_every, 1), ("--validate-every", args.validate_every, 0),
                               ("--validation-problems", args.validation_problems, 1), ("--num-env-runners", args.num_env_runners, 0)):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be {'positive' if least else '>= 0'}, got {value}")
    if args.time_budget is None:
        return None
    try:
        return parse_duration(args.time_budget)
    except ValueError as error:
        raise ValueError(f"--time-budget: {error}") from None


def _train(args) -> int:
    time_budget_s = _check_numbers(args)
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
    from looprl.train.config import agent_target, check_env, load_agent, validate_agent
    from looprl.train.loop import DEMONSTRATIONS_FILE, PRETRAINED_POLICY, RunDirectory, RunState

    cache_path(args.cache)
    writable_folder(args.out, "--out")
    # Everything is checked before the run folder is written: a start refused for bad input leaves nothing behind.
    if args.resume:
        run = RunDirectory(args.out)
        if not run.exists():
            raise ValueError(f"nothing to resume in {args.out}")
        agent, state, arguments = run.load()
        agent = validate_agent(agent, str(run.agent_path))
        starting = state.checkpoint is None  # its start failed or was interrupted: start it again
        if starting:
            state = RunState()
            if arguments.get("init_from") == str(run.path / PRETRAINED_POLICY):
                arguments.pop("init_from")  # cloned again below
    else:
        agent = load_agent(args.algo, args.config)
        if args.problems is not None:
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
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run = RunDirectory(args.out if args.out is not None else Path("runs") / f"{args.algo}__s{args.seed}__{stamp}")
        if run.checkpointed():
            raise ValueError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
        arguments = {"algo": args.algo, "seed": args.seed, "num_env_runners": args.num_env_runners,
                     "config": str(args.config) if args.config is not None else f"agents/{args.algo}.yaml"}
        if args.init_from is not None:
            arguments["init_from"] = str(args.init_from)
        state, starting = RunState(), True
    where = str(run.agent_path if args.resume else (args.config or f"agents/{args.algo}.yaml"))
    agent_target(agent).check_runs_on_host()
    check_env(agent, where)
    settings = _run_settings(args, agent)
    if agent.get("demonstrations"):
        from looprl.train import expert_iteration

        try:
            expert_iteration.settings(agent)  # checked before minutes of demonstrations
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    validator = _validator(agent, settings["validation_count"]) if settings["validate_every"] else None
    initial_policy = None
    if starting and arguments.get("init_from"):
        from looprl.train.evaluate import resolve_policy
        from looprl.train.warm_start import check_compatible

        initial_policy = resolve_policy(arguments["init_from"])
        check_compatible(initial_policy, agent, arguments["init_from"])
    num_env_runners = args.num_env_runners if args.num_env_runners is not None else arguments.get("num_env_runners")
    address = _reachable(args.address) if args.address else None

    if starting:
        if args.resume:
            print(f"{run.path} holds no checkpoint (its start did not get that far): starting it again", flush=True)
        run.discard_unstarted()
        if initial_policy is None and agent.get("pretrain"):
            from looprl.train.demonstrations import pretrain_policy

            initial_policy = pretrain_policy(agent, seed=arguments["seed"], log=lambda line: print(line, flush=True))
            initial_policy.save(run.path / PRETRAINED_POLICY)
            arguments["init_from"] = str(run.path / PRETRAINED_POLICY)
        elif initial_policy is not None:
            initial_policy.save(run.path / PRETRAINED_POLICY)  # the run folder holds the policy it started from
        if agent.get("demonstrations"):
            from looprl.train import expert_iteration

            expert_iteration.gather_round(agent, run.path, initial_policy, arguments["seed"], log=lambda line: print(line, flush=True))
        run.create(agent, arguments)
    else:
        run.trim_metrics(state.iteration)
    demonstrations = run.path / DEMONSTRATIONS_FILE if agent.get("demonstrations") else None
    algo = _start(agent, arguments["seed"], num_env_runners, address, demonstrations)
    try:
        return _run(args, algo, run, state, agent, arguments, settings, time_budget_s, validator, initial_policy, starting)
    except KeyboardInterrupt:
        # The final checkpoint is saved; Ray's own processes may have had the signal too
        # (SIGTERM to the process group, Ctrl-C in a terminal): do not wait for them.
        _stop(algo, quickly=True)
        where = f"resume with --resume --out {run.path}" if run.checkpointed() else f"start it again with --out {run.path}"
        print(f"looprl-train: interrupted; {where}", file=sys.stderr, flush=True)
        _exit_now(EXIT_INTERRUPTED)
    finally:
        _stop(algo, quickly=False)


def _run_settings(args, agent: dict) -> dict:
    """Iterations, checkpoint and validation intervals: the flags, else the agent's ``run`` section."""
    section = agent.get("run", {})
    limited = args.time_budget is not None or args.env_steps is not None
    settings = {
        "iterations": args.iterations if args.iterations is not None else (None if limited else section.get("iterations", 100)),
        "checkpoint_every": args.checkpoint_every or section.get("checkpoint_every", 5),
        "validate_every": args.validate_every if args.validate_every is not None else section.get("validate_every", 25),
        "validation_count": args.validation_problems if args.validation_problems is not None else section.get("validation_problems", 64),
    }
    for name, least in (("iterations", 1), ("checkpoint_every", 1), ("validate_every", 0), ("validation_count", 1)):
        value = settings[name]
        if value is None and name == "iterations":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            key = "validation_problems" if name == "validation_count" else name
            raise ValueError(f"run.{key} must be an integer >= {least}, got {value!r}")
    return settings


def _run(args, algo, run, state, agent, arguments, settings, time_budget_s, validator, initial_policy, starting) -> int:
    from looprl.train.export import export_policy, policy_from_module
    from looprl.train.loop import BEST_POLICY, train

    if not starting:
        run.restore(algo, state)
        buffer = getattr(algo, "local_replay_buffer", None)
        held = f"; replay buffer: {buffer.get_num_timesteps()} timesteps" if buffer is not None else ""
        print(f"resumed {run.path} at iteration {state.iteration} ({state.env_steps} env steps{held})", flush=True)
    elif initial_policy is not None:
        from looprl.train.warm_start import warm_start

        copied = warm_start(algo, initial_policy)
        print(f"training {arguments['algo']} into {run.path}, starting from {arguments['init_from']} ({copied} weight arrays)", flush=True)
    else:
        print(f"training {arguments['algo']} into {run.path}", flush=True)

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

    if validator is not None and initial_policy is not None and starting:
        # The starting policy competes too: RL keeps it unless a later snapshot validates better.
        score = validator(initial_policy)
        if score > run.best_validation():
            validation = {"speedup_geomean": score, "iteration": 0, "env_steps": 0, "policy": "the starting policy"}
            dataclasses.replace(initial_policy, metadata={**initial_policy.metadata, "validation": validation}).save(run.path / BEST_POLICY)
        arguments["start_validation"] = round(score, 4)  # the level a learning curve is drawn against
        run.save_state(state, arguments)
        print(f"  validation of the starting policy: greedy speed-up {score:.3f}x (geomean)", flush=True)

    from looprl.train import expert_iteration

    rounds, round_iterations = expert_iteration.rounds(agent)
    for round_number in range(arguments.get("demonstration_round", 1), rounds + 1):
        last = round_number == rounds
        until = settings["iterations"] if last else round_iterations * round_number
        if not last and settings["iterations"] is not None:
            until = min(until, settings["iterations"])
        train(algo, run, state, arguments, iterations=until, time_budget_s=time_budget_s,
              checkpoint_every=settings["checkpoint_every"], export=export, env_steps=args.env_steps,
              validate=validate if validator else None, validate_every=settings["validate_every"])
        if last or state.iteration < round_iterations * round_number:
            break  # the run's own limit came first
        # Expert iteration's next round: the best policy so far searches, its finds are the new demonstrations.
        print(f"round {round_number + 1} of expert iteration: demonstrations from the best validated policy's measured search",
              flush=True)
        expert_iteration.gather_round(agent, run.path, expert_iteration.expert(run.path), arguments["seed"], round_number + 1,
                                      log=lambda line: print(line, flush=True))
        algo.learner_group.foreach_learner(lambda learner: learner.reload_demonstrations())
        arguments["demonstration_round"] = round_number + 1
        run.save_state(state, arguments)
    best = run.best_validation()
    kept = f"; best validated policy ({best:.3f}x) in {run.path / BEST_POLICY}" if best > 0 else ""
    print(f"done: {state.iteration} iterations, {state.env_steps} env steps; newest policy in {run.path / 'policy'}{kept}")
    return 0


def _validator(agent: dict, count: int):
    """Greedy validation on ``count`` of the agent's training problems (as many from each
    training dataset), measured like the env."""
    from looprl.train.config import agent_measure_budget_s
    from looprl.train.validation import Validator, spread_over_datasets, training_groups

    env = agent.get("env", {})
    problems = spread_over_datasets(agent, -(-count // len(training_groups(agent))))
    evaluator = Evaluator(env.get("cache"), agent_measure_budget_s(agent), target=env.get("target"),
                          threads=env.get("threads", 1))
    return Validator(problems, evaluator)


def _reachable(address: str) -> str:
    """``address`` if a Ray head node answers there (``auto`` and ``ray://`` addresses are left
    to Ray): an unreachable cluster is a one-line error at once, not Ray's traceback after its retries."""
    if address == "auto" or "://" in address:
        return address
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: expected HOST:PORT, the Ray head node's GCS port (usually 6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_TIMEOUT_S):
            pass
    except OSError as error:
        raise ValueError(f"--address {address}: no Ray cluster answers there ({error.strerror or error})") from None
    return address


def _start(agent: dict, seed: int, num_env_runners: int | None, address: str | None, demonstrations=None):
    """Start (or attach to) Ray and build the algorithm."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import torch

    torch.set_num_threads(1)  # on 2 cores torch's own threads make iterations swing wildly
    import ray

    from looprl.train.config import build_config

    # The processes Ray starts (GCS, raylet, their workers) inherit this thread's signal mask:
    # with SIGTERM blocked they outlive a SIGTERM to the process group (a scheduler stopping the
    # job), so this process can save its final checkpoint and then stop them itself. (Ray blocks
    # SIGINT in them for the same reason.)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        if address:
            ray.init(address=address, include_dashboard=False)
        else:
            ray.init(include_dashboard=False, configure_logging=True, logging_level="warning")
    except ConnectionError as error:
        raise ValueError(f"--address {address}: cannot attach to the Ray cluster: {one_line(error)}") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        return build_config(agent, seed=seed, num_env_runners=num_env_runners, demonstrations=demonstrations).build_algo()
    except BaseException:
        _shutdown_ray(quickly=True)
        raise


def _stop(algo, quickly: bool) -> None:
    """Stop the algorithm and Ray (once; bounded in time when ``quickly``)."""
    if getattr(algo, "_looprl_stopped", False):
        return
    algo._looprl_stopped = True
    if quickly:
        _bounded(algo.stop, RAY_STOP_WAIT_S)
    else:
        algo.stop()
    _shutdown_ray(quickly)


def _shutdown_ray(quickly: bool) -> None:
    import ray

    if quickly:
        _bounded(ray.shutdown, RAY_STOP_WAIT_S)
    else:
        ray.shutdown()


def _bounded(function, seconds: float) -> bool:
    """Run ``function`` for at most ``seconds`` (in a daemon thread); whether it finished.
    After SIGTERM to the process group Ray's GCS is gone and Ray would retry for a minute."""
    worker = threading.Thread(target=function, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def _exit_now(status: int) -> None:
    """Exit with ``status`` without Ray's exit handlers, which wait for a GCS that a signal to
    the process group has stopped (what matters is saved, and the output flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
