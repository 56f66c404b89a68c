"""The CPU a kernel is generated for: one frozen value that answers every target question.

Lanes, registers, FMA and what fits the register file (:meth:`Target.holds`,
:meth:`Target.fits`, :meth:`Target.register_tiles`) are read from a :class:`Target` by the code
generator's register planning, the JIT's target machine, expert schedules, the peak
measurement, the measurement cache key and policy metadata; nothing else in looprl holds an
ISA constant or a register-fit rule. This is the bottom layer: it imports nothing of looprl.

``Target.host()`` describes this machine (its LLVM CPU name and full feature string, so LLVM
schedules for the real micro-architecture). ``Target.named("avx2")`` and the other names
describe a vector ISA generically (LLVM's x86-64-v2/v3/v4 levels) with every wider feature
switched off, so that code compiled for it runs on any CPU that has the ISA: this is how AVX2
code is developed and measured on an AVX-512 host.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import llvmlite.binding as llvm

# name -> (float32 lanes, vector registers, FMA, LLVM CPU, features that must be on, features switched off)
_AVX512_FEATURES = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_WIDER_THAN_AVX2 = (
    *_AVX512_FEATURES,
    "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512vnni", "avx512bitalg", "avx512vpopcntdq",
    "avx512bf16", "avx512fp16", "avx512vp2intersect", "avx10.1", "avx10.2",
)  # fmt: skip  (names as LLVM 22 spells them: an unknown name only draws a warning)
_WIDER_THAN_SSE4 = (*_WIDER_THAN_AVX2, "avx", "avx2", "fma", "f16c", "fma4", "xop", "avxvnni", "avxifma", "avxvnniint8", "avxvnniint16", "avxneconvert")
_NAMED = {
    "avx512": (16, 32, True, "x86-64-v4", ("avx512f", "avx2", "fma"), ()),
    "avx2": (8, 16, True, "x86-64-v3", ("avx2", "fma"), _WIDER_THAN_AVX2),
    "sse4": (4, 16, False, "x86-64-v2", ("sse4.2",), _WIDER_THAN_SSE4),
}
TARGET_NAMES = tuple(_NAMED)  # widest first
TARGET_CHOICES = ("host", *TARGET_NAMES)  # what command lines accept


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(LLVM CPU name, LLVM feature string) of this machine."""
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def _enabled(features: str) -> set[str]:
    return {item[1:] for item in features.split(",") if item.startswith("+")}


