"""A problem's epilogue done the way numpy users do it: one numpy call per step, in place.

``out = activation(scale * out + bias) + residual`` after the contraction, each step a
separate pass over the output (a scratch array of the output's shape is given, so nothing is
allocated while timing). gelu's erf is ``scipy.special.erf`` when scipy is installed (what a
numpy user calls; it is not a dependency of looprl), else the code generator's own rational
approximation evaluated with numpy operations; :func:`erf_source` says which.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from looprl.backend.epilogue_ir import ERF_LIMIT, ERF_P, ERF_Q, GELU_TANH_C, GELU_TANH_CUBE
from looprl.ir.epilogue import Epilogue


@lru_cache(maxsize=1)
def _scipy_erf():
    """scipy's erf, imported once (the import takes ~0.1 s: call :func:`erf_source` before
    timing), or None."""
    try:
        from scipy.special import erf
    except ImportError:
        return None
    return erf


def erf_source() -> str:
    """Where numpy's gelu gets erf: ``"scipy.special.erf"`` or ``"numpy polynomial"``."""
    return "scipy.special.erf" if _scipy_erf() is not None else "numpy polynomial"


def _numpy_erf(x: np.ndarray, out: np.ndarray) -> None:
    """erf(x) into ``out`` by the generated code's rational function, with numpy calls."""
    z = np.clip(x, -ERF_LIMIT, ERF_LIMIT)
    t = z * z
    p = np.full_like(t, ERF_P[-1])
    for c in reversed(ERF_P[:-1]):
        p *= t
        p += np.float32(c)
    q = np.full_like(t, ERF_Q[-1])
    for c in reversed(ERF_Q[:-1]):
        q *= t
        q += np.float32(c)
    np.multiply(z, p, out=out)
    out /= q


def apply_epilogue(epilogue: Epilogue, out: np.ndarray, scratch: np.ndarray, bias: np.ndarray | None = None,
                   residual: np.ndarray | None = None) -> None:
    """Apply ``epilogue`` to ``out`` in place, step by step (``scratch``: float32, out's shape)."""
    if epilogue.scale != 1.0:
        out *= np.float32(epilogue.scale)
    if epilogue.bias:
        out += bias
    activation = epilogue.activation
    if activation == "relu":
        np.maximum(out, np.float32(0.0), out=out)
    elif activation == "gelu":
        np.multiply(out, np.float32(1.0 / math.sqrt(2.0)), out=scratch)
        erf = _scipy_erf()
        if erf is not None:
            erf(scratch, out=scratch)
        else:
            _numpy_erf(scratch.copy(), scratch)
        scratch += np.float32(1.0)
        out *= scratch
        out *= np.float32(0.5)
    elif activation == "gelu_tanh":
        np.multiply(out, out, out=scratch)
        scratch *= np.float32(GELU_TANH_C * GELU_TANH_CUBE)
        scratch += np.float32(GELU_TANH_C)
        scratch *= out
        np.tanh(scratch, out=scratch)
        scratch += np.float32(1.0)
        out *= scratch
        out *= np.float32(0.5)
    elif activation == "silu":
        np.negative(out, out=scratch)
        np.exp(scratch, out=scratch)
        scratch += np.float32(1.0)
        out /= scratch
    if epilogue.residual:
        out += residual
