"""Issue 61, item 2: split-k kernels (a compute loop over a reduction made parallel with
``ksplit``: looprl.backend.partials). Each thread of the team sums its share of the reduction
into a partial accumulator of its own, the calling thread adds the partials, and the write-back
applies the epilogue to their sum once.

The tolerance: a split-k kernel associates each output element's sum differently from its
serial twin (each thread's share, then the shares in turn), so the two agree within float32
summation rounding, not bit for bit. Any order of summing k float32 products lies within
``looprl.ir.dtypes.error_bound`` (gamma_k times the sum of the products' magnitudes, Higham
3.1) of the exact float64 contraction; so the kernel and its serial twin each lie within that
bound of the exact result, and within twice it of each other. On a team of one the order is the
serial one, and the outputs are equal bit for bit (except a dot-product scope the split loop
cuts, or one the split loop, innermost, keeps from vectorising: :func:`bit_identical`).

Checked on teams of 1, 2 and 3, sizes no split divides, inputs, output and a workspace of
exactly the kernel's size flush against guard pages, two repetitions per call (the partials
zeroed again each time), epilogues (applied once, after the sum: a white-box test reads the
partials back), bfloat16 (pairs, dot products), runtime rows, and the plan's placement of the
partials."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.threads import available_cores
from looprl.ir import Epilogue
from looprl.ir.dtypes import error_bound, from_bfloat16
from looprl.measurement.pair_steps import with_pairs
from looprl.target import TARGET_NAMES, Target
from tests.backend.test_bfloat16 import bf16_inputs
from tests.backend.test_codegen_correctness import random_inputs
from tests.backend.test_epilogue_codegen import random_arrays, reference, tolerance
from looprl.backend.register_plan import plan as register_plan
from tests.backend.test_staged_teams import cores
from tests.conftest import examples
from tests.guarded import GuardedArray
from tests.schedules import action_steps, walk

pytestmark = pytest.mark.target_dependent  # parallel kernels on the default target's vectors

PROBLEMS = [
    looprl.matmul(7, 37, 300),  # no split divides these
    looprl.matmul(3, 20, 517),
    looprl.contraction("mk,nk->mn", m=5, n=9, k=301),  # A @ B.T: dot products
    looprl.contraction("mk,k->m", m=11, k=403),  # matrix-vector
    looprl.contraction("bmk,bkn->bmn", b=2, m=3, k=129, n=19),
    looprl.contraction("abcd,cde->abe", a=2, b=3, c=13, d=11, e=17),  # two reduction dimensions
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]
TEAMS = (1, 2, 3)


def k_blocks_outermost(problem, block: int):
    """``problem``'s untuned nest with its ``k`` loop split by ``block`` and the blocks' loop
    moved outermost."""
    nest = looprl.initial_nest(problem)
    k = next(i for i, loop in enumerate(nest.compute) if loop.var == "k")
    nest = nest.split(k, block)
    for at in range(k - 1, -1, -1):
        nest = nest.swap(at)
    return nest


def bit_identical(nest, target) -> bool:
    """Whether the split-k kernel of ``nest`` on one thread sums as its serial twin does: both
    or neither keep partial sums along the reduction in a vector (a dot product), and both
    from the same loop on (the split loop cuts the register scope; innermost, it runs element
    by element)."""
    split, serial = register_plan(nest, target), register_plan(nest.serial(), target)
    return split.reduces_vector == serial.reduces_vector and (not split.reduces_vector or split.scope_start == serial.scope_start)


def split_k(nest, pick: int):
    """``nest`` with its ``pick``-th (modulo their count) compute loop that takes ``ksplit``
    split among the threads."""
    places = [i for i in range(len(nest.compute)) if nest.why_not_ksplit(i) is None]
    return nest.ksplit(places[pick % len(places)])


def guarded_call(kernel, arrays: dict, team: int, side: str, reps: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``kernel`` on ``team`` threads (the core count unchecked), ``reps`` times, its inputs
    (``arrays`` by tensor name: in0, in1 and the epilogue's), output and a workspace of exactly
    :attr:`workspace_elements` flush against guard pages on ``side``: (output, workspace)."""
    problem = kernel.problem
    storage = problem.dtype.storage
    shapes = {"out": (problem.output_shape, storage), "acc": ((kernel.workspace_elements,), np.float32)}
    shapes.update({name: (array.shape, array.dtype) for name, array in arrays.items()})
    guards = {name: GuardedArray(shape, side, dtype) for name, (shape, dtype) in shapes.items()}
    try:
        for name, array in arrays.items():
            guards[name].array[...] = array
        guards["out"].array[...] = 0
        kernel.raw_call(tuple(guards[t].array.ctypes.data for t in kernel.tensors), reps, team)
        return guards["out"].array.copy(), guards["acc"].array.copy()
    finally:
        for guard in guards.values():
            guard.release()


