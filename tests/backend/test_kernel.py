import re

import numpy as np
import pytest

import looprl
from looprl.backend.buffers import aligned_copy, is_aligned
from looprl.target import host_cpu
from looprl.target import Target


@pytest.fixture(scope="module")
def kernel():
    return looprl.compile(looprl.initial_nest(looprl.matmul(12, 20, 8)))


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((12, 8)).astype(np.float32), rng.standard_normal((8, 20)).astype(np.float32)


def test_call_returns_new_output(kernel):
    a, b = inputs()
    out = kernel(a, b)
    assert out.shape == (12, 20) and out.dtype == np.float32
    np.testing.assert_allclose(out, a @ b, atol=1e-5)


def test_run_in_place_with_workspace(kernel):
    a, b = inputs()
    out = looprl.aligned_zeros((12, 20))
    ws = looprl.aligned_empty((12, 20))
    kernel.run(a, b, out, reps=4, workspace=ws)
    np.testing.assert_allclose(out, a @ b, atol=1e-5)


@pytest.mark.parametrize(
    "args, message",
    [
        (lambda a, b: (a.astype(np.float64), b), "dtype float32"),
        (lambda a, b: (a[:, :4], b), "shape"),
        (lambda a, b: (a, np.asfortranarray(b)), "C-contiguous"),
        (lambda a, b: (a.tolist(), b), "numpy array"),
        (lambda a, b: (np.ones((12, 16), np.float32)[:, ::2], b), "C-contiguous"),
    ],
)
def test_bad_inputs_raise_value_error(kernel, args, message):
    a, b = inputs()
    with pytest.raises(ValueError, match=message):
        kernel(*args(a, b))


def test_bad_output_and_reps(kernel):
    a, b = inputs()
    with pytest.raises(ValueError, match="output has shape"):
        kernel.run(a, b, np.empty((20, 12), np.float32))
    with pytest.raises(ValueError, match=r"reps must be an integer in 1\.\.2147483647, got 0"):
        kernel.run(a, b, np.empty((12, 20), np.float32), reps=0)
    readonly = np.empty((12, 20), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernel.run(a, b, readonly)
    with pytest.raises(ValueError, match="workspace has"):
        kernel.run(a, b, np.empty((12, 20), np.float32), workspace=np.empty(3, np.float32))


def test_output_must_not_overlap_inputs():
    problem = looprl.matmul(8, 8, 8)
    kernel = looprl.compile(looprl.initial_nest(problem))
    a = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        kernel.run(a, a, a)


def test_compile_rejects_non_nests():
    with pytest.raises(ValueError, match="expects a LoopNest"):
        looprl.compile(looprl.matmul(4, 4, 4))


def test_aligned_buffers():
    for shape in [(3,), (5, 7), (2, 3, 4)]:
        array = looprl.aligned_empty(shape)
        assert is_aligned(array) and array.shape == shape and array.flags.c_contiguous
    copy = aligned_copy(np.arange(10, dtype=np.float32)[::2])
    assert is_aligned(copy) and copy.tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="power of two"):
        looprl.aligned_empty(4, alignment=48)


# A packed single-precision FMA on a vector register, e.g. "vfmadd231ps 64(%rsi), %zmm3, %zmm2"
# (AT&T syntax). A bare "fma" substring would also match "call fmaf", the scalar libcall that
# LLVM emits when it cannot select the instruction.
VECTOR_FMA = re.compile(r"^\s*vfmadd(132|213|231)ps\s+[^\n]*%(ymm|zmm)\d+", re.MULTILINE)
FMA_CALL = re.compile(r"\bcall[a-z]*\s+[^\n]*\bfmaf?\b")


def test_fma_patterns_tell_instructions_from_libcalls():
    instructions = "\tvfmadd231ps\t64(%rsi), %zmm3, %zmm2\n\tvfmadd213ps\t%ymm0, %ymm1, %ymm2\n"
    libcalls = "\tcallq\tfmaf@PLT\n\tcall\tfmaf\n\tvfmadd231ss\t%xmm0, %xmm1, %xmm2\n"
    assert len(VECTOR_FMA.findall(instructions)) == 2 and not FMA_CALL.search(instructions)
    assert not VECTOR_FMA.search(libcalls) and len(FMA_CALL.findall(libcalls)) == 2


