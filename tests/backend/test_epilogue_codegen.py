"""Epilogues in generated code: every reachable schedule (write-back transforms included) of
problems with a scale, bias, activation and residual computes the float64 reference, on every
target the host runs, without touching memory it must not."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.ir import ACTIVATIONS, Epilogue, linear
from looprl.target import TARGET_NAMES, Target
from tests.guarded import GuardedArray
from tests.schedules import action_steps, layout_steps, walk, with_layouts

HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]
SHAPES = [
    ("mk,nk->mn", dict(m=13, n=37, k=19)),  # a linear layer, odd sizes
    ("mk,kn->mn", dict(m=9, n=70, k=11)),
    ("mk,nk->mn", dict(m=1, n=33, k=7)),
    ("bmk,bkn->bmn", dict(b=2, m=5, k=6, n=21)),  # bias over n, broadcast over b and m
    ("mk,k->m", dict(m=37, k=9)),  # matrix-vector: the bias is one value per row of the output
    ("m,n->mn", dict(m=7, n=19)),  # no reduction
]
epilogues = st.builds(
    Epilogue,
    scale=st.sampled_from([1.0, 0.5, -1.75]),
    bias=st.booleans(),
    activation=st.sampled_from((None,) + ACTIVATIONS),
    residual=st.booleans(),
)


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def reference(problem, a, b, extra):
    """The problem's output in float64 (no scipy): the contraction, then the epilogue."""
    e = problem.epilogue
    y = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64)) * e.scale
    if e.bias:
        y = y + extra["bias"].astype(np.float64)
    if e.activation == "relu":
        y = np.maximum(y, 0.0)
    elif e.activation == "gelu":
        y = 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))
    elif e.activation == "gelu_tanh":
        y = 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    elif e.activation == "silu":
        y = y / (1.0 + np.exp(-y))
    if e.residual:
        y = y + extra["residual"].astype(np.float64)
    return y


def random_arrays(problem, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in problem.input_shapes)
    extra = {name: rng.uniform(-1, 1, shape).astype(np.float32) for name, shape in problem.epilogue_shapes}
    return a, b, extra


def tolerance(problem):
    reduction = max([problem.size(d) for d in problem.reduction_dims] or [1])
    return 2e-6 * reduction * max(abs(problem.epilogue.scale), 1.0) + 2e-6


def check(problem, kernel, seed=0):
    a, b, extra = random_arrays(problem, seed)
    out = kernel(a, b, *(extra[name] for name in problem.epilogue.inputs))
    np.testing.assert_allclose(out, reference(problem, a, b, extra), rtol=1e-5, atol=tolerance(problem))


def problem_of(index, epilogue):
    spec, sizes = SHAPES[index]
    return looprl.contraction(spec, sizes, epilogue=epilogue)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.integers(0, len(SHAPES) - 1), epilogue=epilogues, steps=action_steps(), seed=st.integers(0, 2**16))
def test_random_schedules_with_epilogues_match_the_reference(shape, epilogue, steps, seed):
    problem = problem_of(shape, epilogue)
    nest = walk(problem, steps)
    check(problem, looprl.compile(nest), seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.integers(0, len(SHAPES) - 1), epilogue=epilogues, steps=action_steps(),
       target=st.sampled_from([t for t in HOST_TARGETS if t.isa != "avx512"] or HOST_TARGETS))
def test_narrower_targets_with_epilogues_match_the_reference(shape, epilogue, steps, target):
    problem = problem_of(shape, epilogue)
    nest = walk(problem, steps)
    check(problem, looprl.compile(nest, target=target))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.integers(0, len(SHAPES) - 1), epilogue=epilogues, steps=action_steps(), layouts=layout_steps())
def test_epilogues_with_data_layouts(shape, epilogue, steps, layouts):
    """An accumulator in another layout is unpacked by the write-back nest, epilogue included."""
    problem = problem_of(shape, epilogue)
    nest = with_layouts(walk(problem, steps), layouts)
    check(problem, looprl.compile(nest))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.integers(0, len(SHAPES) - 1), activation=st.sampled_from(ACTIVATIONS), steps=action_steps(),
       side=st.sampled_from(["start", "end"]), target=st.sampled_from(HOST_TARGETS))
