"""The problems looprl tunes: benchmark sets (LoopTune's matmuls, real models' contractions)
and their entries, independent of the environment that draws from them."""

from looprl.workloads.datasets import dataset_entries, dataset_names, dataset_problems
from looprl.workloads.entries import DatasetEntry

__all__ = ["DatasetEntry", "dataset_entries", "dataset_names", "dataset_problems"]
