"""Cache blocks sized from the host's caches: the derivation, the candidates, the blocked
schedules (correct against numpy, in bounds, reachable as env action paths)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import ActionSet, State
from looprl.ir.cache_blocks import (Blocks, Caches, block_candidates, blocked_steps, derive_blocks, host_caches, strip_candidates,
                                    why_not_blocked)
from looprl.ir.schedules import cache_blocks
from looprl.ir.step import MAX_FACTOR
from looprl.target import Target
from tests.guarded import GuardedArray

ZEN = Caches(32 * 2**10, 2**20, 32 * 2**20)


def test_the_blocks_follow_the_cache_sizes():
    panel, half, blis = derive_blocks(ZEN, 6, 16)
    assert panel == Blocks(512, None, 256)  # 6 x 512 floats: 12 KB of L1 (capped at MAX_FACTOR); 512 x 256 floats: half of L2
    assert half == Blocks(256, None, 512)
    assert blis == Blocks(256, 510, 16384)  # 256 x 16 floats: half of L1; 510 x 256: about half of L2; 256 x 16384: half of L3
    assert panel.n * panel.k * 4 <= ZEN.l2 // 2 and blis.m * blis.k * 4 <= ZEN.l2 // 2 and blis.n * blis.k * 4 <= ZEN.l3 // 2
    bigger = derive_blocks(Caches(48 * 2**10, 2 * 2**20, 96 * 2**20), 6, 16)
    assert bigger[0].n > panel.n and bigger[2].k > blis.k and bigger[2].n > blis.n
    smaller = derive_blocks(Caches(16 * 2**10, 256 * 2**10, 8 * 2**20), 6, 16)
    assert smaller[1].k < panel.k and smaller[-1].m < blis.m
    # there BLIS's reduction block (its 16-wide micro-panel in half of L1) is below the half
    # block: the panel block with it comes first, its right block from L2
    assert smaller[0] == Blocks(128, None, 256) and len(smaller) == 4
    assert derive_blocks(Caches(0, 0, 0), 6, 16) == ()  # sizes not known: not blocked
    assert derive_blocks(Caches(ZEN.l1, 0, 0), 6, 16)[0] == Blocks(512, None, None)
    problem = looprl.matmul(2048, 2048, 2048)
    assert cache_blocks(problem, 6, 16, ZEN) != cache_blocks(problem, 6, 16, Caches(16 * 2**10, 2**19, 8 * 2**20))


def test_a_narrow_row_tile_first_gets_the_block_whose_right_micro_panel_stays_in_l1():
    """A 2 x 32 tile: the A slice rule alone gives 512 x 32 micro-panels of the right
    operand (64 KB, twice L1), which every row tile reads again; the first candidate keeps
    them in half of L1."""
    first = derive_blocks(ZEN, 2, 32)[0]
    assert first.k * 32 * 4 <= ZEN.l1 // 2 and first.m is None and first.n * first.k * 4 <= ZEN.l2 // 2
    assert derive_blocks(ZEN, 2, 32)[1] == Blocks(512, None, first.n * first.k // 512)
    assert len(derive_blocks(ZEN, 6, 16)) == 3  # where BLIS's block is the half one: nothing added


def test_candidates_are_multiples_of_the_tile_inside_the_problem():
    problem = looprl.matmul(2048, 3000, 4096)
    found = block_candidates(problem, 6, 16, ZEN)
    assert len(found) == len(set(found)) == 3
    for blocks in found:
        assert blocks.k is not None and (blocks.m or blocks.n)
        assert blocks.k is None or (blocks.k % 16 == 0 and 16 <= blocks.k <= MAX_FACTOR)
        assert blocks.m is None or (blocks.m % 6 == 0 and 6 < blocks.m < 2048)
        assert blocks.n is None or (blocks.n % 16 == 0 and 16 < blocks.n < 3000)
    assert block_candidates(looprl.matmul(64, 128, 128), 14, 32, ZEN) == []  # too small for any block
    assert block_candidates(looprl.matmul(256, 256, 256), 4, 24, ZEN) == []  # the whole reduction fits: no k block
    assert block_candidates(looprl.contraction("mk,k->m", m=64, k=64), 4, 1, ZEN) == []


def test_column_strips_fill_half_of_l2_the_whole_reduction_deep_and_compute_what_numpy_does():
    """A strip holds the panels whose whole-reduction strip fills half of L2 (2 to 8 of them),
    then twice and half as many; evened out over the columns; none where the columns hold one
    strip or L2 is not known. Packed strip by strip with tails (no strip divides 1000 columns
    nor a tile 130 rows), the kernel computes numpy's answer against guard pages."""
    # 8.5 panels fill half of L2
    assert strip_candidates(looprl.matmul(128, 960, 960), 6, 16, ZEN) == [Blocks(None, None, 128), Blocks(None, None, 64)]
    assert strip_candidates(looprl.matmul(128, 960, 960), 6, 16, Caches(ZEN.l1, ZEN.l2 // 2, ZEN.l3)) == [
        Blocks(None, None, 64), Blocks(None, None, 128), Blocks(None, None, 32)]
    assert strip_candidates(looprl.matmul(128, 4096, 4096), 6, 16, ZEN) == [Blocks(None, None, 32), Blocks(None, None, 64)]  # at least two
    assert strip_candidates(looprl.matmul(128, 1536, 64), 6, 16, ZEN) == [Blocks(None, None, 128), Blocks(None, None, 64)]  # at most eight
    assert strip_candidates(looprl.matmul(128, 960, 960), 6, 16, Caches(ZEN.l1, 0, ZEN.l3)) == []
    assert strip_candidates(looprl.matmul(128, 48, 960), 6, 16, ZEN) == []  # 48 columns: no two strips of two panels
    problem = looprl.matmul(130, 1000, 700)
    strips = strip_candidates(problem, 6, 16, ZEN)
    assert strips and all(blocks.n % 16 == 0 and 1000 % blocks.n for blocks in strips)
    for blocks in strips:
        nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 6, 16, blocks, stage="n"))
        assert nest.staged_at("in1") is not None
        _check_against_guard_pages(nest, Target.default(), "end")


