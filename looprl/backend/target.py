"""What the code generator and the JIT need to know about the CPU they generate code for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """What the code generator needs to know about the CPU."""

    vector_width: int  # float32 lanes per vector register
    registers: int  # vector registers

    @staticmethod
    def from_features(features: str) -> "Target":
        """Pick the widest vector ISA from an LLVM feature string (``+avx512f,...``)."""
        enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
        if "avx512f" in enabled:
            return Target(16, 32)
        if "avx" in enabled:
            return Target(8, 16)
        return Target(4, 16)


def host_target() -> Target:
    """The widest vector ISA of this machine."""
    from looprl.backend.jit import host_cpu

    return Target.from_features(host_cpu()[1])
