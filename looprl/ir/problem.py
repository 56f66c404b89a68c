"""Tensor contractions with constant sizes: what is to be computed, not how."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

_SPEC_RE = re.compile(r"^([a-z]*),([a-z]*)->([a-z]*)$")


@dataclass(frozen=True)
class Problem:
    """A float32 contraction ``out[o...] = sum(in0[i...] * in1[j...])`` of two inputs.

    ``spec`` is einsum notation with one lower-case letter per dimension
    (e.g. ``"mk,kn->mn"``); ``sizes`` maps every letter to its extent. All
    tensors are dense and row-major. Build one with :func:`matmul` or
    :func:`contraction`, which validate their arguments.
    """

    spec: str
    sizes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        _validate(self.spec, dict(self.sizes))

    # -- structure -----------------------------------------------------------------
    @cached_property
    def operands(self) -> tuple[str, str]:
        left, right = self.spec.split("->")[0].split(",")
        return left, right

    @property
    def output(self) -> str:
        return self.spec.split("->")[1]

    @cached_property
    def dims(self) -> tuple[str, ...]:
        """Every dimension in order of first appearance in the spec."""
        return _first_appearance(self.spec)

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if d not in self.output)

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    def shape(self, tensor: str) -> tuple[int, ...]:
        """Shape of ``tensor``, given by its index letters (e.g. ``"mk"``)."""
        return tuple(self.size(d) for d in tensor)

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.shape(self.operands[0]), self.shape(self.operands[1])

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.shape(self.output)

    @property
    def flops(self) -> int:
        """2 x the product of all loop extents (one multiply and one add each)."""
        total = 2
        for d in self.dims:
            total *= self.size(d)
        return total

    @property
    def name(self) -> str:
        """Stable, human-readable identifier, e.g. ``mk,kn->mn:m=64,k=32,n=16``."""
        return f"{self.spec}:" + ",".join(f"{d}={self.size(d)}" for d in self.dims)

    def __str__(self) -> str:
        return self.name

    def initial_nest(self):
        """The untiled nest in first-appearance order plus the write-back nest."""
        from looprl.ir.nest import LoopNest

        return LoopNest.initial(self)


def contraction(spec: str, /, sizes: Mapping[str, int] | None = None, **dims: int) -> Problem:
    """A contraction of two inputs in einsum notation, e.g.
    ``contraction("bmk,bkn->bmn", b=4, m=64, k=32, n=16)``."""
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a string like 'mk,kn->mn', got {spec!r}")
    merged = dict(sizes or {})
    merged.update(dims)
    spec = spec.replace(" ", "")
    _validate(spec, merged)
    return Problem(spec, tuple((d, int(merged[d])) for d in _first_appearance(spec)))


def matmul(m: int, n: int, k: int) -> Problem:
    """``C[m, n] = A[m, k] @ B[k, n]``; note the argument order (m, n, k)."""
    return contraction("mk,kn->mn", m=m, n=n, k=k)


def parse_problem(text: str) -> Problem:
    """Parse ``"MxNxK"`` (a matmul, m x n x k) or a :attr:`Problem.name` string."""
    text = text.strip()
    if ":" in text:
        spec, _, rest = text.partition(":")
        sizes = {}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"bad size {item!r} in problem {text!r}; expected letter=integer")
            sizes[key.strip()] = int(value)
        return contraction(spec, sizes)
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"cannot parse problem {text!r}; expected MxNxK or 'spec:m=..,n=..'")
    m, n, k = (int(p) for p in parts)
    return matmul(m, n, k)


def as_problem(item: Problem | str) -> Problem:
    """A :class:`Problem` from itself, ``"MxNxK"`` or a :attr:`Problem.name` string."""
    if isinstance(item, Problem):
        return item
    if isinstance(item, str):
        return parse_problem(item)
    raise ValueError(f"expected a Problem or a problem string like '128x64x256', got {type(item).__name__}")


def _first_appearance(spec: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(spec.replace(",", "").replace("->", "")))


def _validate(spec: str, sizes: Mapping[str, int]) -> None:
    match = _SPEC_RE.match(spec)
    if not match:
        raise ValueError(
            f"unsupported contraction spec {spec!r}: expected two inputs and one output of "
            "lower-case letters, like 'mk,kn->mn'"
        )
    left, right, out = match.groups()
    for name, term in (("first input", left), ("second input", right), ("output", out)):
        if not term:
            raise ValueError(f"spec {spec!r}: the {name} has no dimensions (scalars are not supported)")
        if len(set(term)) != len(term):
            raise ValueError(f"spec {spec!r}: the {name} {term!r} repeats a dimension (diagonals are not supported)")
    missing_out = sorted(set(out) - set(left) - set(right))
    if missing_out:
        raise ValueError(f"spec {spec!r}: output dimension(s) {missing_out} appear in no input")
    letters = set(left) | set(right)
    unknown = sorted(set(sizes) - letters)
    if unknown:
        raise ValueError(f"spec {spec!r}: sizes given for unknown dimension(s) {unknown}")
    absent = sorted(letters - set(sizes))
    if absent:
        raise ValueError(f"spec {spec!r}: no size given for dimension(s) {absent}")
    for dim, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
            raise ValueError(f"size of {dim!r} must be an integer, got {value!r}")
        if int(value) < 1:
            raise ValueError(f"size of {dim!r} must be >= 1, got {value}")
