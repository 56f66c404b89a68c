"""RLlib's side of a run: the algorithm config classes and learners an agent configuration
names, found in registries, and the ``AlgorithmConfig`` built from a checked agent
configuration (new API stack, torch).

This module imports Ray and torch: :mod:`looprl.train.run` imports it only once everything
is checked and a run is about to start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.impala import IMPALAConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.env_to_module import FlattenObservations
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.tune.registry import register_env

from looprl.train.callbacks import ApexCallbacks, LoopNestCallbacks
from looprl.train.config import RLLIB_ENV_NAME, env_config, make_env
from looprl.train.dqfd import DQfDTorchLearner
from looprl.train.schema import LOSS_SETTINGS, section_settings

# RLlib's config class for each of the schema's algorithm names (schema.RLLIB_ALGORITHMS).
ALGORITHM_CONFIGS: dict[str, type] = {"dqn": DQNConfig, "ppo": PPOConfig, "impala": IMPALAConfig, "appo": APPOConfig}
# Learners that replace the algorithm's own, by the agent section that asks for one (the
# schema allows each section only with an algorithm whose learner the replacement extends).
SECTION_LEARNERS: dict[str, type] = {"demonstrations": DQfDTorchLearner}
DEFAULT_ENV_RUNNERS = {
    "num_env_runners": 1,
    "rollout_fragment_length": 20,  # "auto" means n_step for DQN: hundreds of tiny sample rounds
}


def build_config(agent: dict[str, Any], *, seed: int, num_env_runners: int | None = None, demonstrations: Path | None = None):
    """The RLlib ``AlgorithmConfig`` for a checked agent configuration. ``demonstrations``:
    the run's demonstrations file, for an agent with that section."""
    register_env(RLLIB_ENV_NAME, make_env)  # stored in the cluster, found by every env runner
    env_runners = {**DEFAULT_ENV_RUNNERS, **agent.get("env_runners", {})}
    if num_env_runners is not None:
        env_runners["num_env_runners"] = num_env_runners
    config = (
        ALGORITHM_CONFIGS[agent["algorithm"]]()
        .framework("torch")
        .environment(RLLIB_ENV_NAME, env_config=env_config(agent))
        .env_runners(
            # The observation is (max_loops, 20); the default MLP encoder wants a flat vector.
            env_to_module_connector=lambda env, spaces=None, device=None: FlattenObservations(),
            **env_runners,
        )
        .learners(**agent.get("learners", {}))
        .rl_module(model_config=DefaultModelConfig(**agent.get("model", {})))
        .training(**agent.get("training", {}))
        .reporting(**agent.get("reporting", {}))
        .callbacks(ApexCallbacks if agent.get("apex") else LoopNestCallbacks)
        .debugging(seed=seed)
    )
    if agent.get("apex"):
        config = config.training(epsilon=[[0, 0.4], [1, 0.4]])  # each runner replaces it (callbacks)
    if agent.get("demonstrations"):
        if demonstrations is None:
            raise ValueError("the agent has a 'demonstrations' section but the run has no demonstrations file")
        settings = section_settings(agent, "demonstrations")
        inputs = {**{name: settings[name] for name in LOSS_SETTINGS}, "path": str(demonstrations), "seed": seed}
        config = config.learners(learner_class=SECTION_LEARNERS["demonstrations"], learner_config_dict={"demonstrations": inputs})
    return config
