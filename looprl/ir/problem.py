"""Tensor contractions with constant sizes: what is to be computed, not how."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Mapping, Sequence

from looprl import checks, defaults
from looprl.ir.dtypes import DEFAULT_DTYPE, DType, as_dtype
from looprl.ir.epilogue import IDENTITY, Epilogue, as_epilogue

_SPEC_RE = re.compile(r"([a-z]*),([a-z]*)->([a-z]*)")  # used with fullmatch: no trailing "\n"
_MATMUL_RE = re.compile(r"\s*([0-9]+)\s*x\s*([0-9]+)\s*x\s*([0-9]+)\s*", re.ASCII | re.IGNORECASE)
_SIZE_RE = re.compile(r"\s*([^=\s]*)\s*=\s*(-?[0-9]+)\s*", re.ASCII)


@dataclass(frozen=True)
class Problem:
    """A contraction ``out[o...] = sum(in0[i...] * in1[j...])`` of two inputs.

    ``spec`` is einsum notation with one lower-case letter per dimension
    (e.g. ``"mk,kn->mn"``); ``sizes`` maps every letter to its extent. All
    tensors are dense and row-major. Build one with :func:`matmul` or
    :func:`contraction`. Construction validates the spec and the sizes, stores the sizes as
    Python ints in first-appearance order, and refuses problems whose buffers would not fit
    in :data:`looprl.defaults.MAX_BUFFER_BYTES` or whose indices would overflow ``i64``.

    ``constant`` names inputs (``"in0"``, ``"in1"``) that stay the same from call to call (a
    weight, as in ALT): a schedule that stores one in another layout converts it once, when
    the kernel is bound to it, so its conversion is not part of the measured time. It is part
    of :attr:`name` (``...;const=in1``) only when set.

    ``epilogue`` (:class:`~looprl.ir.epilogue.Epilogue`, its key text, or None for the
    identity) is applied element-wise to the output: ``activation(scale * out + bias) +
    residual``, with a bias over the output's last dimension and a residual of the output's
    shape as extra inputs (:attr:`epilogue_shapes`). It is part of :attr:`name`
    (``...;epilogue=bias+gelu``) unless it is the identity. :attr:`flops` counts the
    contraction only.

    ``between``: bytes that other work reads between two calls of the problem (a model's other
    layers, in a decode step, between two calls of this layer), which evict its constant inputs
    (weights) from the caches as far as they reach: 0 (the default) for calls back to back, the
    weights as warm as the caches keep them; :data:`COLD` for "more than any cache holds" (the
    weights read from memory on every call: ``cold``, a problem's name saying ``;cold``). A
    problem with bytes between is timed so (:func:`looprl.measurement.timing.time_kernel` rotates
    copies of its constant inputs: as many as put that many bytes between two uses of one
    copy), and its schedules are searched for that; it needs a constant input. Part of
    :attr:`name` (``...;between=<bytes>``, or ``...;cold``) only when set.

    ``dtype``: the tensors' element type, a :class:`~looprl.ir.dtypes.DType` (given as one or as
    anything :func:`~looprl.ir.dtypes.as_dtype` takes): float32 (the default) or bfloat16
    (inputs, output and epilogue inputs in bfloat16, products and sums in float32, the output
    rounded once: :mod:`looprl.ir.dtypes`). Part of :attr:`name` (``...;dtype=bfloat16``) only
    when it is not float32.
    """

    spec: str
    sizes: tuple[tuple[str, int], ...]
    constant: tuple[str, ...] = ()
    epilogue: Epilogue = IDENTITY
    between: int = 0
    dtype: DType = DEFAULT_DTYPE

    def __post_init__(self) -> None:
        object.__setattr__(self, "epilogue", as_epilogue(self.epilogue))
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        sizes = _validate(self.spec, _size_pairs(self.sizes), self.epilogue, self.dtype)
        object.__setattr__(self, "sizes", tuple((d, sizes[d]) for d in _first_appearance(self.spec)))
        constant = self.constant
        if isinstance(constant, str):
            constant = (constant,)
        try:
            names = set(constant)
        except TypeError:
            raise ValueError(f"constant must be a sequence of input names ('in0', 'in1'), got {self.constant!r}") from None
        names = {_INPUT_ALIASES.get(n, n) if isinstance(n, str) else n for n in names}
        if not names <= {"in0", "in1"}:
            raise ValueError(f"constant inputs must be 'in0'/'a' (the first) or 'in1'/'b' (the second), got {self.constant!r}")
        object.__setattr__(self, "constant", tuple(sorted(names)))
        object.__setattr__(self, "between", _between_bytes(self.between))
        if self.between and not self.constant:
            raise ValueError("bytes read between calls (cold=True, between=) evict constant inputs (weights): the problem has none; "
                             "give constant='in1' (or 'in0') too")

    @property
    def cold(self) -> bool:
        """Whether other work reads anything between two calls (:attr:`between` > 0)."""
        return self.between > 0

    # -- structure -----------------------------------------------------------------
    @cached_property
    def operands(self) -> tuple[str, str]:
        left, right = self.spec.split("->")[0].split(",")
        return left, right

    @property
    def output(self) -> str:
        return self.spec.split("->")[1]

    @cached_property
    def row_dim(self) -> str | None:
        """The output's leading dimension when it also leads the first input and is not in the
        second (the *rows*: any leading part of them is a contiguous prefix of the first input
        and of the output, so a kernel may compute fewer of them: runtime rows), else None."""
        first = self.output[0]
        left, right = self.operands
        return first if left[0] == first and first not in right else None

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
    def element_bytes(self) -> int:
        """Bytes of one element of the inputs and the output (4 for float32, 2 for bfloat16)."""
        return self.dtype.element_bytes

    @property
    def constant_bytes(self) -> int:
        """Bytes of the constant inputs (the weights that bytes between calls evict)."""
        shapes = dict(zip(("in0", "in1"), self.input_shapes))
        return self.element_bytes * sum(math.prod(shapes[t]) for t in self.constant)

    @property
    def epilogue_shapes(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The epilogue's extra inputs in call order, with their shapes: ``("bias", (n,))``
        (``n`` the output's last extent) and ``("residual", output shape)``."""
        shapes = {"bias": (self.size(self.output[-1]),), "residual": self.output_shape}
        return tuple((name, shapes[name]) for name in self.epilogue.inputs)

    def with_epilogue(self, epilogue=None, **parts) -> "Problem":
        """This problem with ``epilogue`` (an :class:`~looprl.ir.epilogue.Epilogue`, its key
        or None), or with one built from ``parts`` (``scale=``, ``bias=``, ``activation=``,
        ``residual=``)."""
        if epilogue is not None and parts:
            raise ValueError("give an epilogue or its parts (scale=, bias=, activation=, residual=), not both")
        unknown = sorted(set(parts) - {"scale", "bias", "activation", "residual"})
        if unknown:
            raise ValueError(f"unknown epilogue part(s) {unknown}; expected scale=, bias=, activation=, residual=")
        return replace(self, epilogue=Epilogue(**parts) if parts else as_epilogue(epilogue))

    def with_cold(self, cold: bool = True) -> "Problem":
        """This problem with its constant inputs read from memory on every call (``cold``:
        :data:`COLD` bytes between calls), or called back to back (see :class:`Problem`)."""
        return self.with_between(COLD if checks.flag(cold, "cold") else 0)

    def with_between(self, between: int) -> "Problem":
        """This problem with ``between`` bytes read by other work between two calls (see :class:`Problem`)."""
        return replace(self, between=between)

    def with_dtype(self, dtype) -> "Problem":
        """This problem with tensors of ``dtype`` (a :class:`~looprl.ir.dtypes.DType`, ``"float32"`` or ``"bfloat16"``)."""
        return replace(self, dtype=as_dtype(dtype))

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
        text = f"{self.spec}:" + ",".join(f"{d}={self.size(d)}" for d in self.dims)
        if self.constant:
            text += ";const=" + ",".join(self.constant)
        if not self.epilogue.is_identity:
            text += ";epilogue=" + self.epilogue.key
        if self.between == COLD:
            text += ";cold"
        elif self.between:
            text += f";between={self.between}"
        if self.dtype != DEFAULT_DTYPE:
            text += f";dtype={self.dtype.name}"
        return text

    def __str__(self) -> str:
        return self.name



