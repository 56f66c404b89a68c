"""What the experiments share to name their result files.

Not a script (``test_experiments`` skips names that start with ``_``); the experiments import it
from their own folder.
"""

from __future__ import annotations

import re


def cpu_slug(name: str) -> str:
    """A file-name form of a CPU's name: lower case, runs of other characters as ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"
