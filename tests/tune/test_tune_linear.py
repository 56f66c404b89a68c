"""looprl.tune on linear layers: weights stored [out, in], fused epilogues, the re-laid start."""


import numpy as np
import pytest

import looprl
from looprl.ir.rewrites import RELAID, relaid
from tests.policies import random_policy


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")


def reference(x, w, b, activation, r=None):
    y = x.astype(np.float64) @ w.astype(np.float64).T + b
    if activation == "relu":
        y = np.maximum(y, 0)
    elif activation == "silu":
        y = y / (1 + np.exp(-y))
    return y if r is None else y + r


@pytest.mark.parametrize("activation, residual", [("relu", False), ("silu", True)])
def test_tuned_linear_layers_compute_the_layer(policy_dir, activation, residual):
    problem = looprl.linear(37, 48, 70, activation=activation, residual=residual)
    result = looprl.tune(problem, policy_dir, cache=":memory:", budget_s=0.3)
    assert result.problem == problem and result.nest.problem == problem
    assert result.tuned_as is None and result.record.replays_on == RELAID  # searched from the weight re-laid
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (37, 48)).astype(np.float32), rng.uniform(-1, 1, (70, 48)).astype(np.float32)
    b, r = rng.uniform(-1, 1, 70).astype(np.float32), rng.uniform(-1, 1, (37, 70)).astype(np.float32)
    expected = reference(x, w, b, activation, r if residual else None)
    args = (x, w, b, r) if residual else (x, w, b)
    np.testing.assert_allclose(result(*args), expected, rtol=1e-5, atol=1e-4)
    bound = result.kernel.bind(b=w, bias=b)  # the weight converted once
    np.testing.assert_allclose(bound(*((x, r) if residual else (x,))), expected, rtol=1e-5, atol=1e-4)
    # The actions replay from the re-laid start, the layer's untuned nest with W re-laid.
    assert result.replayed() == result.nest
    assert "in1" in looprl.backend.layout_plan.layouts_applied(result.nest)  # W is never read across its rows


def test_only_weights_across_the_columns_have_a_re_laid_start():
    assert relaid(looprl.linear(4, 8, 16)).coordinates.spec == "mk,kn->mn" and relaid(looprl.linear(4, 8, 16)).exact
    assert relaid(looprl.contraction("bmk,bnk->bmn", b=2, m=3, n=4, k=5, constant="b")).coordinates.spec == "bmk,bkn->bmn"
    assert not relaid(looprl.contraction("mk,nk->mn", m=4, n=8, k=16)).exact  # not constant: converted every call
    assert relaid(looprl.matmul(4, 8, 16, constant="b")) is None  # already contiguous along the columns
    assert relaid(looprl.contraction("mk,k->m", m=4, k=8, constant="b")) is None


def test_looprl_tune_takes_a_linear_layer(policy_dir, capsys):
    """The command line through its main() in this process: the same exit statuses and lines,
    without a process start each (``python -m looprl tune`` as a user starts it is
    tests/tune/test_tune.py::test_cli's)."""
    from looprl.cli.tune import main

    capsys.readouterr()
    assert main(["--linear", "20,24,40", "--activation", "gelu", "--residual", "--no-numpy",
                 "--cache", ":memory:", "--policy", str(policy_dir), "--budget", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "# mk,nk->mn:m=20,k=24,n=40;const=in1;epilogue=bias+gelu+residual" in out
    assert "out[mn] = gelu(acc[mn] + bias[n]) + residual[mn]" in out
    for bad, message in ((["--linear", "20,24"], "BATCH,IN,OUT"), (["16", "16", "16", "--activation", "relu"], "go with --linear"),
                         (["--linear", "2,3,4", "--epilogue", "relu"], "--linear takes neither")):
        try:
            status = main([*bad, "--no-numpy", "--cache", ":memory:"])
        except SystemExit as exit_:  # argparse's own refusals
            status = exit_.code
        errors = capsys.readouterr().err
        assert status == 2 and message in errors and "Traceback" not in errors, (bad, errors[-500:])


def test_the_environment_takes_layers_with_epilogues():
    import gymnasium

    problem = looprl.linear(16, 32, 48, activation="gelu", residual=True)
    env = gymnasium.make("LoopNest-v0", problems=[problem], cache=":memory:")
    _, info = env.reset(seed=0)
    assert info["problem"] == problem.name and info["gflops"] > 0
    _, _, _, _, info = env.step(env.unwrapped.action_names.index("split_8"))
    assert info["valid"] and info["gflops"] > 0