_INPUT_ALIASES = {"a": "in0", "b": "in1"}
# Bytes between calls that stand for "more than any cache holds" (a problem named ``;cold``): 1 TiB.
COLD = 2**40


def _between_bytes(value) -> int:
    if isinstance(value, bool):  # the former ``cold`` flag, given where the bytes go now
        return COLD if value else 0
    return checks.integer(value, "bytes read between calls (between)", minimum=0)


def contraction(spec: str, /, sizes: Mapping[str, int] | None = None, *, constant=(), epilogue=None, cold=False, between: int = 0,
                dtype=DEFAULT_DTYPE, **dims: int) -> Problem:
    """A contraction of two inputs in einsum notation, e.g.
    ``contraction("bmk,bkn->bmn", b=4, m=64, k=32, n=16)``; ``constant``, ``epilogue``, ``between`` and
    ``dtype``: see :class:`Problem` (``cold=True``: :data:`COLD` bytes between).

    Spaces in ``spec`` are ignored; any other character outside ``a-z , ->`` (a newline or a
    tab included) is an error. Sizes may be Python or numpy integers."""
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a string like 'mk,kn->mn', got {spec!r}")
    if sizes is not None and not isinstance(sizes, Mapping):
        raise ValueError(f"sizes must be a mapping of dimension letter to size, got {type(sizes).__name__}")
    merged = dict(sizes or {})
    twice = sorted(set(merged) & set(dims), key=repr)
    if twice:
        raise ValueError(f"size(s) of {twice} given both in the sizes mapping and as keywords")
    merged.update(dims)
    if checks.flag(cold, "cold") and between:
        raise ValueError("give cold=True or between=<bytes>, not both")
    return Problem(spec.replace(" ", ""), tuple(merged.items()), constant, epilogue, COLD if cold else between, dtype)


