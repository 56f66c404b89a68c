"""Issue 61, item 3: a compute loop over a reduction may spill the output tile
(looprl.ir.nest_spill): the tile is stored and reloaded at each of its iterations, so the code
generator's register scope lies inside the loop and the nest's order holds (a few-row kernel
then streams whole rows of its right operand, where the register-blocked scope read them a
block's width at a time).

Checked: random schedules (sizes no split divides, batch and two-reduction problems, teams of
1 and 2, parallel loops), each with a spill at a drawn reduction loop, against the exact
contraction within float32 summation rounding and against its unspilled twin within twice
that (the sums run in the nest's order in both kernels, but a register-blocked twin may run its
whole reduction in registers in another association), inputs, output and workspace flush
against guard pages; the register plan's scope inside the spilled loop; the streaming tiles
tune proposes spilled."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.register_plan import plan as register_plan
from looprl.ir.dtypes import error_bound
from looprl.ir.nest import LoopNest
from looprl.ir.schedules import stream_steps
from looprl.search.streams import spilled_stream_steps, spilled_tiles
from looprl.target import TARGET_NAMES, Target
from tests.backend.test_codegen_correctness import random_inputs
from tests.backend.test_ksplit_codegen import guarded_call
from tests.backend.test_staged_teams import cores
from tests.conftest import examples
from tests.schedules import action_steps, walk

pytestmark = pytest.mark.target_dependent

PROBLEMS = [
    looprl.matmul(1, 37, 300),  # no split divides these
    looprl.matmul(3, 20, 517),
    looprl.matmul(7, 45, 61),
    looprl.contraction("mk,nk->mn", m=2, n=9, k=301),  # A @ B.T: dot products
    looprl.contraction("mk,k->m", m=11, k=403),  # matrix-vector
    looprl.contraction("bmk,bkn->bmn", b=2, m=3, k=129, n=19),
    looprl.contraction("abcd,cde->abe", a=2, b=3, c=13, d=11, e=17),  # two reduction dimensions
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]


def spilled(nest: LoopNest, pick: int) -> LoopNest:
    """``nest`` with its ``pick``-th (modulo their count) compute loop that takes a spill spilled."""
    places = [i for i in range(len(nest.compute)) if nest.why_not_spill(i) is None]
    return nest.spill(places[pick % len(places)])


def assert_within_rounding(problem, out, twin, a, b):
    exact = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))
    reductions = int(np.prod([problem.size(d) for d in problem.reduction_dims]))
    bound = error_bound(problem.spec, a, b, reductions, "float32")
    assert np.all(np.abs(out - exact) <= bound) and np.all(np.abs(twin - exact) <= bound)
    assert np.all(np.abs(out.astype(np.float64) - twin) <= 2 * bound)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(("split", "split", "swap_down", "swap_up", "parallel"), max_size=10),
       pick=st.integers(0, 20), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS), side=st.sampled_from(["start", "end"]))
@example(problem=PROBLEMS[0], steps=[(1, "split_8"), (0, "swap_down"), (0, "swap_down")], pick=0, seed=0, target=Target.default(), side="end")
def test_random_spilled_kernels_match_numpy_and_their_unspilled_twin(problem, steps, pick, seed, target, side):
    nest = spilled(walk(problem, steps), pick)
    spill = nest.spilled_loop
    assert spill is not None and nest.compute[spill].var in problem.reduction_dims
    assert LoopNest.from_key(problem, nest.key) == nest and "~" in nest.key  # the key round-trips the mark
    assert register_plan(nest, target).scope_start > spill  # the scope lies inside the spilled loop
    with cores(2):
        kernel = looprl.compile(nest, target=target, threads=2)
    a, b = random_inputs(problem, seed)
    twin = looprl.compile(LoopNest.from_key(problem, nest.key.replace("~", "")), target=target)(a, b)
    for team in (1, 2):
        out, _ = guarded_call(kernel, {"in0": a, "in1": b}, team, side)
        assert_within_rounding(problem, out, twin, a, b)


def test_a_spill_keeps_the_few_row_streaming_order_the_register_blocks_would_take_over():
    """1 x 960 outputs fit the register-blocked tile: unspilled, the scope reaches the block loop
    (each register block runs the whole reduction); spilled at the block loop, it starts inside."""
    problem = looprl.matmul(1, 960, 2560)
    for target in HOST_TARGETS:
        plain = looprl.initial_nest(problem).apply(stream_steps(problem, 8, 32))
        marked = looprl.initial_nest(problem).apply(spilled_stream_steps(problem, 8, 32))
        assert marked.key == plain.key.replace("k320s8,", "k320s8~,", 1)
        assert register_plan(plain, target).scope_start == 0 and register_plan(marked, target).scope_start > 0
        assert not register_plan(marked, target).zero_init  # the tile is reloaded: it starts from the accumulator


def test_tune_proposes_spilled_streaming_tiles_only_where_the_register_blocks_take_the_rows():
    assert spilled_tiles(looprl.matmul(1, 960, 2560))  # 960 outputs: at most BLOCKED_TILE_FLOATS
    assert not spilled_tiles(looprl.matmul(1, 4864, 896))  # the nest's order holds already
    assert not spilled_tiles(looprl.matmul(64, 960, 960))  # not a few-row problem


@pytest.mark.parametrize("key, why", [
    ("m1s1,k300s1~,n37s1|m1s1,n37s1~", "only a compute loop over a reduction dimension spills"),
    ("m1s1~,k300s1,n37s1|m1s1,n37s1", "only a compute loop over a reduction dimension spills"),
    ("m1s1,k30s10~,k10s1~,n37s1|m1s1,n37s1", "spills at two loops"),
])
def test_a_key_that_spills_where_no_spill_applies_is_refused(key, why):
    with pytest.raises(ValueError, match=why):
        LoopNest.from_key(looprl.matmul(1, 37, 300), key)


def test_spill_refusals_split_swap_and_merge():
    nest = looprl.initial_nest(looprl.matmul(1, 37, 300))  # m, k, n | m, n
    assert "output dimension" in nest.why_not_spill(0) and "write-back" in nest.why_not_spill(3)
    marked = nest.spill(1)
    assert "spilled already" in marked.why_not_spill(1)
    split = marked.split(1, 8)  # the mark stays on the blocks
    assert split.compute[1].spilled and not split.compute[2].spilled
    assert split.swap(0).compute[0].spilled  # a swap moves it with its loop
    assert split.merge(1).compute[1].spilled and split.merge(1).key == marked.key
    assert "spill for k" in split.to_text()
    with pytest.raises(ValueError, match="cannot spill at loop 0"):
        nest.spill(0)
