"""Agent configurations: YAML files under ``agents/`` -> RLlib ``AlgorithmConfig``.

A file has the sections ``algorithm`` (dqn, ppo, impala or appo), ``apex`` (DQN only: one
fixed epsilon per env runner), ``env`` (``LoopNestEnv`` arguments), ``model``
(``DefaultModelConfig`` fields), ``env_runners``, ``learners``, ``training`` and
``reporting`` (passed to the config methods of the same name), ``run`` (``iterations``,
``checkpoint_every``, ``validate_every``, ``validation_problems``) and, optionally,
``pretrain`` (start from a policy cloned from measured demonstrations:
:mod:`looprl.train.demonstrations`) and ``demonstrations`` (DQN only: demonstrations found by
measured search that stay with the learner under DQfD's large-margin loss,
:mod:`looprl.train.dqfd`). Everything here is plain data until :func:`build_config`, which
is the only function that imports Ray.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from looprl import defaults
from looprl.resources import shipped_path

ALGORITHMS = ("apex-dqn", "dqn", "ppo", "impala", "appo")
_RLLIB_ALGORITHMS = ("dqn", "ppo", "impala", "appo")
_SECTIONS = {"algorithm", "apex", "env", "model", "env_runners", "learners", "training", "reporting", "run", "pretrain", "demonstrations"}


def load_agent(algo: str, path: str | Path | None = None) -> dict[str, Any]:
    """The agent configuration for ``algo`` from ``path`` or ``agents/<algo>.yaml``."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; expected one of {', '.join(ALGORITHMS)}")
    path = Path(path) if path is not None else shipped_path("agents", f"{algo}.yaml")
    if not path.exists():
        raise ValueError(f"agent configuration {path} not found (pass --config PATH)")
    import yaml  # the [train] extra: imported here so that the command line's help needs none of it

    try:
        agent = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read agent configuration {path}: {error}") from error
    return validate_agent(agent, str(path))


def validate_agent(agent: Any, where: str = "agent configuration") -> dict[str, Any]:
    if not isinstance(agent, dict):
        raise ValueError(f"{where}: expected a mapping of sections")
    unknown = set(agent) - _SECTIONS
    if unknown:
        raise ValueError(f"{where}: unknown sections {sorted(unknown)}; expected {sorted(_SECTIONS)}")
    if agent.get("algorithm") not in _RLLIB_ALGORITHMS:
        raise ValueError(f"{where}: 'algorithm' must be one of {', '.join(_RLLIB_ALGORITHMS)}")
    if agent.get("apex") and agent["algorithm"] != "dqn":
        raise ValueError(f"{where}: 'apex: true' needs algorithm dqn")
    if agent.get("demonstrations") and agent["algorithm"] != "dqn":
        raise ValueError(f"{where}: a 'demonstrations' section needs algorithm dqn (its margin loss acts on Q-values)")
    for section in _SECTIONS - {"algorithm", "apex"}:
        if not isinstance(agent.get(section, {}), dict):
            raise ValueError(f"{where}: section {section!r} must be a mapping")
    return copy.deepcopy(agent)


def agent_measure_budget_s(agent: dict[str, Any]) -> float:
    """The timing budget per new state of an agent configuration's env (its
    ``env.measure_budget_s``, else LoopNest-v0's default): what its validation and
    demonstrations measure with, so that they share the env's cache key."""
    return agent.get("env", {}).get("measure_budget_s", defaults.ENV_STATE_BUDGET_S)


def agent_target(agent: dict[str, Any]):
    """The :class:`~looprl.Target` an agent configuration's env generates code for (its
    ``env.target`` name; none: this host)."""
    from looprl.target import Target

    return Target.resolve(agent.get("env", {}).get("target"))


def agent_actions(agent: dict[str, Any], target=None):
    """The env's action set an agent configuration trains with (env defaults filled in), for
    ``target`` (default: :func:`agent_target`)."""
    from looprl.actions import ActionSet

    env = agent.get("env", {})
    return ActionSet.for_target(target if target is not None else agent_target(agent), env.get("split_factors", defaults.SPLIT_FACTORS),
                                env.get("max_loops", defaults.MAX_LOOPS), layouts=bool(env.get("layouts", False)),
                                parallel=env.get("threads", 1) > 1)


