"""Dot-product kernels: an innermost loop over a reduction both inputs store contiguously is
vectorised along it (``nn.Linear``'s weight read as it lies). Every such schedule computes what
numpy computes, tails and masked vectors included, inside its buffers; tune searches them for
few-row linear layers, and a tuned layer whose kernels read the weight in place keeps no copy."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import State, reach
from looprl.backend.register_plan import plan as register_plan
from looprl.ir.plans import Plan, plan_catalogue, plan_nest, why_not_plan
from looprl.ir.rewrites import RELAID
from looprl.target import Target
from looprl.tune.store import TUNER
from tests.conftest import examples
from tests.guarded import GuardedArray
from tests.schedules import ACTIONS, action_steps

pytestmark = pytest.mark.target_dependent  # dot-product plans on the default target

AVX2, SSE4 = Target.named("avx2"), Target.named("sse4")
HOST = Target.default()  # the default target: the host's unless LOOPRL_TARGET names another
PROBLEMS = [
    looprl.linear(1, 37, 21),  # k: 4 vectors and a masked tail of 5
    looprl.linear(3, 64, 50, activation="gelu"),
    looprl.linear(5, 9, 3, bias=False),
    looprl.linear(16, 130, 40, activation="relu", residual=True),
    looprl.linear(2, 1, 9),  # a reduction of one element
    looprl.linear(7, 300, 17, scale=0.5),
    looprl.contraction("bmk,bnk->bmn", b=3, m=5, n=7, k=19),  # attention's q . k^T
    # (matrix-vector, mk,k->m, vectorises so too: in the random walks of test_codegen_correctness)
]


def dot_plans(target):
    return [plan for plan in plan_catalogue(target) if plan.dot]


def reference(problem, arrays):
    a, b = arrays[:2]
    out = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))
    epilogue = problem.epilogue
    out = epilogue.scale * out
    rest = dict(zip(epilogue.inputs, arrays[2:]))
    if "bias" in rest:
        out = out + rest["bias"]
    if epilogue.activation is not None:
        out = {"relu": lambda v: np.maximum(v, 0), "gelu": lambda v: torch.nn.functional.gelu(torch.from_numpy(v)).numpy()}[epilogue.activation](out)
    if "residual" in rest:
        out = out + rest["residual"]
    return out


def inputs(problem, seed):
    rng = np.random.default_rng(seed)
    shapes = list(problem.input_shapes) + [shape for _, shape in problem.epilogue_shapes]
    return [rng.uniform(-1, 1, size=shape).astype(np.float32) for shape in shapes]


def tolerance(problem, arrays):
    """Sums of k products of values in [-1, 1], added in another order: k ulps of the largest
    partial sum at most."""
    k = max(problem.size(d) for d in problem.reduction_dims)
    return 4 * k * np.finfo(np.float32).eps * max(k, 1)


def test_the_dot_plans_vectorise_along_the_reduction():
    problem = looprl.linear(4, 100, 30)
    for plan in dot_plans(AVX2):
        nest = plan_nest(problem, AVX2, plan)
        decided = register_plan(nest, AVX2)
        assert decided.vector_var == "k" and decided.reduces_vector and decided.zero_init
    # where both inputs do not store the reduction last, there is no such plan
    assert "both must store it last" in why_not_plan(looprl.matmul(4, 30, 100), AVX2, Plan(1, 8, dot=True))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), index=st.integers(0, 9), steps=action_steps(max_size=6),
       target=st.sampled_from([HOST, AVX2, SSE4]), seed=st.integers(0, 2**16))
def test_dot_schedules_match_numpy(problem, index, steps, target, seed):
    """A dot-product plan, then random steps from it (splits with tails, swaps), on every target."""
    plans = dot_plans(target)
    nest = plan_nest(problem, target, plans[index % len(plans)])
    state = State(nest, 0)
    for loop, name in steps:
        at = loop % len(state.nest)
        state = reach(ACTIONS, state, (*ACTIONS.moves(state.cursor, at), name))
    arrays = inputs(problem, seed)
    out = looprl.compile(state.nest, target=target)(*arrays)
    np.testing.assert_allclose(out, reference(problem, arrays), rtol=0, atol=tolerance(problem, arrays))


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), index=st.integers(0, 9), side=st.sampled_from(["start", "end"]))
def test_dot_kernels_stay_in_bounds(problem, index, side):
    """Every buffer flush against an inaccessible page: a masked tail that read past the end of
    the weight's last row would crash."""
    plans = dot_plans(HOST)
    kernel = looprl.compile(plan_nest(problem, HOST, plans[index % len(plans)]))
    shapes = list(problem.input_shapes) + [shape for _, shape in problem.epilogue_shapes] + [problem.output_shape]
    guards = [GuardedArray(shape, side) for shape in shapes]
    try:
        *given_arrays, out = (g.array for g in guards)
        for array, values in zip(given_arrays, inputs(problem, 1)):
            array[...] = values
        extra = dict(zip(problem.epilogue.inputs, given_arrays[2:]))
        kernel.run(given_arrays[0], given_arrays[1], out, reps=2, **extra)
        np.testing.assert_allclose(out, reference(problem, given_arrays), rtol=0, atol=tolerance(problem, given_arrays))
    finally:
        for g in guards:
            g.release()


