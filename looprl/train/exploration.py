"""Ape-X's exploration schedule: one fixed epsilon per actor."""

from __future__ import annotations


def apex_epsilon(index: int, count: int) -> float:
    """Ape-X's per-actor exploration: 0.4 ** (1 + 7 i / (N - 1)) for actor i of N."""
    if not 0 <= index < count:
        raise ValueError(f"actor index {index} outside 0..{count - 1}")
    if count == 1:
        return 0.4
    return 0.4 ** (1 + 7 * index / (count - 1))
