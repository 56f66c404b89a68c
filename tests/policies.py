"""Small hand-made policies for tests (no training needed)."""

import numpy as np

from looprl.env.observation import OBSERVATION_LAYOUT_VERSION
from looprl.policy.numpy_policy import POLICY_FORMAT, POLICY_FORMAT_VERSION, Policy

NAMES = ["up", "down", "swap_up", "swap_down", "split_4", "split_8", "split_16"]


def random_policy(seed=0, hidden=8, bias=None, observation="normalized", target=None, layouts=False) -> Policy:
    """A random 200 -> hidden -> 7 MLP (9 outputs with ``layouts``: pack and pad follow);
    ``bias`` (a value per action) with zero weights makes a fixed preference order instead."""
    rng = np.random.default_rng(seed)
    names = NAMES + ["pack", "pad"] if layouts else NAMES
    arrays = {
        "trunk.0.weight": rng.normal(size=(hidden, 200)).astype(np.float32),
        "trunk.0.bias": rng.normal(size=hidden).astype(np.float32),
        "logits.0.weight": rng.normal(size=(len(names), hidden)).astype(np.float32),
        "logits.0.bias": rng.normal(size=len(names)).astype(np.float32),
    }
    if bias is not None:
        arrays["logits.0.weight"][:] = 0
        arrays["logits.0.bias"] = np.asarray(bias, dtype=np.float32)
    metadata = {
        "format": POLICY_FORMAT, "format_version": POLICY_FORMAT_VERSION, "observation": observation,
        "observation_layout_version": OBSERVATION_LAYOUT_VERSION,
        "observation_shape": [10, 20], "action_names": names, "split_factors": [4, 8, 16], "episode_length": 10,
        "layouts": layouts,
        "network": {
            "trunk": [{"weight": "trunk.0.weight", "bias": "trunk.0.bias", "activation": "relu"}],
            "heads": {"logits": [{"weight": "logits.0.weight", "bias": "logits.0.bias", "activation": "linear"}]},
            "greedy": "logits",
        },
    }
    if target is not None:
        metadata["target"] = target.to_dict()
    return Policy.from_arrays(metadata, arrays)
