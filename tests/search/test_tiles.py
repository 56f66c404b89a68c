"""Register tiles, cache blocks and packing as env action paths; budgets that follow the problem."""

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.target import Target
from looprl.actions import ActionSet, State
from looprl.ir.register_tiles import tile_of, tile_shapes, tile_steps
from looprl.ir.schedules import STREAM_ROWS, STREAM_TILES, stream_steps, why_not_stream
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.search.budget import MAX_BUDGET_S, MIN_BUDGET_S, scaled_budget
from looprl.search.context import BudgetExhausted, SearchContext
from looprl.policy.rollout import measured_path
from looprl.search.tiles import all_tiles, measure_tiles
from looprl.tune.winner import CONTENDER_WITHIN
from tests.conftest import examples
from tests.guarded import GuardedArray
from tests.policies import random_policy

pytestmark = pytest.mark.target_dependent  # the tiles searched are the target's register tiles

TARGETS = [Target.named("avx512"), Target.named("avx2"), Target.named("sse4")]


def _runs_here(target):
    try:
        target.check_runs_on_host()
    except ValueError:
        return False
    return True


RUNNABLE = [t for t in TARGETS if _runs_here(t)]


def _reference(problem, a, b):
    return np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))


def test_a_flat_tile_is_the_register_blocked_order():
    nest = looprl.initial_nest(looprl.matmul(128, 768, 768)).apply(tile_steps(looprl.matmul(128, 768, 768), 14, 32))
    assert [(lp.var, lp.size, lp.step, lp.tail) for lp in nest.compute] == [
        ("n", 24, 32, 0), ("m", 9, 14, 2), ("k", 768, 1, 0), ("m", 14, 1, 0), ("n", 32, 1, 0)]


def test_a_blocked_tile_blocks_k_and_n_around_the_register_tile():
    problem = looprl.matmul(100, 1000, 700)
    nest = looprl.initial_nest(problem).apply(tile_steps(problem, 6, 64, k_block=256, n_block=512))
    assert [(lp.var, lp.step) for lp in nest.compute] == [("n", 512), ("k", 256), ("m", 6), ("n", 64), ("k", 1), ("m", 1), ("n", 1)]
    assert nest.compute[0].tail == 1000 - 512 and nest.compute[1].tail == 700 - 2 * 256
    with pytest.raises(ValueError, match="multiple of columns"):
        tile_steps(problem, 6, 64, k_block=256, n_block=100)
    with pytest.raises(ValueError, match="two output dimensions"):
        tile_steps(looprl.contraction("mk,k->m", m=8, k=8), 2, 2)


def test_tile_shapes_widen_the_tile_when_the_output_has_few_rows():
    avx512 = Target.named("avx512")
    assert tile_shapes(looprl.matmul(256, 256, 256), avx512)[0] == (14, 32)
    gemv = tile_shapes(looprl.matmul(1, 4096, 1024), avx512)
    assert gemv == [(1, 30 * 16)]  # 30 accumulators + 1 input vector + 1 broadcast = 32 registers (Target.fits)
    assert tile_shapes(looprl.matmul(3, 20, 64), Target.named("avx2")) == [(3, 20), (2, 20)]  # clipped to the 20 columns


def test_the_tiles_proposed_hold_the_cache_blocks_of_the_host_s_caches(monkeypatch):
    from looprl.ir import schedules
    from looprl.ir.cache_blocks import Caches, blocked_steps
    from looprl.ir.register_tiles import packed_right

    problem, target = looprl.matmul(130, 1000, 700), Target.named("avx2")
    small = Caches(8 * 2**10, 16 * 2**10, 128 * 2**10)
    monkeypatch.setattr(schedules, "host_caches", lambda: small)
    proposed = all_tiles(problem, target)
    blocked = [looprl.initial_nest(problem).apply(blocked_steps(problem, rows, columns, blocks, pack=False))
               for rows, columns in tile_shapes(problem, target) for blocks in schedules.cache_blocks(problem, rows, columns)]
    assert blocked and all(nest in proposed and packed_right(nest) in proposed for nest in blocked)
    monkeypatch.setattr(schedules, "host_caches", lambda: Caches(0, 0, 0))  # sizes not known: no block
    assert all(sum(lp.var == "k" for lp in nest.compute) == 1 for nest in all_tiles(problem, target))


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40), n=st.integers(2, 70), k=st.integers(2, 40),
    rows=st.integers(1, 9), columns=st.sampled_from([2, 8, 16, 24]),
    k_block=st.sampled_from([None, 3, 8]), blocks=st.integers(2, 4),
    target=st.sampled_from(RUNNABLE), side=st.sampled_from(["start", "end"]),
)
def test_tiles_with_tails_compute_what_numpy_does_and_stay_in_bounds(m, n, k, rows, columns, k_block, blocks, target, side):
    problem = looprl.matmul(m, n, k)
    rows, columns = min(rows, m), min(columns, n)
    n_block = columns * blocks if k_block is not None else None
    try:
        steps = tile_steps(problem, rows, columns, k_block, n_block)
    except ValueError:
        return  # a factor that does not fit (e.g. a 1-wide split)
    nest = looprl.initial_nest(problem).apply(steps)
    for variant in (nest, nest.layout_pack("in1", "n", columns) if 2 <= columns < n else nest):
        _check_against_guard_pages(variant, target, side)


