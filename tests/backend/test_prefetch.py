"""Prefetch steps in generated code (looprl.ir.step's ``prefetch``): a kernel that prefetches an
input computes the same bits as the kernel without the step (and what numpy computes), for
random schedules with a prefetch at a random legal loop, sizes no split divides, packed
layouts, float32 and bfloat16 (paired weights too), one and two threads, runtime rows; it
reads and writes nothing out of bounds (a prefetch past a buffer's end is a hint, never a
read); and its IR carries one ``llvm.prefetch`` per line of the block an iteration reads,
addressed without ``inbounds``."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.codegen import generate_ir
from looprl.backend.kernel_plan import Prefetch, plan_kernel
from looprl.backend.threads import available_cores
from looprl.ir.layers import linear
from looprl.ir.plans import plan_catalogue, planned
from looprl.ir.step import Step
from looprl.measurement.pair_steps import with_pairs
from looprl.target import TARGET_NAMES, Target
from tests.backend.test_bfloat16 import bf16_inputs
from tests.backend.test_codegen_correctness import assert_matches, random_inputs, reference
from tests.guarded import GuardedArray
from tests.schedules import action_steps, pack_every_tiled_loop, walk

PROBLEMS = [
    looprl.matmul(37, 50, 29),  # no split divides these
    looprl.matmul(3, 100, 70),
    looprl.contraction("bmk,bkn->bmn", b=3, m=5, k=9, n=35),
    looprl.contraction("mk,nk->mn", m=3, n=30, k=67),  # a few-row linear layer, its weight as stored
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]
TENSORS = ("in0", "in1")
DISTANCES = (64, 512, 1024, 4096, 16384)


def prefetched(nest, tensor: str, pick: int, ahead: int):
    """``nest`` with ``tensor`` prefetched ``ahead`` bytes at its ``pick``-th legal loop (modulo
    their count), or None where no loop takes the step."""
    legal = [i for i in range(len(nest.compute)) if nest.why_not(Step("prefetch", i, ahead, tensor)) is None]
    return nest.prefetch(legal[pick % len(legal)], tensor, ahead) if legal else None


def threads_offered(nest) -> list[int]:
    return [1, 2] if nest.is_parallel and available_cores() >= 2 else [1]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(("split", "split", "swap_down", "swap_up", "parallel"), max_size=10),
       pack=st.booleans(), tensor=st.sampled_from(TENSORS), pick=st.integers(0, 20), ahead=st.sampled_from(DISTANCES),
       seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS))
def test_random_prefetching_schedules_compute_the_same_bits(problem, steps, pack, tensor, pick, ahead, seed, target):
    plain = walk(problem, steps)
    plain = pack_every_tiled_loop(plain, seed) if pack else plain
    nest = prefetched(plain, tensor, pick, ahead)
    if nest is None:
        return
    kernel, without = looprl.compile(nest, target=target), looprl.compile(plain, target=target)
    assert kernel.plan.prefetches == (Prefetch(tensor, nest.prefetched_at(tensor), ahead),)
    a, b = random_inputs(problem, seed)
    assert_matches(problem, kernel, a, b)
    for threads in threads_offered(nest):
        out, expected = np.empty(problem.output_shape, np.float32), np.empty(problem.output_shape, np.float32)
        kernel.run(a, b, out, threads=threads)
        without.run(a, b, expected, threads=threads)
        np.testing.assert_array_equal(out, expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(max_size=10), tensor=st.sampled_from(TENSORS),
       pick=st.integers(0, 20), ahead=st.sampled_from(DISTANCES), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS))
def test_random_prefetching_bfloat16_schedules_compute_the_same_bits(problem, steps, tensor, pick, ahead, seed, target):
    problem = problem.with_dtype("bfloat16")
    plain = with_pairs(walk(problem, steps), target)  # a weight paired where the kernel takes pairs
    nest = prefetched(plain, tensor, pick, ahead)
    if nest is None:
        return
    a, b = bf16_inputs(problem, seed)
    np.testing.assert_array_equal(looprl.compile(nest, target=target)(a, b), looprl.compile(plain, target=target)(a, b))


def dot_nest(problem, target, ahead: int | None):
    """The first dot-product plan of ``problem`` on ``target``, its weight prefetched ``ahead``
    bytes at its outermost legal loop (None: not prefetched)."""
    nest = next(n for plan in plan_catalogue(target) if plan.dot and not isinstance(n := planned(problem, target, plan), str))
    return nest if ahead is None else prefetched(nest, "in1", 0, ahead)


@pytest.mark.target_dependent
@pytest.mark.parametrize("side", ["start", "end"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefetching_kernels_stay_in_bounds(side, dtype):
    """A few-row linear layer's dot product and a matmul's streaming tile, their weight
    prefetched 16 KB ahead (past its end on the last iterations), inputs, output and workspace
    against guard pages: the same bits as without the step."""
    target = Target.default()
    layer = linear(3, 700, 130, bias=False)
    problems = [(layer, dot_nest(layer, target, None))]
    matmul = looprl.matmul(2, 300, 70)
    tile = looprl.initial_nest(matmul).split(1, 8).split(3, 16).swap(0).swap(1).swap(2)  # k/8, n/16, m, k8, n16
    problems.append((matmul, tile))
    for problem, plain in problems:
        problem = problem.with_dtype(dtype)
        plain = with_pairs(looprl.LoopNest.from_key(problem, plain.key), target)
        nest = prefetched(plain, "in1", 0, 16384)
        assert nest is not None
        expected = looprl.compile(plain)(*_inputs(problem, dtype))
        kernel = looprl.compile(nest)
        shapes = (*problem.input_shapes, problem.output_shape, (max(kernel.workspace_elements, 1),))
        dtypes = [kernel.storage, kernel.storage, kernel.storage, np.float32]
        guards = [GuardedArray(shape, side, dtype=kind) for shape, kind in zip(shapes, dtypes)]
        try:
            a, b, out, work = (g.array for g in guards)
            a[...], b[...] = _inputs(problem, dtype)
            kernel.run(a, b, out, reps=2, workspace=work)
            np.testing.assert_array_equal(out, expected)
        finally:
            for g in guards:
                g.release()


def _inputs(problem, dtype):
    return bf16_inputs(problem, 4) if dtype == "bfloat16" else random_inputs(problem, 4)


def test_a_runtime_rows_kernel_prefetches_its_weight():
    """Runtime rows (a decode layer called with fewer rows): the same bits as without the step."""
    problem = looprl.matmul(9, 100, 70)
    plain = looprl.initial_nest(problem).split(1, 8).split(3, 16).swap(0).swap(1).swap(2)
    nest = prefetched(plain, "in0", 0, 512)
    kernel, without = looprl.compile(nest, runtime_rows=True), looprl.compile(plain, runtime_rows=True)
    a, b = random_inputs(problem, 1)
    for rows in (1, 4, 9):
        out, expected = kernel(a[:rows], b), without(a[:rows], b)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_allclose(out, reference(problem, a[:rows], b), rtol=1e-4, atol=1e-4)


def test_the_ir_prefetches_each_line_of_a_block_ahead_without_inbounds():
    """A dot product's k-block loop over 8 rows x 16 floats: 8 lines an iteration, each ``ahead``
    bytes further on, through a getelementptr that may point past the weight; the rest of the
    IR is the IR without the step."""
    target = Target.named("avx512")
    problem = linear(1, 4096, 512, bias=False)
    plain = looprl.LoopNest.from_key(problem, "n64s8,k256s16,m1s1,n8s1,k16s1|m1s1,n512s1")
    nest = plain.prefetch(1, "in1", 1024)
    ir, before = generate_ir(nest, target), generate_ir(plain, target)
    calls = [line for line in ir.splitlines() if "call void @llvm.prefetch.p0" in line]
    addresses = [line for line in ir.splitlines() if "getelementptr i8, ptr" in line]
    assert len(calls) == len(addresses) == 8 and "llvm.prefetch" not in before
    offsets = sorted(int(line.rsplit(" ", 1)[1]) for line in addresses)
    assert offsets == [1024 + row * 4096 * 4 for row in range(8)]  # each row's line, 1 KB on
    assert all("i32 0, i32 3, i32 1" in line for line in calls)  # a read, every cache level, data
    kept = [line for line in ir.splitlines() if line and "prefetch" not in line and "%pf" not in line]
    assert len(kept) == len([line for line in before.splitlines() if line])  # (the SSA names after them shift)


def test_the_plan_carries_the_prefetch_and_a_nest_without_it_none():
    target = Target.named("avx2")
    problem = linear(2, 300, 40, bias=False)
    plain = dot_nest(problem, target, None)
    assert plan_kernel(plain, target).prefetches == ()
    nest = dot_nest(problem, target, 2048)
    assert plan_kernel(nest, target).prefetches == (Prefetch("in1", nest.prefetched_at("in1"), 2048),)
    assert nest.key != plain.key and "prefetch in1 +2048" in str(nest) and ">in1:2048" in nest.key
