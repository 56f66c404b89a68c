"""Start training from an exported numpy policy instead of random weights (``--init-from``).

An exported policy holds the MLP trunk, the greedy head (DQN: advantages or Q-values;
actor-critics: logits) and, for a dueling DQN, the value head. Those are copied into the
learner's RLModule (and, for DQN, into its target network); layers the policy file does not
hold (policies exported before the value head was, or an actor-critic's value layers) keep
their fresh initialisation. Used to continue a shipped policy's training on another machine,
whose kernels run at other speeds, without its RLlib checkpoint, or with actions added after
its own (a loops-only policy continued with the layout actions).
"""

from __future__ import annotations

import re

import numpy as np

from looprl import defaults
from looprl.env.observation import OBSERVATION_LAYOUT_VERSION
from looprl.policy.numpy_policy import Policy
from looprl.train.config import agent_actions, hidden_layers

# RLModule parameter prefixes of the trunk and the greedy head, per module layout.
_TRUNK_PREFIXES = ("encoder.net.mlp", "encoder.encoder.net.mlp", "encoder.actor_encoder.net.mlp")
_HEAD_PREFIXES = ("af.net.mlp", "pi.net.mlp")
_TARGET = "_target_"


def check_compatible(policy: Policy, agent: dict, where: str) -> None:
    """Raise ValueError naming the mismatch when ``policy`` cannot seed ``agent``'s network."""
    env = agent.get("env", {})
    actions = agent_actions(agent)
    if policy.metadata.get("observation_layout_version") != OBSERVATION_LAYOUT_VERSION:
        raise ValueError(f"{where}: observation layout v{policy.metadata.get('observation_layout_version')}, "
                         f"training uses v{OBSERVATION_LAYOUT_VERSION}")
    if tuple(actions.names[: len(policy.action_names)]) != tuple(policy.action_names):
        raise ValueError(f"{where}: actions {list(policy.action_names)} are not the first of the agent's {list(actions.names)}")
    observation = env.get("observation", defaults.TRAINING_OBSERVATION)
    if policy.metadata.get("observation") != observation:
        raise ValueError(f"{where}: observation {policy.metadata.get('observation')!r}, the agent uses {observation!r}")
    hidden = hidden_layers(agent)
    trunk = [layer.weight.shape[0] for layer in policy.trunk]
    if trunk != hidden:
        raise ValueError(f"{where}: trunk layers {trunk}, the agent's model has fcnet_hiddens {hidden}")


def _linear_layers(weights: dict[str, np.ndarray], prefix: str) -> list[str]:
    """Names (without .weight/.bias) of the Linear layers under ``prefix``, in order."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.weight$")
    found = sorted((int(m.group(1)), name[: -len(".weight")]) for name in weights if (m := pattern.match(name)))
    return [name for _, name in found]


def seeded_weights(weights: dict[str, np.ndarray], policy: Policy) -> tuple[dict[str, np.ndarray], int]:
    """A copy of an RLModule's ``weights`` with the trunk and greedy head taken from ``policy``
    (also in the target network when there is one); returns it and the number of arrays set."""
    trunk_prefix = next((p for p in _TRUNK_PREFIXES if _linear_layers(weights, p)), None)
    head_prefix = next((p for p in _HEAD_PREFIXES if _linear_layers(weights, p)), None)
    if trunk_prefix is None or head_prefix is None:
        raise ValueError("the agent's module has no MLP trunk and greedy head to seed")
    head = policy.heads[policy.metadata["network"]["greedy"]]
    parts = [(trunk_prefix, policy.trunk), (head_prefix, head)]
    if "value" in policy.heads and _linear_layers(weights, "vf.net.mlp"):
        parts.append(("vf.net.mlp", policy.heads["value"]))  # DQN's dueling value head
    seeded, count = dict(weights), 0
    for prefix, layers in parts:
        for copy in (prefix, _TARGET + prefix):
            names = _linear_layers(weights, copy)
            if not names and copy.startswith(_TARGET):
                continue  # no target network (actor-critics)
            if len(names) != len(layers):
                raise ValueError(f"the module has {len(names)} layers under {copy}, the policy {len(layers)}")
            for position, (name, layer) in enumerate(zip(names, layers)):
                for part, array in (("weight", layer.weight), ("bias", layer.bias)):
                    key = f"{name}.{part}"
                    if prefix == head_prefix and position == len(layers) - 1:
                        array = _with_new_actions(array, np.shape(weights[key]), key)
                    if np.shape(weights[key]) != array.shape:
                        raise ValueError(f"{key}: module shape {np.shape(weights[key])}, policy shape {array.shape}")
                    seeded[key] = np.array(array, dtype=np.float32)
                    count += 1
    return seeded, count


def _with_new_actions(array: np.ndarray, shape: tuple[int, ...], key: str) -> np.ndarray:
    """The greedy head's output layer (``array``: a row per action) grown to ``shape`` when
    the agent has actions after the policy's own (e.g. ``pack``, ``pad``): each new action
    starts as the mean of the trained ones, so it is neither favoured nor shunned at first."""
    if len(shape) != array.ndim or shape[0] <= array.shape[0] or shape[1:] != array.shape[1:]:
        return array  # same actions, or a mismatch the caller reports
    new_rows = np.repeat(array.mean(axis=0, keepdims=True), shape[0] - array.shape[0], axis=0)
    return np.concatenate([array, new_rows], axis=0)


def warm_start(algo, policy: Policy) -> int:
    """Copy ``policy``'s weights into ``algo``'s learner and env runners; returns the number of
    arrays copied."""
    weights = algo.learner_group.get_weights()
    seeded, count = seeded_weights(weights["default_policy"], policy)
    algo.learner_group.set_weights({"default_policy": seeded})
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)
    return count