def _check_against_guard_pages(nest, target, side):
    """The kernel of ``nest`` computes numpy's answer on operands that end (or start) at a guard page."""
    problem = nest.problem
    k = problem.size(problem.reduction_dims[0])
    kernel = looprl.compile(nest, target=target)
    guards = [GuardedArray(shape, side) for shape in (*problem.input_shapes, problem.output_shape)]
    try:
        a, b, out = (g.array for g in guards)
        rng = np.random.default_rng(problem.size("m") * problem.size("n") + k)
        a[...] = rng.uniform(-1, 1, a.shape)
        b[...] = rng.uniform(-1, 1, b.shape)
        kernel.run(a, b, out, reps=1)
        np.testing.assert_allclose(out, _reference(problem, a, b), atol=1e-4 * k)
    finally:
        for g in guards:
            g.release()


@settings(max_examples=examples(30), deadline=None)
@given(rows=st.integers(1, 14), columns=st.sampled_from([16, 32, 48, 64]), blocked=st.booleans())
def test_an_action_path_builds_exactly_the_nest_the_steps_build(rows, columns, blocked):
    problem = looprl.matmul(100, 700, 600)
    steps = tile_steps(problem, rows, columns, *((256, columns * 4) if blocked else (None, None)))
    actions = ActionSet().extended([f"split_{s.arg}" for s in steps if s.op == "split"])
    path, state = actions.path(State(looprl.initial_nest(problem), 0), steps)
    assert state.nest == looprl.initial_nest(problem).apply(steps)
    replayed = State(looprl.initial_nest(problem), 0)
    for action in path:
        replayed = actions.apply(replayed, action)
    assert replayed == state
    assert ActionSet().path(State(looprl.initial_nest(problem), 0), steps) is None or all(
        f"split_{s.arg}" in ActionSet().names for s in steps if s.op == "split")


def test_a_streaming_tile_reads_k_inner_rows_of_a_panel_inside_the_output_rows():
    problem = looprl.matmul(4, 1000, 2050)
    nest = looprl.initial_nest(problem).apply(stream_steps(problem, 8, 64))
    assert [(lp.var, lp.size, lp.step, lp.tail) for lp in nest.compute] == [
        ("k", 256, 8, 2), ("n", 15, 64, 40), ("m", 4, 1, 0), ("k", 8, 1, 0), ("n", 64, 1, 0)]
    batched = looprl.contraction("bmk,bkn->bmn", b=3, m=2, k=64, n=128)
    assert [lp.var for lp in looprl.initial_nest(batched).apply(stream_steps(batched, 4, 16)).compute] == ["b", "k", "n", "m", "k", "n"]
    assert "at most" in why_not_stream(looprl.matmul(STREAM_ROWS + 1, 256, 256), 8, 16)
    assert "k_inner" in why_not_stream(looprl.matmul(4, 256, 8), 8, 16)
    assert "columns" in why_not_stream(looprl.matmul(4, 16, 256), 8, 16)
    assert "one reduction" in why_not_stream(looprl.contraction("mkl,kln->mn", m=2, k=4, l=4, n=32), 2, 16)
    with pytest.raises(ValueError, match="at most"):
        stream_steps(looprl.matmul(64, 256, 256), 8, 16)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, STREAM_ROWS), n=st.integers(3, 150), k=st.integers(3, 70),
    tile=st.sampled_from(STREAM_TILES + ((2, 8), (3, 5))), target=st.sampled_from(RUNNABLE), side=st.sampled_from(["start", "end"]),
)
def test_streaming_tiles_with_tails_compute_what_numpy_does_and_stay_in_bounds(m, n, k, tile, target, side):
    problem = looprl.matmul(m, n, k)
    k_inner, columns = tile
    if why_not_stream(problem, k_inner, columns) is not None:
        k_inner, columns = min(k_inner, k - 1), min(columns, n - 1)
    _check_against_guard_pages(looprl.initial_nest(problem).apply(stream_steps(problem, k_inner, columns)), target, side)


