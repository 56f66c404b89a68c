"""The code generator: target description, LLVM IR emission, JIT, compiled kernels, buffers.

Imports nothing of gymnasium, Ray or torch (checked by the layering contract in pyproject)."""

from looprl.backend.buffers import aligned_empty, aligned_zeros
from looprl.backend.kernel import Kernel, compile
from looprl.target import Target, host_target

__all__ = ["Kernel", "Target", "aligned_empty", "aligned_zeros", "compile", "host_target"]