def test_dot_kernels_take_runtime_rows_and_threads():
    problem = looprl.linear(8, 70, 45, activation="relu")
    arrays = inputs(problem, 3)
    nest = plan_nest(problem, HOST, Plan(2, 4, dot=True))
    kernel = looprl.compile(nest, runtime_rows=True)
    for rows in (1, 3, 8):
        out = np.empty((rows, 45), np.float32)
        kernel.run(arrays[0][:rows], arrays[1], out, bias=arrays[2])
        np.testing.assert_allclose(out, reference(looprl.linear(rows, 70, 45, activation="relu"), [arrays[0][:rows], *arrays[1:]]),
                                   rtol=0, atol=1e-4)
    parallel = nest.parallel(0)  # the panels of columns shared among threads
    out = looprl.compile(parallel, threads=2)(*arrays)
    np.testing.assert_allclose(out, reference(problem, arrays), rtol=0, atol=1e-4)


def test_tune_reads_a_few_row_linear_layer_in_place_and_the_answer_replays(tmp_path):
    """A decode-sized linear layer: tune searches its dot-product tiles on the layer as given
    (beside the re-laid start) and keeps one unless the re-laid one is clearly faster; the kernel
    it returns converts nothing when it is in place, and its actions replay to its schedule."""
    problem = looprl.linear(1, 512, 256)
    result = looprl.tune(problem, cache=str(tmp_path / "c.sqlite"), threads=1)
    arrays = inputs(problem, 5)
    np.testing.assert_allclose(result.kernel(*arrays), reference(problem, arrays), rtol=0, atol=1e-4)
    if result.answer.record.found_by == "in place":
        assert result.tuned_as is None and not result.kernel.packed_inputs
        assert result.actions[0].startswith("plan_dot_")
    # no actions: a start won (on AVX-512 the re-laid start already streams n in vectors)
    assert result.tuned_as is None and result.replayed() == result.nest
    again = looprl.tune(problem, cache=str(tmp_path / "c.sqlite"), threads=1)  # remembered: the same choice
    assert again.answer.mode == "remembered" and again.nest == result.nest


def test_tune_searches_in_place_only_few_rows_as_given():
    from looprl.tune.winner import in_place_rows

    assert in_place_rows(looprl.linear(16, 64, 64)) and not in_place_rows(looprl.linear(17, 64, 64))
    assert not in_place_rows(looprl.matmul(1, 64, 64))  # B[k, n]: the reduction is not last in B


def test_a_tuned_layer_reads_an_in_place_weight_live(monkeypatch):
    """Row counts whose kernels read the weight in place take the live tensors: an edit of the
    weight is followed with nothing compared or bound again (the content cache is never asked)."""
    from looprl.torch.routes import LinearKernels
    from looprl.torch.weights import ContentCache

    layer = torch.nn.Linear(96, 40)
    problem = looprl.linear(1, 96, 40)
    nest = plan_nest(problem, HOST, Plan(1, 4, dot=True))
    result = looprl.TuneResult(problem, kernel=looprl.compile(nest), answer=_answer(nest))
    kernels = LinearKernels(96, 40, None, {1: result})
    assert kernels.in_place == {1}
    asked = []
    monkeypatch.setattr(ContentCache, "get", lambda self, *a: asked.append(a) or {})
    x = torch.randn(1, 96)
    with torch.no_grad():
        torch.testing.assert_close(kernels(x, layer.weight, layer.bias), layer(x), rtol=1e-5, atol=1e-5)
        layer.weight.mul_(-2)
        layer.bias.add_(1)
        torch.testing.assert_close(kernels(x, layer.weight, layer.bias), layer(x), rtol=1e-5, atol=1e-5)
        strided = torch.nn.Parameter(torch.randn(96, 40).t())  # not contiguous: read through a contiguous copy
        torch.testing.assert_close(kernels(x, strided, layer.bias), torch.nn.functional.linear(x, strided, layer.bias), rtol=1e-5, atol=1e-5)
    assert not asked