def test_measured_tiles_include_the_streaming_tiles_of_a_decode_problem():
    problem = looprl.matmul(2, 256, 512)
    measured = []

    class Recording(Evaluator):
        def __call__(self, nest):
            measured.append(nest.key)
            return super().__call__(nest)

    evaluator = Recording(MeasurementCache(":memory:"), 0.001, samples=1)
    measure_tiles(SearchContext(problem, ActionSet(), evaluator), ActionSet())
    for k_inner, columns in STREAM_TILES:
        wanted = looprl.initial_nest(problem).apply(stream_steps(problem, k_inner, columns)).key
        assert wanted in measured
    prefill = looprl.matmul(STREAM_ROWS + 1, 256, 512)
    measured.clear()
    measure_tiles(SearchContext(prefill, ActionSet(), evaluator), ActionSet())
    streaming = tuple(f"k{-(-512 // k_inner)}s{k_inner},n" for k_inner, _ in STREAM_TILES)
    # no streaming tile beyond STREAM_ROWS (a cache-blocked tile may split k too: k4s128,... on AVX2)
    assert measured and not any(key.startswith(streaming) for key in measured)


def test_the_budget_grows_with_the_problem_within_its_bounds():
    small = scaled_budget(2 * 256**3, 100.0, 0.008)
    assert small == MIN_BUDGET_S
    medium, large = scaled_budget(2 * 1024**3, 45.0, 0.008), scaled_budget(2 * 2048**3, 45.0, 0.008)
    assert MIN_BUDGET_S < medium < large == MAX_BUDGET_S
    assert scaled_budget(2 * 1024**3, 90.0, 0.008) < medium  # a faster untuned nest needs less


def test_a_search_context_refuses_what_would_end_late_and_measures_each_schedule_once():
    problem = looprl.matmul(256, 256, 256)
    evaluator = Evaluator(":memory:", 0.002, samples=1)
    context = SearchContext(problem, ActionSet(), evaluator)
    root = looprl.initial_nest(problem)
    first = context.measure(root)
    assert first.ok and context.measure(root).gflops == first.gflops and evaluator.compiled == 1
    tile = root.apply(tile_steps(problem, 4, 32))
    context.deadline = time.perf_counter() + 0.01  # not passed, but a compile (~20 ms predicted) does not fit
    with pytest.raises(BudgetExhausted):
        context.measure(tile)
    assert context.budget.refused == 1 and evaluator.compiled == 1
    assert context.measure(root).ok  # known: costs nothing, never refused
    evaluator(tile)  # in the cache now: free
    context.deadline = time.perf_counter() + 0.01
    assert context.measure(tile).ok and evaluator.compiled == 2


def test_a_failed_schedule_is_no_node_and_is_not_measured_twice(failing_compiles):
    problem = looprl.matmul(32, 32, 32)
    failing_compiles(lambda nest: nest != looprl.initial_nest(problem))
    evaluator = Evaluator(":memory:", 0.001, samples=1)
    actions = ActionSet()
    context = SearchContext(problem, actions, evaluator)
    root = context.root()
    assert context.child(root, actions.index("split_4")) is None  # not a 0-GFLOPS node beam search could expand
    assert context.child(root, actions.index("down")) is not None  # a cursor move measures nothing
    assert context.child(root, actions.index("split_4")) is None and evaluator.failures == 1
    assert [node.state.nest for node in context.children(root)] == [root.state.nest]  # only the move
    assert context.best is root and context.failures == evaluator.failures == 4  # swap_down, split_4/8/16: once each


def test_measured_tiles_replay_in_the_env_and_tune_returns_at_least_the_best_tile():
    problem = looprl.matmul(64, 200, 96)
    cache = MeasurementCache(":memory:")
    evaluator = Evaluator(cache, 0.001, samples=1)
    policy = random_policy(seed=0)
    from looprl.policy.rollout import policy_actions

    tiles, tried = measure_tiles(SearchContext(problem, ActionSet(), evaluator), policy_actions(policy))
    assert tile_of(tiles.nest) is not None
    assert tried >= 2 and tiles.gflops > 0
    values = measured_path(problem, tiles.actions, evaluator, ActionSet().extended(tiles.actions))
    assert values[-1] == pytest.approx(tiles.gflops)
    result = looprl.tune(problem, policy, cache=cache, budget_s=0.5, measure_budget_s=0.001, remember=False, threads=1)  # replayed on one
    assert result.gflops >= CONTENDER_WITHIN * result.greedy_gflops  # below it only where it lost the paired rounds
    again = measured_path(problem, result.actions, evaluator, result.action_set)
    assert again[-1] == pytest.approx(result.gflops)
    a, b = (np.random.default_rng(1).uniform(-1, 1, s).astype(np.float32) for s in problem.input_shapes)
    np.testing.assert_allclose(result.kernel(a, b), a @ b, atol=1e-3)


