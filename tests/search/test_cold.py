"""Cold problems: constant inputs read from memory on every call (a decode step of a model whose
weights outgrow the last-level cache), timed over copies, tuned with panel schedules first, and
chosen by tune_module and the compile backend when the model's weights outgrow the cache."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import ActionSet
from looprl.backend.kernel import Kernel
from looprl.ir.layers import linear
from looprl.ir.problem import parse_problem
from looprl.ir.register_tiles import packed_right
from looprl.ir.rewrites import relaid
from looprl.ir.schedules import PANEL_REGISTERS, panel_steps, panel_widths, stream_panel_shapes, stream_panel_steps
from looprl.measurement import timing
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.search.tiles import measure_tiles
from looprl.search.context import SearchContext
from looprl.target import Target
from tests.guarded import GuardedArray
from tests.policies import random_policy


def test_a_cold_problem_is_named_parsed_and_kept_through_its_rewrites():
    problem = linear(1, 96, 200, activation="relu").with_cold()
    assert problem.cold and problem.name.endswith(";cold")
    assert parse_problem(problem.name) == problem and not parse_problem(problem.name.replace(";cold", "")).cold
    assert problem.with_epilogue(bias=True).cold and not problem.with_cold(False).cold
    assert relaid(problem).coordinates.cold  # its re-laid start's coordinates problem is cold too
    with pytest.raises(ValueError, match="constant"):
        looprl.matmul(4, 8, 8).with_cold()
    with pytest.raises(ValueError, match="cold must be"):
        looprl.contraction("mk,kn->mn", m=2, n=2, k=2, constant="b", cold="yes")
    with pytest.raises(ValueError, match="bad part"):
        parse_problem("mk,kn->mn:m=2,k=2,n=2;const=in1;cold=1")
    # bytes other work reads between two calls: named, parsed, carried through the rewrites
    some = linear(4, 96, 200).with_between(3 << 20)
    assert some.cold and some.between == 3 << 20 and some.name.endswith(";between=3145728") and parse_problem(some.name) == some
    assert relaid(some).coordinates.between == 3 << 20 and some.with_epilogue(bias=False).between == 3 << 20
    assert problem.between == looprl.ir.problem.COLD and not linear(4, 96, 200).cold
    for bad, match in (("-1", "whole number"), ("1.5", "whole number"), ("x", "whole number")):
        with pytest.raises(ValueError, match=match):
            parse_problem(f"mk,nk->mn:m=2,k=2,n=2;const=in1;between={bad}")
    with pytest.raises(ValueError, match="one of them"):
        parse_problem("mk,nk->mn:m=2,k=2,n=2;const=in1;cold;between=5")
    with pytest.raises(ValueError, match="between"):
        linear(4, 96, 200).with_between(-5)
    with pytest.raises(ValueError, match="constant"):
        looprl.matmul(4, 8, 8).with_between(100)
    with pytest.raises(ValueError, match="not both"):
        looprl.contraction("mk,kn->mn", m=2, n=2, k=2, constant="b", cold=True, between=10)


def test_copies_cover_twice_the_last_level_cache_and_one_input_larger_than_that_is_its_own():
    assert timing.cold_copy_count(8 << 20, llc_bytes=32 << 20) == 9  # 8 copies pass 64 MB, + the one in use
    assert timing.cold_copy_count(100 << 20, llc_bytes=32 << 20) == 1
    assert timing.cold_copy_count(1 << 10, llc_bytes=32 << 20) == timing.MAX_COLD_COPIES
    # a given number of bytes between calls: copies that put about as many between two uses of one
    assert timing.cold_copy_count(8 << 20, llc_bytes=32 << 20, between=16 << 20) == 3
    assert timing.cold_copy_count(8 << 20, llc_bytes=32 << 20, between=3 << 20) == 1  # less than half a weight: warm
    assert timing.cold_copy_count(8 << 20, llc_bytes=32 << 20, between=1 << 30) == 9  # past twice the cache: as cold


@pytest.mark.parametrize("key", [None, "n3s64t8,k40s1,m2s1,n64s1|m2s1,n200s1|in1=n64.k1.n1%64"])
def test_a_cold_timing_calls_each_copy_in_turn_and_every_copy_computes_the_same_answer(key, monkeypatch):
    monkeypatch.setattr(timing, "cache_sizes", lambda: (1 << 16, 100_000))  # 32 KB weights: 8 copies
    problem = looprl.matmul(2, 200, 40, constant="b").with_cold()
    nest = looprl.initial_nest(problem) if key is None else looprl.LoopNest.from_key(problem, key)
    kernel = looprl.compile(nest)
    assert bool(kernel.packed_inputs) == (key is not None)
    ws = timing.Workspace(problem)
    ws.ensure(kernel.workspace_elements)
    used = []
    original = Kernel._call

    def recording(self, function, pointers, reps, threads, rows=None):
        used.append(pointers)
        original(self, function, pointers, reps, threads, rows)
        np.testing.assert_allclose(ws.out, ws.inputs[0] @ ws.inputs[1], rtol=1e-4, atol=1e-4)
        ws.out[...] = np.nan  # the next call must write every element again

    monkeypatch.setattr(Kernel, "_call", recording)
    copies = timing.cold_copy_count(ws.inputs[1].nbytes)
    assert copies == 8
    timing._cold_call(kernel, ws, 1, 1)(2 * copies)
    weights = [pointers[kernel.tensors.index("in1")] for pointers in used]
    assert len(set(weights)) == copies and weights[:copies] == weights[copies:]  # each copy once per round, in turn
    assert timing.time_kernel(kernel, 0.002, workspace=ws).gflops > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 4), n=st.integers(3, 300), k=st.integers(1, 90), columns=st.sampled_from([2, 16, 64, 128, 256]))
def test_panel_schedules_with_tails_compute_what_numpy_does(m, n, k, columns):
    problem = linear(m, k, n, bias=True).with_cold()
    twin = relaid(problem).coordinates
    columns = min(columns, n - 1)
    if columns < 2:
        return
    nest = looprl.initial_nest(twin).apply(panel_steps(twin, columns))
    assert [lp.var for lp in nest.compute][-3:] == ["k", "m", "n"] and nest.compute[0].var == "n"
    nest = relaid(problem).schedule(nest)
    rng = np.random.default_rng(m * 1000 + n + k)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (n, k), (n,)))
    np.testing.assert_allclose(looprl.compile(nest)(x, w, b), x @ w.T + b, rtol=1e-4, atol=1e-4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 3), n=st.integers(5, 300), k=st.integers(1, 90), streams=st.sampled_from([2, 4, 8]),
       columns=st.sampled_from([2, 8, 16, 32]))
def test_panels_read_side_by_side_with_tails_compute_what_numpy_does_and_stay_in_bounds(m, n, k, streams, columns):
    """Groups of panels that the output's columns do not divide, panels the group does not
    divide, packed by the panel's width, bound once and called on a weight between guard pages."""
    problem = linear(m, k, n, bias=True).with_cold()
    rewrite = relaid(problem)
    twin = rewrite.coordinates
    if streams * columns >= n:
        with pytest.raises(ValueError, match="streams"):
            stream_panel_steps(twin, streams, columns)
        return
    nest = looprl.initial_nest(twin).apply(stream_panel_steps(twin, streams, columns))
    assert [lp.var for lp in nest.compute] == ["n", "k", "m", "n", "n"] and nest.compute[-1].size == columns
    kernel = looprl.compile(rewrite.schedule(packed_right(nest)))
    assert kernel.packed_inputs
    rng = np.random.default_rng(m * 1000 + n + k)
    guards = [GuardedArray(shape, side) for side in ("end", "start") for shape in ((m, k), (n, k), (n,), (m, n))]
    try:
        for group in (guards[:4], guards[4:]):
            x, w, b, out = (guard.array for guard in group)
            for array in (x, w, b):
                array[...] = rng.standard_normal(array.shape)
            kernel.run(x, w, out, bias=b)
            np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-4, atol=1e-4)
            kernel.bind(b=w, bias=b).run(x, out=out)
            np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-4, atol=1e-4)
    finally:
        for guard in guards:
            guard.release()


