"""The loop-nest IR: problems (what to compute), nests (how) and hand-written schedules.

Pure values and pure transforms; nothing here compiles or measures."""

from looprl.ir.epilogue import ACTIVATIONS, Epilogue
from looprl.ir.layers import linear
from looprl.ir.nest import Loop, LoopNest, initial_nest
from looprl.ir.problem import Problem, as_problem, contraction, matmul, parse_problem, parse_problems

__all__ = [
    "ACTIVATIONS",
    "Epilogue",
    "Loop",
    "LoopNest",
    "Problem",
    "as_problem",
    "contraction",
    "initial_nest",
    "linear",
    "matmul",
    "parse_problem",
    "parse_problems",
]
