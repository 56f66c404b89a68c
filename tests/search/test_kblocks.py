"""Issue 61, item 3: a few-row problem with a long reduction gets its fastest flat tile with the
reduction blocks outermost (looprl.search.kblocks): block sizes from the L2 it is given, none
where the code generator would take the block loop into its register scope, where the problem
has many rows or no more than the tile's; the steps put the block loop outermost; every such
nest computes numpy's answer, tails included, on every runnable target; measure_tiles measures
them, as paths that replay."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import ActionSet
from looprl.backend.register_plan import plan
from looprl.ir.action import action_steps
from looprl.ir.cache_blocks import Caches
from looprl.ir.layers import linear
from looprl.ir.step import MAX_FACTOR
from looprl.ir.register_tiles import tile_shapes, tile_steps, why_not_tile
from looprl.search.context import SearchContext
from looprl.search.kblocks import MIN_BLOCK, kblock_sizes, kblock_steps
from looprl.search.tiles import measure_tiles
from looprl.target import Target
from tests.conftest import examples
from tests.search.test_prefetch_proposals import TARGET, FakeEvaluator
from tests.search.test_tiles import RUNNABLE, _check_against_guard_pages

pytestmark = pytest.mark.target_dependent  # the kernels checked are the target's register tiles

ZEN4 = Caches(32 << 10, 1 << 20, 32 << 20)


def test_block_sizes_fill_half_of_l2_then_a_quarter_evened_over_the_reduction():
    assert kblock_sizes(looprl.matmul(16, 256, 16384), 4, ZEN4) == (512, 256)  # 512 x 256 floats: 512 KB
    assert kblock_sizes(looprl.matmul(16, 256, 16384), 4, Caches(32 << 10, 2 << 20, 0)) == (MAX_FACTOR,)  # 1024: capped
    assert kblock_sizes(looprl.matmul(8, 1000, 3000), 4, ZEN4) == (128, 64)  # 131 rows: 24 blocks of 125, rounded up
    for problem in (looprl.matmul(16, 256, 16384), looprl.matmul(8, 1000, 3000), looprl.matmul(4, 600, 5000)):
        for block in kblock_sizes(problem, 2, ZEN4):
            assert block % 16 == 0 and MIN_BLOCK <= block < problem.size("k")


def test_no_block_where_it_would_not_be_kept_outermost_or_reused():
    assert kblock_sizes(looprl.matmul(16, 128, 16384), 4, ZEN4) == ()  # 2048 outputs: the register scope takes it in
    assert plan(looprl.initial_nest(looprl.matmul(16, 128, 512)), TARGET).tile_registers  # (the plan exists)
    assert kblock_sizes(looprl.matmul(17, 256, 16384), 4, ZEN4) == ()  # not few rows
    assert kblock_sizes(looprl.matmul(4, 1024, 16384), 4, ZEN4) == ()  # one row tile: nothing reuses a block
    assert kblock_sizes(looprl.matmul(16, 10240, 2560), 4, ZEN4) == ()  # 12 rows of B fill half of L2: too short
    assert kblock_sizes(looprl.matmul(16, 256, 16384), 4, Caches(32 << 10, 0, 0)) == ()  # L2 not known
    assert kblock_sizes(looprl.matmul(16, 256, 300), 4, ZEN4) == ()  # the whole reduction fits
    with pytest.raises(ValueError, match="Caches"):
        kblock_sizes(looprl.matmul(16, 256, 16384), 4, (32768, 1 << 20))
    with pytest.raises(ValueError, match="rows"):
        kblock_sizes(looprl.matmul(16, 256, 16384), 0, ZEN4)


def test_the_steps_move_the_block_loop_outermost_and_the_generator_keeps_it_outside_the_scope():
    problem = looprl.matmul(16, 256, 16384)
    flat = looprl.initial_nest(problem).apply(tile_steps(problem, 4, 24))
    nest = flat.apply(kblock_steps(flat, 512))
    assert [(lp.var, lp.step) for lp in nest.compute][:1] == [("k", 512)]
    assert [(lp.size, lp.step) for lp in nest.compute if lp.var == "k"] == [(32, 512), (512, 1)]
    assert plan(nest, Target.named("avx2")).scope_start > 0  # the block loop stays a loop around the tile
    with pytest.raises(ValueError, match="reduction block 20000"):
        kblock_steps(flat, 20000)


@settings(max_examples=examples(16), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(2, 16), n=st.integers(3, 120), k=st.integers(20, 300), block=st.integers(2, 19),
    tile=st.sampled_from([(1, 16), (2, 8), (4, 24), (3, 5)]), target=st.sampled_from(RUNNABLE), side=st.sampled_from(["start", "end"]),
)
def test_reduction_blocks_outermost_with_tails_compute_what_numpy_does_and_stay_in_bounds(m, n, k, block, tile, target, side):
    problem = looprl.matmul(m, n, k)
    rows, columns = min(tile[0], m), min(tile[1], n)
    if why_not_tile(problem, rows, columns) is not None:
        rows, columns = 1, min(8, n)
    flat = looprl.initial_nest(problem).apply(tile_steps(problem, rows, columns))
    _check_against_guard_pages(flat.apply(kblock_steps(flat, block)), target, side)


def test_measure_tiles_measures_the_fastest_flat_tile_with_its_blocks_outermost():
    problem = looprl.matmul(16, 256, 16384)
    evaluator = FakeEvaluator()
    record, _ = measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
    flats = [looprl.initial_nest(problem).apply(tile_steps(problem, *shape)) for shape in tile_shapes(problem, TARGET)
             if why_not_tile(problem, *shape) is None]
    fastest = max(flats, key=FakeEvaluator.value)
    rows = next(shape[0] for shape in tile_shapes(problem, TARGET)
                if why_not_tile(problem, *shape) is None and looprl.initial_nest(problem).apply(tile_steps(problem, *shape)) == fastest)
    blocks = kblock_sizes(problem, rows)
    assert blocks  # this host's L2 gives at least one
    measured = {nest.key for nest in evaluator.measured}
    for block in blocks:
        assert fastest.apply(kblock_steps(fastest, block)).key in measured
    assert looprl.initial_nest(problem).apply(action_steps(problem, record.actions, TARGET)) == record.nest  # the answer replays


def test_a_linear_layer_s_weight_as_stored_gets_its_blocks_outermost_packed_and_they_compute_what_numpy_does():
    problem = linear(16, 2048, 256, bias=False)  # W[n, k], a constant: every tile is packed
    evaluator = FakeEvaluator()
    measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
    blocked = [nest for nest in evaluator.measured if nest.compute[0].var == "k"]
    assert len(blocked) == len(kblock_sizes(problem, 4)) > 0
    rng = np.random.default_rng(0)
    a, w = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in problem.input_shapes)
    for nest in blocked:
        assert nest.layouts  # the weight packed into column panels
        np.testing.assert_allclose(looprl.compile(nest)(a, w), a @ w.T, rtol=1e-4, atol=1e-3 * 2048 ** 0.5)
