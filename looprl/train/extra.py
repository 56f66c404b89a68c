"""What training needs beyond looprl's own dependencies: the ``[train]`` extra.

The training command line's help and a policy's evaluation run without it; anything that
builds, saves or reads a run (Ray, RLlib, torch, YAML, TensorBoard) first calls
:func:`require_training_extra`, which names the missing modules and how to install them.
"""

from __future__ import annotations

import importlib.util

TRAINING_MODULES = ("yaml", "ray", "torch", "tensorboardX")
INSTALL_HINT = "pip install 'looprl[train]'"


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that are not installed (found without importing them: Ray and
    torch take seconds to import, and a refused start must not wait for them)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require_training_extra(what: str = "training", modules: tuple[str, ...] = TRAINING_MODULES) -> None:
    """ValueError naming the missing modules and the install command when ``modules`` are not all importable."""
    missing = missing_modules(modules)
    if missing:
        raise ValueError(f"{what} needs the [train] extra, which is not installed (no module {', '.join(missing)}): {INSTALL_HINT}")
