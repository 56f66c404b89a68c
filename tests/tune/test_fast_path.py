"""The fast path: ``measure=False`` in tune, tune_module, the torch.compile backend and
looprl-tune: the policy's answers alone, each timed once, nothing searched."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import looprl  # noqa: E402
from looprl.torch import route_table, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch.module import TORCH_EVERYWHERE  # noqa: E402
from looprl.torch.records import left_to_torch  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache") / "fast.sqlite")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(96, 160), nn.GELU(), nn.Linear(160, 48)).eval()


@pytest.mark.target_dependent
def test_a_linear_layer_of_few_rows_gets_an_episode_on_each_layout_and_nothing_is_searched():
    problem = looprl.linear(2, 96, 160)
    result = looprl.tune(problem, measure=False, cache=":memory:", threads=1)
    assert result.mode == "policy"
    # the twin's last state and the last state of the episode in place: no search, the untuned nest not timed
    assert result.measured == 2 and result.speedup != result.speedup
    many = looprl.tune(looprl.linear(64, 96, 160), measure=False, cache=":memory:", threads=1)
    assert many.mode == "policy" and many.measured == 1  # more rows than IN_PLACE_ROWS: the twin alone
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 96), (160, 96), (160,)))
    np.testing.assert_allclose(result.kernel(x, w, b), x @ w.T + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("frozen", [False, True])
def test_tune_module_fast_path_schedules_every_layer_by_the_policy_alone(cache, frozen, capsys):
    model = mlp()
    examples = [torch.randn(1, 96), torch.randn(24, 96)]
    tuned = tune_module(model, examples, measure=False, cache=cache, frozen=frozen, progress=True)
    layers = tuned_layers(tuned)
    put_back = [name for name, why in left_to_torch(tuned).items() if why == TORCH_EVERYWHERE]  # torch's at every row count
    assert len(layers) + len(put_back) == 2
    for _, layer in layers:
        for kernels in layer.all_kernels():
            assert {result.mode for result in kernels.results.values()} == {"policy"}
            assert all(result.measured <= 2 for result in kernels.results.values())  # each answer timed once
    err = capsys.readouterr().err
    assert "(the policy alone)" in err and re.search(r"policy alone +(torch|looprl)", err)  # the route table, every layer judged
    with torch.no_grad():
        for x in (torch.randn(1, 96), torch.randn(7, 96), torch.randn(24, 96)):
            torch.testing.assert_close(tuned(x), model(x), rtol=1e-4, atol=1e-4)
    assert stats(tuned)["looprl_calls"] + stats(tuned)["fallback_calls"] > 0


def test_records_and_the_fast_path_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="measure=False"):
        tune_module(mlp(), torch.randn(4, 96), measure=False, records=tmp_path / "none.json", progress=False)


@pytest.mark.parametrize("bad", ["no", 0, None])
def test_measure_must_be_a_bool(bad):
    with pytest.raises(ValueError, match="measure"):
        tune_module(mlp(), torch.randn(4, 96), measure=bad, progress=False)


def test_the_backend_fast_path(cache):
    from looprl import dynamo

    torch._dynamo.reset()
    model = mlp()
    compiled = torch.compile(model, backend="looprl", options={"measure": False, "cache": cache, "rest": "eager", "max_rows": 8})
    x = torch.randn(8, 96)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert dynamo.stats()["layers"]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option measure"):
        with torch.no_grad():
            torch.compile(mlp(), backend="looprl", options={"measure": "fast"})(x)
    torch._dynamo.reset()


@pytest.mark.target_dependent
def test_on_two_threads_the_policy_s_answer_is_split_by_tune_s_rule_and_its_actions_replay():
    problem = looprl.linear(96, 256, 384)
    result = looprl.tune(problem, measure=False, cache=":memory:", threads=2)
    assert result.mode == "policy" and result.answer.record.threads == 2
    serial = looprl.tune(problem, measure=False, cache=":memory:", threads=1)
    assert not serial.nest.is_parallel
    # the split is one of measured mode's variants of the serial answer (or that answer itself): the serial
    # episode's actions first, then only cursor moves, swaps and parallel marks
    assert result.actions[:len(serial.actions)] == serial.actions
    assert set(result.actions[len(serial.actions):]) <= {"up", "down", "swap_up", "swap_down", "parallel"}
    assert result.tuned_as is None and result.replayed() == result.nest  # from the re-laid start
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((96, 256), (384, 256), (384,)))
    np.testing.assert_allclose(result.kernel(x, w, b), x @ w.T + b, rtol=1e-4, atol=1e-4)


@pytest.mark.target_dependent
def test_a_weight_gets_the_isa_s_weights_policy_where_one_is_shipped(monkeypatch, tmp_path):
    import json

    from looprl.policy import loading

    listed = json.loads(loading.DEFAULT_POLICIES.read_text())
    assert loading.default_policy_dir("avx512", weights=True) == loading.DEFAULT_POLICIES.parent / listed["avx512/weights"]
    assert loading.default_policy_dir("avx512") == loading.DEFAULT_POLICIES.parent / listed["avx512"]
    assert loading.default_policy_dir("avx2", weights=True) == loading.DEFAULT_POLICIES.parent / listed["avx2/weights"]
    monkeypatch.setattr(loading, "_warned", set())  # (another test may have been warned already)
    with pytest.warns(RuntimeWarning, match="no policy for sse4"):  # none of its own: the closest ISA's, its weights policy too
        assert loading.default_policy_dir("sse4", weights=True) == loading.DEFAULT_POLICIES.parent / listed["avx2/weights"]
    from looprl.tune import proposers as tuner

    asked = []
    monkeypatch.setattr(tuner, "load_policy",
                        lambda policy, target, weights=False, dtype="float32": asked.append(weights) or loading.load_policy(policy, target))
    looprl.tune(looprl.linear(4, 64, 96), measure=False, cache=":memory:", threads=1)  # a linear layer: a weight on the right
    looprl.tune(looprl.matmul(4, 96, 64), measure=False, cache=":memory:", threads=1)  # a plain matmul: no weight
    assert asked == [True, False]
    bad = tmp_path / "default_policies.json"
    bad.write_text(json.dumps({"avx512/weights": "x/policy"}))
    monkeypatch.setattr(loading, "DEFAULT_POLICIES", bad)
    with pytest.raises(ValueError, match="no policy for an ISA"):
        loading.default_policies()
    bad.write_text(json.dumps({"avx512": "x", "neon/weights": "y"}))
    with pytest.raises(ValueError, match="unknown ISA"):
        loading.default_policies()


@pytest.mark.target_dependent
def test_an_excluded_action_is_never_taken_and_the_policy_s_next_best_is():
    from looprl.policy.loading import load_policy
    from looprl.policy.rollout import greedy_rollout

    policy = load_policy("default", looprl.Target.default(), weights=True)
    # a weight as stored, read cold, 64 rows: every shipped weights policy acts here (at 4 rows
    # the AVX2 one leaves the nest as it is, which would leave nothing to exclude)
    problem = looprl.linear(64, 256, 384).with_cold()
    free = greedy_rollout(policy, problem, None).final_actions
    assert free, "the policy takes at least one action here"
    barred = greedy_rollout(policy, problem, None, excluded=frozenset({free[0]})).final_actions
    assert free[0] not in barred


@pytest.mark.target_dependent
def test_a_weight_as_stored_is_demonstrated_by_plans_that_read_it_in_place():
    from looprl.actions import ActionSet
    from looprl.ir.plans import Plan
    from looprl.measurement.evaluator import Evaluator
    from looprl.train.demonstrations import plan_values, reads_weight_as_stored

    stored = looprl.linear(4, 64, 96, bias=False)  # mk,nk->mn, the weight constant
    assert reads_weight_as_stored(stored)
    assert not reads_weight_as_stored(looprl.matmul(4, 96, 64))  # B[k, n]: not stored along the reduction
    assert not reads_weight_as_stored(looprl.contraction("mk,nk->mn", m=4, k=64, n=96))  # not a weight
    target = looprl.Target.default()
    actions = ActionSet.for_target(target, layouts=True, plans=True)
    values = plan_values(stored, actions, Evaluator(":memory:", 0.002, target=target))
    names = [actions.names[i] for i in values]
    assert any(Plan.parse(n).dot for n in names) and not any(Plan.parse(n).packed for n in names)


def test_layers_of_one_shape_share_their_runtime_rows_kernels():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    tuned = tune_module(model, torch.randn(8, 64), measure=False, cache=":memory:", fuse=False, compare_torch=False, progress=False)
    kernels = [layer.kernels._kernels for _, layer in tuned_layers(tuned)]
    assert len(kernels) == 3 and all(k.keys() == kernels[0].keys() for k in kernels)
    for count in kernels[0]:
        assert kernels[0][count] is kernels[1][count] is kernels[2][count]  # one compiled kernel per schedule