@dataclass(frozen=True)
class Target:
    """A vector ISA and the LLVM target machine that generates code for it."""

    isa: str  # "avx512", "avx2" or "sse4": the widest vector ISA the code may use
    vector_width: int  # float32 lanes per vector register
    registers: int  # architectural vector registers
    fma: bool  # fused multiply-add instructions (else the code multiplies, then adds)
    cpu: str  # LLVM CPU name (what the instruction scheduler models)
    features: str  # LLVM feature string ("+avx2,-avx512f,...")

    def __post_init__(self):
        if self.isa not in _NAMED:
            raise ValueError(f"unknown vector ISA {self.isa!r}; known: {', '.join(TARGET_NAMES)}")
        if self.vector_width not in (4, 8, 16) or self.registers not in (16, 32):
            raise ValueError(f"a target has 4, 8 or 16 lanes and 16 or 32 registers, got {self.vector_width} and {self.registers}")

    @classmethod
    def host(cls) -> "Target":
        """This machine: its widest vector ISA, with its own LLVM CPU name and features."""
        cpu, features = host_cpu()
        enabled = _enabled(features)
        isa = "avx512" if "avx512f" in enabled else "avx2" if {"avx2", "avx"} <= enabled else "sse4"
        width, registers, _, _, _, _ = _NAMED[isa]
        return cls(isa, width, registers, "fma" in enabled, cpu, features)

    @classmethod
    def named(cls, name: str) -> "Target":
        """A generic target for one vector ISA (``"avx512"``, ``"avx2"``, ``"sse4"``), or
        ``"host"`` for :meth:`host`."""
        if not isinstance(name, str):
            raise ValueError(f"a target name must be a string, got {type(name).__name__}")
        key = name.strip().lower()
        if key == "host":
            return cls.host()
        if key not in _NAMED:
            raise ValueError(f"unknown target {name!r}; known: host, {', '.join(TARGET_NAMES)}")
        width, registers, fma, cpu, required, switched_off = _NAMED[key]
        features = ",".join([f"+{f}" for f in required] + [f"-{f}" for f in switched_off])
        return cls(key, width, registers, fma, cpu, features)

    @classmethod
    def resolve(cls, target: "Target | str | None") -> "Target":
        """``target`` as a Target: None is the host, a string a name for :meth:`named`."""
        if target is None:
            return cls.host()
        if isinstance(target, Target):
            return target
        if isinstance(target, str):
            return cls.named(target)
        raise ValueError(f"target must be a looprl Target, a target name or None, got {type(target).__name__} {target!r}")

    # -- what fits the register file: the one rule the code generator plans with and the
    # schedules, tiles and demonstrations choose tiles by ----------------------------------
    def holds(self, accumulators: int, row_vectors: int = 1) -> bool:
        """Whether an output tile of ``accumulators`` registers, in rows of ``row_vectors``
        registers, stays in the register file with the inputs it needs live: the row's input
        vectors, which every row of the tile reuses (one register when the tile is a single
        row: each input vector is then used once), and one broadcast of the other operand."""
        shared = row_vectors if accumulators > row_vectors else 1
        return accumulators + shared + 1 <= self.registers

    def fits(self, rows: int, vectors: int) -> bool:
        """Whether a register tile of ``rows`` rows of ``vectors`` vectors fits (:meth:`holds`)."""
        return self.holds(rows * vectors, vectors)

    def most_rows(self, vectors: int) -> int:
        """The most rows of ``vectors`` vectors that fit (0: not even one)."""
        return max((rows for rows in range(1, self.registers + 1) if self.fits(rows, vectors)), default=0)

    def most_vectors(self, rows: int) -> int:
        """The most vectors per row that fit in a tile of ``rows`` rows (0: not even one)."""
        return max((vectors for vectors in range(1, self.registers + 1) if self.fits(rows, vectors)), default=0)

    def register_tiles(self) -> list[tuple[int, int]]:
        """Register tiles (rows, vectors) for expert schedules and tile searches, most
        accumulators first: for 2, 3 and 4 vectors per row the most rows that fit (at least
        two), and the widest tile of 4 rows."""
        tiles = [(self.most_rows(vectors), vectors) for vectors in (2, 3, 4) if self.most_rows(vectors) >= 2]
        if self.most_vectors(4):
            tiles.append((4, self.most_vectors(4)))
        tiles = sorted(set(tiles), key=lambda t: (-t[0] * t[1], -t[1]))
        return tiles or [(1, 1)]

    @staticmethod
    def required(value, what: str) -> "Target":
        """``value``, which must already be a Target (inner functions take a resolved one:
        :meth:`resolve` runs once at each public entry); else a ValueError naming ``what``."""
        if not isinstance(value, Target):
            raise ValueError(f"{what}: expected a looprl Target, got {type(value).__name__} {value!r}")
        return value

    @property
    def required_features(self) -> tuple[str, ...]:
        """The CPU features a host needs to run code compiled for this target."""
        required = _NAMED[self.isa][4]
        return tuple(f for f in required if f != "fma" or self.fma)

    def missing_on_host(self) -> tuple[str, ...]:
        """Required features this machine lacks (empty when it can run the code)."""
        enabled = _enabled(host_cpu()[1])
        return tuple(f for f in self.required_features if f not in enabled)

    def check_runs_on_host(self) -> None:
        """ValueError naming the missing features if this machine cannot run the target's code."""
        missing = self.missing_on_host()
        if missing:
            raise ValueError(f"this CPU cannot run code for target {self.isa!r} ({self.cpu}): it lacks {', '.join(missing)}")

    @property
    def key(self) -> str:
        """Identifies code generated for this target (the measurement cache key's target part)."""
        digest = hashlib.sha256(self.features.encode()).hexdigest()[:12]
        return f"{self.isa}|{self.cpu}|{digest}|{'fma' if self.fma else 'nofma'}"

    def to_dict(self) -> dict:
        """A JSON-ready description (policy metadata and reports)."""
        return {"isa": self.isa, "vector_width": self.vector_width, "registers": self.registers, "fma": self.fma, "cpu": self.cpu, "features": self.features}

    @classmethod
    def from_dict(cls, data: dict) -> "Target":
        """The inverse of :meth:`to_dict`; a ValueError names what is missing or wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"a target description must be an object, got {type(data).__name__}")
        try:
            values = {name: data[name] for name in ("isa", "vector_width", "registers", "fma", "cpu", "features")}
        except KeyError as missing:
            raise ValueError(f"a target description lacks {missing.args[0]!r}") from None
        kinds = {"isa": str, "vector_width": int, "registers": int, "fma": bool, "cpu": str, "features": str}
        for name, kind in kinds.items():
            if type(values[name]) is not kind:
                raise ValueError(f"target field {name!r} must be {kind.__name__}, got {values[name]!r}")
        return cls(**values)

    def __str__(self) -> str:
        return f"{self.isa} ({self.cpu}, {self.vector_width} lanes, {self.registers} registers{', FMA' if self.fma else ''})"


def host_target() -> Target:
    """This machine's target (:meth:`Target.host`)."""
    return Target.host()
