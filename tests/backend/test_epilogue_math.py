"""The epilogue's vectorised exp, erf and activations, run on their own against float64
math: every target the host runs, full vectors and scalars."""

import ctypes
import math

import numpy as np
import pytest

from looprl.backend.epilogue_ir import ELEMENTWISE_NAME, elementwise_ir
from looprl.backend.jit import CompiledModule
from looprl.target import TARGET_NAMES, Target

_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def host_targets():
    found = []
    for name in TARGET_NAMES:
        target = Target.named(name)
        try:
            target.check_runs_on_host()
        except ValueError:
            continue
        found.append(target)
    return found


TARGETS = host_targets()


def run(function, values, target, lanes=None):
    """``function`` applied to float32 ``values`` by the generated code."""
    lanes = target.vector_width if lanes is None else lanes
    values = np.asarray(values, dtype=np.float32)
    padded = np.zeros(-(-values.size // lanes) * lanes, dtype=np.float32)
    padded[: values.size] = values
    result = np.empty_like(padded)
    module = CompiledModule(elementwise_ir(function, lanes, target.fma), ELEMENTWISE_NAME, target)
    _SIGNATURE(module.address)(padded.ctypes.data, result.ctypes.data, padded.size)
    return result[: values.size]


def wide_range(limit, count=200_001):
    dense = np.linspace(-limit, limit, count)
    special = [0.0, -0.0, 1e-30, -1e-30, 1e-7, 1e-3, 0.5, 1.0, 3.999, 4.0, 4.001, 30.0, -30.0, 1e4, -1e4, 3e38, -3e38]
    return np.concatenate([dense, special]).astype(np.float32)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.isa)
def test_erf_is_within_float32_tolerance_of_math_erf(target):
    x = wide_range(12.0)
    got = run("erf", x, target).astype(np.float64)
    expected = np.array([math.erf(float(v)) for v in x])
    assert np.abs(got - expected).max() < 5e-7
    small = np.abs(x) < 0.5  # near 0 erf is small: relative accuracy matters
    relative = np.abs(got[small] - expected[small]) / np.maximum(np.abs(expected[small]), 1e-30)
    assert relative.max() < 5e-7
    assert np.all(np.abs(got) <= 1.0) and np.all(np.sign(got) == np.sign(expected))


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.isa)
def test_exp_is_within_a_few_ulps_over_its_range(target):
    x = np.linspace(-87.0, 88.0, 200_001).astype(np.float32)
    got = run("exp", x, target).astype(np.float64)
    expected = np.exp(x.astype(np.float64))
    assert (np.abs(got - expected) / expected).max() < 4e-7
    ends = run("exp", [-1e4, -100.0, 100.0, 1e4], target)  # clamped to normal floats, never inf or 0
    assert np.all(np.isfinite(ends)) and np.all(ends > 0)


def reference(name, x):
    x = x.astype(np.float64)
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "gelu":
        return np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return np.array([v / (1.0 + math.exp(-v)) if v > -700 else 0.0 for v in x])


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.isa)
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activations_match_float64_references(name, target):
    x = np.concatenate([np.linspace(-30, 30, 60_001), [0.0, -0.0, 1e-20, -1e-20, 200.0, -200.0]]).astype(np.float32)
    for lanes in (target.vector_width, 1):
        got = run(name, x, target, lanes).astype(np.float64)
        expected = reference(name, x)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu", "exp", "erf"])
def test_nan_stays_nan(name):
    target = TARGETS[0]
    got = run(name, [np.nan, 1.0, np.nan, -1.0], target)
    assert np.isnan(got[0]) and np.isnan(got[2]) and np.isfinite(got[1]) and np.isfinite(got[3])


def test_elementwise_ir_refuses_unknown_functions_and_widths():
    with pytest.raises(ValueError, match="unknown function"):
        elementwise_ir("tanh", 8, True)
    with pytest.raises(ValueError, match="lanes"):
        elementwise_ir("erf", 3, True)
