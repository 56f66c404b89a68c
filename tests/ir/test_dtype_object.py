"""A problem's dtype is a DType value: its facts, how names, numpy and torch dtypes become one, and
that names, keys and stored text keep the names they had."""

import dataclasses
import pickle

import numpy as np
import pytest
import torch

import looprl
from looprl.backend.kernel_plan import tensor_elements
from looprl.backend.peak_kernel import flops_per_step, pairs_in_peak
from looprl.ir.dtypes import BFLOAT16, DEFAULT_DTYPE, DTYPES, FLOAT32, DType, as_dtype, error_bound, from_bfloat16, storage
from looprl.measurement.keys import peak_key
from looprl.measurement.timing import Workspace
from looprl.target import Target

AVX512 = Target.named("avx512")
AVX512_BF16 = dataclasses.replace(AVX512, features=AVX512.features + ",+avx512bf16")  # never run: only asked


@pytest.mark.parametrize("value, expected", [
    ("float32", FLOAT32), ("bfloat16", BFLOAT16), (FLOAT32, FLOAT32), (BFLOAT16, BFLOAT16),
    (np.float32, FLOAT32), (np.dtype(np.float32), FLOAT32), (torch.float32, FLOAT32), (torch.bfloat16, BFLOAT16),
])
def test_as_dtype_gives_the_one_instance_of_each_dtype(value, expected):
    assert as_dtype(value) is expected


@pytest.mark.parametrize("bad", ["float16", "FLOAT32", " bfloat16", "", None, 3, np.float64, np.uint16, torch.float16, object()])
def test_anything_else_is_a_value_error_naming_the_dtypes(bad):
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, got"):
        as_dtype(bad)


def test_each_dtype_states_its_facts():
    assert (FLOAT32.name, FLOAT32.element_bytes, FLOAT32.significand_bits, FLOAT32.llvm_element) == ("float32", 4, 24, "float")
    assert (BFLOAT16.name, BFLOAT16.element_bytes, BFLOAT16.significand_bits, BFLOAT16.llvm_element) == ("bfloat16", 2, 8, "i16")
    assert FLOAT32.accumulator is FLOAT32 and BFLOAT16.accumulator is FLOAT32
    assert FLOAT32.storage == np.float32 and BFLOAT16.storage == np.uint16
    assert FLOAT32.rounding is None and not FLOAT32.rounds_output
    assert BFLOAT16.rounding == "nearest-even" and BFLOAT16.rounds_output
    assert BFLOAT16.exact_products and not FLOAT32.exact_products  # 8 + 8 bits fit float32's 24; 24 + 24 do not
    assert (FLOAT32.unit_roundoff, BFLOAT16.unit_roundoff) == (2.0**-24, 2.0**-8)
    assert FLOAT32.numpy_computes and not BFLOAT16.numpy_computes
    assert DEFAULT_DTYPE is FLOAT32 and DTYPES == ("float32", "bfloat16")


def test_a_dtype_is_frozen_and_pickles_to_the_same_instance():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BFLOAT16.element_bytes = 4
    assert pickle.loads(pickle.dumps(BFLOAT16)) is BFLOAT16
    problem = looprl.matmul(4, 8, 16, dtype="bfloat16")
    assert pickle.loads(pickle.dumps(problem)).dtype is BFLOAT16


def test_a_dtype_answers_to_its_name_as_numpy_dtypes_do():
    assert BFLOAT16 == "bfloat16" and BFLOAT16 != "float32" and FLOAT32 != BFLOAT16
    assert {BFLOAT16: 1}["bfloat16"] == 1 and {"float32": 2}[FLOAT32] == 2
    assert str(BFLOAT16) == "bfloat16" and repr(BFLOAT16) == "DType('bfloat16')"
    assert BFLOAT16 != 2  # neither a name nor a dtype