def assert_agrees(problem, out, serial, a, b, same_order: bool):
    """``out`` (a split-k kernel's) and ``serial`` (its serial twin's) against the exact
    contraction: the module docstring's tolerance."""
    if same_order:
        assert np.array_equal(out, serial)
    exact = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))
    reductions = int(np.prod([problem.size(d) for d in problem.reduction_dims]))
    bound = error_bound(problem.spec, a, b, reductions, "float32")
    assert np.all(np.abs(out - exact) <= bound) and np.all(np.abs(serial - exact) <= bound)
    assert np.all(np.abs(out.astype(np.float64) - serial) <= 2 * bound)


def assert_planned(kernel, nest):
    """The plan of a split-k kernel: its split loop, no direct store, the partial accumulator a
    private buffer (thread_stride apart, at least the accumulator's size), a team bound of the
    split loop's iterations."""
    plan = kernel.plan
    assert plan.ksplit == nest.split_reduction is not None and not plan.direct
    offset, floats = plan.workspace["partial"]
    assert floats == plan.workspace["acc"][1] and offset % 16 == 0 and plan.thread_stride >= floats and plan.thread_stride % 16 == 0
    assert plan.stage_team == nest.compute[plan.ksplit].iterations
    assert kernel.workspace_elements == plan.workspace_for(3)  # (compiled for 3 cores)
    assert plan.private_strides["acc"] == plan.thread_stride


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(("split", "split", "swap_down", "swap_up"), max_size=10),
       pick=st.integers(0, 20), parallel_copy=st.booleans(), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS),
       side=st.sampled_from(["start", "end"]))
@example(problem=PROBLEMS[0], steps=[(1, "split_64"), (0, "swap_down")], pick=0, parallel_copy=False, seed=0, target=Target.default(),
         side="end")
def test_random_split_k_kernels_match_their_serial_twin_and_numpy_within_bounds(problem, steps, pick, parallel_copy, seed, target, side):
    nest = split_k(walk(problem, steps), pick)
    if parallel_copy:  # the write-back nest's outermost loop on the threads too
        nest = nest.parallel(len(nest.compute))
    with cores(max(TEAMS)):
        kernel = looprl.compile(nest, target=target)
    assert_planned(kernel, nest)
    a, b = random_inputs(problem, seed)
    serial = looprl.compile(nest.serial(), target=target)(a, b)
    for team in TEAMS:
        out, _ = guarded_call(kernel, {"in0": a, "in1": b}, team, side)
        assert_agrees(problem, out, serial, a, b, same_order=team == 1 and bit_identical(nest, target))


@pytest.mark.parametrize("epilogue", [Epilogue(bias=True, activation="relu"),
                                      Epilogue(scale=0.5, bias=True, activation="gelu", residual=True),
                                      Epilogue(scale=-1.75, activation="silu")], ids=["bias-relu", "gelu-residual", "silu"])
