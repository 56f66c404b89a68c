"""Trained policies as plain data and their greedy rollout and guided search; no Ray or torch.
(``looprl.tune``, which schedules with them, is the package above: :mod:`looprl.tune`.)"""

from looprl.policy.numpy_policy import Policy

__all__ = ["Policy"]