def test_the_host_caches_are_what_the_os_reports():
    caches = host_caches()
    assert isinstance(caches, Caches) and caches.l3 >= caches.l2 >= 0
    with pytest.raises(ValueError, match="non-negative"):
        Caches(-1, 0, 0)
    with pytest.raises(ValueError, match="Caches"):
        derive_blocks((32768, 2**20, 2**25), 6, 16)


def test_a_blocked_schedule_is_blis_order_with_the_right_operand_in_panels():
    problem = looprl.matmul(130, 1000, 700)
    nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 6, 16, Blocks(256, 48, 128)))
    assert [(lp.var, lp.size, lp.step, lp.tail) for lp in nest.compute] == [
        ("n", 7, 128, 104), ("k", 2, 256, 188), ("m", 2, 48, 34), ("n", 8, 16, 0), ("m", 8, 6, 0),
        ("k", 256, 1, 0), ("m", 6, 1, 0), ("n", 16, 1, 0)]
    assert nest.layout("in1").key == "n16.k1.n1%16"
    unblocked = looprl.initial_nest(problem).apply(blocked_steps(problem, 6, 16, Blocks(None, None, None), pack=False))
    assert [lp.var for lp in unblocked.compute] == ["n", "m", "k", "m", "n"] and not unblocked.layouts
    assert "multiple" in why_not_blocked(problem, 6, 16, Blocks(256, 50, None))
    with pytest.raises(ValueError, match="two output dimensions"):
        blocked_steps(looprl.contraction("mk,k->m", m=8, k=8), 2, 2, Blocks(None, None, None))


