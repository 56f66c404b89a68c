"""looprl: tune tensor-contraction loop nests for the CPU with reinforcement learning.

The package is layered, each layer importing only those below it (checked by the import
contract in ``pyproject.toml``)::

    cli          command lines
    bench        benchmarks
    dynamo       the torch.compile backend
    torch        looprl.torch: tuned kernels inside PyTorch modules (imports torch; never imported here)
    train        RLlib agents (the only layer that imports Ray)
    tune         looprl.tune: proposers, one measurer, one store, one winner rule
    policy       numpy policies, their greedy rollout, policy-guided search
    search       greedy, beam, random and AutoTVM search
    costmodel    AutoTVM's schedule features and XGBoost cost model
    env          LoopNest-v0 (gymnasium) and its observations
    actions      actions as data and the one transition rule
    measurement  timing, peak, numpy baseline, cache, evaluator
    backend      looprl.Target, code generator, JIT, kernels
    workloads    benchmark sets and real models' contractions (the problems)
    ir           problems, loop nests, hand-written schedules

This module re-exports the public API and registers ``LoopNest-v0`` with gymnasium.
"""

import gymnasium as _gymnasium

from looprl.backend import Kernel, Target, aligned_empty, aligned_zeros, compile
from looprl.actions import ActionSet, State
from looprl.env import nest_graph, observation
from looprl.ir import (
    ACTIVATIONS,
    Epilogue,
    Loop,
    LoopNest,
    Problem,
    contraction,
    initial_nest,
    linear,
    matmul,
    parse_problem,
    parse_problems,
)
from looprl.measurement import (
    Evaluator,
    Measurement,
    MeasurementCache,
    measure,
    peak_gflops,
)
from looprl.policy import Policy
# Importing looprl.tune.api imports the package looprl.tune first, which sets looprl.tune to the
# package; the name is then bound to the function, the public API (the parts stay importable by
# their full names: looprl.tune.winner, ...).
from looprl.tune.api import tune
from looprl.tune.results import Answer, TuneResult
from looprl.workloads import DatasetEntry, dataset_entries, dataset_names, dataset_problems

ENV_ID = "LoopNest-v0"

# Registered on every import (also inside RLlib's env-runner processes, which import the
# package to unpickle the config). Measured rewards make the env nondeterministic, which
# also tells gymnasium's checker not to compare measured infos across runs.
if ENV_ID not in _gymnasium.registry:
    _gymnasium.register(ENV_ID, entry_point="looprl.env:LoopNestEnv", nondeterministic=True)

__all__ = [
    "ACTIVATIONS",
    "Answer",
    "ENV_ID",
    "ActionSet",
    "DatasetEntry",
    "Epilogue",
    "Evaluator",
    "Kernel",
    "Loop",
    "LoopNest",
    "Measurement",
    "MeasurementCache",
    "Policy",
    "Problem",
    "State",
    "Target",
    "TuneResult",
    "aligned_empty",
    "aligned_zeros",
    "compile",
    "contraction",
    "dataset_entries",
    "dataset_names",
    "dataset_problems",
    "initial_nest",
    "linear",
    "matmul",
    "measure",
    "nest_graph",
    "observation",
    "parse_problem",
    "parse_problems",
    "peak_gflops",
    "tune",
]
