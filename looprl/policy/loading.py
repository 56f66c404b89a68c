"""Finding and checking a policy: the shipped default or a folder, against this looprl's
observation layout and action set."""

from __future__ import annotations

from pathlib import Path

from looprl.env.features import FEATURES_PER_LOOP, OBSERVATION_LAYOUT_VERSION
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import policy_actions
from looprl.resources import shipped_path

DEFAULT_POLICY_DIR = shipped_path("checkpoints", "apex-dqn", "policy")


def load_policy(policy: Policy | str | Path) -> Policy:
    """The shipped default policy, a policy folder or file, or a Policy; checked for the
    observation layout and action set this version of looprl produces."""
    if isinstance(policy, Policy):
        loaded, where = policy, "the given policy"
    elif not isinstance(policy, (str, Path)):
        raise ValueError(f"policy must be 'default', a policy folder or a Policy, got {type(policy).__name__}")
    else:
        path = DEFAULT_POLICY_DIR if policy == "default" else Path(policy)
        if policy == "default" and not path.exists():
            raise ValueError(f"the default policy is missing ({path}); pass policy=PATH to a policy folder")
        loaded, where = Policy.load(path), str(path)
    meta = loaded.metadata
    if meta.get("observation_layout_version") != OBSERVATION_LAYOUT_VERSION:
        raise ValueError(
            f"{where}: observation layout version {meta.get('observation_layout_version')} does not match "
            f"this looprl's {OBSERVATION_LAYOUT_VERSION}"
        )
    if meta.get("observation") not in ("raw", "normalized"):
        raise ValueError(f"{where}: unknown observation kind {meta.get('observation')!r}")
    if len(loaded.observation_shape) != 2 or loaded.observation_shape[1] != FEATURES_PER_LOOP:
        raise ValueError(f"{where}: observation shape {loaded.observation_shape} is not (max_loops, {FEATURES_PER_LOOP})")
    try:
        policy_actions(loaded)
    except (KeyError, ValueError) as error:
        raise ValueError(f"{where}: incompatible action set: {error}") from error
    return loaded
