import numpy as np
import pytest

import looprl
from looprl.backend.buffers import aligned_copy, is_aligned


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
    with pytest.raises(ValueError, match="reps must be a positive integer"):
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


def test_kernel_exposes_ir_and_assembly():
    kernel = looprl.compile(looprl.initial_nest(looprl.matmul(16, 32, 8)))
    assert "define void @looprl_kernel" in kernel.ir
    assert "fma" in kernel.assembly()
