"""A training run from start to end, what ``looprl-train`` runs (:mod:`looprl.cli.train`
parses the flags and reports).

:func:`prepare` checks everything a run depends on (the agent configuration against the
schema, the run folder's files when resuming, the env, the starting policy, the Ray address)
and writes nothing; :func:`execute` then attaches to the cluster (``--address``: one that
cannot be reached is refused before anything is written), makes the run folder (the starting
policy, expert iteration's demonstrations, ``agent.yaml``, ``run.json``), starts Ray and the algorithm and
trains until the run's limit, validating and checkpointing on the way. A start refused for
bad input therefore leaves ``--out`` as it was.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.train import cluster, expert_iteration
from looprl.train.config import agent_measure_budget_s, agent_target, check_env, load_agent, validate_agent
from looprl.train.demonstrations import pretrain_policy
from looprl.train.evaluate import CHECKPOINT_POLICY, resolve_policy
from looprl.train.export import export_policy, policy_from_module
from looprl.train.loop import train
from looprl.train.run_folder import BEST_POLICY, DEMONSTRATIONS_FILE, NEWEST_POLICY, PRETRAINED_POLICY, RunDirectory, RunState
from looprl.train.schema import section_settings
from looprl.train.validation import Validator, spread_over_datasets, training_groups
from looprl.train.warm_start import check_compatible, warm_start

ADDRESS_TIMEOUT_S = 5.0
RAY_STOP_WAIT_S = 10.0
Log = Callable[[str], None]


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class TrainOptions:
    """What a run is asked for: the command line's flags, checked by it (None: the agent
    YAML's value, or the default)."""

    algo: str = "apex-dqn"  # agents/<algo>.yaml, unless ``config``
    config: Path | None = None  # the agent YAML
    out: Path | None = None  # the run folder (default runs/<algo>__s<seed>__<time>)
    resume: bool = False  # continue the run in ``out``
    init_from: Path | None = None  # a policy whose weights a new run starts from
    iterations: int | None = None  # total training iterations
    time_budget_s: float | None = None  # total training time
    env_steps: int | None = None  # total env steps
    checkpoint_every: int | None = None
    validate_every: int | None = None  # 0: never
    validation_problems: int | None = None
    num_env_runners: int | None = None
    seed: int = 0
    address: str | None = None  # an existing Ray cluster's head node, HOST:PORT
    problems: tuple[str, ...] | None = None  # instead of the env's dataset
    cache: str | None = None  # the measurement cache
    target: str | None = None  # the env's target
    layouts: bool = False  # add the layout actions
    threads: int | None = None  # threads for parallel loops


@dataclass(frozen=True)
class RunSettings:
    """How long a run trains and how often it checkpoints and validates: the flags, else the
    agent's ``run`` section."""

    iterations: int | None  # None: until the time budget or env steps
    checkpoint_every: int
    validate_every: int
    validation_problems: int