def test_tile_of_reads_the_register_tile_a_schedule_computes():
    problem = looprl.matmul(100, 300, 64)
    assert tile_of(looprl.initial_nest(problem)) is None  # n innermost but never split
    assert tile_of(looprl.initial_nest(problem).apply(tile_steps(problem, 6, 32))) == (6, 32)
    assert tile_of(looprl.initial_nest(problem).apply(tile_steps(problem, 1, 48))) == (1, 48)
    assert tile_of(looprl.initial_nest(problem).apply(tile_steps(problem, 6, 32, 16, 64))) == (6, 32)
    small = looprl.matmul(4, 300, 64)  # all four rows in the tile: the m loop sinks whole
    assert tile_of(looprl.initial_nest(small).apply(tile_steps(small, 4, 96))) == (4, 96)
    assert [lp.var for lp in looprl.initial_nest(small).apply(tile_steps(small, 4, 96)).compute] == ["n", "k", "m", "n"]
    skinny = looprl.matmul(300, 24, 64)  # the columns unsplit: n stays innermost
    assert [lp.var for lp in looprl.initial_nest(skinny).apply(tile_steps(skinny, 14, 24)).compute] == ["m", "k", "m", "n"]
    swapped = looprl.initial_nest(problem).apply(tile_steps(problem, 6, 32)).swap(3)  # the rows innermost: no vector tile
    assert tile_of(swapped) is None


def test_time_spent_waiting_for_another_process_s_timing_moves_the_deadline(tmp_path):
    import threading

    from looprl.measurement.lock import TimingLock

    path = tmp_path / "timing.lock"
    evaluator = Evaluator(":memory:", 0.001, samples=1, timing_lock=TimingLock(path))
    problem = looprl.matmul(64, 64, 64)
    context = SearchContext(problem, ActionSet(), evaluator)
    context.measure(looprl.initial_nest(problem))  # compiled once: the JIT is warm
    other = TimingLock(path)  # another holder of the same file lock, as another process would be
    held = threading.Event()

    def hold():
        with other:
            held.set()
            time.sleep(0.3)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    context.deadline = time.perf_counter() + 10.0
    before, waited_before = context.deadline, context.budget.waited_s  # the warm-up may have waited on a busy machine
    assert context.measure(looprl.initial_nest(problem).split(2, 16)).ok
    thread.join()
    assert 0.2 < context.deadline - before < 1.0
    assert context.budget.waited_s - waited_before == pytest.approx(context.deadline - before)
    context.deadline = None  # without a deadline the wait is still counted
    waited = context.budget.waited_s
    assert context.measure(looprl.initial_nest(problem).split(2, 8)).ok and context.budget.waited_s >= waited


def test_a_changing_right_operand_gets_its_panels_staged_block_by_block():
    """Issue 61: for B an input (packed on every call), tune also measures the blocked tiles whose
    panels are packed one k block at a time (the stage action at the k-block loop), and the path
    replays to the schedule blocked_steps(..., stage="k") builds; a constant B (packed once when
    bound) gets none."""
    from looprl.ir.cache_blocks import blocked_steps
    from looprl.ir.schedules import cache_blocks
    from looprl.measurement.schedule_record import ScheduleRecord
    from looprl.search.tiles import staged_path

    target = Target.named("avx2")
    problem = looprl.matmul(128, 1000, 700)
    actions = ActionSet.for_target(target)
    assert "stage" not in actions.names  # a policy's actions are as they were
    blocks = cache_blocks(problem, 4, 16)
    assert blocks
    for block in blocks:
        names, state = staged_path(problem, 4, 16, block, actions)
        assert names[-1] == "stage" and "pack" in names
        assert state.nest == looprl.initial_nest(problem).apply(blocked_steps(problem, 4, 16, block, pack=True, stage="k"))
        record = ScheduleRecord(state.nest, 1.0, names, "tiles", target, 1)
        assert looprl.initial_nest(problem).apply(record.steps) == state.nest  # the record's steps, no action replayed
    weight = looprl.matmul(128, 1000, 700, constant=("b",))
    assert all(staged_path(weight, 4, 16, block, actions) is None for block in cache_blocks(weight, 4, 16))

    seen = []
    context = SearchContext(problem, actions, Evaluator(MeasurementCache(":memory:"), 0.0005, target=target))
    original = context.measure

    def measure(nest):
        seen.append(nest)
        return original(nest)

    context.measure = measure
    measure_tiles(context, actions, shapes=[(4, 16)])
    staged = [nest for nest in seen if any(loop.staged for loop in nest.compute)]
    assert staged, "no staged tile was measured"


