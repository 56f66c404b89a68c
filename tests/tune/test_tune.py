import json
import math
import subprocess
import sys

import numpy as np
import pytest

import looprl
from looprl.actions import State, reach
from tests.policies import random_policy


@pytest.fixture
def policy_dir(tmp_path):
    return random_policy(seed=3).save(tmp_path / "policy")


def check_kernel(result, rng):
    a = rng.uniform(-1, 1, result.problem.input_shapes[0]).astype(np.float32)
    b = rng.uniform(-1, 1, result.problem.input_shapes[1]).astype(np.float32)
    expected = np.einsum(result.problem.spec, a, b)
    np.testing.assert_allclose(result.kernel(a, b), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("measure", [True, False])
@pytest.mark.parametrize("problem", ["100x72x200", looprl.contraction("bmk,bkn->bmn", b=3, m=20, k=36, n=52), (64, 48, 80)])
def test_tuned_kernels_match_numpy(problem, measure, policy_dir):
    result = looprl.tune(problem, policy_dir, measure=measure, cache=":memory:")
    check_kernel(result, np.random.default_rng(0))
    assert result.gflops > 0 and result.seconds > 0
    # the untuned nest is timed by a measured tune; pure policy mode times its answer alone
    assert result.initial_gflops > 0 if measure else math.isnan(result.initial_gflops)
    assert result.mode == ("measured" if measure else "policy")
    # The reported actions lead from the untuned nest to the returned one (tiles may have
    # split by a target's tile rows, e.g. split_9 with AVX-512: the result's action set has them).
    actions = result.action_set
    assert reach(actions, State(looprl.initial_nest(result.problem), 0), result.actions).nest == result.nest
    if measure:
        assert result.gflops >= result.initial_gflops  # the best state seen, the start included


def test_problem_from_arrays_and_tuple(policy_dir):
    a = np.ones((48, 20), np.float32)
    b = np.ones((20, 36), np.float32)
    result = looprl.tune((a, b), policy_dir, cache=":memory:")
    assert result.problem == looprl.matmul(m=48, n=36, k=20)
    np.testing.assert_allclose(result(a, b), a @ b)
    for bad in [(a, a), (1, 2), "12x", None, (a,)]:
        with pytest.raises(ValueError):
            looprl.tune(bad, policy_dir, cache=":memory:")
    with pytest.raises(ValueError, match="episode_length"):
        looprl.tune((8, 8, 8), policy_dir, episode_length=-1, cache=":memory:")


def test_tune_stops_when_the_policy_picks_an_action_that_cannot_apply(tmp_path):
    # Always prefers "down": walks to the last loop, where "down" cannot apply.
    folder = random_policy(bias=[5, 9, 0, 0, 0, 0, 0]).save(tmp_path / "p")
    result = looprl.tune((32, 32, 32), folder, measure=False, cache=":memory:", threads=1)  # one thread: no team split timed
    assert result.actions == ("down",) * 4
    assert result.nest == looprl.initial_nest(looprl.matmul(32, 32, 32))
    measured = looprl.tune((32, 32, 32), folder, measure=True, cache=":memory:", budget_s=0, threads=1)  # the rollout alone
    assert measured.actions == () and measured.nest == result.nest  # cursor moves change no schedule


def test_pure_policy_mode_stops_when_the_policy_oscillates(tmp_path):
    # "down" while the cursor is on loop 0, "up" elsewhere: 0 -> 1 -> 0, a state seen before.
    policy = random_policy(hidden=2)
    trunk, head = policy.trunk[0], policy.heads["logits"][0]
    trunk.weight[:] = 0
    trunk.weight[0, 0], trunk.bias[0] = 1.0, 0.0  # h0 = cursor flag of loop 0
    trunk.weight[1, 0], trunk.bias[1] = -1.0, 1.0  # h1 = 1 - that flag
    head.weight[:] = 0
    head.bias[:] = 0
    head.weight[1, 0] = 5.0  # down
    head.weight[0, 1] = 5.0  # up
    folder = policy.save(tmp_path / "p")
    # 0 -> 1 -> 0 -> ...: after an even number of steps the episode is back on loop 0, after
    # an odd number on loop 1 (the same schedule either way), and a million steps cost nothing.
    # (one thread: with more, the fast path also times the answer split over a team, which a
    # timing may prefer: not this test's subject)
    result = looprl.tune((32, 32, 32), folder, measure=False, cache=":memory:", threads=1)
    assert result.actions == () and result.nest == looprl.initial_nest(result.problem)
    assert looprl.tune((32, 32, 32), folder, episode_length=9, measure=False, cache=":memory:", threads=1).actions == ("down",)
    assert looprl.tune((32, 32, 32), folder, episode_length=10**6 + 1, measure=False, cache=":memory:", threads=1).actions == ("down",)
    # Measured, the answer is the rollout's state or a register tile of tune's tile stage (whose
    # path may be longer than an episode): a finite path that replays to the answer.
    from looprl.actions import State, follow

    measured = looprl.tune((32, 32, 32), folder, measure=True, cache=":memory:", threads=1)
    reached = follow(measured.action_set, State(looprl.initial_nest(measured.problem), 0), measured.actions)
    assert reached is not None and reached.nest == measured.nest and len(measured.actions) < 40


def test_broken_and_incompatible_policies_are_rejected(tmp_path, policy_dir):
    with pytest.raises(ValueError, match="no policy at"):
        looprl.tune((16, 16, 16), tmp_path / "nothing")
    (policy_dir / "policy.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="unreadable policy weights"):
        looprl.tune((16, 16, 16), policy_dir)

    other = random_policy(seed=1).save(tmp_path / "other")
    meta = json.loads((other / "policy.json").read_text())
    meta["observation_layout_version"] = 0
    (other / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"other.*observation layout version 0"):
        looprl.tune((16, 16, 16), other)

    meta["observation_layout_version"] = random_policy().metadata["observation_layout_version"]
    meta["split_factors"] = [2, 8, 16]
    (other / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="incompatible action set"):
        looprl.tune((16, 16, 16), other)


@pytest.fixture(scope="module")
def tune_command(tmp_path_factory):
    """``looprl tune`` started as a user starts it, once for the module (one process start and
    import of looprl, not one per test), with ``-X importtime``: Python lists on stderr every
    module the process imported, whenever it did."""
    policy = random_policy(seed=3).save(tmp_path_factory.mktemp("tune-command") / "policy")
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "looprl", "tune", "96", "64", "80", "--policy", str(policy), "--cache", ":memory:"],
        capture_output=True, text=True, timeout=120,
    )