@pytest.mark.skipif("+fma" not in host_cpu()[1].split(","), reason="the host has no FMA instructions")
def test_kernel_exposes_ir_and_assembly():
    kernel = looprl.compile(looprl.initial_nest(looprl.matmul(16, 32, 8)))
    assert "define void @looprl_kernel" in kernel.ir
    assembly = kernel.assembly()
    assert VECTOR_FMA.search(assembly), "no vector FMA instruction in the kernel's assembly"
    assert not FMA_CALL.search(assembly), "the kernel calls fmaf instead of using FMA instructions"


def test_workspace_must_not_overlap_inputs_or_output(kernel):
    a, b = inputs()
    out = looprl.aligned_zeros((12, 20))
    storage = looprl.aligned_zeros(12 * 8 + 12 * 20)
    shared_a = storage[: 12 * 8].reshape(12, 8)
    shared_a[...] = a
    with pytest.raises(ValueError, match="workspace overlaps the first input"):
        kernel.run(shared_a, b, out, workspace=storage[50 : 50 + 12 * 20])
    np.testing.assert_array_equal(shared_a, a)  # the input is intact
    storage = looprl.aligned_zeros(8 * 20 + 12 * 20)
    shared_b = storage[12 * 20 :].reshape(8, 20)
    shared_b[...] = b
    with pytest.raises(ValueError, match="workspace overlaps the second input"):
        kernel.run(a, shared_b, out, workspace=storage[1:])
    np.testing.assert_array_equal(shared_b, b)
    with pytest.raises(ValueError, match="workspace overlaps the output"):
        kernel.run(a, b, out, workspace=out)
    readonly = np.zeros((12, 20), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="workspace array is read-only"):
        kernel.run(a, b, out, workspace=readonly)
    kernel.run(a, b, out, workspace=storage[: 12 * 20])  # adjacent but disjoint: fine
    np.testing.assert_allclose(out, a @ b, atol=1e-5)


def test_reps_must_fit_the_kernel_loop_count(kernel):
    a, b = inputs()
    out = np.empty((12, 20), np.float32)
    # 2**64 wrapped to 0 repetitions (nothing computed); larger than 2**31 - 1 is refused outright
    for reps in (2**64, 2**64 + 1, 2**63, 2**31, -1, 0):
        with pytest.raises(ValueError, match=r"reps must be an integer in 1\.\.2147483647, got"):
            kernel.run(a, b, out, reps=reps)
    for reps in (True, np.True_, 2.0, "2", None, np.array([2])):
        with pytest.raises(ValueError, match=r"reps must be an integer in 1\.\.2147483647, got"):
            kernel.run(a, b, out, reps=reps)
    for reps in (np.int64(2), np.int32(3), np.uint8(1), np.array(2)):
        out[...] = 0
        kernel.run(a, b, out, reps=reps)
        np.testing.assert_allclose(out, a @ b, atol=1e-5)


@pytest.mark.parametrize("target", [16, (16, 32), {"vector_width": 8}, 3.5])
def test_compile_rejects_targets_that_are_not_targets(target):
    with pytest.raises(ValueError, match=f"expects target to be a looprl Target, a target name or None, got {type(target).__name__}"):
        looprl.compile(looprl.initial_nest(looprl.matmul(4, 4, 4)), target=target)


@pytest.mark.parametrize("name", ["avx1024", "neon", ""])
def test_compile_rejects_unknown_target_names(name):
    with pytest.raises(ValueError, match="unknown target"):
        looprl.compile(looprl.initial_nest(looprl.matmul(4, 4, 4)), target=name)


def test_compile_accepts_a_target():
    kernel = looprl.compile(looprl.initial_nest(looprl.matmul(4, 8, 4)), target=Target.named("sse4"))
    assert kernel.target == Target.named("sse4")
    assert "<4 x float>" in kernel.ir and "<8 x float>" not in kernel.ir


def test_aligned_buffers_take_numpy_integers_and_refuse_bad_shapes():
    assert looprl.aligned_empty(np.int64(5)).shape == (5,)
    assert looprl.aligned_empty((np.int32(2), np.uint8(3))).shape == (2, 3)
    assert looprl.aligned_empty(np.array(4)).shape == (4,)
    assert looprl.aligned_zeros(0).shape == (0,)
    for bad, message in (
        (-1, "array size must be a non-negative integer, got -1"),
        ((2, -3), "array extent must be a non-negative integer, got -3"),
        (2.0, "shape must be an integer or a sequence of integers"),
        ((2, True), "array extent must be a non-negative integer, got the bool True"),
        (None, "shape must be"),
    ):
        with pytest.raises(ValueError, match=message):
            looprl.aligned_empty(bad)
