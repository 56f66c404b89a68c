"""What the torch experiments share: timing a module call by looprl's rule, writing the CSV.

Not a script (``test_experiments`` skips names that start with ``_``); the experiments import it
from their own folder.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from looprl.measurement.timing import best_time


def seconds(module, x, budget_s: float) -> float:
    """Best seconds of one ``module(x)`` under ``torch.inference_mode()``, by looprl's timing rule."""

    def repeat(reps: int) -> None:
        for _ in range(reps):
            module(x)

    with torch.inference_mode():
        return best_time(repeat, budget_s).seconds


def write_csv(out: Path, fields: list[str], rows: list[dict]) -> Path:
    """``rows`` to ``<out>.csv`` (folders made); the path, printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".csv")
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
    return path
