"""What the torch experiments share: timing a module call by looprl's rule, writing the CSV.

Not a script (``test_experiments`` skips names that start with ``_``); the experiments import it
from their own folder.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import torch
from torch import nn

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


class OneDNNLinear(nn.Module):
    """An ``nn.Linear`` computed by oneDNN's linear on its weight packed once
    (``torch.ops.mkldnn._reorder_linear_weight`` for ``rows`` rows, then ``_linear_pointwise``):
    what Inductor's ``freezing`` runs for a linear layer, without the rest of its graph. The
    peer a tuned layer is compared with on the library side."""

    def __init__(self, linear: nn.Linear, rows: int):
        super().__init__()
        self.out_features = linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)


def onednn_packed(module: nn.Module, rows: int) -> nn.Module | None:
    """A copy of ``module`` whose ``nn.Linear`` layers are :class:`OneDNNLinear` (packed for
    ``rows`` rows), or None where torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    packed = copy.deepcopy(module)
    for name, child in list(packed.named_modules()):
        for attribute, layer in list(child.named_children()):
            if type(layer) is nn.Linear:
                setattr(child, attribute, OneDNNLinear(layer, rows))
    return packed
