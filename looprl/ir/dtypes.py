"""Element types of a problem's tensors: float32, or bfloat16 (the format CPU inference of
recent models runs in).

A dtype is a :class:`DType`: a value that holds every fact looprl's modules ask of an element
type (its size, the type its products are summed in, how a result is rounded to it, how numpy
and the generated code hold it, what a target can do with it). :data:`FLOAT32` and
:data:`BFLOAT16` are the two; :func:`as_dtype` turns a name, numpy's float32 or a torch dtype
into one. A dtype's :attr:`~DType.name` is its text in problem names, cache keys, records,
JSON and command lines.

A problem of dtype bfloat16 has bfloat16 inputs, output and epilogue inputs (bias, residual),
and float32 arithmetic: every product and sum is computed in float32 (a product of two bfloat16
values is exact in float32) and the output is rounded to bfloat16 once, at the end, to nearest,
ties to even (as PyTorch rounds). The kernels' workspace (the accumulator, the inputs converted
into other layouts) is the accumulation type, float32, for both.

numpy has no bfloat16: looprl's kernels take and return bfloat16 tensors as ``numpy.uint16``
arrays of their bits (:func:`to_bfloat16` makes them from float32, :func:`from_bfloat16` reads
them back); :mod:`looprl.torch` passes ``torch.bfloat16`` tensors' memory as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEAREST_EVEN = "nearest-even"  # to nearest, ties to even (as PyTorch rounds float32 to bfloat16)


@dataclass(frozen=True, eq=False)
class DType:
    """One element type of a problem's tensors, with the facts every module asks of it.

    Two dtypes are equal when their names are; a dtype is also equal to (and hashes as) its
    name, as numpy's dtypes are, so a caller's ``problem.dtype == "bfloat16"`` and a dict keyed
    by names keep working. ``str()`` of a dtype is its name. Only :data:`FLOAT32` and
    :data:`BFLOAT16` exist (made once, here; a pickled one comes back as the same object)."""

    name: str  # "float32", "bfloat16": the text in problem names, keys, records and command lines
    element_bytes: int  # bytes one element takes in memory
    significand_bits: int  # the implicit leading one included (float32: 24, bfloat16: 8)
    accumulation: str  # the name of the dtype its products are computed and summed in
    rounding: str | None  # how a result in the accumulation type is rounded to it (None: it is that type)
    storage: np.dtype  # the numpy dtype of an array holding it, handed to a kernel (bfloat16: uint16 bits)
    llvm_element: str  # the LLVM IR element type a kernel addresses a tensor of it with
    dot_pairs: bool  # a dot instruction (vdpbf16ps) multiplies pairs of it into one float32 lane where a target has it

    @property
    def accumulator(self) -> "DType":
        """The dtype its products are computed and summed in (float32 for both)."""
        return as_dtype(self.accumulation)

    @property
    def rounds_output(self) -> bool:
        """Whether a kernel rounds its output from the accumulator to this dtype."""
        return self.rounding is not None

    @property
    def unit_roundoff(self) -> float:
        """The largest relative error of rounding a real number to this dtype (to nearest):
        2^-24 for float32, 2^-8 for bfloat16."""
        return 2.0 ** -self.significand_bits

    @property
    def exact_products(self) -> bool:
        """Whether the product of two values of this dtype is exact in the accumulator (its
        significand holds both factors' significand bits): bfloat16 yes (8 + 8 <= 24), float32 no."""
        return 2 * self.significand_bits <= self.accumulator.significand_bits

    @property
    def numpy_computes(self) -> bool:
        """Whether numpy computes in this dtype (it stores it as a float type of its own): not
        bfloat16, which numpy holds as bits."""
        return self.storage.kind == "f"

    def pairs_on(self, target) -> bool:
        """Whether code for ``target`` (a :class:`~looprl.target.Target`) multiplies pairs of
        this dtype into one float32 lane with a dot instruction (bfloat16 where the target has
        ``vdpbf16ps``: :attr:`~looprl.target.Target.bfloat16_dot`)."""
        return self.dot_pairs and target.bfloat16_dot

    def reduction_lanes(self, target) -> int:
        """Reduction elements one vector of a dot product's partial sums takes per step on
        ``target``: its vector width, twice it where :meth:`pairs_on` (a pair per lane)."""
        return target.vector_width * (2 if self.pairs_on(target) else 1)

    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DType({self.name!r})"

    def __reduce__(self):
        return as_dtype, (self.name,)


FLOAT32 = DType("float32", element_bytes=4, significand_bits=24, accumulation="float32", rounding=None,
                storage=np.dtype(np.float32), llvm_element="float", dot_pairs=False)
BFLOAT16 = DType("bfloat16", element_bytes=2, significand_bits=8, accumulation="float32", rounding=NEAREST_EVEN,
                 storage=np.dtype(np.uint16), llvm_element="i16", dot_pairs=True)
DEFAULT_DTYPE = FLOAT32  # a problem's dtype unless one is given; unnamed in problem names and keys
_BY_NAME = {dtype.name: dtype for dtype in (FLOAT32, BFLOAT16)}
DTYPES = tuple(_BY_NAME)  # the dtypes' names: what command lines and configurations take


def as_dtype(value) -> DType:
    """``value`` (:data:`FLOAT32` or :data:`BFLOAT16`, its name, numpy's float32, or a
    ``torch.dtype`` of either) as its :class:`DType`; a ValueError naming the dtypes looprl
    takes otherwise (a DType made elsewhere included: its kernels would not exist)."""
    if isinstance(value, DType):
        if _BY_NAME.get(value.name) is value:
            return value
    elif isinstance(value, str):
        if value in _BY_NAME:
            return _BY_NAME[value]
    elif getattr(value, "__module__", "") == "torch" and str(value).removeprefix("torch.") in _BY_NAME:
        return _BY_NAME[str(value).removeprefix("torch.")]
    else:
        try:
            if np.dtype(value) == np.float32:
                return FLOAT32
        except TypeError:
            pass
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {value!r}")


def unit_roundoff(dtype) -> float:
    """The largest relative error of rounding a real number to ``dtype`` (to nearest):
    :attr:`DType.unit_roundoff`."""
    return as_dtype(dtype).unit_roundoff


def to_bfloat16(values) -> np.ndarray:
    """The bits (``uint16``, same shape, C-contiguous) of ``values`` (anything numpy reads as
    float32) rounded to bfloat16: to nearest, ties to even; NaN stays a (quiet) NaN, infinities
    and overflow to infinity as in float32 rounding."""
    floats = np.ascontiguousarray(values, dtype=np.float32)
    bits = floats.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(floats)
    result = rounded.astype(np.uint16)
    result[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return result


def from_bfloat16(bits) -> np.ndarray:
    """float32 values of bfloat16 ``bits`` (a ``uint16`` array): exact."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise ValueError(f"bfloat16 values are given as their bits in a uint16 array, got dtype {bits.dtype}")
    return (bits.astype(np.uint32) << 16).view(np.float32)


def storage(values, dtype) -> np.ndarray:
    """float32 ``values`` in the numpy storage of ``dtype`` (:attr:`DType.storage`): a float32
    array, or bfloat16 bits (rounded: :func:`to_bfloat16`)."""
    dtype = as_dtype(dtype)
    return np.ascontiguousarray(values, dtype=dtype.storage) if dtype.numpy_computes else to_bfloat16(values)


def as_float32(array, dtype) -> np.ndarray:
    """The float32 values of ``array``, stored as ``dtype`` stores them (:func:`storage`)."""
    return np.asarray(array, dtype=np.float32) if as_dtype(dtype).numpy_computes else from_bfloat16(array)


def error_bound(spec: str, a, b, reductions: int, dtype) -> np.ndarray:
    """How far a kernel's output may be from the exact contraction ``spec`` of ``a`` and ``b``
    (float32 values, exactly as the kernel reads them: for bfloat16 the rounded inputs), per
    output element, with ``reductions`` products summed into each (the product of the
    reduction extents): derived, not fitted.

    Products of two bfloat16 values are exact in float32 (8 + 8 significand bits), those of
    float32 values rounded once (u = 2^-24); summing ``k`` terms in float32 in any order (the
    register tiles, the partial sums of dot products, the parallel splits) errs by at most
    gamma_k = k u / (1 - k u) times the sum of their magnitudes (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 3.1); rounding the result to the output's dtype adds
    its unit roundoff times the result's magnitude. So, with ``S = sum |a| |b|``:
    ``gamma_n S (1 + u_out) + u_out |exact|``, n = k (+1 where products round). For bfloat16,
    ``vdpbf16ps`` also treats subnormal inputs and results as zeros: at most 2^-126 (max |a| +
    max |b| + 1) per term more."""
    dtype = as_dtype(dtype)
    u = dtype.accumulator.unit_roundoff
    terms = reductions + (not dtype.exact_products)
    gamma = terms * u / (1 - terms * u)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    magnitude = np.einsum(spec, np.abs(a64), np.abs(b64))
    exact = np.einsum(spec, a64, b64)
    rounding = dtype.unit_roundoff if dtype.rounds_output else 0.0
    flushed = 0.0
    if dtype.dot_pairs and a64.size and b64.size:  # the dot instruction flushes subnormals
        flushed = reductions * 2.0**-126 * (np.abs(a64).max() + np.abs(b64).max() + 1)
    return gamma * magnitude * (1 + rounding) + rounding * np.abs(exact) + flushed