def matmul(m: int, n: int, k: int, *, constant=(), epilogue=None, dtype=DEFAULT_DTYPE) -> Problem:
    """``C[m, n] = A[m, k] @ B[k, n]``; note the argument order (m, n, k). ``constant``:
    inputs that are weights (``"b"`` for B); ``epilogue`` and ``dtype``: see :class:`Problem`."""
    return contraction("mk,kn->mn", m=m, n=n, k=k, constant=constant, epilogue=epilogue, dtype=dtype)


def parse_problem(text: str) -> Problem:
    """Parse ``"MxNxK"`` (a matmul, m x n x k) or a :attr:`Problem.name` string (with its
    optional ``;const=...``, ``;epilogue=...``, ``;cold`` or ``;between=<bytes>`` and
    ``;dtype=bfloat16`` parts).

    Surrounding whitespace is ignored; anything else that is not part of the syntax is a
    :class:`ValueError`."""
    if not isinstance(text, str):
        raise ValueError(f"expected a problem string like '128x64x256' or 'mk,kn->mn:m=..,k=..,n=..', got {type(text).__name__}")
    text = text.strip()
    if ";" in text:
        base, *parts = text.split(";")
        options: dict[str, str] = {}
        for part in parts:
            key, equals, value = part.partition("=")
            key = key.strip()
            if (not equals or key not in ("const", "epilogue", "between", "dtype")) and not (key == "cold" and not equals):
                raise ValueError(f"bad part {part!r} of problem {text!r}; expected ';const=<inputs>', ';epilogue=<parts>', ';cold', "
                                 "';between=<bytes>' or ';dtype=<float32|bfloat16>'")
            if key in options:
                raise ValueError(f"problem {text!r} gives {key} twice")
            options[key] = value
        problem = parse_problem(base)
        constant = tuple(n.strip() for n in options["const"].split(",")) if "const" in options else ()
        if "cold" in options and "between" in options:
            raise ValueError(f"problem {text!r} gives ';cold' and ';between=': one of them")
        between = COLD if "cold" in options else _parsed_bytes(options.get("between", "0"), text)
        return Problem(problem.spec, problem.sizes, constant, Epilogue.from_key(options.get("epilogue", "")), between,
                       options.get("dtype", DEFAULT_DTYPE.name).strip())
    if ":" in text:
        spec, _, rest = text.partition(":")
        sizes: dict[str, int] = {}
        for item in rest.split(","):
            match = _SIZE_RE.fullmatch(item)
            if not match:
                raise ValueError(f"bad size {item!r} in problem {text!r}; expected letter=integer, comma-separated")
            key, value = match.groups()
            if key in sizes:
                raise ValueError(f"size of {key!r} given twice in problem {text!r}")
            sizes[key] = int(value)
        return contraction(spec, sizes)
    match = _MATMUL_RE.fullmatch(text)
    if not match:
        raise ValueError(f"cannot parse problem {text!r}; expected MxNxK or 'spec:m=..,n=..'")
    m, n, k = (int(p) for p in match.groups())
    return matmul(m, n, k)


def parse_problems(items: str | Sequence[str]) -> list[Problem]:
    """Problems from command-line text: whitespace-separated items (or a list of them), each
    either comma-separated ``MxNxK`` matmuls or one problem name, whose spec has its own
    commas (``"mk,nk->mn:m=128,n=96,k=64"``, written without spaces)."""
    if isinstance(items, str):
        items = [items]
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Sequence):
        raise ValueError(f"expected problem strings, got {type(items).__name__}")
    texts = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"expected problem strings, got {type(item).__name__} {item!r}")
        for word in item.split():
            texts += [word] if ":" in word else [part for part in word.split(",") if part]
    if not texts:
        raise ValueError("no problems given")
    return [parse_problem(text) for text in texts]