@pytest.mark.parametrize("team", [2, 3])
def test_the_epilogue_is_applied_once_to_the_sum(epilogue, team):
    problem = looprl.contraction("mk,nk->mn", m=4, n=24, k=900, epilogue=epilogue)
    nest = k_blocks_outermost(problem, 64).ksplit(0)  # k14s64 t4 (parallel), m4, k64, n24
    with cores(3):
        kernel = looprl.compile(nest)
    a, b, extra = random_arrays(problem, 11)
    out, _ = guarded_call(kernel, {"in0": a, "in1": b, **extra}, team, "end")
    np.testing.assert_allclose(out, reference(problem, a, b, extra), rtol=1e-5, atol=tolerance(problem))


def test_the_partials_are_summed_in_thread_order_and_the_epilogue_applied_after():
    """White box: after a call on two threads the workspace holds each thread's partial sums,
    both non-zero (each summed its half of k); the accumulator is their sum, added thread 0's
    first (bit for bit as numpy adds them); the output is the epilogue of that sum. Dropping the
    final sum leaves the accumulator without thread 1's half; an epilogue applied per thread
    gives relu(p0 + bias) + relu(p1 + bias), which is not the output."""
    problem = looprl.matmul(4, 16, 512, epilogue=Epilogue(bias=True, activation="relu"))
    nest = looprl.initial_nest(problem).swap(0).ksplit(0)  # k512 (parallel), m4, n16
    with cores(3):
        kernel = looprl.compile(nest)
    a, b, extra = random_arrays(problem, 5)
    out, workspace = guarded_call(kernel, {"in0": a, "in1": b, **extra}, 2, "end", reps=1)
    plan = kernel.plan
    offset, floats = plan.workspace["partial"]
    partials = [workspace[offset + t * plan.thread_stride: offset + t * plan.thread_stride + floats].reshape(4, 16) for t in (0, 1)]
    acc = workspace[:floats].reshape(4, 16)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(partials[0], a64[:, :256] @ b64[:256], atol=1e-4)  # thread 0: the first half of k
    np.testing.assert_allclose(partials[1], a64[:, 256:] @ b64[256:], atol=1e-4)
    assert np.array_equal(acc, partials[0] + partials[1])
    bias = extra["bias"]
    assert np.array_equal(out, np.maximum(acc + bias, np.float32(0)))
    np.testing.assert_allclose(out, reference(problem, a, b, extra), atol=tolerance(problem))
    per_thread = np.maximum(partials[0] + bias, 0) + np.maximum(partials[1] + bias, 0)
    assert np.abs(per_thread - out).max() > 0.1


@pytest.mark.parametrize("team", [1, 2, 3])
def test_bfloat16_pairs_and_dot_products_split_k(team):
    """A bfloat16 weight paired (the k loop inside the scope walks pairs; the split loop's step is
    even, so every thread's share starts on a pair), and a dot-product kernel reading both inputs
    in pairs: within the bfloat16 bound of the exact result, equal to the serial twin on one
    thread where the order is the serial one."""
    target = Target.default()
    paired = looprl.matmul(4, 16, 701, constant="b", dtype="bfloat16")
    nest = with_pairs(k_blocks_outermost(paired, 64), target)  # k10s64 t61, m4, k64 (in pairs), n16
    dots = looprl.contraction("mk,nk->mn", m=3, n=10, k=333, dtype="bfloat16")
    dot_nest = looprl.initial_nest(dots).swap(1).split(2, 32).swap(1).swap(0)  # k10s32 t13, m3, n10, k32: partial sums along k
    for problem, nest in ((paired, nest.ksplit(0)), (dots, dot_nest.ksplit(0))):
        with cores(3):
            kernel = looprl.compile(nest, target=target)
        if problem is paired:
            assert kernel.plan.pairing is not None and nest.compute[0].step % 2 == 0
        a, b = bf16_inputs(problem, 9)
        serial = looprl.compile(nest.serial(), target=target)(a, b)
        out, _ = guarded_call(kernel, {"in0": a, "in1": b}, team, "start")
        fa, fb = from_bfloat16(a), from_bfloat16(b)
        exact = np.einsum(problem.spec, fa.astype(np.float64), fb.astype(np.float64))
        bound = error_bound(problem.spec, fa, fb, problem.size("k"), problem.dtype)
        for result in (out, serial):
            assert np.all(np.abs(from_bfloat16(result).astype(np.float64) - exact) <= bound)
        if team == 1 and bit_identical(nest, target):
            assert np.array_equal(out, serial)


