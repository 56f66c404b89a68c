"""A trained policy as plain data: the network's weights in a numpy ``.npz`` and JSON metadata.

``Policy.load(path)`` needs neither Ray nor torch and never unpickles anything, so a policy
loads in milliseconds and is safe to read from anywhere. The network is a feed-forward
stack described in the metadata::

    "network": {
      "trunk": [{"weight": "trunk.0.weight", "bias": "trunk.0.bias", "activation": "relu"}, ...],
      "heads": {"advantages": [{"weight": ..., "bias": ..., "activation": "linear"}], ...},
      "greedy": "advantages"
    }

The observation is flattened, run through the trunk and then through the head named by
``greedy``; the greedy action is the argmax of that head's output (Q-values or advantages for
DQN, logits for PPO/IMPALA/APPO), optionally restricted to the valid actions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

POLICY_FORMAT = "looprl-policy"
POLICY_FORMAT_VERSION = 1
JSON_NAME, WEIGHTS_NAME = "policy.json", "policy.npz"

_ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


@dataclass(frozen=True)
class Dense:
    weight: np.ndarray  # (out, in), as torch stores it
    bias: np.ndarray  # (out,)
    activation: str

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _ACTIVATIONS[self.activation](x @ self.weight.T + self.bias)


@dataclass(frozen=True)
class Policy:
    """A greedy policy for LoopNest-v0 observations; see the module docstring."""

    metadata: dict[str, Any]
    trunk: tuple[Dense, ...]
    heads: dict[str, tuple[Dense, ...]] = field(repr=False)

    # -- loading -------------------------------------------------------------------------
    @staticmethod
    def load(path: str | Path) -> "Policy":
        """Read a policy folder (``policy.json`` + ``policy.npz``) or either file of it."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        json_path, weights_path = folder / JSON_NAME, folder / WEIGHTS_NAME
        if not json_path.exists() or not weights_path.exists():
            raise ValueError(f"no policy at {path}: expected {JSON_NAME} and {WEIGHTS_NAME} in {folder}")
        try:
            metadata = json.loads(json_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"unreadable policy metadata {json_path}: {error}") from error
        if metadata.get("format") != POLICY_FORMAT or metadata.get("format_version") != POLICY_FORMAT_VERSION:
            raise ValueError(f"{json_path} is not a {POLICY_FORMAT} v{POLICY_FORMAT_VERSION} file")
        try:
            with np.load(weights_path, allow_pickle=False) as archive:
                arrays = {name: archive[name].astype(np.float32) for name in archive.files}
        except (OSError, ValueError) as error:
            raise ValueError(f"unreadable policy weights {weights_path}: {error}") from error
        return Policy.from_arrays(metadata, arrays)

    @staticmethod
    def from_arrays(metadata: dict[str, Any], arrays: dict[str, np.ndarray]) -> "Policy":
        network = metadata.get("network")
        if not isinstance(network, dict) or "trunk" not in network or "heads" not in network:
            raise ValueError("policy metadata has no 'network' with 'trunk' and 'heads'")

        def layers(specs) -> tuple[Dense, ...]:
            built = []
            for spec in specs:
                for key in ("weight", "bias"):
                    if spec[key] not in arrays:
                        raise ValueError(f"policy weights lack array {spec[key]!r}")
                if spec["activation"] not in _ACTIVATIONS:
                    raise ValueError(f"unknown activation {spec['activation']!r}")
                built.append(Dense(arrays[spec["weight"]], arrays[spec["bias"]], spec["activation"]))
            return tuple(built)

        policy = Policy(metadata, layers(network["trunk"]), {name: layers(specs) for name, specs in network["heads"].items()})
        policy._check_shapes()
        return policy

    def save(self, folder: str | Path) -> Path:
        """Write ``policy.json`` and ``policy.npz`` into ``folder`` (atomically per file)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {}
        network = self.metadata["network"]
        for spec, layer in zip(network["trunk"], self.trunk):
            arrays[spec["weight"]], arrays[spec["bias"]] = layer.weight, layer.bias
        for name, specs in network["heads"].items():
            for spec, layer in zip(specs, self.heads[name]):
                arrays[spec["weight"]], arrays[spec["bias"]] = layer.weight, layer.bias
        temporary = folder / (WEIGHTS_NAME + ".tmp.npz")
        np.savez(temporary, **arrays)
        temporary.replace(folder / WEIGHTS_NAME)
        text = folder / (JSON_NAME + ".tmp")
        text.write_text(json.dumps(self.metadata, indent=1) + "\n", encoding="utf-8")
        text.replace(folder / JSON_NAME)
        return folder

    # -- acting ------------------------------------------------------------------------------
    @property
    def observation_shape(self) -> tuple[int, int]:
        return tuple(self.metadata["observation_shape"])

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(self.metadata["action_names"])

    def scores(self, observation: np.ndarray) -> np.ndarray:
        """The greedy head's output (Q-values, advantages or logits) for one observation
        ``(max_loops, 20)`` or a batch ``(B, max_loops, 20)``."""
        obs = np.asarray(observation, dtype=np.float32)
        batched = obs.ndim == len(self.observation_shape) + 1
        if obs.shape[-len(self.observation_shape):] != self.observation_shape:
            raise ValueError(f"observation shape {obs.shape} does not match the policy's {self.observation_shape}")
        x = obs.reshape(obs.shape[0] if batched else 1, -1)
        for layer in self.trunk:
            x = layer(x)
        for layer in self.heads[self.metadata["network"]["greedy"]]:
            x = layer(x)
        return x if batched else x[0]

    def act(self, observation: np.ndarray, mask: np.ndarray | None = None) -> int:
        """The greedy action; with ``mask`` (1 = valid) only valid actions are considered."""
        scores = self.scores(observation)
        if scores.ndim != 1:
            raise ValueError("act() takes one observation; use scores() for a batch")
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != scores.shape:
                raise ValueError(f"mask shape {mask.shape} does not match {scores.shape[0]} actions")
            if not mask.any():
                raise ValueError("mask allows no action")
            scores = np.where(mask.astype(bool), scores, -np.inf)
        return int(np.argmax(scores))

    def _check_shapes(self) -> None:
        width = int(math.prod(self.observation_shape))
        for layer in self.trunk:
            if layer.weight.ndim != 2 or layer.weight.shape[1] != width or layer.bias.shape != (layer.weight.shape[0],):
                raise ValueError(f"policy trunk layer shapes do not chain: {layer.weight.shape} after width {width}")
            width = layer.weight.shape[0]
        greedy = self.metadata["network"].get("greedy")
        if greedy not in self.heads:
            raise ValueError(f"greedy head {greedy!r} is not among the heads {sorted(self.heads)}")
        for name, head in self.heads.items():
            inner = width
            for layer in head:
                if layer.weight.ndim != 2 or layer.weight.shape[1] != inner or layer.bias.shape != (layer.weight.shape[0],):
                    raise ValueError(f"policy head {name!r} layer shapes do not chain")
                inner = layer.weight.shape[0]
        if self.heads[greedy][-1].weight.shape[0] != len(self.action_names):
            raise ValueError(f"the greedy head has {self.heads[greedy][-1].weight.shape[0]} outputs for {len(self.action_names)} actions")
