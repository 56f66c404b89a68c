"""Stage steps in generated code: a block of an input copied at a loop into a workspace buffer
(looprl.ir.step's ``stage``) computes what numpy computes for random schedules with a stage at
a random legal loop, on every target this host runs, in float32 and bfloat16, and never reads
or writes out of bounds (tails included: sizes no block divides)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.ir.cache_blocks import Blocks, blocked_steps
from looprl.ir.step import Step
from looprl.target import TARGET_NAMES, Target
from tests.backend.test_bfloat16 import assert_within_bound, bf16_inputs
from tests.backend.test_codegen_correctness import assert_matches, random_inputs, reference
from tests.guarded import GuardedArray
from tests.schedules import action_steps, pack_every_tiled_loop, walk

PROBLEMS = [
    looprl.matmul(37, 50, 29),  # no split divides these
    looprl.matmul(67, 100, 50),
    looprl.contraction("bmk,bkn->bmn", b=3, m=17, k=9, n=35),
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19),
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]
TENSORS = ("in0", "in1")


def staged(nest, tensor: str, pick: int):
    """``nest`` with ``tensor`` staged at its ``pick``-th legal loop (modulo their count), or
    None where no loop takes the stage."""
    legal = [i for i in range(len(nest.compute)) if nest.why_not(Step("stage", i, tensor=tensor)) is None]
    return nest.stage(legal[pick % len(legal)], tensor) if legal else None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(("split", "split", "swap_down", "swap_up", "parallel"), max_size=10),
       pack=st.booleans(), tensor=st.sampled_from(TENSORS),
       pick=st.integers(0, 20), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS))
def test_random_staged_schedules_match_numpy(problem, steps, pack, tensor, pick, seed, target):
    nest = walk(problem, steps)
    nest = pack_every_tiled_loop(nest, seed) if pack else nest
    nest = staged(nest, tensor, pick)
    if nest is None:
        return
    kernel = looprl.compile(nest, target=target)
    assert not (tensor in kernel.plan.stages and tensor in kernel.packed_inputs)  # staged or converted whole
    a, b = random_inputs(problem, seed)
    assert_matches(problem, kernel, a, b)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(max_size=10), tensor=st.sampled_from(TENSORS),
       pick=st.integers(0, 20), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS))
def test_random_staged_bfloat16_schedules_within_bound(problem, steps, tensor, pick, seed, target):
    problem = problem.with_dtype("bfloat16")
    nest = staged(pack_every_tiled_loop(walk(problem, steps), seed), tensor, pick)
    if nest is None:
        return
    a, b = bf16_inputs(problem, seed)
    assert_within_bound(problem, looprl.compile(nest, target=target)(a, b), a, b)


def blocked(problem, stage_at: str | None):
    """The BLIS-ordered blocked schedule of ``problem`` (4x16 tiles, blocks k 64, m 32, n 128),
    B packed in panels; ``stage_at`` ("n" or "k"): B staged at the n-block or k-block loop."""
    nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 4, 16, Blocks(64, 32, 128)))
    if stage_at is not None:
        nest = nest.stage(next(i for i, lp in enumerate(nest.compute) if lp.var == stage_at), "in1")
    return nest


@pytest.mark.target_dependent
@pytest.mark.parametrize("stage_at", ["n", "k"])
@pytest.mark.parametrize("side", ["start", "end"])
def test_staged_blocks_stay_in_bounds(stage_at, side):
    """130x1000x700 (tails in every block): inputs, output and workspace against guard pages;
    the staged B is copied block by block, not converted whole."""
    problem = looprl.matmul(130, 1000, 700)
    nest = blocked(problem, stage_at)
    kernel = looprl.compile(nest)
    assert "in1" in kernel.plan.stages and kernel.packed_inputs == ()
    whole = looprl.compile(blocked(problem, None))
    assert kernel.workspace_elements < whole.workspace_elements  # a block, not all of B
    shapes = (*problem.input_shapes, problem.output_shape, (kernel.workspace_elements,))
    guards = [GuardedArray(shape, side) for shape in shapes]
    try:
        a, b, out, work = (g.array for g in guards)
        a[...], b[...] = random_inputs(problem, 3)
        kernel.run(a, b, out, reps=2, workspace=work)
        np.testing.assert_allclose(out, reference(problem, a, b), rtol=1e-4, atol=1e-3)
    finally:
        for g in guards:
            g.release()


def test_staged_small_schedules_stay_in_bounds():
    """Small problems whose every block has a tail, each input staged at each legal loop."""
    for problem in PROBLEMS[:2]:
        nest = looprl.initial_nest(problem).split(1, 16).split(3, 8).swap(0).swap(1).swap(2)
        for tensor in TENSORS:
            for index in range(len(nest.compute)):
                if nest.why_not(Step("stage", index, tensor=tensor)) is not None:
                    continue
                schedule = nest.stage(index, tensor)
                kernel = looprl.compile(schedule)
                shapes = (*problem.input_shapes, problem.output_shape, (kernel.workspace_elements,))
                guards = [GuardedArray(shape, "end") for shape in shapes]
                try:
                    a, b, out, work = (g.array for g in guards)
                    a[...], b[...] = random_inputs(problem, index)
                    kernel.run(a, b, out, workspace=work)
                    np.testing.assert_allclose(out, reference(problem, a, b), rtol=1e-4, atol=1e-3)
                finally:
                    for g in guards:
                        g.release()


def test_a_stage_inside_the_register_scope_is_inert():
    """Staged at the tile's reduction loop (inside the register scope): the kernel converts B
    whole, as without the stage, and still matches numpy."""
    problem = looprl.matmul(37, 50, 29)
    nest = blocked(problem, None)
    inner_k = max(i for i, lp in enumerate(nest.compute) if lp.var == "k")
    staged_nest = nest.stage(inner_k, "in1")
    kernel = looprl.compile(staged_nest)
    assert not kernel.plan.stages and kernel.packed_inputs == ("in1",)
    a, b = random_inputs(problem, 5)
    assert_matches(problem, kernel, a, b)