def test_panels_side_by_side_keep_every_row_s_accumulators_in_registers():
    avx2, avx512 = Target.named("avx2"), Target.named("avx512")
    assert stream_panel_shapes(looprl.matmul(1, 3072, 768), avx2) == [(4, 16), (4, 8), (8, 16), (8, 8)]
    assert stream_panel_shapes(looprl.matmul(1, 3072, 768), avx512) == [(4, 32), (4, 16), (8, 32), (8, 16)]
    assert stream_panel_shapes(looprl.matmul(2, 3072, 768), avx2) == [(4, 16), (4, 8), (8, 8)]
    assert stream_panel_shapes(looprl.matmul(4, 3072, 768), avx2) == [(4, 8)]
    assert stream_panel_shapes(looprl.matmul(1, 64, 768), avx2) == [(4, 8)]  # narrower than the output together
    for rows in (1, 2, 3, 4, 5, 16):
        for streams, columns in stream_panel_shapes(looprl.matmul(rows, 3072, 768), avx2):
            assert rows * streams * columns // 8 <= PANEL_REGISTERS


def test_panel_widths_keep_every_row_s_accumulators_in_registers():
    avx512 = Target.named("avx512")
    assert panel_widths(looprl.matmul(1, 3072, 768), avx512) == [64, 128, 256]
    assert panel_widths(looprl.matmul(4, 3072, 768), avx512) == [64]
    assert all(4 * -(-w // 16) <= PANEL_REGISTERS for w in panel_widths(looprl.matmul(4, 3072, 768), avx512))
    assert panel_widths(looprl.matmul(1, 100, 768), avx512) == [64]  # narrower than the output
    with pytest.raises(ValueError, match="panel columns"):
        panel_steps(looprl.matmul(1, 64, 64), 64)


def test_a_cold_problem_measures_packed_panels_first():
    problem = relaid(linear(1, 256, 512, bias=False).with_cold()).coordinates
    measured = []

    class Recording(Evaluator):
        def __call__(self, nest):
            measured.append(nest)
            return super().__call__(nest)

    evaluator = Recording(MeasurementCache(":memory:"), 0.001, samples=1)
    measure_tiles(SearchContext(problem, ActionSet(), evaluator), ActionSet())
    side_by_side, widths = stream_panel_shapes(problem, evaluator.target), panel_widths(problem, evaluator.target)
    assert side_by_side and widths
    first = measured[:len(side_by_side) + len(widths)]
    # panels read side by side, then one at a time: each group (or panel) outermost, the panel's width innermost
    assert [(nest.compute[-2].size, nest.compute[-1].size) for nest in first[:len(side_by_side)]] == side_by_side
    assert [nest.compute[-1].size for nest in first[len(side_by_side):]] == widths
    assert all(nest.layouts and nest.compute[0].var == "n" for nest in first)  # packed, a panel at a time
    warm = relaid(linear(1, 256, 512, bias=False)).coordinates
    measured.clear()
    measure_tiles(SearchContext(warm, ActionSet(), evaluator), ActionSet())
    assert not any(nest.key in {m.key for m in first} for nest in measured[:1])


def test_tune_of_a_cold_problem_returns_a_kernel_that_computes_the_layer(tmp_path):
    policy = random_policy(seed=5).save(tmp_path / "policy")
    problem = linear(2, 160, 300, bias=True, activation="relu").with_cold()
    result = looprl.tune(problem, policy, budget_s=0.3, cache=":memory:")
    assert result.problem == problem and result.kernel.problem.cold
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 160)).astype(np.float32), rng.standard_normal((300, 160)).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    np.testing.assert_allclose(result.kernel(x, w, b), np.maximum(x @ w.T + b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("llc_bytes", "measure"), [(10_000, True), (1 << 30, False)])
def test_tune_module_tunes_few_rows_with_the_other_layers_bytes_between_calls(llc_bytes, measure, tmp_path, monkeypatch):
    """Rows up to COLD_ROWS carry the bytes of the model's other weights (read between two calls
    of the layer in a decode step), named cold where that reaches twice the last-level cache;
    in measured tuning and on the fast path (the policy alone: a third of the time). Tuned for
    the rows seen, 1, COLD_ROWS and twice that (max_rows=1: no other power of two, each row
    count a tune of ~0.6 CPU s when measured), so both sides of COLD_ROWS are checked."""
    torch = pytest.importorskip("torch")
    from looprl import torch as looprl_torch

    monkeypatch.setattr("looprl.torch.layers.cache_sizes", lambda: (1 << 16, llc_bytes))  # weights: 24 KB and 12 KB
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32)).eval()
    policy = random_policy(seed=5).save(tmp_path / "policy")
    examples = [torch.randn(rows, 64) for rows in (1, looprl_torch.COLD_ROWS, 2 * looprl_torch.COLD_ROWS)]
    tuned = looprl_torch.tune_module(model, examples, policy=policy, budget_s=0.05, cache=":memory:", progress=False,
                                     compare_torch=False, measure=measure, max_rows=1)
    layers = looprl_torch.tuned_layers(tuned)
    assert len(layers) == 2
    others = {64: 4 * 96 * 32, 96: 4 * 64 * 96}  # by in_features: the other layer's weight
    for _, layer in layers:
        between = others[layer.in_features]
        expected = looprl.ir.problem.COLD if llc_bytes == 10_000 and between >= 2 * llc_bytes else between
        found = {rows: result.problem.between for rows, result in layer.results.items()}
        assert sorted(found) == [1, looprl_torch.COLD_ROWS, 2 * looprl_torch.COLD_ROWS]
        assert found == {rows: expected if rows <= looprl_torch.COLD_ROWS else 0 for rows in found}, found
    with torch.no_grad():
        for x in examples + [torch.randn(5, 64)]:
            torch.testing.assert_close(tuned(x), model(x), rtol=1e-4, atol=1e-4)