@dataclass(frozen=True)
class RunSpec:
    """A checked run, ready to :func:`execute`."""

    run: RunDirectory
    agent: dict
    state: RunState
    arguments: dict  # what run.json records
    starting: bool  # False: continue from the run's checkpoint
    resumed: bool  # asked for with --resume
    settings: RunSettings
    time_budget_s: float | None
    env_steps: int | None
    validator: Validator | None
    initial_policy: Policy | None  # given (--init-from, or kept in the run folder); a pretrain section's clone is made by execute
    num_env_runners: int | None
    address: str | None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM once Ray was started: the run saved what it had; ``hint`` says how to
    go on. The process should then exit at once (Ray's exit handlers would wait for processes
    the signal stopped)."""

    def __init__(self, hint: str):
        super().__init__(hint)
        self.hint = hint


def prepare(options: TrainOptions, log: Log = _print) -> RunSpec:
    """Check everything a run depends on and write nothing: a ValueError names what is wrong."""
    if options.resume:
        run = RunDirectory(options.out)
        if not run.exists():
            raise ValueError(f"nothing to resume in {options.out}")
        agent, state, arguments = run.load()
        where = str(run.agent_path)
        starting, initial_policy = state.checkpoint is None, None  # no checkpoint: its start failed or was interrupted
        if starting:
            state = RunState()
            if arguments.get("init_from") == str(run.path / PRETRAINED_POLICY):
                arguments.pop("init_from")  # cloned (or taken from pretrain.policy) again
            elif arguments.get("init_from"):
                initial_policy = run.pretrained_policy()  # the copy in the run folder, not what run.json names
        else:
            run.checkpoint_folder(state.checkpoint)  # the run's own checkpoint, checked before anything reads it
    else:
        where = str(options.config or f"agents/{options.algo}.yaml")
        agent = validate_agent(_overridden(load_agent(options.algo, options.config), options), where)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run = RunDirectory(options.out if options.out is not None else Path("runs") / f"{options.algo}__s{options.seed}__{stamp}")
        if run.checkpointed():
            raise ValueError(f"{run.path} already holds a run; pass --resume to continue it or choose another --out")
        arguments = {"algo": options.algo, "seed": options.seed, "num_env_runners": options.num_env_runners, "config": where}
        if options.init_from is not None:
            arguments["init_from"] = str(options.init_from)
        state, starting = RunState(), True
        initial_policy = resolve_policy(options.init_from) if options.init_from is not None else None
    agent_target(agent).check_runs_on_host()
    check_env(agent, where)
    if initial_policy is not None:
        check_compatible(initial_policy, agent, arguments["init_from"])
    settings = run_settings(options, agent)
    address = reachable(options.address) if options.address else None
    return RunSpec(
        run=run, agent=agent, state=state, arguments=arguments, starting=starting, resumed=options.resume, settings=settings,
        time_budget_s=options.time_budget_s, env_steps=options.env_steps,
        validator=validator_for(agent, settings.validation_problems, address) if settings.validate_every else None,
        initial_policy=initial_policy,
        num_env_runners=options.num_env_runners if options.num_env_runners is not None else arguments.get("num_env_runners"),
        address=address,
    )


def _overridden(agent: dict, options: TrainOptions) -> dict:
    """A new run's agent configuration with the flags that change it applied."""
    env = agent.setdefault("env", {})
    if options.problems is not None:
        env["problems"] = list(options.problems)
        env.pop("dataset", None)
        env.pop("split", None)
    if options.cache is not None:
        env["cache"] = options.cache
    if options.target is not None:
        env["target"] = options.target
    if options.layouts:
        env["layouts"] = True
    if options.threads is not None and options.threads > 1:
        env["threads"] = options.threads
    return agent


def run_settings(options: TrainOptions, agent: dict) -> RunSettings:
    """The flags, else the agent's ``run`` section (a time or env-step limit without
    ``--iterations`` trains until that limit)."""
    section = section_settings(agent, "run")
    limited = options.time_budget_s is not None or options.env_steps is not None
    return RunSettings(
        iterations=options.iterations if options.iterations is not None else (None if limited else section["iterations"]),
        checkpoint_every=options.checkpoint_every or section["checkpoint_every"],
        validate_every=options.validate_every if options.validate_every is not None else section["validate_every"],
        validation_problems=options.validation_problems if options.validation_problems is not None else section["validation_problems"],
    )


