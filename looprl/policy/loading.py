"""Finding and checking a policy: the shipped default for a target or a folder, against this
looprl's observation layout and action set.

The shipped defaults are listed in ``checkpoints/default_policies.json``: one policy folder per
vector ISA (``{"avx512": "apex-dqn/policy", ...}``). ``load_policy("default", target)`` takes
the one made for ``target``'s ISA; when there is none it warns once and takes the closest
(the nearest vector width, then the most registers).

An ISA may also list a policy for problems whose right operand is a weight (constant: a
linear layer's, bound to the kernel once), under ``"<isa>/weights"``:
``load_policy("default", target, weights=True)`` takes it where there is one. The observation
has no feature for a constant operand, and the two kinds want different answers to the same
observation: packing a weight is free (done once, when the kernel is bound), packing an operand
that changes per call is paid on every call.

A policy for bfloat16 problems is listed with ``"/bfloat16"`` after the ISA's or the weights'
key (``"avx512/weights/bfloat16"``): ``dtype="bfloat16"`` takes the most specific key listed
(:func:`role_keys`), so an ISA without one falls back to its float32 policy, which reads the
dtype from the observation but was never trained on bfloat16 labels.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from looprl.ir.dtypes import FLOAT32, as_dtype
from looprl.target import TARGET_NAMES, Target
from looprl.env.observation import FEATURES_PER_LOOP, OBSERVATION_LAYOUT_VERSION
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import policy_actions
from looprl.resources import shipped_path

DEFAULT_POLICIES = shipped_path("checkpoints", "default_policies.json")
_warned: set[tuple[str, str]] = set()  # (asked ISA, used ISA) pairs already warned about
WEIGHTS_SUFFIX = "/weights"  # "<isa>/weights": the policy for problems whose right operand is a weight
DTYPE_SUFFIXES = ("/bfloat16",)  # "<isa>[/weights]/bfloat16": the policy for problems of that dtype


def default_policies() -> dict[str, Path]:
    """ISA name (or ``<isa>/weights``) -> folder of the shipped default policy for it."""
    try:
        listed = json.loads(DEFAULT_POLICIES.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the list of default policies {DEFAULT_POLICIES}: {error}") from None
    if not isinstance(listed, dict) or not listed or not all(isinstance(k, str) and isinstance(v, str) for k, v in listed.items()):
        raise ValueError(f"{DEFAULT_POLICIES}: expected an object mapping ISA names to policy folders")
    unknown = {key for key in listed if _isa_of(key) not in TARGET_NAMES}
    if unknown:
        raise ValueError(f"{DEFAULT_POLICIES}: unknown ISA names {sorted(unknown)}")
    if not any(key in TARGET_NAMES for key in listed):
        raise ValueError(f"{DEFAULT_POLICIES}: no policy for an ISA (only for weights)")
    return {isa: DEFAULT_POLICIES.parent / folder for isa, folder in listed.items()}


def _isa_of(key: str) -> str:
    """The ISA a key of the list names (its role suffixes removed)."""
    for suffix in DTYPE_SUFFIXES:
        key = key.removesuffix(suffix)
    return key.removesuffix(WEIGHTS_SUFFIX)


def role_keys(isa: str, weights: bool = False, dtype=FLOAT32) -> tuple[str, ...]:
    """The keys of the list that can serve a problem on ``isa``, most specific first, the role
    before the dtype (the observation shows a problem's dtype but not that an operand is a
    weight): for a weight of a bfloat16 problem ``<isa>/weights/bfloat16``, ``<isa>/weights``,
    ``<isa>/bfloat16``, ``<isa>``; the first one listed is the policy."""
    dtype = as_dtype(dtype)
    roles = [WEIGHTS_SUFFIX, ""] if weights else [""]
    suffixes = ["/" + dtype.name, ""] if dtype != FLOAT32 else [""]
    return tuple(isa + role + suffix for role in roles for suffix in suffixes)


def default_policy_dir(target: Target | str | None = None, weights: bool = False, dtype=FLOAT32) -> Path:
    """The folder of the shipped policy for ``target`` (None: the host's); with a warning, the
    closest one if none was made for its ISA. ``weights``: for a problem whose right operand is
    a weight; ``dtype``: for a problem of that dtype; the most specific role the ISA lists
    (:func:`role_keys`)."""
    target = Target.resolve(target)
    listed = default_policies()
    available = [isa for isa in listed if isa in TARGET_NAMES]
    isa = target.isa
    if isa not in available:
        wanted = TARGET_NAMES.index(isa)  # widest first: on a tie, the wider one
        isa = min(available, key=lambda name: (abs(TARGET_NAMES.index(name) - wanted), TARGET_NAMES.index(name)))
        if (target.isa, isa) not in _warned:
            _warned.add((target.isa, isa))
            warnings.warn(
                f"looprl ships no policy for {target.isa}; using the {isa} policy (measured tuning corrects for it; "
                f"train one with: python -m looprl.train --init-from default --target {target.isa})",
                RuntimeWarning,
                stacklevel=3,
            )
    return listed[next(key for key in role_keys(isa, weights, dtype) if key in listed)]


def load_policy(policy: Policy | str | Path, target: Target | str | None = None, weights: bool = False,
                dtype=FLOAT32) -> Policy:
    """The shipped default policy for ``target`` (None: the host's; ``weights``: for a problem
    whose right operand is a weight; ``dtype``: for a problem of that dtype; see the module
    docstring), a policy folder or file, or a Policy; checked for the observation layout and
    action set this version of looprl produces."""
    if isinstance(policy, Policy):
        loaded, where = policy, "the given policy"
    elif not isinstance(policy, (str, Path)):
        raise ValueError(f"policy must be 'default', a policy folder or a Policy, got {type(policy).__name__}")
    else:
        path = default_policy_dir(target, weights, dtype) if policy == "default" else Path(policy)
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
