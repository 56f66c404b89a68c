"""Derive the coefficients of the vectorised erf and exp that the code generator's epilogues
use (``looprl/backend/epilogue_ir.py``), and print them.

Both are fitted in float64 by Lawson's iteratively reweighted least squares, which converges
towards the minimax (equioscillating) fit:

* erf(x) ~ x * P(x^2) / Q(x^2) on 0 <= x <= 4 (erf is odd; beyond 4 it is 1 to float32
  precision, and the kernel clamps its argument there), P of degree 5, Q of degree 5 with
  Q(0) = 1; the rational form is linearised as x P - erf Q and reweighted by 1 / Q
  (Sanathanan-Koerner) so that the fit minimises the error of the ratio itself;
* exp(r) ~ polynomial of degree 6 on |r| <= ln(2) / 2 (after the range reduction
  x = n ln 2 + r), minimising the relative error.

    python experiments/fit_epilogue_polynomials.py

Nothing here runs at import time of looprl; the printed values are written into the module by
hand, rounded to float32, and tests/backend/test_epilogue_math.py checks their error in float32.
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def lawson(columns: np.ndarray, target: np.ndarray, rounds: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients c minimising max |columns @ c - target| (approximately), and the errors."""
    weights = np.ones(len(target))
    for _ in range(rounds):
        root = np.sqrt(weights)
        solution, *_ = np.linalg.lstsq(columns * root[:, None], target * root, rcond=None)
        errors = columns @ solution - target
        weights = np.maximum(weights * np.abs(errors), 1e-14)
        weights /= weights.sum()
    return solution, errors


def fit_erf(p_degree: int = 5, q_degree: int = 5, limit: float = 4.0, points: int = 20001):
    x = np.linspace(0.0, limit, points)
    t = x * x
    f = np.array([math.erf(v) for v in x])
    q = np.ones_like(x)
    for _ in range(12):  # Sanathanan-Koerner: reweight the linearised residual by 1 / Q
        columns = np.stack([x * t**i for i in range(p_degree + 1)] + [-f * t**j for j in range(1, q_degree + 1)], axis=1)
        solution, _ = lawson(columns / q[:, None], f / q)
        p_coefs = solution[: p_degree + 1]
        q_coefs = np.concatenate([[1.0], solution[p_degree + 1 :]])
        q = np.polyval(q_coefs[::-1], t)
    approx = x * np.polyval(p_coefs[::-1], t) / q
    return p_coefs, q_coefs, float(np.abs(approx - f).max())


def fit_exp(degree: int = 6, points: int = 20001):
    half = math.log(2.0) / 2
    r = np.linspace(-half * 1.01, half * 1.01, points)
    f = np.exp(r)
    columns = np.stack([r**i for i in range(degree + 1)], axis=1) / f[:, None]
    solution, errors = lawson(columns, np.ones_like(r))
    return solution, float(np.abs(errors).max())


def as_float32(values) -> list[str]:
    return [repr(float(np.float32(v))) for v in values]


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    p, q, error = fit_erf()
    print(f"erf: max error of the float64 fit {error:.3g}")
    print("ERF_P =", "(" + ", ".join(as_float32(p)) + ")")
    print("ERF_Q =", "(" + ", ".join(as_float32(q)) + ")")
    coefs, error = fit_exp()
    print(f"exp: max relative error of the float64 fit {error:.3g}")
    print("EXP_P =", "(" + ", ".join(as_float32(coefs)) + ")")