def test_tune_imports_neither_ray_nor_torch(tune_command):
    """A measured tune (the command's: tune's every step, numpy timed beside it) imports no Ray
    and no torch."""
    assert tune_command.returncode == 0, tune_command.stderr[-2000:]
    assert "GFLOPS" in tune_command.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in tune_command.stderr.splitlines() if line.startswith("import time:")}
    assert "looprl.tune.api" in imported and "numpy" in imported  # the list is read as it should be
    assert not {name for name in imported if name.split(".")[0] in ("ray", "torch")}


def test_cli(tune_command, policy_dir, capsys):
    from looprl.cli.tune import main

    result = tune_command  # the command as a user starts it
    assert result.returncode == 0, result.stderr[-2000:]
    assert "GFLOPS" in result.stdout and "looprl / numpy" in result.stdout and "actions:" in result.stdout
    # The rest through its main() in this process: the same exit status and lines, no process start each.
    capsys.readouterr()
    assert main(["--spec", "bmk,bkn->bmn", "--sizes", "b=2,m=24,k=16,n=40", "--policy", str(policy_dir),
                 "--no-measure", "--no-numpy", "--cache", ":memory:"]) == 0
    assert "policy mode" in capsys.readouterr().out
    assert main(["96", "64"]) == 2 and "three integers" in capsys.readouterr().err


@pytest.mark.target_dependent
def test_default_policy_is_shipped_and_compatible():
    from looprl.policy.loading import default_policy_dir, load_policy

    policy = load_policy("default", "avx512")
    assert (default_policy_dir("avx512") / "policy.npz").exists()
    assert policy.target.isa == "avx512" and "EPYC" in policy.metadata["host_cpu"]
    assert policy.metadata["algorithm"] == "dqn" and policy.metadata["apex"] is True  # the agent it was cloned for
    assert policy.metadata["training_problems"] == {"dataset": ["models", "gemm-shapes", "mm64-256"], "split": "train"}
    plans = policy.metadata["plans"]  # it acts with plan actions, listed last
    assert plans and list(policy.action_names[-len(plans):]) == plans
    training = policy.metadata["training"]  # a clone of measured plan demonstrations, and says so: no RL
    assert "no RL" in training["algorithm"] and training["rl_iterations"] == 0 and training["demonstrations"]["problems"] > 100
    assert training["demonstrations"]["expert"] == "planner"
    for problem in [(128, 96, 160), looprl.contraction("bmk,bkn->bmn", b=2, m=40, k=24, n=56)]:
        result = looprl.tune(problem, cache=":memory:")
        check_kernel(result, np.random.default_rng(1))


def test_measured_tune_stops_at_a_cycle_however_many_steps(tmp_path):
    # Always "split_4": the first split applies, then the nest is full or the loop too short
    # and the policy repeats a no-op forever; a million steps must not mean a million calls.
    folder = random_policy(bias=[0, 0, 0, 0, 9, 0, 0]).save(tmp_path / "p")
    result = looprl.tune((64, 64, 64), folder, episode_length=10**6, measure=True, cache=":memory:", budget_s=0, threads=1)
    assert len(result.actions) <= 10 and result.gflops >= result.initial_gflops


def test_the_tune_function_is_not_shadowed_by_a_module():
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(looprl.__path__, "looprl."):
        if not module.name.startswith(("looprl.train", "looprl.cli", "looprl.bench")) and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    assert callable(looprl.tune) and callable(looprl.measure) and looprl.tune.__module__ == "looprl.tune.api"


