"""looprl: tune tensor-contraction loop nests for the CPU with reinforcement learning."""

from .buffers import aligned_empty, aligned_zeros
from .cache import MeasurementCache
from .kernel import Kernel, compile
from .measure import measure
from .nest import Loop, LoopNest
from .peak import peak_gflops
from .problem import Problem, contraction, matmul, parse_problem

__all__ = [
    "Kernel",
    "Loop",
    "LoopNest",
    "MeasurementCache",
    "Problem",
    "aligned_empty",
    "aligned_zeros",
    "compile",
    "contraction",
    "matmul",
    "measure",
    "parse_problem",
    "peak_gflops",
]
