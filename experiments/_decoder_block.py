"""The decoder block the block experiments time (decoder_lengths, block_layers_in_turn,
block_rotated_tuning): a pre-norm transformer decoder block built from ``torch.nn``, random
weights, nothing downloaded.

Not a script (``test_experiments`` skips names that start with ``_``); the experiments import it
from their own folder.
"""

from __future__ import annotations

import torch.nn.functional as functional
from torch import nn


class DecoderBlock(nn.Module):
    """A pre-norm transformer decoder block with causal self-attention."""

    def __init__(self, dim: int = 640, heads: int = 10, hidden: int = 2560):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp(self.norm2(x))
