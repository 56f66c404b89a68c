"""The numpy baseline's environment (which OpenBLAS kernels) and its calls."""

import math

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


class _RecordingChild:
    """Stands in for numpy's child process: its figures in turn, each call recorded."""

    def __init__(self, order, figures, failure_after=None):
        self.order, self.figures, self.failure, self.failure_after = order, list(figures), None, failure_after

    def time(self, problem, budget_s):
        self.order.append("numpy")
        if self.failure_after is not None and len([o for o in self.order if o == "numpy"]) > self.failure_after:
            self.failure = "numpy baseline process killed by SIGKILL"
            return math.nan
        return self.figures.pop(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_the_command_line_s_ratio_times_the_kernel_and_numpy_in_turn_and_keeps_each_best(monkeypatch):
    """looprl-tune's printed ratio: its kernel and numpy one after the other, round after
    round, so a drift of the machine touches both (it used to set tune's best sample against
    numpy timed once, later)."""
    from looprl.measurement import numpy_baseline, timing
    from looprl.measurement.timing import Timing

    order, mine = [], iter([50.0, 80.0, 70.0])
    problem = looprl.matmul(8, 16, 4)

    def kernel_timing(kernel, budget_s, lock=None, **_):
        order.append("looprl")
        return Timing(problem.flops / (next(mine) * 1e9), 3, 1, problem.flops)

    monkeypatch.setattr(timing, "time_kernel", kernel_timing)
    monkeypatch.setattr(numpy_baseline, "numpy_child", lambda isa, threads: _RecordingChild(order, [60.0, 40.0, 65.0]))
    assert numpy_baseline.in_turn_with_numpy(object(), problem, 0.01, rounds=3) == (pytest.approx(80.0), 65.0)
    assert order == ["looprl", "numpy"] * 3
    order.clear()
    mine = iter([50.0, 80.0, 70.0])
    monkeypatch.setattr(numpy_baseline, "numpy_child", lambda isa, threads: _RecordingChild(order, [60.0], failure_after=1))
    with pytest.raises(RuntimeError, match="killed by SIGKILL"):
        numpy_baseline.in_turn_with_numpy(object(), problem, 0.01, rounds=3)
    with pytest.raises(ValueError, match="rounds"):
        numpy_baseline.in_turn_with_numpy(object(), problem, 0.01, rounds=0)
