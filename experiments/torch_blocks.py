"""Whole PyTorch blocks through ``looprl.torch.tune_module``, against torch, one thread.

    python experiments/torch_blocks.py [--target avx2] [--rounds 5] [--out experiments/results/torch_blocks]

Blocks, built from ``torch.nn`` modules with random weights (nothing is downloaded):

* ``vit-s16-mlp``: ``Linear(384, 1536) -> GELU -> Linear(1536, 384)`` on a (197, 384) input
  (ViT-S/16's MLP on its 197 tokens);
* ``vit-s16-encoder``: a pre-norm ViT-S/16 encoder block on a (1, 197, 384) input: LayerNorm,
  a qkv ``Linear(384, 1152)``, 6-head attention (``F.scaled_dot_product_attention``), an output
  ``Linear(384, 384)``, the residual, LayerNorm, the MLP above, the residual;
* ``bert-base-ffn``: ``Linear(768, 3072) -> GELU -> Linear(3072, 768)`` on a (1, 128, 768)
  input (BERT-base's feed-forward on 128 tokens; leading dimensions flattened).

Each block is tuned from an empty measurement cache (the tune time is reported), its output
compared with the original's (float32 tolerance: ``torch.allclose(rtol=1e-4, atol=1e-4)``, max
absolute difference reported), then the original and the tuned block are timed in interleaved
rounds (``torch.set_num_threads(1)``, ``torch.inference_mode()``, looprl's timing rule under
the machine-wide lock; best of the rounds kept). Writes ``<out>.csv`` and prints a table.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

from _torch_timing import seconds, write_csv

from looprl.backend.host import cpu_model_name
from looprl.target import TARGET_CHOICES, Target
from looprl.torch import tune_module, tuned_layers

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ["block", "input", "target", "cpu", "tune_s", "tuned_layers", "torch_ms", "looprl_ms", "speedup", "max_abs_diff", "allclose"]


class Attention(nn.Module):
    """Multi-head self-attention from a qkv projection and an output projection."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(q, k, v)
        return self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))


class EncoderBlock(nn.Module):
    """A pre-norm transformer encoder block (ViT's)."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def blocks():
    torch.manual_seed(0)
    yield "vit-s16-mlp", nn.Sequential(nn.Linear(384, 1536), nn.GELU(), nn.Linear(1536, 384)), torch.randn(197, 384)
    yield "vit-s16-encoder", EncoderBlock(384, 6, 1536), torch.randn(1, 197, 384)
    yield "bert-base-ffn", nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)), torch.randn(1, 128, 768)



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per timing (default 0.1)")
    parser.add_argument("--out", type=Path, default=RESULTS / "torch_blocks")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target = Target.resolve(args.target)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, module, x in blocks():
            module.eval()
            started = time.perf_counter()
            tuned = tune_module(module, x, target=target, cache=str(Path(folder) / f"{name}.sqlite"))
            tune_s = time.perf_counter() - started
            with torch.no_grad():
                expected, got = module(x), tuned(x)
            best = {"torch": math.inf, "looprl": math.inf}
            for _ in range(args.rounds):
                best["torch"] = min(best["torch"], seconds(module, x, args.budget))
                best["looprl"] = min(best["looprl"], seconds(tuned, x, args.budget))
            rows.append({
                "block": name, "input": "x".join(map(str, x.shape)), "target": target.isa, "cpu": cpu_model_name(),
                "tune_s": round(tune_s, 3), "tuned_layers": len(tuned_layers(tuned)),
                "torch_ms": round(1e3 * best["torch"], 4), "looprl_ms": round(1e3 * best["looprl"], 4),
                "speedup": round(best["torch"] / best["looprl"], 3),
                "max_abs_diff": float((expected - got).abs().max()), "allclose": bool(torch.allclose(expected, got, rtol=1e-4, atol=1e-4)),
            })
            row = rows[-1]
            print(f"{name:>16} {row['input']:>10} tune {row['tune_s']:5.2f} s, {row['tuned_layers']} layers tuned: torch {row['torch_ms']:.3f} ms, "
                  f"looprl {row['looprl_ms']:.3f} ms, {row['speedup']:.2f}x; max |diff| {row['max_abs_diff']:.2e} "
                  f"({'allclose' if row['allclose'] else 'NOT allclose'})", flush=True)
    write_csv(args.out, FIELDS, rows)
    return 0 if all(row["allclose"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