def test_a_frozen_layer_judges_its_cold_rows_on_copies_of_the_weight_in_turn(monkeypatch):
    torch = pytest.importorskip("torch")
    from looprl import torch as looprl_torch

    monkeypatch.setattr("looprl.torch.routes.cold_copy_count", lambda nbytes, **_: 3)
    results = {}
    for rows in (1, 32):
        problem = linear(rows, 48, 40, bias=True)
        problem = problem.with_cold() if rows == 1 else problem
        nest = looprl.initial_nest(problem)
        results[rows] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0,
                                          initial_gflops=1.0, seconds=0.0, mode="policy")
    layer = torch.nn.Linear(48, 40)
    kernels = looprl_torch.LinearKernels(48, 40, None, results, frozen=True)
    seen, answers = [], []
    fallback = kernels.fallback

    def recording(x, weight, bias):
        seen.append((x.shape[0], weight.data_ptr()))
        return fallback(x, weight, bias)

    monkeypatch.setattr(kernels, "fallback", recording)
    run_plan = kernels._run_plan

    def checked(x, rows, plan, kernel_set):
        answer = run_plan(x, rows, plan, kernel_set)
        answers.append(bool(torch.allclose(answer, fallback(x, layer.weight, layer.bias), rtol=1e-4, atol=1e-4)))
        return answer

    monkeypatch.setattr(kernels, "_run_plan", checked)
    routes = kernels.judge(layer.weight.detach(), layer.bias.detach(), budget_s=0.002, rounds=1)
    assert sorted(routes) == [1, 32]
    one_row = {pointer for rows, pointer in seen if rows == 1}
    assert len(one_row) == 3 and layer.weight.data_ptr() in one_row  # the weight and two copies, in turn
    assert {pointer for rows, pointer in seen if rows == 32} == {layer.weight.data_ptr()}  # warm rows: the weight itself
    assert answers and all(answers)  # every copy's kernels compute the layer
