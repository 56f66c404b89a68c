"""The errors looprl raises on purpose.

Bad input is a ``ValueError`` naming what is wrong. A schedule that fails to compile or run is
a :class:`CompileError` or :class:`KernelError`: the evaluator turns those (and only those)
into a failed :class:`~looprl.measurement.evaluator.Measurement`, so that one bad state cannot
end a long search or training run; anything else is a bug and propagates.
"""


class LoopRLError(RuntimeError):
    """Base of looprl's runtime errors."""


class CompileError(LoopRLError):
    """LLVM refused the generated IR, or the JIT produced no code."""


class KernelError(LoopRLError):
    """A compiled kernel could not be run (e.g. its buffers could not be allocated)."""