def test_the_stage_action_names_the_right_operand_s_stage_step():
    from looprl.ir.action import Action
    from looprl.ir.step import Step

    action = Action.parse("stage")
    assert action is not None and action.name == "stage"
    assert action.step(2) == Step("stage", 2, tensor="in1")
    assert [found.name for found, _ in Action.taking(Step("stage", 1, tensor="in1"))] == ["stage"]
    assert Action.taking(Step("stage", 1, tensor="in0")) == []  # the left operand: no action stages it
    extended = ActionSet().extended(["split_8", "stage"])
    assert extended.names[-1] == "stage" and extended.stages and not ActionSet().stages


def test_the_tiles_stage_offers_its_runners_up_within_the_contender_ratio():
    """tile_contenders: the fastest tile first, then the others measured within ``within`` of
    it, fastest first, at most ``most`` schedules, each once; measure_tiles keeps the first."""
    import math

    from tests.search.test_prefetch_proposals import FakeEvaluator
    from looprl.search.tiles import tile_contenders

    problem = looprl.matmul(96, 256, 512)
    evaluator = FakeEvaluator()
    actions = ActionSet()
    found, tried = tile_contenders(SearchContext(problem, actions, evaluator, budget_s=math.inf), actions, within=0.5, most=3)
    figures = {nest.key: FakeEvaluator.value(nest) for nest in evaluator.measured}
    ranked = sorted(figures.values(), reverse=True)
    wanted = [g for g in ranked if g >= 0.5 * ranked[0]][:3]
    assert tried == len(evaluator.measured) >= 3 and len(wanted) >= 2
    assert [record.gflops for record in found] == wanted
    assert len({record.nest.key for record in found}) == len(found)
    assert all(figures[record.nest.key] == record.gflops and record.actions for record in found)
    alone, _ = measure_tiles(SearchContext(problem, actions, FakeEvaluator(), budget_s=math.inf), actions)
    assert alone.nest.key == found[0].nest.key
    narrow, _ = tile_contenders(SearchContext(problem, actions, FakeEvaluator(), budget_s=math.inf), actions, within=1.0, most=3)
    assert [record.nest.key for record in narrow] == [found[0].nest.key]


def test_a_changing_right_operand_s_staged_blocks_come_first_and_one_row_tile_gets_no_blocks():
    """16 rows of a changing 960 x 2560 right operand: its panels staged per column strip, then
    per reduction block, are measured right after the flat tiles, before the blocks read in place (a budget spent
    on those left the staged ones untimed: 20 against 29-37 GFLOPS on a Zen 3). One row: no
    cache block at all, neither staged nor in place (one row tile reads the panels once)."""
    import math

    from tests.search.test_prefetch_proposals import FakeEvaluator

    def measured(problem):
        evaluator = FakeEvaluator()
        measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
        return evaluator.measured

    sixteen = measured(looprl.matmul(16, 2560, 960))
    staged = [i for i, nest in enumerate(sixteen) if nest.staged_at("in1") is not None]
    in_place_blocks = [i for i, nest in enumerate(sixteen)
                       if nest.staged_at("in1") is None and sum(loop.var == "k" for loop in nest.compute) > 1]
    assert staged and in_place_blocks and max(staged) < min(in_place_blocks)
    flat_tiles = len(tile_shapes(looprl.matmul(16, 2560, 960), FakeEvaluator.target))
    assert min(staged) <= flat_tiles + 1  # right after the flat tiles (and the untiled root)
    # the column strips (staged at the column loop, the whole reduction deep) before the reduction blocks
    strips = [i for i in staged if sum(loop.var == "k" for loop in sixteen[i].compute) == 1]
    k_blocks = [i for i in staged if i not in strips]
    assert strips and k_blocks and max(strips) < min(k_blocks)
    assert not any(nest.staged_at("in1") is not None for nest in measured(looprl.matmul(1, 4864, 896)))