def test_a_blocked_schedule_is_an_action_path_then_the_pack_action():
    problem = looprl.matmul(1500, 2000, 1300)
    for blocks in block_candidates(problem, 6, 16, ZEN) + [Blocks(512, 1020, 1600)]:
        steps = blocked_steps(problem, 6, 16, blocks, pack=False)
        actions = ActionSet().extended([f"split_{s.arg}" for s in steps if s.op == "split"] + ["pack"])
        found = actions.path(State(looprl.initial_nest(problem), 0), steps)
        assert found is not None and found[1].nest == looprl.initial_nest(problem).apply(steps)
        innermost = len(found[1].nest.compute) - 1  # the tile's column loop
        packed = actions.apply(found[1].at(innermost), actions.index("pack"))
        assert packed.nest == looprl.initial_nest(problem).apply(blocked_steps(problem, 6, 16, blocks))


def _check_against_guard_pages(nest, target, side):
    """The kernel of ``nest`` computes numpy's answer on operands that end (or start) at a guard page."""
    problem = nest.problem
    k = problem.size("k")
    kernel = looprl.compile(nest, target=target)
    guards = [GuardedArray(shape, side) for shape in (*problem.input_shapes, problem.output_shape)]
    try:
        a, b, out = (g.array for g in guards)
        rng = np.random.default_rng(problem.size("m") * problem.size("n") + k)
        a[...] = rng.uniform(-1, 1, a.shape)
        b[...] = rng.uniform(-1, 1, b.shape)
        kernel.run(a, b, out, reps=1)
        np.testing.assert_allclose(out, np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64)), atol=1e-4 * k)
    finally:
        for g in guards:
            g.release()


@pytest.mark.target_dependent
def test_every_candidate_of_a_size_no_block_divides_computes_what_numpy_does():
    problem = looprl.matmul(130, 1000, 700)
    target = Target.default()
    small = Caches(8 * 2**10, 16 * 2**10, 128 * 2**10)  # small caches: every dimension blocked
    every = []
    for rows, columns in looprl.ir.register_tiles.tile_shapes(problem, target):
        candidates = block_candidates(problem, rows, columns, small)
        assert candidates
        every += candidates
        for blocks in candidates:
            _check_against_guard_pages(looprl.initial_nest(problem).apply(blocked_steps(problem, rows, columns, blocks)), target, "end")
    assert any(b.k and b.m and b.n for b in every)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 40), n=st.integers(2, 70), k=st.integers(2, 60),
    rows=st.integers(1, 9), columns=st.sampled_from([2, 8, 16, 24]),
    k_block=st.sampled_from([None, 3, 16]), m_blocks=st.sampled_from([None, 2, 3]), n_blocks=st.sampled_from([None, 2, 3]),
    pack=st.booleans(), side=st.sampled_from(["start", "end"]), stage=st.sampled_from([None, None, "k", "n"]),
)
def test_blocked_schedules_with_tails_compute_what_numpy_does_and_stay_in_bounds(
        m, n, k, rows, columns, k_block, m_blocks, n_blocks, pack, side, stage):
    """Every block, with the right operand packed whole, or staged block by block (``"k"``) or
    strip by strip (``"n"``, the column strips of :func:`strip_candidates`), where such a stage
    exists."""
    problem = looprl.matmul(m, n, k)
    rows, columns = min(rows, m), min(columns, n)
    blocks = Blocks(k_block, m_blocks and rows * m_blocks, n_blocks and columns * n_blocks)
    try:
        steps = blocked_steps(problem, rows, columns, blocks, pack or stage is not None, stage)
    except ValueError as error:
        assert stage is not None and ("no " in str(error) or "cannot stage" in str(error)), error
        return  # no block loop to stage at here
    nest = looprl.initial_nest(problem).apply(steps)
    _check_against_guard_pages(nest, Target.default(), side)
