"""looprl: tune tensor-contraction loop nests for the CPU with reinforcement learning."""

import gymnasium as _gymnasium

from .actions import ActionSet, State
from .buffers import aligned_empty, aligned_zeros
from .cache import MeasurementCache
from .datasets import dataset_names, dataset_problems
from .evaluator import Evaluator, Measurement
from .features import nest_graph, observation
from .kernel import Kernel, compile
from .measure import measure
from .nest import Loop, LoopNest
from .peak import peak_gflops
from .policy import Policy
from .problem import Problem, contraction, matmul, parse_problem
from .tuning import TuneResult, tune

ENV_ID = "LoopNest-v0"

# Registered on every import (also inside RLlib's env-runner processes, which import the
# package to unpickle the config). Measured rewards make the env nondeterministic, which
# also tells gymnasium's checker not to compare measured infos across runs.
if ENV_ID not in _gymnasium.registry:
    _gymnasium.register(ENV_ID, entry_point="looprl.env:LoopNestEnv", nondeterministic=True)

__all__ = [
    "ENV_ID",
    "ActionSet",
    "Evaluator",
    "Kernel",
    "Loop",
    "LoopNest",
    "Measurement",
    "MeasurementCache",
    "Policy",
    "Problem",
    "State",
    "TuneResult",
    "aligned_empty",
    "aligned_zeros",
    "compile",
    "contraction",
    "dataset_names",
    "dataset_problems",
    "matmul",
    "measure",
    "nest_graph",
    "observation",
    "parse_problem",
    "peak_gflops",
    "tune",
]
