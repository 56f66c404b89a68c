"""The numpy baseline's environment (which OpenBLAS kernels) and its calls."""

import pytest

import looprl
import numpy as np

from looprl.measurement.numpy_baseline import baseline_environment, baseline_label, coretype_for, numpy_gflops
# The view calls the baseline times have no public name yet: their results are checked through it.
from looprl.measurement.numpy_baseline import _view_call


@pytest.mark.parametrize(("isa", "host", "coretype"), [
    ("avx2", "avx512", "Haswell"),
    ("sse4", "avx512", "Nehalem"),
    ("sse4", "avx2", "Nehalem"),
    ("avx512", "avx512", None),
    ("avx2", "avx2", None),
    (None, "avx512", None),
    (None, "sse4", None),
])
def test_the_child_gets_the_coretype_of_a_narrower_isa(monkeypatch, isa, host, coretype):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")  # inherited: never passed on
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    env = baseline_environment(isa, host_isa=host)
    assert env.get("OPENBLAS_CORETYPE") == coretype
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert coretype_for(isa, host) == coretype
    assert ("native kernels" in baseline_label(isa, host)) == (coretype is None)


def test_the_host_isa_is_the_default():
    host = looprl.Target.host().isa
    assert baseline_environment("avx512" if host == "avx512" else host).get("OPENBLAS_CORETYPE") is None
    assert baseline_environment(None).get("OPENBLAS_CORETYPE") is None


def test_unknown_isas_are_rejected():
    with pytest.raises(ValueError, match="unknown isa 'neon'"):
        baseline_environment("neon", host_isa="avx512")
    with pytest.raises(ValueError, match="unknown host isa"):
        coretype_for("avx2", host_isa="avx10")


def test_every_spec_is_timed():
    problems = [
        looprl.matmul(8, 16, 4),
        looprl.contraction("mk,nk->mn", m=8, n=16, k=4),
        looprl.contraction("bmk,bnk->bmn", b=2, m=8, n=16, k=4),
        looprl.contraction("bmk,bkn->bmn", b=2, m=8, n=16, k=4),
        looprl.contraction("km,kn->mn", m=8, n=16, k=4),
        looprl.contraction("nhwc,oc->nhwo", n=1, h=2, w=3, c=4, o=5),
        looprl.linear(8, 4, 16, activation="gelu", residual=True),  # the epilogue, step by step
    ]
    gflops = numpy_gflops(problems, 0.002)  # in a child process, as tune and train time it
    assert len(gflops) == len(problems) and all(g > 0 for g in gflops)


@pytest.mark.parametrize("spec, sizes", [
    ("km,kn->mn", {"m": 5, "k": 7, "n": 6}),
    ("bkm,bkn->bmn", {"b": 2, "m": 5, "k": 7, "n": 6}),
    ("nchw,oc->nohw", {"n": 2, "c": 3, "h": 4, "w": 5, "o": 6}),
    ("nhwc,oc->nhwo", {"n": 2, "h": 4, "w": 5, "c": 3, "o": 6}),
])
def test_matmul_on_views_computes_what_einsum_computes(spec, sizes):
    problem = looprl.contraction(spec, **sizes)
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in problem.input_shapes)
    out = np.full(problem.output_shape, np.nan, dtype=np.float32)
    _view_call(problem, a, b, out)()
    np.testing.assert_allclose(out, np.einsum(spec, a, b), rtol=1e-5, atol=1e-5)
    assert _view_call(looprl.contraction("abc,cd->abd", a=2, b=3, c=4, d=5), a, b, out) is None
