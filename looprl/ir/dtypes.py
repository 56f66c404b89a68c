"""Element types of a problem's tensors: float32, or bfloat16 (the format CPU inference of
recent models runs in).

A problem of dtype ``"bfloat16"`` has bfloat16 inputs, output and epilogue inputs (bias,
residual), and float32 arithmetic: every product and sum is computed in float32 (a product of
two bfloat16 values is exact in float32) and the output is rounded to bfloat16 once, at the
end, to nearest, ties to even (as PyTorch rounds). The kernels' workspace (the accumulator, the
inputs converted into other layouts) is float32 for both.

numpy has no bfloat16: looprl's kernels take and return bfloat16 tensors as ``numpy.uint16``
arrays of their bits (:func:`to_bfloat16` makes them from float32, :func:`from_bfloat16` reads
them back); :mod:`looprl.torch` passes ``torch.bfloat16`` tensors' memory as it is.
"""

from __future__ import annotations

import numpy as np

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
DTYPES = (FLOAT32, BFLOAT16)
ELEMENT_BYTES = {FLOAT32: 4, BFLOAT16: 2}
# How a tensor of each dtype is stored in a numpy array handed to a kernel.
NUMPY_STORAGE = {FLOAT32: np.dtype(np.float32), BFLOAT16: np.dtype(np.uint16)}
# The element type a kernel's LLVM IR addresses a tensor of each dtype with.
LLVM_ELEMENT = {FLOAT32: "float", BFLOAT16: "i16"}
# Significand bits of each dtype, the implicit one included (float32: 24, bfloat16: 8).
SIGNIFICAND_BITS = {FLOAT32: 24, BFLOAT16: 8}


def as_dtype(value) -> str:
    """``value`` (``"float32"``, ``"bfloat16"``, numpy's float32, or a ``torch.dtype`` of either)
    as its name; a ValueError naming the dtypes looprl takes otherwise."""
    if isinstance(value, str) and value in DTYPES:
        return value
    name = getattr(value, "__module__", "") == "torch" and str(value).removeprefix("torch.")
    if name in DTYPES:
        return name
    try:
        if not isinstance(value, str) and np.dtype(value) == np.float32:
            return FLOAT32
    except TypeError:
        pass
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {value!r}")


def unit_roundoff(dtype: str) -> float:
    """The largest relative error of rounding a real number to ``dtype`` (to nearest): 2^-24 for
    float32, 2^-8 for bfloat16."""
    return 2.0 ** -SIGNIFICAND_BITS[as_dtype(dtype)]


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


def storage(values, dtype: str) -> np.ndarray:
    """float32 ``values`` in the numpy storage of ``dtype`` (:data:`NUMPY_STORAGE`): a float32
    array, or bfloat16 bits."""
    return np.ascontiguousarray(values, dtype=np.float32) if as_dtype(dtype) == FLOAT32 else to_bfloat16(values)


def as_float32(array, dtype: str) -> np.ndarray:
    """The float32 values of ``array``, stored as ``dtype`` stores them (:func:`storage`)."""
    return np.asarray(array, dtype=np.float32) if as_dtype(dtype) == FLOAT32 else from_bfloat16(array)


def error_bound(spec: str, a, b, reductions: int, dtype: str) -> np.ndarray:
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
    u = unit_roundoff(FLOAT32)
    terms = reductions + (dtype == FLOAT32)
    gamma = terms * u / (1 - terms * u)
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    magnitude = np.einsum(spec, np.abs(a64), np.abs(b64))
    exact = np.einsum(spec, a64, b64)
    rounding = 0.0 if dtype == FLOAT32 else unit_roundoff(dtype)
    flushed = 0.0
    if dtype != FLOAT32 and a64.size and b64.size:
        flushed = reductions * 2.0**-126 * (np.abs(a64).max() + np.abs(b64).max() + 1)
    return gamma * magnitude * (1 + rounding) + rounding * np.abs(exact) + flushed
