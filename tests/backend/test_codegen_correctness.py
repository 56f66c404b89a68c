"""Every reachable schedule computes what numpy computes, without touching memory it must not."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend import register_plan
from looprl.ir.step import MERGE, Step
from looprl.search.autotvm import ScheduleSpace
from looprl.target import TARGET_NAMES, Target
from tests.guarded import GuardedArray
from tests.schedules import action_steps, walk

PROBLEMS = [
    looprl.matmul(67, 100, 250),  # no split divides these
    looprl.matmul(64, 48, 32),
    looprl.matmul(100, 72, 200),
    looprl.matmul(1, 33, 7),
    looprl.contraction("bmk,bkn->bmn", b=3, m=17, k=9, n=35),
    looprl.contraction("mk,k->m", m=37, k=50),  # matrix-vector
    looprl.contraction("k,kn->n", k=19, n=70),  # vector-matrix
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19),  # A @ B.T
    looprl.contraction("m,n->mn", m=21, n=35),  # outer product: no reduction
    looprl.contraction("abc,cd->abd", a=5, b=6, c=7, d=19),
    looprl.contraction("abcd,cde->abe", a=3, b=4, c=5, d=6, e=17),  # two reduction indices
    looprl.contraction("kn,mk->nm", k=13, m=17, n=40),
]


def reference(problem, a, b):
    return np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))


def random_inputs(problem, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=shape).astype(np.float32) for shape in problem.input_shapes]


def assert_matches(problem, kernel, a, b):
    out = kernel(a, b)
    expected = reference(problem, a, b)
    scale = np.abs(a).max() * np.abs(b).max() * max(problem.size(d) for d in problem.reduction_dims or problem.dims)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * max(scale, 1.0))


def test_the_random_walks_take_their_steps_by_the_transition_rule():
    """The schedules the property tests draw: each step moves the cursor, then acts; an action
    that cannot apply leaves the schedule (no exception is swallowed). Loops get tails."""
    problem = looprl.matmul(67, 100, 250)
    steps = [
        (2, "split_7"),  # n (100) by 7: 14 iterations and a tail of 2
        (3, "swap_down"),  # the innermost compute loop: refused
        (6, "split_64"),  # 6 % 6 loops: m by 64, a tail of 3
        (0, "split_64"),  # the outer m loop has one iteration: refused
        (2, "swap_up"),  # k above the inner m
    ]
    nest = walk(problem, steps)
    assert nest == looprl.initial_nest(problem).split(2, 7).split(0, 64).swap(1)
    assert [lp.tail for lp in nest.compute if lp.tail] == [3, 2]
    both = walk(problem, [(0, "parallel"), (3, "parallel"), (4, "parallel"), (5, "parallel")])
    assert both.parallel_loops == (0, 3)  # one per nest: the nested and repeated ones are refused


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), seed=st.integers(0, 2**16))
def test_random_schedules_match_numpy(problem, steps, seed):
    nest = walk(problem, steps)
    a, b = random_inputs(problem, seed)
    assert_matches(problem, looprl.compile(nest), a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(kinds=("split", "split", "swap_down", "swap_up", "parallel")),
       seed=st.integers(0, 2**16))
def test_merged_schedules_match_numpy(problem, steps, seed):
    """AutoTVM's merge (``LoopNest.merge``, an IR step no env action takes): a random schedule
    with up to three of its splits merged back, tails included, computes what numpy computes,
    and so does a short walk of AutoTVM's annealing moves (splits, swaps, merges) from it."""
    nest = walk(problem, steps)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        merges = [Step(MERGE, i) for i in range(len(nest)) if nest.why_not(Step(MERGE, i)) is None]
        if merges:
            nest = nest.apply([merges[int(rng.integers(len(merges)))]])
    a, b = random_inputs(problem, seed)
    assert_matches(problem, looprl.compile(nest), a, b)
    space = ScheduleSpace(nest, 12)
    for _ in range(4):
        nest = space.neighbour(nest, rng)
    assert_matches(problem, looprl.compile(nest), a, b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), target=st.sampled_from([Target.named("avx2"), Target.named("sse4")]))
def test_narrower_vector_targets_match_numpy(problem, steps, target):
    """AVX2 and SSE4 code (generic x86-64-v3 / v2, wider features off) is correct too."""
    nest = walk(problem, steps)
    a, b = random_inputs(problem, 0)
    assert_matches(problem, looprl.compile(nest, target=target), a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), side=st.sampled_from(["start", "end"]))
def test_kernels_stay_in_bounds(problem, steps, side):
    """Inputs and output sit flush against inaccessible pages: a stray access would crash."""
    nest = walk(problem, steps)
    kernel = looprl.compile(nest)
    guards = [GuardedArray(shape, side) for shape in (*problem.input_shapes, problem.output_shape)]
    try:
        a, b, out = (g.array for g in guards)
        a[...], b[...] = random_inputs(problem, 1)
        kernel.run(a, b, out, reps=2)
        np.testing.assert_allclose(out, reference(problem, a, b), atol=1e-3)
    finally:
        for g in guards:
            g.release()


def test_write_back_nest_transforms():
    problem = looprl.matmul(37, 45, 11)
    nest = looprl.initial_nest(problem)
    wb = len(nest.compute)
    for variant in (nest.swap(wb), nest.split(wb + 1, 8), nest.split(wb, 4).swap(wb + 1).split(wb + 1, 16)):
        a, b = random_inputs(problem, 3)
        assert_matches(problem, looprl.compile(variant), a, b)


def test_expert_schedule_with_tails():
    problem = looprl.matmul(250, 100, 67)
    nest = looprl.initial_nest(problem).split(2, 64).split(0, 4).swap(2).swap(1).swap(0).swap(2)
    assert [lp.var for lp in nest.compute] == ["n", "m", "k", "m", "n"]
    a, b = random_inputs(problem, 4)
    assert_matches(problem, looprl.compile(nest), a, b)


@pytest.mark.parametrize("target", [Target.named(name) for name in TARGET_NAMES], ids=TARGET_NAMES)
def test_repetitions_give_the_same_result(target):
    """With the reduction outside the register tile the accumulator is zeroed by a separate
    pass: every repetition must start again from zero. The kernel is compiled for the very
    target whose plan is asserted (AVX-512 code runs only where the host has AVX-512)."""
    problem = looprl.matmul(20, 200, 30)
    nest = looprl.initial_nest(problem).swap(0)  # k outermost, a tile of 20 x 200 outputs: the reduction stays outside
    assert not register_plan.plan(nest, target).zero_init
    if target.missing_on_host():
        pytest.skip(f"the host lacks {target.missing_on_host()}: the plan is checked, the kernel cannot run")
    kernel = looprl.compile(nest, target=target)
    assert "llvm.memset" in kernel.ir  # the zeroing pass ...
    assert f"<{target.vector_width} x float>" in kernel.ir  # ... in code of this target's width
    a, b = random_inputs(problem, 5)
    out = np.empty(problem.output_shape, np.float32)
    for reps in (1, 3):
        out[...] = np.nan
        kernel.run(a, b, out, reps=reps)
        np.testing.assert_allclose(out, reference(problem, a, b), atol=1e-4)


def test_guard_pages_catch_out_of_bounds_reads():
    """The harness above is only useful if a stray read really faults."""
    import subprocess
    import sys

    code = (
        "import ctypes, sys; sys.path.insert(0, '.');"
        "from tests.guarded import GuardedArray;"
        "g = GuardedArray((4, 4), 'end');"
        "print(ctypes.c_float.from_address(g.array.ctypes.data + 64).value)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert result.returncode < 0  # killed by SIGSEGV