def test_epilogue_inputs_stay_in_bounds(shape, activation, steps, side, target):
    """Every buffer, the bias and the residual included, sits flush against an inaccessible
    page: a stray access would crash."""
    problem = problem_of(shape, Epilogue(scale=0.5, bias=True, activation=activation, residual=True))
    kernel = looprl.compile(walk(problem, steps), target=target)
    shapes = [*problem.input_shapes, *(shape for _, shape in problem.epilogue_shapes), problem.output_shape]
    guards = [GuardedArray(s, side) for s in shapes]
    try:
        a, b, bias, residual, out = (g.array for g in guards)
        a0, b0, extra = random_arrays(problem, 1)
        a[...], b[...], bias[...], residual[...] = a0, b0, extra["bias"], extra["residual"]
        kernel.run(a, b, out, reps=2, bias=bias, residual=residual)
        np.testing.assert_allclose(out, reference(problem, a0, b0, extra), rtol=1e-5, atol=tolerance(problem))
    finally:
        for g in guards:
            g.release()


@pytest.mark.parametrize("target", HOST_TARGETS, ids=lambda t: t.isa)
@pytest.mark.parametrize("activation", (None,) + ACTIVATIONS)
def test_tuned_shape_of_a_linear_layer(target, activation):
    """The register tile tune builds for a linear layer (n/16, m/4, k, m4, n16, W packed into
    column panels and bound once), with every activation, on every target."""
    problem = linear(23, 40, 70, activation=activation, residual=True)
    nest = looprl.initial_nest(problem).split(2, 16).swap(1).swap(0).split(1, 4).swap(2)
    nest = nest.layout_pack("in1", "n", 16)
    kernel = looprl.compile(nest, target=target)
    assert kernel.packed_inputs == ("in1",)
    x, w, extra = random_arrays(problem, 7)
    expected = reference(problem, x, w, extra)
    np.testing.assert_allclose(kernel(x, w, extra["bias"], extra["residual"]), expected, rtol=1e-5, atol=tolerance(problem))
    bound = kernel.bind(b=w, bias=extra["bias"])
    assert bound.free == ("in0", "residual")
    np.testing.assert_allclose(bound(x, extra["residual"]), expected, rtol=1e-5, atol=tolerance(problem))


def test_the_identity_epilogue_generates_the_plain_kernel():
    """A problem without an epilogue (or with the identity one) gets exactly the IR it always
    got: no extra arguments, same names, so cached measurements stay valid."""
    plain = looprl.matmul(16, 32, 8)
    same = plain.with_epilogue(Epilogue())
    assert same == plain and same.name == plain.name
    nest = looprl.initial_nest(plain).split(2, 16)
    ir = looprl.compile(nest).ir
    assert "bias" not in ir and "residual" not in ir
    assert "define void @looprl_kernel(ptr noalias %in0, ptr noalias %in1, ptr noalias %out, ptr noalias %acc, i64 %reps)" in ir


def test_bad_epilogue_arguments_are_value_errors():
    problem = linear(4, 8, 12, activation="relu", residual=True)
    kernel = looprl.compile(looprl.initial_nest(problem))
    x, w, extra = random_arrays(problem, 0)
    bias, residual = extra["bias"], extra["residual"]
    with pytest.raises(ValueError, match="epilogue input"):
        kernel(x, w, bias)
    with pytest.raises(ValueError, match="bias has shape"):
        kernel(x, w, bias[:5], residual)
    with pytest.raises(ValueError, match="residual must have dtype float32"):
        kernel(x, w, bias, residual.astype(np.float64))
    with pytest.raises(ValueError, match="residual must be C-contiguous"):
        kernel(x, w, bias, np.asfortranarray(residual))
    out = np.empty(problem.output_shape, np.float32)
    with pytest.raises(ValueError, match="needs its epilogue's residual"):
        kernel.run(x, w, out, bias=bias)
    with pytest.raises(ValueError, match="overlaps the residual"):
        kernel.run(x, w, residual, bias=bias, residual=residual)
    plain = looprl.compile(looprl.initial_nest(looprl.matmul(4, 12, 8)))
    with pytest.raises(ValueError, match="no bias"):
        plain.run(x, w.T.copy(), out, bias=bias)
    with pytest.raises(ValueError, match="has no bias"):
        plain.bind(bias=bias)
    with pytest.raises(ValueError, match="takes the first input and the residual"):
        kernel.bind(b=w, bias=bias)(x)