def _answer(nest):
    from looprl.measurement.schedule_record import ScheduleRecord
    from looprl.tune.results import Answer

    return Answer(ScheduleRecord(nest, 1.0, ("plan_dot_1x4",), "in place", HOST, 1), "measured", 1.0)


@pytest.mark.parametrize("target", [AVX2, SSE4])
def test_each_target_has_dot_tiles_that_fit_its_registers(target):
    for plan in dot_plans(target):
        assert target.fits(plan.rows, plan.vectors)


def test_a_re_laid_copy_that_is_compared_on_every_call_must_win_with_its_comparison_counted():
    """tune's choice between the re-laid start's answer (a copy of the weight) and the in-place
    answer: the copy must be IN_PLACE_MARGIN faster, with the seconds of comparing it on every
    call added to its call where the weights may change (``weights_change``)."""
    from dataclasses import replace

    from looprl.ir.rewrites import relaid
    from looprl.tune.winner import IN_PLACE_MARGIN, preferred as _preferred

    problem = looprl.linear(64, 640, 640)
    copy, in_place = _answer(relaid(problem).start), _answer(looprl.initial_nest(problem))
    copy = replace(copy, record=replace(copy.record, gflops=40.0))
    in_place = replace(in_place, record=replace(in_place.record, gflops=36.0))
    assert _preferred([copy, in_place]).nest == copy.nest  # 11% faster: the copy
    assert _preferred([copy, replace(in_place, record=replace(in_place.record, gflops=39.0))]).nest == in_place.nest  # a near-tie
    call_s = problem.flops / 40e9
    assert _preferred([copy, in_place], compare_s=0.2 * call_s).nest == in_place.nest  # the comparison makes the copy 33 GFLOPS
    assert _preferred([copy, None]) is copy
    assert IN_PLACE_MARGIN == 0.05


def test_tune_searches_every_row_count_in_place_where_the_weights_may_change(tmp_path):
    problem = looprl.linear(64, 96, 64)
    result = looprl.tune(problem, cache=str(tmp_path / "c.sqlite"), threads=1, weights_change=True)
    arrays = inputs(problem, 2)
    np.testing.assert_allclose(result.kernel(*arrays), reference(problem, arrays), rtol=0, atol=1e-4)
    from looprl.measurement.cache import MeasurementCache

    cache = MeasurementCache(str(tmp_path / "c.sqlite"))
    assert cache.get_tuned(problem, HOST, threads=1, tuner=TUNER) is not None  # searched in place, remembered
    with pytest.raises(ValueError, match="weights_change"):
        looprl.tune(problem, cache=":memory:", weights_change="yes")


def test_many_rows_are_searched_in_place_only_where_the_comparison_is_a_share_of_the_call():
    from dataclasses import replace

    from looprl.ir.rewrites import relaid
    from looprl.tune.winner import COMPARISON_SHARE, searches_in_place as _searches_in_place

    for rows, compare_share, expected in ((8, 0.0, True), (64, 2 * COMPARISON_SHARE, True), (512, COMPARISON_SHARE / 4, False)):
        problem = looprl.linear(rows, 640, 640)
        copy = _answer(relaid(problem).start)
        copy = replace(copy, record=replace(copy.record, gflops=40.0))
        compare_s = compare_share * problem.flops / 40e9
        assert _searches_in_place(problem, copy, compare_s) is expected, rows
    assert not _searches_in_place(None, copy, 1.0)


def test_a_rollout_alone_or_a_capped_tune_does_not_search_in_place():
    """budget_s=0 is the policy's rollout alone, and max_evaluations caps the schedules measured:
    neither measures the dot-product tiles besides."""
    problem = looprl.linear(1, 64, 48)
    for options in ({"budget_s": 0}, {"max_evaluations": 3}):
        result = looprl.tune(problem, cache=":memory:", threads=1, **options)
        assert result.answer.record.found_by != "in place" and result.record.replays_on == RELAID, options