def test_a_target_s_dot_pairs_are_asked_of_the_dtype():
    for target in (Target.named("sse4"), Target.named("avx2"), AVX512):
        assert not BFLOAT16.pairs_on(target) and not FLOAT32.pairs_on(target)
        assert BFLOAT16.reduction_lanes(target) == FLOAT32.reduction_lanes(target) == target.vector_width
    assert BFLOAT16.pairs_on(AVX512_BF16) and not FLOAT32.pairs_on(AVX512_BF16)
    assert (BFLOAT16.reduction_lanes(AVX512_BF16), FLOAT32.reduction_lanes(AVX512_BF16)) == (32, 16)
    assert pairs_in_peak(AVX512_BF16, "bfloat16") and not pairs_in_peak(AVX512, BFLOAT16)
    assert (flops_per_step(AVX512_BF16, BFLOAT16), flops_per_step(AVX512_BF16)) == (64, 32)


def test_a_problem_holds_the_dtype_and_its_name_keeps_today_s_text():
    f32 = looprl.contraction("mk,nk->mn", m=4, n=8, k=16, constant="in1")
    bf16 = f32.with_dtype(torch.bfloat16)
    assert f32.dtype is FLOAT32 and bf16.dtype is BFLOAT16
    assert f32.name == "mk,nk->mn:m=4,k=16,n=8;const=in1"  # float32: unnamed, as every stored record has it
    assert bf16.name == "mk,nk->mn:m=4,k=16,n=8;const=in1;dtype=bfloat16"
    assert looprl.parse_problem(bf16.name) == bf16 and looprl.parse_problem(bf16.name).dtype is BFLOAT16
    assert looprl.parse_problem(f32.name + ";dtype=float32") == f32
    assert (bf16.element_bytes, bf16.constant_bytes) == (2, 2 * 8 * 16)
    assert looprl.linear(2, 16, 8, dtype=BFLOAT16).dtype is BFLOAT16
    with pytest.raises(ValueError, match="dtype must be one of"):
        looprl.matmul(4, 4, 4, dtype="half")


def test_peak_keys_keep_today_s_text():
    target = Target.named("avx2")
    assert peak_key(target) == peak_key(target, 1, FLOAT32) == peak_key(target, 1, "float32")
    assert peak_key(target, 1, BFLOAT16) == peak_key(target, 1, "bfloat16") == peak_key(target) + "|bfloat16"


def test_kernels_address_and_store_each_tensor_in_its_dtype():
    problem = looprl.matmul(4, 8, 16, dtype=BFLOAT16).with_epilogue(bias=True)
    assert tensor_elements(looprl.initial_nest(problem)) == {"in0": "i16", "in1": "i16", "out": "i16", "acc": "float", "bias": "i16"}
    assert set(tensor_elements(looprl.initial_nest(problem.with_dtype("float32"))).values()) == {"float"}
    workspace = Workspace(problem)
    assert all(array.dtype == np.uint16 for array in (*workspace.inputs, workspace.out, workspace.epilogue["bias"]))
    assert workspace.acc.dtype == np.float32
    assert Workspace(problem.with_dtype(FLOAT32)).inputs[0].dtype == np.float32


def test_storage_and_the_error_bound_follow_the_dtype_s_facts():
    values = np.array([1.0, 1.0 + 2.0**-9, 3.14159], dtype=np.float32)
    assert storage(values, FLOAT32).dtype == np.float32 and np.array_equal(storage(values, "float32"), values)
    assert np.array_equal(from_bfloat16(storage(values, BFLOAT16)), np.array([1.0, 1.0, 3.140625], dtype=np.float32))
    a, b = np.ones((1, 4)), np.ones((4, 1))
    u = 2.0**-24
    assert error_bound("mk,kn->mn", a, b, 4, FLOAT32)[0, 0] == pytest.approx(5 * u / (1 - 5 * u) * 4)  # products round: k + 1 terms
    bf16 = 4 * u / (1 - 4 * u) * 4 * (1 + 2.0**-8) + 2.0**-8 * 4 + 4 * 2.0**-126 * 3  # exact products, one rounding, flushed subnormals
    assert error_bound("mk,kn->mn", a, b, 4, "bfloat16")[0, 0] == pytest.approx(bf16)


def test_a_dtype_made_elsewhere_is_refused():
    for made in (DType("float16", 2, 11, "float32", "nearest-even", np.dtype(np.float16), "half", False),
                 dataclasses.replace(BFLOAT16, dot_pairs=False)):  # a lookalike of a known name too
        with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
            as_dtype(made)
        with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
            looprl.matmul(4, 4, 4, dtype=made)
