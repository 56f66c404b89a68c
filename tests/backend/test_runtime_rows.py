"""Kernels of runtime rows: one compiled schedule computes any row count from 1 to the problem's
in one call, as numpy does, reading and writing only those rows (guard pages), and the rows it
computes are the very numbers the full-size kernel computes."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.loops import SWITCH_LIMIT, RuntimeRowsUnsupported
from looprl.target import TARGET_NAMES, Target
from tests.guarded import GuardedArray
from tests.schedules import action_steps, layout_steps, walk, with_layouts

PROBLEMS = [
    looprl.matmul(67, 100, 50),  # no split divides these
    looprl.matmul(16, 48, 32),
    looprl.matmul(5, 33, 7),
    looprl.contraction("mk,k->m", m=37, k=50),  # matrix-vector: the rows are the output
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19),  # A @ B.T
    looprl.contraction("abc,cd->abd", a=5, b=6, c=7, d=19),  # rows of 6 x 19 outputs
    looprl.contraction("m,n->mn", m=21, n=35),  # no reduction
    looprl.matmul(24, 40, 30, constant="b", epilogue="bias+gelu+residual"),
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]


def arrays(problem, rows: int, seed: int) -> dict:
    """The inputs of a call on ``rows`` rows (the first input's and the residual's rows cut)."""
    rng = np.random.default_rng(seed)
    shapes = {"in0": problem.input_shapes[0], "in1": problem.input_shapes[1], **dict(problem.epilogue_shapes)}
    found = {}
    for name, shape in shapes.items():
        if name in ("in0", "residual"):
            shape = (rows, *shape[1:])
        found[name] = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return found


def reference(problem, given: dict) -> np.ndarray:
    out = np.einsum(problem.spec, given["in0"].astype(np.float64), given["in1"].astype(np.float64))
    epilogue = problem.epilogue
    if epilogue.is_identity:
        return out
    if epilogue.bias:
        out = out + given["bias"]
    if epilogue.activation == "gelu":
        from math import erf
        out = 0.5 * out * (1 + np.vectorize(erf)(out / np.sqrt(2)))
    if epilogue.residual:
        out = out + given["residual"]
    return out


def compiled(nest, target=None, threads=1):
    """The runtime-rows kernel of ``nest``, or None where codegen declines it for a stated reason."""
    try:
        return looprl.compile(nest, target, threads, runtime_rows=True)
    except RuntimeRowsUnsupported as refused:
        assert "first input" in str(refused) or f"at most {SWITCH_LIMIT}" in str(refused)
        return None


def run_guarded(kernel, given: dict, rows: int, side: str, threads: int) -> np.ndarray:
    """One call with every array ending (or starting) at an inaccessible page."""
    problem = kernel.problem
    out_shape = (rows, *problem.output_shape[1:])
    guards = {name: GuardedArray(array.shape, side) for name, array in given.items()}
    guards["out"] = GuardedArray(out_shape, side)
    try:
        for name, array in given.items():
            guards[name].array[...] = array
        extra = {name: guards[name].array for name in ("bias", "residual") if name in given}
        kernel.run(guards["in0"].array, guards["in1"].array, guards["out"].array, reps=2, threads=threads, **extra)
        return guards["out"].array.copy()
    finally:
        for guard in guards.values():
            guard.release()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=st.sampled_from(PROBLEMS),
    steps=action_steps(kinds=("split", "split", "swap_down", "swap_up", "parallel", "pack")),
    layouts=layout_steps(max_size=3),
    fraction=st.floats(0, 1),
    seed=st.integers(0, 2**16),
    side=st.sampled_from(["start", "end"]),
    target=st.sampled_from(HOST_TARGETS),
)
def test_any_row_count_matches_numpy_and_the_full_kernel_in_bounds(problem, steps, layouts, fraction, seed, side, target):
    nest = with_layouts(walk(problem, steps), layouts, seed)
    kernel = compiled(nest, target, threads=2)
    assume(kernel is not None)
    most = problem.size(problem.row_dim)
    rows = 1 + int(fraction * (most - 1))
    given_arrays = arrays(problem, rows, seed)
    threads = 2 if nest.is_parallel else 1
    out = run_guarded(kernel, given_arrays, rows, side, threads)
    expected = reference(problem, given_arrays)
    np.testing.assert_allclose(out, expected, rtol=0, atol=2e-5 * max(problem.size(d) for d in problem.reduction_dims or problem.dims))
    # The full-size kernel of the same schedule, on inputs whose first rows are these: the same numbers.
    full = looprl.compile(nest, target)
    padded = {name: (np.concatenate([a, np.zeros((most - rows, *a.shape[1:]), np.float32)]) if name in ("in0", "residual") else a)
              for name, a in given_arrays.items()}
    whole = full(padded["in0"], padded["in1"], *(padded[n] for n in problem.epilogue.inputs))
    np.testing.assert_array_equal(out, whole[:rows])


def test_one_kernel_serves_every_row_count_of_a_register_tiled_schedule():
    problem = looprl.matmul(13, 70, 50)
    nest = looprl.initial_nest(problem).split(0, 8).split(2, 16)  # 8-row blocks: a dynamic tail of 1..7 rows
    kernel = looprl.compile(nest, runtime_rows=True)
    assert kernel.runtime_rows and kernel.max_rows == 13
    b = np.random.default_rng(0).standard_normal((50, 70)).astype(np.float32)
    for rows in range(1, 14):
        a = np.random.default_rng(rows).standard_normal((rows, 50)).astype(np.float32)
        out = kernel(a, b)
        assert out.shape == (rows, 70)
        np.testing.assert_allclose(out, a @ b, atol=1e-4)
    bound = kernel.bind(b=b)  # bound kernels take any row count too
    np.testing.assert_allclose(bound(a[:3]), a[:3] @ b, atol=1e-4)


def test_a_parallel_loop_passes_the_row_count_to_every_thread():
    """Parallel over columns with the rows dynamic inside: each thread's region reads the row
    count from its context."""
    problem = looprl.matmul(37, 256, 40)
    nest = looprl.initial_nest(problem).split(2, 64).swap(1).swap(0).parallel(0)  # n/64 (parallel), m, k, n
    assert nest.compute[0].parallel and nest.compute[0].var == "n"
    kernel = looprl.compile(nest, threads=2, runtime_rows=True)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((40, 256)).astype(np.float32)
    for rows in (1, 2, 17, 36, 37):
        a = rng.standard_normal((rows, 40)).astype(np.float32)
        out = np.empty((rows, 256), np.float32)
        kernel.run(a, b, out, threads=2)
        np.testing.assert_allclose(out, a @ b, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16, 31, 99, 100])
def test_a_parallel_loop_over_the_rows_shares_the_row_count_among_the_threads(rows):
    """Parallel over blocks of 8 rows, whatever the count: the threads split the whole blocks
    of the count given, the one whose share ends there runs the rest."""
    problem = looprl.matmul(100, 96, 40)
    nest = looprl.initial_nest(problem).split(0, 8).parallel(0)  # m/8 (parallel), m8, k, n
    kernel = looprl.compile(nest, threads=2, runtime_rows=True)
    assert "@GOMP_parallel" in kernel.ir and "switch" not in kernel.ir.split("define internal void @region")[0]
    rng = np.random.default_rng(rows)
    a, b = rng.standard_normal((rows, 40)).astype(np.float32), rng.standard_normal((40, 96)).astype(np.float32)
    out = run_guarded(kernel, {"in0": a, "in1": b}, rows, "end", threads=2)
    np.testing.assert_allclose(out, a @ b, atol=1e-4)


def test_bad_row_counts_and_unsupported_kernels_are_value_errors():
    problem = looprl.matmul(8, 16, 16)
    kernel = looprl.compile(looprl.initial_nest(problem), runtime_rows=True)
    b = np.ones((16, 16), np.float32)
    for rows in (0, 9):
        with pytest.raises(ValueError, match="rows"):
            kernel(np.ones((rows, 16), np.float32), b)
    with pytest.raises(ValueError, match="shape"):  # the columns stay fixed
        kernel(np.ones((4, 15), np.float32), b)
    with pytest.raises(ValueError, match="runtime_rows"):
        looprl.compile(looprl.initial_nest(problem), runtime_rows=1)
    transposed = looprl.contraction("km,kn->mn", k=8, m=4, n=16)  # the rows do not lead the first input
    with pytest.raises(ValueError, match="leading dimension"):
        looprl.compile(looprl.initial_nest(transposed), runtime_rows=True)
    batched = looprl.contraction("bmk,bkn->bmn", b=2, m=4, k=8, n=16)  # b is in the second input too
    with pytest.raises(ValueError, match="leading dimension"):
        looprl.compile(looprl.initial_nest(batched), runtime_rows=True)
    whole_in_registers = looprl.initial_nest(looprl.matmul(40, 16, 4)).swap(0)  # k, m, n: all 40 rows in one (blocked) register scope
    with pytest.raises(ValueError, match="specialised copies"):
        looprl.compile(whole_in_registers, runtime_rows=True)


def test_a_kernel_of_fixed_rows_is_unchanged():
    """Without runtime rows the generated code is what it was (measurements keyed on it stay valid)."""
    problem = looprl.matmul(13, 70, 50)
    nest = looprl.initial_nest(problem).split(0, 8).split(2, 16)
    assert "%dyn" not in looprl.compile(nest).ir
    assert "%dyn" in looprl.compile(nest, runtime_rows=True).ir