def validator_for(agent: dict, count: int, address: str | None = None) -> Validator:
    """Greedy validation on ``count`` of the agent's training problems (as many from each
    training dataset), measured like the env (on the cluster's nodes, as Ray tasks, when
    ``address`` names one)."""
    env = agent.get("env", {})
    problems = spread_over_datasets(agent, -(-count // len(training_groups(agent))))
    evaluator = Evaluator(env.get("cache"), agent_measure_budget_s(agent), target=env.get("target"), threads=env.get("threads", 1))
    return Validator(problems, evaluator, address, node_cache=env.get("cache"))


def reachable(address: str) -> str:
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


def execute(plan: RunSpec, log: Log = _print) -> None:
    """Write the run folder, start Ray and train (a checked :class:`RunSpec`). Ctrl-C or SIGTERM
    saves a final checkpoint, stops Ray and raises :class:`RunInterrupted` (before Ray started:
    KeyboardInterrupt)."""
    run, agent, arguments, initial_policy = plan.run, plan.agent, plan.arguments, plan.initial_policy
    keep_ray = ray_running()  # a Ray this process ran before the run (its caller's) is left running after it
    if plan.address:
        start_ray(plan.address)  # attached before anything is written: an unreachable cluster leaves --out as it was
    if plan.starting:
        if plan.resumed:
            log(f"{run.path} holds no checkpoint (its start did not get that far): starting it again")
        run.discard_unstarted()
        tune_expert = section_settings(agent, "pretrain")["expert"] == "tune" and bool(agent.get("pretrain"))
        if initial_policy is None and agent.get("pretrain"):
            # expert: tune writes its demonstrations into the run folder: DQfD's first round
            initial_policy = pretrain_policy(agent, seed=arguments["seed"], log=log, run_path=run.path, address=plan.address)
            arguments["init_from"] = str(run.path / PRETRAINED_POLICY)
        if initial_policy is not None:
            initial_policy.save(run.path / PRETRAINED_POLICY)  # the run folder holds the policy it started from
        if agent.get("demonstrations") and not tune_expert:
            expert_iteration.gather_round(agent, run.path, initial_policy, arguments["seed"], log=log, address=plan.address)
        run.create(agent, arguments)
    else:
        run.trim_metrics(plan.state.iteration)
    demonstrations = run.path / DEMONSTRATIONS_FILE if agent.get("demonstrations") else None
    try:
        algo = start_algorithm(agent, arguments["seed"], plan.num_env_runners, plan.address, demonstrations, keep_ray=keep_ray)
    except KeyboardInterrupt:
        raise RunInterrupted(f"start it again with --out {run.path}") from None
    try:
        _train(plan, algo, initial_policy, log)
    except KeyboardInterrupt:
        # The final checkpoint is saved; Ray's own processes may have had the signal too
        # (SIGTERM to the process group, Ctrl-C in a terminal): do not wait for them.
        stop(algo, quickly=True, keep_ray=keep_ray)
        raise RunInterrupted(f"resume with --resume --out {run.path}" if run.checkpointed() else f"start it again with --out {run.path}") from None
    finally:
        stop(algo, quickly=False, keep_ray=keep_ray)


def _train(plan: RunSpec, algo, initial_policy: Policy | None, log: Log) -> None:
    run, state, agent, arguments, settings = plan.run, plan.state, plan.agent, plan.arguments, plan.settings
    if not plan.starting:
        run.restore(algo, state)
        buffer = getattr(algo, "local_replay_buffer", None)
        held = f"; replay buffer: {buffer.get_num_timesteps()} timesteps" if buffer is not None else ""
        log(f"resumed {run.path} at iteration {state.iteration} ({state.env_steps} env steps{held})")
    elif initial_policy is not None:
        copied = warm_start(algo, initial_policy)
        log(f"training {arguments['algo']} into {run.path}, starting from {arguments['init_from']} ({copied} weight arrays)")
    else:
        log(f"training {arguments['algo']} into {run.path}")

    def metrics() -> dict:
        extra = {"metrics": {"iteration": state.iteration, "env_steps": state.env_steps, "elapsed_s": round(state.elapsed_s, 1)}}
        if arguments.get("init_from"):
            extra["init_from"] = arguments["init_from"]  # where the weights started
        return extra

    def export(checkpoint: Path) -> None:
        # Exported into the checkpoint too: --evaluate and --init-from read a checkpoint only
        # through that export, never RLlib's pickles.
        exported = export_policy(checkpoint, checkpoint / CHECKPOINT_POLICY, agent, metrics())
        Policy.load(exported).save(run.path / NEWEST_POLICY)

    def validate():
        # The local env runner's module, brought up to the learner's weights.
        algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
        policy = policy_from_module(algo.get_module(), agent, metrics())
        return plan.validator(policy), policy

    if plan.validator is not None and initial_policy is not None and plan.starting:
        # The starting policy competes too: RL keeps it unless a later snapshot validates better.
        score = plan.validator(initial_policy)
        if score > run.best_validation():
            validation = {"speedup_geomean": score, "iteration": 0, "env_steps": 0, "policy": "the starting policy"}
            dataclasses.replace(initial_policy, metadata={**initial_policy.metadata, "validation": validation}).save(run.path / BEST_POLICY)
        arguments["start_validation"] = round(score, 4)  # the level a learning curve is drawn against
        run.save_state(state, arguments)
        log(f"  validation of the starting policy: greedy speed-up {score:.3f}x (geomean)")

    rounds, round_iterations = expert_iteration.rounds(agent)
    for round_number in range(arguments.get("demonstration_round", 1), rounds + 1):
        last = round_number == rounds
        until = settings.iterations if last else round_iterations * round_number
        if not last and settings.iterations is not None:
            until = min(until, settings.iterations)
        train(algo, run, state, arguments, iterations=until, time_budget_s=plan.time_budget_s,
              checkpoint_every=settings.checkpoint_every, export=export, env_steps=plan.env_steps,
              validate=validate if plan.validator else None, validate_every=settings.validate_every)
        if last or state.iteration < round_iterations * round_number:
            break  # the run's own limit came first
        # Expert iteration's next round: the best policy so far searches, its finds are the new demonstrations.
        log(f"round {round_number + 1} of expert iteration: demonstrations from the best validated policy's measured search")
        expert_iteration.gather_round(agent, run.path, expert_iteration.expert(run.path), arguments["seed"], round_number + 1, log=log,
                                      address=plan.address)
        algo.learner_group.foreach_learner(lambda learner: learner.reload_demonstrations())
        arguments["demonstration_round"] = round_number + 1
        run.save_state(state, arguments)
    best = run.best_validation()
    kept = f"; best validated policy ({best:.3f}x) in {run.path / BEST_POLICY}" if best > 0 else ""
    if best > 0 and Policy.load(run.path / BEST_POLICY).metadata.get("validation", {}).get("policy") == "the starting policy":
        kept += " (the starting policy: no snapshot validated better)"
    elif best <= 0 and initial_policy is not None:
        kept = (f"; not validated: the newest policy was not compared with the starting one "
                f"({run.path / PRETRAINED_POLICY}), which may be faster")
    log(f"done: {state.iteration} iterations, {state.env_steps} env steps; newest policy in {run.path / NEWEST_POLICY}{kept}")


def start_algorithm(agent: dict, seed: int, num_env_runners: int | None, address: str | None, demonstrations: Path | None = None,
                    keep_ray: bool = False):
    """Start (or attach to) Ray and build the algorithm; if that fails, Ray is stopped again
    unless ``keep_ray`` (a Ray that was running before the run)."""
    start_ray(address)
    # torch and the learners (which import Ray and torch) only now: checking a run needs none of them.
    import torch

    from looprl.train.learners import build_config

    torch.set_num_threads(1)  # on 2 cores torch's own threads make iterations swing wildly
    try:
        return build_config(agent, seed=seed, num_env_runners=num_env_runners, demonstrations=demonstrations).build_algo()
    except BaseException:
        if not keep_ray:
            shutdown_ray(quickly=True)
        raise


def start_ray(address: str | None) -> None:
    """Attach to the Ray cluster at ``address`` (:func:`looprl.train.cluster.attach`), or with
    no address start a Ray of this run's own; nothing when Ray is running already."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        return  # attached already (execute, or gathering demonstrations on the cluster)
    # The processes Ray starts (GCS, raylet, their workers) inherit this thread's signal mask:
    # with SIGTERM blocked they outlive a SIGTERM to the process group (a scheduler stopping the
    # job), so this process can save its final checkpoint and then stop them itself. (Ray blocks
    # SIGINT in them for the same reason.)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        if address:
            cluster.attach(address)
        else:
            # "local": a Ray of its own, never a cluster another process started on this machine
            # (ray.init() alone attaches to the newest one it finds, e.g. a concurrent run's).
            ray.init(address="local", include_dashboard=False, configure_logging=True, logging_level="warning")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def ray_running() -> bool:
    """Whether this process is connected to a Ray (started here or attached to)."""
    ray = sys.modules.get("ray")  # never imported: never started
    return ray is not None and ray.is_initialized()


def stop(algo, quickly: bool, keep_ray: bool = False) -> None:
    """Stop the algorithm and Ray (once; bounded in time when ``quickly``), leaving Ray running
    when ``keep_ray``: a Ray the process ran before the run (a caller that trains several runs,
    or tests sharing one, calling :func:`execute` in its own process)."""
    if getattr(algo, "_looprl_stopped", False):
        return
    algo._looprl_stopped = True
    if quickly:
        _bounded(algo.stop, RAY_STOP_WAIT_S)
    else:
        algo.stop()
    if not keep_ray:
        shutdown_ray(quickly)


def shutdown_ray(quickly: bool) -> bool:
    """Shut Ray down if this process runs one (bounded in time when ``quickly``); whether it had."""
    if not ray_running():
        return False
    import ray

    if quickly:
        _bounded(ray.shutdown, RAY_STOP_WAIT_S)
    else:
        ray.shutdown()
    return True


def _bounded(function, seconds: float) -> bool:
    """Run ``function`` for at most ``seconds`` (in a daemon thread); whether it finished.
    After SIGTERM to the process group Ray's GCS is gone and Ray would retry for a minute."""
    worker = threading.Thread(target=function, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()
