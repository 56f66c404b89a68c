"""Agent configurations: YAML files under ``agents/``, read and checked, and what training
derives from them (the env's arguments, target and actions).

A file's sections and every key's rule are :mod:`looprl.train.schema`'s; the RLlib
``AlgorithmConfig`` built from a configuration is :mod:`looprl.train.learners`' (the only
part that imports Ray). Everything here is plain data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from looprl import defaults
from looprl.actions import ActionSet
from looprl.env.loopnest_env import LoopNestEnv
from looprl.resources import shipped_path
from looprl.target import Target
from looprl.train.schema import section_settings, validate_agent

ALGORITHMS = ("apex-dqn", "dqn", "ppo", "impala", "appo")  # the shipped agents/<name>.yaml
RLLIB_ENV_NAME = "looprl-LoopNest"


def load_agent(algo: str, path: str | Path | None = None) -> dict[str, Any]:
    """The agent configuration for ``algo`` from ``path`` or ``agents/<algo>.yaml``, checked."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; expected one of {', '.join(ALGORITHMS)}")
    path = Path(path) if path is not None else shipped_path("agents", f"{algo}.yaml")
    if not path.exists():
        raise ValueError(f"agent configuration {path} not found (pass --config PATH)")
    return read_agent(path)


def read_agent(path: str | Path) -> dict[str, Any]:
    """The agent configuration in the YAML file ``path``, checked against the schema; a
    ValueError naming the file (and the key) otherwise."""
    import yaml  # the [train] extra: imported here so that the command line's help and evaluation need none of it

    path = Path(path)
    try:
        agent = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"cannot read agent configuration {path}: {error}") from None
    return validate_agent(agent, str(path))


def agent_measure_budget_s(agent: dict[str, Any]) -> float:
    """The timing budget per new state of an agent configuration's env (its
    ``env.measure_budget_s``, else LoopNest-v0's default): what its validation and
    demonstrations measure with, so that they share the env's cache key."""
    return agent.get("env", {}).get("measure_budget_s", defaults.ENV_STATE_BUDGET_S)


def agent_target(agent: dict[str, Any]) -> Target:
    """The :class:`~looprl.Target` an agent configuration's env generates code for (its
    ``env.target`` name; none: this host)."""
    return Target.resolve(agent.get("env", {}).get("target"))


def agent_actions(agent: dict[str, Any], target: Target | None = None) -> ActionSet:
    """The env's action set an agent configuration trains with (env defaults filled in), for
    ``target`` (default: :func:`agent_target`)."""
    env = agent.get("env", {})
    return ActionSet.for_target(target if target is not None else agent_target(agent), env.get("split_factors", defaults.SPLIT_FACTORS),
                                env.get("max_loops", defaults.MAX_LOOPS), layouts=bool(env.get("layouts", False)),
                                parallel=env.get("threads", 1) > 1, plans=env.get("plans", False))


def hidden_layers(agent: dict[str, Any]) -> list[int]:
    """The widths of the agent network's hidden layers (``model.fcnet_hiddens``)."""
    return list(section_settings(agent, "model")["fcnet_hiddens"])


def make_env(env_context) -> LoopNestEnv:
    """RLlib's env creator: it passes the env config as one mapping."""
    return LoopNestEnv(**dict(env_context))


def env_config(agent: dict[str, Any]) -> dict[str, Any]:
    """The ``LoopNestEnv`` arguments of an agent configuration, as every env runner gets them."""
    config = dict(agent.get("env", {}))
    config.setdefault("observation", defaults.TRAINING_OBSERVATION)
    return config


def check_env(agent: dict[str, Any], where: str = "agent configuration") -> None:
    """Build the agent's env once in this process, as each env runner will, so that what the
    schema cannot see (a problem that is not one, a dataset that does not exist, more threads
    than cores) is a ValueError naming it here, before a run folder or Ray exists, instead of
    an env runner's traceback. With no ``peak`` in the settings this measures the target's
    peak (cached), which the runners reuse."""
    try:
        LoopNestEnv(**env_config(agent)).close()
    except ValueError as error:
        raise ValueError(f"{where}: section 'env': {error}") from None
