"""Data the library reads at run time: benchmark sets, agent configurations, shipped policies.

In the repository they live in the top-level ``envs/``, ``agents/`` and ``checkpoints/``
folders; a wheel carries the same files as the package ``looprl._shipped.<folder>`` (see
``pyproject.toml``), read here through :mod:`importlib.resources`. A checkout that is not
installed (or installed in editable mode) reads the folders directly.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from looprl import checks

FOLDERS = ("envs", "agents", "checkpoints")
_REPOSITORY = Path(__file__).resolve().parent.parent


def shipped_folder(folder: str) -> Path:
    """The directory holding the shipped ``folder`` (``envs``, ``agents`` or ``checkpoints``)."""
    folder = checks.one_of(folder, "shipped folder", FOLDERS)
    package = importlib.resources.files("looprl")
    if not isinstance(package, Path):  # e.g. a zip import: the loaders need real files
        raise ValueError(f"looprl is not installed on the file system ({package}); install it unzipped")
    installed = package / "_shipped" / folder
    return installed if installed.is_dir() else _REPOSITORY / folder


def shipped_path(folder: str, *parts: str) -> Path:
    """A path inside a shipped folder (which may not exist: callers say what is missing)."""
    return shipped_folder(folder).joinpath(*parts)
