"""Issue 61, item 3: tune's streaming tiles of a few-row problem (looprl.search.streams). A problem
whose output rows fit the register-blocked tile also gets deeper tiles (more rows of the right
operand read at once), bounded by the L1 it is given; one whose rows are long streams, or with
too many rows, does not; every deep tile computes numpy's answer, tails included, on every
runnable target; measure_tiles measures each proposal."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import ActionSet
from looprl.backend.register_plan import BLOCKED_TILE_FLOATS
from looprl.ir.cache_blocks import Caches
from looprl.ir.schedules import STREAM_ROWS, STREAM_TILES, stream_steps, why_not_stream
from looprl.search.context import SearchContext
from looprl.search.streams import L1_SHARE, STREAM_COLUMNS, STREAM_DEPTHS, set_crowding, short_segments, stream_tiles
from looprl.search.tiles import measure_tiles
from tests.conftest import examples
from tests.search.test_prefetch_proposals import FakeEvaluator
from tests.search.test_tiles import RUNNABLE, _check_against_guard_pages

pytestmark = pytest.mark.target_dependent  # the kernels checked are the target's register blocks

ZEN4 = Caches(32 << 10, 1 << 20, 32 << 20)
DEEP = tuple((depth, columns) for columns in STREAM_COLUMNS for depth in STREAM_DEPTHS)


def test_a_one_row_problem_whose_row_fits_the_register_blocks_gets_the_deep_tiles_l1_allows():
    problem = looprl.matmul(1, 960, 960)
    assert short_segments(problem)
    tiles = stream_tiles(problem, ZEN4)
    assert tiles[:len(STREAM_TILES)] == STREAM_TILES  # the fixed ones first, in their order
    assert tiles[len(STREAM_TILES):] == ((16, 32), (32, 32), (64, 32), (16, 64), (32, 64))  # 64 x 64 floats: half of L1
    assert all(depth * columns * 4 * L1_SHARE <= ZEN4.l1 for depth, columns in tiles[len(STREAM_TILES):])
    assert stream_tiles(problem, Caches(16 << 10, 1 << 20, 0))[len(STREAM_TILES):] == ((16, 32), (32, 32), (16, 64))
    assert stream_tiles(problem, Caches(0, 0, 0)) == STREAM_TILES  # an L1 not known: no deep tile


def test_long_rows_many_rows_and_a_short_reduction_get_no_tile_that_does_not_fit():
    long_rows = looprl.matmul(1, 4864, 896)  # 4864 floats a row: the nest's order holds, rows are long streams
    assert not short_segments(long_rows) and stream_tiles(long_rows, ZEN4) == STREAM_TILES
    four = looprl.matmul(4, 480, 1024)  # 4 x 480 below BLOCKED_TILE_FLOATS: short segments
    assert 4 * 480 <= BLOCKED_TILE_FLOATS and set(DEEP) & set(stream_tiles(four, ZEN4))
    assert not set(DEEP) & set(stream_tiles(looprl.matmul(4, 520, 1024), ZEN4))
    assert stream_tiles(looprl.matmul(STREAM_ROWS + 1, 128, 1024), ZEN4) == ()
    short_k = stream_tiles(looprl.matmul(1, 960, 20), ZEN4)
    assert (16, 32) in short_k and not [t for t in short_k if t[0] >= 20]  # k_inner below the reduction
    narrow = stream_tiles(looprl.matmul(1, 48, 960), ZEN4)
    assert all(columns < 48 for _, columns in narrow) and (16, 32) in narrow and (16, 64) not in narrow
    for tiles in (short_k, narrow):
        assert len(set(tiles)) == len(tiles)


def test_rows_a_power_of_two_apart_get_no_deep_tile_that_crowds_an_l1_set():
    assert set_crowding(looprl.matmul(1, 960, 960), 32, 64) == 2  # rows 3840 bytes apart: 16 sets' offsets, each twice
    assert set_crowding(looprl.matmul(1, 512, 2048), 32, 64) == 16  # rows 2 KB apart: two offsets
    assert set_crowding(looprl.matmul(1, 1024, 1024), 8, 16) == 8
    for shape in ((1, 512, 2048), (1, 1024, 1024)):  # both short segments, yet only the fixed tiles
        problem = looprl.matmul(*shape)
        assert short_segments(problem) and stream_tiles(problem, ZEN4) == STREAM_TILES
    assert stream_tiles(looprl.matmul(1, 768, 768), ZEN4)[len(STREAM_TILES):] == ((16, 32), (16, 64))  # 3 KB apart: 4 per set at 16
    assert (32, 32) in stream_tiles(looprl.matmul(1, 768, 768), Caches(64 << 10, 1 << 20, 0))  # 16 ways: 8 lines a set
    assert (16, 32) not in stream_tiles(looprl.matmul(1, 768, 768), Caches(16 << 10, 1 << 20, 0))  # 4 ways: 2 a set


def test_stream_tiles_refuses_caches_that_are_not_caches():
    with pytest.raises(ValueError, match="Caches"):
        stream_tiles(looprl.matmul(1, 960, 960), {"l1": 32768})


def test_measure_tiles_measures_every_streaming_proposal_and_only_those():
    problem = looprl.matmul(1, 960, 960)
    evaluator = FakeEvaluator()
    measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
    measured = {nest.key for nest in evaluator.measured}
    wanted = {looprl.initial_nest(problem).apply(stream_steps(problem, *tile)).key for tile in stream_tiles(problem)}
    assert len(wanted) > len(STREAM_TILES) and wanted <= measured  # this host's L1 holds the smallest deep tile
    long_rows = looprl.matmul(1, 4864, 896)
    evaluator = FakeEvaluator()
    measure_tiles(SearchContext(long_rows, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
    deep = {looprl.initial_nest(long_rows).apply(stream_steps(long_rows, *tile)).key for tile in DEEP}
    assert not deep & {nest.key for nest in evaluator.measured}


@settings(max_examples=examples(16), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, STREAM_ROWS), n=st.integers(3, 200), k=st.integers(3, 140),
    tile=st.sampled_from(DEEP), target=st.sampled_from(RUNNABLE), side=st.sampled_from(["start", "end"]),
)
def test_deep_streaming_tiles_with_tails_compute_what_numpy_does_and_stay_in_bounds(m, n, k, tile, target, side):
    problem = looprl.matmul(m, n, k)
    depth, columns = tile
    if why_not_stream(problem, depth, columns) is not None:
        depth, columns = min(depth, k - 1), min(columns, n - 1)
    _check_against_guard_pages(looprl.initial_nest(problem).apply(stream_steps(problem, depth, columns)), target, side)


@pytest.mark.parametrize("shape", [(1, 960, 960), (3, 500, 333), (1, 1000, 1280)])
def test_each_proposed_tile_of_a_decode_shape_computes_what_numpy_does(shape):
    problem = looprl.matmul(*shape)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, problem.input_shapes[0]).astype(np.float32)
    b = rng.uniform(-1, 1, problem.input_shapes[1]).astype(np.float32)
    for tile in stream_tiles(problem, ZEN4):
        kernel = looprl.compile(looprl.initial_nest(problem).apply(stream_steps(problem, *tile)))
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4 * shape[2], err_msg=str(tile))
