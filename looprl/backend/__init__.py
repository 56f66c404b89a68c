"""The code generator (LLVM IR emission: :mod:`looprl.backend.codegen` and its parts), JIT,
compiled kernels, buffers. The target description is :mod:`looprl.target` (re-exported here).

Imports nothing of gymnasium, Ray or torch (checked by the layering contract in pyproject)."""

from looprl.backend.buffers import aligned_empty, aligned_zeros
from looprl.backend.kernel import Kernel, compile
from looprl.target import Target, host_target

__all__ = ["Kernel", "Target", "aligned_empty", "aligned_zeros", "compile", "host_target"]