def _parsed_bytes(text: str, problem: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"problem {problem!r}: ';between=' takes a whole number of bytes, got {text!r}")
    return int(text)


def as_problem(item: Problem | str) -> Problem:
    """A :class:`Problem` from itself, ``"MxNxK"`` or a :attr:`Problem.name` string."""
    if isinstance(item, Problem):
        return item
    if isinstance(item, str):
        return parse_problem(item)
    raise ValueError(f"expected a Problem or a problem string like '128x64x256', got {type(item).__name__}")


def _first_appearance(spec: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(spec.replace(",", "").replace("->", "")))


def _size_pairs(sizes) -> dict:
    """``sizes`` (pairs of dimension and size, or a mapping) as a dict; repeats are errors."""
    if isinstance(sizes, Mapping):
        return dict(sizes)
    try:
        pairs = [tuple(pair) for pair in sizes]
    except TypeError:
        raise ValueError(f"sizes must be (dimension, size) pairs, got {sizes!r}") from None
    if not all(len(pair) == 2 for pair in pairs):
        raise ValueError(f"sizes must be (dimension, size) pairs, got {sizes!r}")
    try:
        result = dict(pairs)
    except TypeError:
        raise ValueError(f"sizes {sizes!r}: dimension names must be letters") from None
    if len(result) != len(pairs):
        raise ValueError(f"sizes {sizes!r} give a dimension twice")
    return result


def _validate(spec: str, sizes: Mapping[str, int], epilogue: Epilogue = IDENTITY, dtype: DType = DEFAULT_DTYPE) -> dict[str, int]:
    """Check ``spec`` and ``sizes``; the sizes as Python ints."""
    if not isinstance(spec, str):
        raise ValueError(f"spec must be a string like 'mk,kn->mn', got {spec!r}")
    match = _SPEC_RE.fullmatch(spec)
    if not match:
        raise ValueError(
            f"unsupported contraction spec {spec!r}: expected two inputs and one output of lower-case letters, like 'mk,kn->mn'"
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
    unknown = sorted(set(sizes) - letters, key=repr)
    if unknown:
        raise ValueError(f"spec {spec!r}: sizes given for unknown dimension(s) {unknown}")
    absent = sorted(letters - set(sizes))
    if absent:
        raise ValueError(f"spec {spec!r}: no size given for dimension(s) {absent}")
    result = {}
    for dim, value in sizes.items():
        result[dim] = checks.positive_int(value, f"size of {dim!r}")
    _check_limits(spec, (left, right, out), result, epilogue, dtype)
    return result


def _check_limits(spec: str, terms: tuple[str, str, str], sizes: dict[str, int], epilogue: Epilogue = IDENTITY,
                  dtype: DType = DEFAULT_DTYPE) -> None:
    """Refuse sizes whose tensors or flop count overflow ``i64``, or whose buffers (two inputs,
    the output and the epilogue's bias and residual in ``dtype``, the accumulator in its accumulation type)
    exceed ``defaults.MAX_BUFFER_BYTES``. Exact: Python ints do not overflow."""
    described = f"{spec} with " + ", ".join(f"{d}={sizes[d]}" for d in _first_appearance(spec))
    elements = [math.prod(sizes[d] for d in term) for term in terms]
    for name, term, count in zip(("first input", "second input", "output"), terms, elements):
        if count > checks.INT64_MAX:
            raise ValueError(
                f"problem {described}: the {name} {term!r} has {count} elements, more than a signed "
                "64-bit integer holds: its flat index overflows (the generated code indexes and counts with i64)"
            )
    flops = 2 * math.prod(sizes.values())
    if flops > checks.INT64_MAX:
        raise ValueError(f"problem {described}: its flop count 2 x {flops // 2} = {flops} overflows a signed 64-bit integer")
    size = dtype.element_bytes
    needed = size * (elements[0] + elements[1] + elements[2]) + dtype.accumulator.element_bytes * elements[2]  # + the accumulator
    needed += size * (sizes[terms[2][-1]] * epilogue.bias + elements[2] * epilogue.residual)
    limit = defaults.MAX_BUFFER_BYTES
    if needed > limit:
        raise ValueError(
            f"problem {described} is too large: its buffers (two inputs, output and "
            f"accumulator{', epilogue inputs' if epilogue.inputs else ''}) need {needed} bytes ({_in_units(needed)}), more than "
            f"looprl.defaults.MAX_BUFFER_BYTES = {limit} ({_in_units(limit)})"
        )


def _in_units(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps the number >= 1."""
    if count < 1024:
        return f"{count} bytes"
    value, unit = count / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.4g} {unit}"
