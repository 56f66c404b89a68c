"""RLlib checkpoint -> numpy :class:`~looprl.policy.Policy` (``policy.json`` + ``policy.npz``).

Reads the RLModule of a checkpoint (``learner_group/learner/rl_module/default_policy``) and
walks its default torch layout: an MLP encoder (``encoder.net.mlp`` for DQN,
``encoder.encoder.net.mlp`` or ``encoder.actor_encoder.net.mlp`` for the actor-critics) and
the greedy head (DQN: ``af``, the advantages with a dueling head and the Q-values without;
PPO/IMPALA/APPO: ``pi``, the action logits). DQN's dueling value head ``vf`` is exported too
(as head ``value``): acting does not need it, but a run started from the policy does.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np

from looprl import defaults
from looprl.backend.host import cpu_model_name
from looprl.env.observation import FEATURES_PER_LOOP, OBSERVATION_LAYOUT_VERSION
from looprl.policy.numpy_policy import POLICY_FORMAT, POLICY_FORMAT_VERSION, Policy
from looprl.train.config import agent_actions, agent_target

MODULE_SUBPATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"
_ACTIVATION_NAMES = {"ReLU": "relu", "Tanh": "tanh", "SiLU": "silu", "ELU": "elu", "Identity": "linear"}


def load_module(checkpoint: str | Path):
    """The trained RLModule of an RLlib checkpoint folder (no ``ray.init`` needed)."""
    from ray.rllib.core.rl_module.rl_module import RLModule  # Ray: only to read a checkpoint

    path = (Path(checkpoint) / MODULE_SUBPATH).resolve()
    if not path.exists():
        raise ValueError(f"{checkpoint} is not an RLlib algorithm checkpoint (no {MODULE_SUBPATH})")
    return RLModule.from_checkpoint(str(path))


def _sequential_layers(sequential, prefix: str) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Dense layer specs and arrays of a torch ``Sequential`` of Linear/activation modules."""
    import torch  # the [train] extra: only to walk a trained module

    specs, arrays = [], {}
    children = list(sequential.children())
    for position, child in enumerate(children):
        if isinstance(child, torch.nn.Linear):
            activation = "linear"
            if position + 1 < len(children) and not isinstance(children[position + 1], torch.nn.Linear):
                kind = type(children[position + 1]).__name__
                if kind not in _ACTIVATION_NAMES:
                    raise ValueError(f"cannot export layer {prefix}.{position}: unsupported activation {kind}")
                activation = _ACTIVATION_NAMES[kind]
            name = f"{prefix}.{len(specs)}"
            arrays[f"{name}.weight"] = child.weight.detach().cpu().numpy().astype(np.float32)
            arrays[f"{name}.bias"] = child.bias.detach().cpu().numpy().astype(np.float32)
            specs.append({"weight": f"{name}.weight", "bias": f"{name}.bias", "activation": activation})
        elif type(child).__name__ not in _ACTIVATION_NAMES:
            raise ValueError(f"cannot export {prefix}: unsupported layer {type(child).__name__}")
    return specs, arrays


def module_network(module) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``network`` description and arrays of a default DQN or actor-critic RLModule."""
    encoder = module.encoder
    if hasattr(encoder, "net"):  # DQN
        trunk = encoder.net.mlp
    elif hasattr(encoder, "encoder"):  # actor-critic, shared layers
        trunk = encoder.encoder.net.mlp
    elif hasattr(encoder, "actor_encoder"):  # actor-critic, separate value layers
        trunk = encoder.actor_encoder.net.mlp
    else:
        raise ValueError(f"cannot export {type(module).__name__}: unknown encoder {type(encoder).__name__}")
    if hasattr(module, "af"):
        if getattr(module, "num_atoms", 1) > 1:
            raise ValueError("cannot export distributional DQN (num_atoms > 1)")
        head_name, head = ("advantages" if getattr(module, "uses_dueling", False) else "q_values"), module.af
    elif hasattr(module, "pi"):
        head_name, head = "logits", module.pi
    else:
        raise ValueError(f"cannot export {type(module).__name__}: no 'af' or 'pi' head")
    trunk_specs, arrays = _sequential_layers(trunk, "trunk")
    heads = {head_name: head}
    if head_name == "advantages" and hasattr(module, "vf"):
        heads["value"] = module.vf  # not needed to act; kept so that --init-from restores all of Q
    network = {"trunk": trunk_specs, "heads": {}, "greedy": head_name}
    for name, layers in heads.items():
        network["heads"][name], head_arrays = _sequential_layers(layers.net.mlp, name)
        arrays.update(head_arrays)
    return network, arrays


def policy_from_module(module, agent: dict[str, Any], extra: dict[str, Any] | None = None) -> Policy:
    """The numpy policy of an RLModule; ``agent`` is the run's agent configuration (its env
    section defines the observation and the actions)."""
    network, arrays = module_network(module)
    return Policy.from_arrays(policy_metadata(agent, network, extra), arrays)


def policy_metadata(agent: dict[str, Any], network: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A policy file's metadata for a network trained with ``agent``'s configuration."""
    env = agent.get("env", {})
    target = agent_target(agent)
    actions = agent_actions(agent, target)
    metadata = {
        "format": POLICY_FORMAT,
        "format_version": POLICY_FORMAT_VERSION,
        "observation_layout_version": OBSERVATION_LAYOUT_VERSION,
        "observation": env.get("observation", defaults.TRAINING_OBSERVATION),
        "observation_shape": [actions.max_loops, FEATURES_PER_LOOP],
        "action_names": list(actions.names),
        "split_factors": list(actions.split_factors),
        "layouts": actions.layouts,  # pack and pad follow the splits
        **({"parallel": True, "threads": env["threads"]} if actions.parallel else {}),  # the parallel action follows
        **({"plans": list(actions.plans)} if actions.plans else {}),  # the plan actions come last
        "episode_length": env.get("episode_length", defaults.EPISODE_LENGTH),
        "algorithm": agent.get("algorithm"),
        "apex": bool(agent.get("apex", False)),
        "training_problems": _training_problems(env),
        **({"dtype": str(env["dtype"])} if env.get("dtype") is not None else {}),  # every training problem in it
        "target": target.to_dict(),
        "host_cpu": cpu_model_name(),
        "network": network,
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    metadata.update(extra or {})
    return metadata


def export_policy(checkpoint: str | Path, out: str | Path, agent: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Write the numpy policy of ``checkpoint`` into folder ``out``."""
    extra = {"checkpoint": str(Path(checkpoint).name), **(extra or {})}
    return policy_from_module(load_module(checkpoint), agent, extra).save(out)


def _training_problems(env: dict[str, Any]) -> dict[str, Any] | list[str]:
    if env.get("problems"):
        return [str(p) for p in env["problems"]]
    return {"dataset": env.get("dataset", defaults.DATASET), "split": env.get("split", "train")}
