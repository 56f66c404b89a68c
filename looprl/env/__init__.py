"""LoopNest-v0: the Gymnasium environment and its observations (state graph and features).
The actions live in :mod:`looprl.actions`, the problems it draws from in :mod:`looprl.workloads`."""

from looprl.env.observation import nest_graph, observation
from looprl.env.loopnest_env import LoopNestEnv

__all__ = ["LoopNestEnv", "nest_graph", "observation"]
