"""LoopNest-v0: LoopTune's observations (state graph and features), benchmark sets and the
Gymnasium environment (the actions live in :mod:`looprl.actions`)."""

from looprl.env.datasets import dataset_entries, dataset_names, dataset_problems
from looprl.env.entries import DatasetEntry
from looprl.env.features import nest_graph, observation
from looprl.env.loopnest_env import LoopNestEnv

__all__ = ["DatasetEntry", "LoopNestEnv", "dataset_entries", "dataset_names", "dataset_problems", "nest_graph", "observation"]