def test_runtime_rows_split_k():
    """A split-k kernel of runtime rows: any row count from 1 to the problem's, on two threads,
    agrees with the serial runtime-rows kernel within the bound."""
    problem = looprl.matmul(9, 40, 600)
    nest = k_blocks_outermost(problem, 100).ksplit(0)  # k6s100 (parallel), m9, k100, n40
    kernel = looprl.compile(nest, runtime_rows=True, threads=min(2, available_cores()))
    serial = looprl.compile(nest.serial(), runtime_rows=True)
    a, b = random_inputs(problem, 2)
    for rows in (1, 4, 9):
        out = kernel(a[:rows].copy(), b)
        assert out.shape == (rows, 40)
        assert_agrees(looprl.matmul(rows, 40, 600), out, serial(a[:rows].copy(), b), a[:rows], b, same_order=False)


def test_a_split_loop_of_one_iteration_in_a_tail_still_sums_into_the_partials():
    """The split loop inside a k-block loop with a tail, inside an m loop with a tail: k 300 =
    2 x 128 + 44, each 128-block split 100 + 28, that split's outer loop parallel (two iterations
    in a full block, one in the 44-tail, emitted there without a team): every context's sums reach
    the partials, and the output."""
    problem = looprl.matmul(7, 37, 300)
    nest = looprl.initial_nest(problem).split(1, 128).split(0, 4)  # m1s4 t3, m4, k2s128 t44, k128, n37
    nest = nest.split(3, 100).ksplit(3)  # the k128 loop split in 100 + 28: its outer part (1 iteration, or 1 in the tail) parallel
    with cores(3):
        kernel = looprl.compile(nest)
    a, b = random_inputs(problem, 3)
    serial = looprl.compile(nest.serial())(a, b)
    for team in TEAMS:
        out, _ = guarded_call(kernel, {"in0": a, "in1": b}, team, "end")
        assert_agrees(problem, out, serial, a, b, same_order=False)


@pytest.mark.parametrize("team", TEAMS)
def test_threads_that_split_k_stage_their_own_panels(team):
    """A BLIS-ordered blocked schedule (n-block, k-block, m-block, 4x16 tiles) with B staged at
    the k-block loop and that loop split among the threads: each thread stages the blocks of its
    own share of k into its own buffer, beside its partial accumulator (both private, one
    thread_stride apart per thread)."""
    from looprl.ir.cache_blocks import Blocks, blocked_steps

    problem = looprl.matmul(20, 150, 700)  # a tail in every block
    nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 4, 16, Blocks(64, 32, 128)))
    k_block = next(i for i, loop in enumerate(nest.compute) if loop.var == "k")
    nest = nest.stage(k_block, "in1").ksplit(k_block)
    with cores(3):
        kernel = looprl.compile(nest)
    plan = kernel.plan
    assert plan.stages["in1"].private and plan.ksplit == k_block
    partial, staged = plan.workspace["partial"], plan.workspace["in1"]
    assert partial[0] < staged[0] and plan.thread_stride >= staged[0] + staged[1] - partial[0]
    a, b = random_inputs(problem, 12)
    serial = looprl.compile(nest.serial())(a, b)
    out, _ = guarded_call(kernel, {"in0": a, "in1": b}, team, "end")
    assert_agrees(problem, out, serial, a, b, same_order=team == 1)
