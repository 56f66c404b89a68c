"""The numpy baseline's environment (which OpenBLAS kernels) and its calls."""

import pytest

import looprl
from looprl.measurement.numpy_baseline import _time_in_process, baseline_environment, baseline_label, coretype_for


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
    names = [p.name for p in (
        looprl.matmul(8, 16, 4),
        looprl.contraction("mk,nk->mn", m=8, n=16, k=4),
        looprl.contraction("bmk,bnk->bmn", b=2, m=8, n=16, k=4),
        looprl.contraction("bmk,bkn->bmn", b=2, m=8, n=16, k=4),
        looprl.contraction("km,kn->mn", m=8, n=16, k=4),
    )]
    assert all(g > 0 for g in _time_in_process(names, 0.002))
