"""Epilogues as part of a problem's identity: names, parsing, equality, bad input."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import looprl
from looprl.ir import ACTIVATIONS, Epilogue, linear, parse_problem


@given(
    scale=st.floats(-1e6, 1e6, allow_nan=False, width=32),
    bias=st.booleans(),
    activation=st.sampled_from((None,) + ACTIVATIONS),
    residual=st.booleans(),
    const=st.sampled_from([(), ("in1",), ("in0", "in1")]),
)
def test_names_round_trip(scale, bias, activation, residual, const):
    epilogue = Epilogue(scale=scale, bias=bias, activation=activation, residual=residual)
    problem = looprl.contraction("mk,nk->mn", m=3, n=5, k=7, constant=const, epilogue=epilogue)
    assert parse_problem(problem.name) == problem
    assert Epilogue.from_key(epilogue.key) == epilogue
    assert (";epilogue=" in problem.name) == (not epilogue.is_identity)


def test_linear_is_a_linear_layer():
    problem = linear(197, 384, 1536, activation="gelu")
    assert problem.spec == "mk,nk->mn" and problem.input_shapes == ((197, 384), (1536, 384))
    assert problem.constant == ("in1",)
    assert problem.name == "mk,nk->mn:m=197,k=384,n=1536;const=in1;epilogue=bias+gelu"
    assert problem.epilogue_shapes == (("bias", (1536,)),)
    assert linear(2, 3, 4, bias=False, residual=True).epilogue_shapes == (("residual", (2, 4)),)
    assert problem.flops == 2 * 197 * 384 * 1536  # the contraction's


def test_epilogues_make_distinct_problems():
    base = looprl.matmul(8, 8, 8)
    variants = {base, base.with_epilogue(bias=True), base.with_epilogue(activation="relu"), base.with_epilogue("bias+relu"),
                base.with_epilogue(scale=0.5), base.with_epilogue(residual=True)}
    assert len(variants) == 6 and len({p.name for p in variants}) == 6
    assert base.with_epilogue(scale=0.1).epilogue.scale == float(np.float32(0.1))
    assert str(looprl.initial_nest(base.with_epilogue("scale0.5+bias+silu+residual"))).endswith(
        "out[mn] = silu(0.5 * acc[mn] + bias[n]) + residual[mn]")


@pytest.mark.parametrize(
    "text, message",
    [
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=tanh", "bad epilogue part"),
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=relu+bias", "order applied"),
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=bias+bias", "twice"),
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=scaleinf", "bad epilogue part"),
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=scale1e39", "overflows float32"),
        ("mk,kn->mn:m=2,k=2,n=2;fused=relu", "bad part"),
        ("mk,kn->mn:m=2,k=2,n=2;epilogue=relu;epilogue=relu", "twice"),
    ],
)
def test_bad_names_are_value_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_problem(text)


def test_bad_epilogues_are_value_errors():
    with pytest.raises(ValueError, match="unknown activation"):
        Epilogue(activation="Relu")
    with pytest.raises(ValueError, match="epilogue scale must be a finite number"):
        Epilogue(scale=float("nan"))
    with pytest.raises(ValueError, match="epilogue scale must be a finite number"):
        Epilogue(scale="2")
    with pytest.raises(ValueError, match="True or False"):
        Epilogue(bias=1)
    with pytest.raises(ValueError, match="unknown epilogue part"):
        looprl.matmul(2, 2, 2).with_epilogue(act="relu")
    with pytest.raises(ValueError, match="epilogue must be"):
        looprl.matmul(2, 2, 2, epilogue=3)
    with pytest.raises(ValueError, match="in_features must be a positive integer, got 0"):
        linear(2, 0, 3)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        linear(2.0, 3, 3)
    looprl.contraction("m,n->mn", m=2**15, n=24576)  # fits the buffer limit ...
    with pytest.raises(ValueError, match="epilogue inputs"):  # ... but not with a residual as large as the output
        looprl.contraction("m,n->mn", m=2**15, n=24576, epilogue="residual")


def test_dataset_entries_carry_epilogues():
    from looprl.workloads.entries import DatasetEntry

    entry = DatasetEntry("mk,nk->mn", (("m", 4), ("k", 8), ("n", 6)), "vit-s16", "mlp.fc1", "4 tokens", "bias+gelu")
    assert entry.problem.epilogue == Epilogue(bias=True, activation="gelu")
    assert DatasetEntry.from_row(entry.to_row()) == entry
    assert "epilogue" not in DatasetEntry("mk,kn->mn", (("m", 4), ("k", 8), ("n", 6))).to_row()  # stored rows stay as they were
    with pytest.raises(ValueError, match="bad epilogue part"):
        DatasetEntry("mk,kn->mn", (("m", 4), ("k", 8), ("n", 6)), epilogue="bias+tanh")


def test_numpy_does_the_epilogue_step_by_step():
    from looprl.measurement.numpy_epilogue import apply_epilogue

    rng = np.random.default_rng(0)
    out = rng.uniform(-3, 3, (5, 7)).astype(np.float32)
    bias, residual = rng.uniform(-1, 1, 7).astype(np.float32), rng.uniform(-1, 1, (5, 7)).astype(np.float32)
    for activation in ACTIVATIONS:
        epilogue = Epilogue(scale=0.5, bias=True, activation=activation, residual=True)
        result = out.copy()
        apply_epilogue(epilogue, result, np.empty_like(result), bias, residual)
        x = 0.5 * out.astype(np.float64) + bias
        if activation == "relu":
            y = np.maximum(x, 0)
        elif activation == "silu":
            y = x / (1 + np.exp(-x))
        else:  # both gelus agree with the erf one to 1e-3 here
            import math

            y = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)
        np.testing.assert_allclose(result, y + residual, atol=1e-3 if activation == "gelu_tanh" else 1e-5)


def test_without_scipy_numpy_s_gelu_takes_erf_from_the_generated_code_s_rational_function():
    """scipy is optional: without it (its import fails in a fresh process), gelu's erf is the
    code generator's approximation evaluated with numpy, as accurate as float32 allows."""
    code = (
        "import sys; sys.modules['scipy'] = None\n"  # `import scipy` now fails, as where it is not installed
        "import math, numpy as np\n"
        "from looprl.ir import Epilogue\n"
        "from looprl.measurement.numpy_epilogue import apply_epilogue, erf_source\n"
        "x = np.linspace(-5, 5, 1001).astype(np.float32)\n"
        "y = x.copy()\n"
        "apply_epilogue(Epilogue(activation='gelu'), y, np.empty_like(y))\n"
        "exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)]\n"
        "print(erf_source(), float(np.abs(y - exact).max()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    source, error = done.stdout.rsplit(maxsplit=1)
    assert source == "numpy polynomial" and float(error) < 1e-6
