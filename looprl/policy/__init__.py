"""Trained policies as plain data, their greedy rollout and ``looprl.tune``; no Ray or torch."""

from looprl.policy.numpy_policy import Policy
from looprl.policy.tuner import TuneResult, tune

__all__ = ["Policy", "TuneResult", "tune"]