RLLIB_ENV_NAME = "looprl-LoopNest"


def make_env(env_context):
    """RLlib's env creator: it passes the env config as one mapping."""
    from looprl.env.loopnest_env import LoopNestEnv

    return LoopNestEnv(**dict(env_context))


def env_config(agent: dict[str, Any]) -> dict[str, Any]:
    """The ``LoopNestEnv`` arguments of an agent configuration, as every env runner gets them."""
    config = dict(agent.get("env", {}))
    config.setdefault("observation", defaults.TRAINING_OBSERVATION)
    return config


def check_env(agent: dict[str, Any], where: str = "agent configuration") -> None:
    """Build the agent's env once in this process, as each env runner will, so that a bad
    setting (``episode_length: -3``, a problem that is not one) is a ValueError naming it
    here, before a run folder or Ray exists, instead of an env runner's traceback. With no
    ``peak`` in the settings this measures the target's peak (cached), which the runners reuse."""
    import inspect

    from looprl.env.loopnest_env import LoopNestEnv

    config = env_config(agent)
    unknown = sorted(set(config) - set(inspect.signature(LoopNestEnv).parameters))
    if unknown:
        raise ValueError(f"{where}: section 'env': unknown settings {unknown}")
    try:
        LoopNestEnv(**config).close()
    except ValueError as error:
        raise ValueError(f"{where}: section 'env': {error}") from None


def build_config(agent: dict[str, Any], *, seed: int, num_env_runners: int | None = None, demonstrations=None):
    """The RLlib ``AlgorithmConfig`` for an agent configuration (new API stack, torch).
    ``demonstrations``: the run's demonstrations file, for an agent with that section."""
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    from looprl.train.callbacks import ApexCallbacks, LoopNestCallbacks

    register_env(RLLIB_ENV_NAME, make_env)  # stored in the cluster, found by every env runner
    classes = _config_classes()
    algorithm = agent["algorithm"]
    config = classes[algorithm]()
    env_runners = dict(agent.get("env_runners", {}))
    if num_env_runners is not None:
        env_runners["num_env_runners"] = num_env_runners
    env_runners.setdefault("num_env_runners", 1)
    env_runners.setdefault("rollout_fragment_length", 20)  # "auto" means n_step for DQN: tiny rounds
    config = (
        config.framework("torch")
        .environment(RLLIB_ENV_NAME, env_config=env_config(agent))
        .env_runners(
            # The observation is (max_loops, 20); the default MLP encoder wants a flat vector.
            env_to_module_connector=lambda env, spaces=None, device=None: FlattenObservations(),
            **env_runners,
        )
        .learners(**agent.get("learners", {}))
        .rl_module(model_config=DefaultModelConfig(**agent.get("model", {})))
        .training(**_training_kwargs(agent))
        .reporting(**agent.get("reporting", {}))
        .callbacks(ApexCallbacks if agent.get("apex") else LoopNestCallbacks)
        .debugging(seed=seed)
    )
    if agent.get("apex"):
        config = config.training(epsilon=[[0, 0.4], [1, 0.4]])  # each runner replaces it (callbacks)
    if agent.get("demonstrations"):
        if demonstrations is None:
            raise ValueError("the agent has a 'demonstrations' section but the run has no demonstrations file")
        from looprl.train.dqfd import DQfDTorchLearner
        from looprl.train.expert_iteration import loss_settings

        settings = {**loss_settings(agent["demonstrations"]), "path": str(demonstrations), "seed": seed}
        config = config.learners(learner_class=DQfDTorchLearner, learner_config_dict={"demonstrations": settings})
    return config


def _training_kwargs(agent: dict[str, Any]) -> dict[str, Any]:
    training = dict(agent.get("training", {}))
    if "epsilon" in training:
        training["epsilon"] = [list(point) for point in training["epsilon"]]
    return training


def _config_classes() -> dict[str, type]:
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    return {"dqn": DQNConfig, "ppo": PPOConfig, "impala": IMPALAConfig, "appo": APPOConfig}