@pytest.mark.parametrize("rows", [2, 24])
def test_a_changing_right_operand_stored_across_the_columns_is_re_laid_when_that_pays(rows, tmp_path):
    """Attention's q.k^T: K changes per call. Searched from its re-laid start, the kernel converts K on
    every call (inside the timed figure); a measured tune of the problem as given is the
    alternative, and the faster is kept; remembered either way."""
    from looprl.backend.layout_plan import conversions
    from looprl.ir.rewrites import RELAID, relaid

    problem = looprl.contraction("bmk,bnk->bmn", b=2, m=rows, k=24, n=40)
    assert not relaid(problem).exact
    cache = tmp_path / "cache.sqlite"
    result = looprl.tune(problem, cache=cache, threads=1)
    check_kernel(result, np.random.default_rng(1))
    assert result.problem == problem and result.nest.problem == problem
    assert result.tuned_as is None and result.replayed() == result.nest
    if result.record.replays_on == RELAID:  # the re-laid kernel won: K converted inside every call
        assert conversions(result.nest)["per_call"] == ["in1"]
    else:  # the measured tune of the problem as given won: K read in place, or packed per tile
        assert conversions(result.nest)["per_call"] in ([], ["in1"]) and not any(t == "in1" and l.key.startswith("b1.k1") for t, l in result.nest.layouts)
    again = looprl.tune(problem, cache=cache, threads=1)
    assert again.mode == "remembered" and again.nest == result.nest
    check_kernel(again, np.random.default_rng(2))


@pytest.mark.parametrize("spec, sizes", [
    ("nchw,oc->nohw", {"n": 2, "c": 16, "h": 5, "w": 7, "o": 24}),  # 1x1 convolution over NCHW
    ("nhwc,oc->nhwo", {"n": 1, "h": 3, "w": 5, "c": 16, "o": 24}),  # over NHWC, constant weight
])
def test_a_convolution_is_tuned_as_its_fused_view_and_called_with_its_own_arrays(spec, sizes):
    problem = looprl.contraction(spec, constant=("in1",) if "nhwc" in spec else (), **sizes)
    result = looprl.tune(problem, cache=":memory:", threads=1)
    view = looprl.ir.rewrites.fused_view(problem)
    assert result.problem == problem and result.nest.problem in (view, result.tuned_as)
    rng = np.random.default_rng(4)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in problem.input_shapes)
    expected = np.einsum(spec, a, b)
    np.testing.assert_allclose(result(a, b), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(result.kernel.bind(b=b)(a), expected, rtol=1e-4, atol=1e-3)
    out = np.empty(problem.output_shape, np.float32)
    result.kernel.run(a, b, out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="shape"):
        result.kernel(a.reshape(-1), b)
    from looprl.measurement.timing import time_kernel

    assert time_kernel(result.kernel, 0.01).gflops > 0  # timed through the view's entry point


def test_a_remembered_answer_comes_back_with_its_action_path(tmp_path):
    cache = tmp_path / "cache.sqlite"
    first = looprl.tune((48, 40, 32), random_policy(seed=3), cache=cache, budget_s=0.1, measure_budget_s=0.001, threads=1)
    again = looprl.tune((48, 40, 32), random_policy(seed=3), cache=cache, budget_s=0.1, measure_budget_s=0.001, threads=1)
    assert again.mode == "remembered" and again.nest == first.nest and again.actions == first.actions
    assert reach(again.action_set, State(looprl.initial_nest(again.problem), 0), again.actions).nest == again.nest


@pytest.mark.parametrize("flag", ["measure", "remember"])
@pytest.mark.parametrize("bad", ["no", 1, None])
def test_flags_must_be_bools(flag, bad):
    with pytest.raises(ValueError, match=flag):
        looprl.tune((16, 16, 16), random_policy(), cache=":memory:", **{flag: bad})


def test_rewrites_are_values_and_a_re_laid_weight_is_a_layout_of_the_problem():
    from looprl.ir.rewrites import FUSED_VIEW, Rewrite, plan_rewrites, relaid

    linear = looprl.linear(6, 8, 16)  # W stored [out, in]: its re-laid start reads it [in, out]
    assert plan_rewrites(linear).chain == ()  # one problem: no twin
    start = relaid(linear)
    nest = start.schedule(looprl.initial_nest(start.coordinates).split(0, 2).swap(1))
    assert nest.problem == linear and nest.loops == start.start.split(0, 2).swap(1).loops
    # the same physical arrangement (k rows of n), which for W indexed [n, k] is not row-major: re-laid once, at bind
    assert nest.layout("in1").key == "k1.n1" and not nest.layout("in1").is_row_major and start.exact
    with pytest.raises(ValueError, match="schedule of"):
        start.schedule(looprl.initial_nest(linear))
    with pytest.raises(ValueError, match="kind"):
        Rewrite("transposed twin", linear, linear)
    conv = looprl.contraction("nchw,oc->nohw", n=1, c=8, h=4, w=5, o=6, constant="b")
    chain = plan_rewrites(conv).chain
    assert chain[0].kind == FUSED_VIEW and "w" not in chain[-1].searched.spec
    keys = looprl.contraction("bmk,bnk->bmn", b=2, m=3, n=4, k=5)
    assert plan_rewrites(keys).chain == () and not relaid(keys).exact
