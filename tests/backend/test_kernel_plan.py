"""The kernel plan (:mod:`looprl.backend.kernel_plan`): made once from the nest and the target,
read-only, and what the compiled kernel reports of itself."""

import pytest

import looprl
from looprl.backend.codegen import generate_ir, kernel_ir
from looprl.backend.kernel_plan import plan_kernel
from looprl.backend.loops import RuntimeRowsUnsupported
from looprl.ir.nest import LoopNest
from looprl.ir.problem import parse_problem
from looprl.target import Target

AVX2 = Target.named("avx2")
PACKED = ("mk,kn->mn:m=64,k=64,n=64", "m2s24t16,m24s1,k1s48t16,k3s16,k16s1,n64s1|m64s1,n64s1|in0=k16.m1.k1%16;in1=k16.n1.k1%16")


def test_a_plan_is_read_only():
    plan = plan_kernel(LoopNest.from_key(parse_problem(PACKED[0]), PACKED[1]), AVX2)
    with pytest.raises(AttributeError):
        plan.packed = ()
    for mapping in (plan.layouts, plan.stages, plan.workspace, plan.elements):
        with pytest.raises(TypeError):
            mapping["in0"] = None


def test_a_plan_says_what_the_kernel_converts_and_where():
    plan = plan_kernel(LoopNest.from_key(parse_problem(PACKED[0]), PACKED[1]), AVX2)
    assert plan.packed == ("in0", "in1") and set(plan.layouts) == {"in0", "in1"} and plan.has_body
    assert plan.workspace["acc"] == (0, 64 * 64) and plan.workspace["in0"][0] == 64 * 64  # the accumulator, then the inputs
    assert plan.workspace_elements == 3 * 64 * 64
    assert plan.extra_entry_points == ("looprl_pack_in0", "looprl_pack_in1", "looprl_kernel_bound_in0",
                                       "looprl_kernel_bound_in1", "looprl_kernel_bound_in0_in1")
    assert not plan.stages and plan.pairing is None and not plan.threaded and plan.rows is None


def test_the_ir_of_a_nest_is_the_ir_of_its_plan():
    nest = looprl.initial_nest(looprl.matmul(37, 53, 29)).split(0, 8).parallel(0)
    plan = plan_kernel(nest, AVX2)
    assert plan.threaded and plan.direct and plan.tensors == ("in0", "in1", "out", "acc")
    assert kernel_ir(plan) == generate_ir(nest, AVX2)


def test_a_stage_the_kernel_carries_out_is_in_the_plan_and_its_buffer_in_the_workspace():
    problem = looprl.matmul(64, 256, 64)
    nest = looprl.initial_nest(problem).split(2, 64)  # m, k, n/64, n64
    staged = nest.swap(1).swap(0).stage(0, "in1")  # n/64 (stage B's 64 x 64 column panel), m, k, n64
    plan = plan_kernel(staged, AVX2)
    assert set(plan.stages) == {"in1"} and plan.packed == () and plan.buffers == ("stage_in1",)
    assert plan.workspace["in1"][1] == 64 * 64 and plan.elements["stage_in1"] == "float"
    with pytest.raises(RuntimeRowsUnsupported, match="stage"):
        plan_kernel(staged, AVX2, runtime_rows=True)


def test_runtime_rows_need_rows_and_the_first_input_as_given():
    with pytest.raises(ValueError, match="runtime rows need the output's leading dimension"):
        plan_kernel(looprl.initial_nest(parse_problem("km,kn->mn:m=8,k=8,n=8")), AVX2, runtime_rows=True)
    nest = LoopNest.from_key(parse_problem(PACKED[0]), PACKED[1])
    with pytest.raises(RuntimeRowsUnsupported, match="first input"):
        plan_kernel(nest, AVX2, runtime_rows=True)
    plan = plan_kernel(looprl.initial_nest(looprl.matmul(8, 16, 8)), AVX2, runtime_rows=True)
    assert plan.rows == "m"


def test_a_kernel_reports_its_plan():
    nest = LoopNest.from_key(parse_problem(PACKED[0]), PACKED[1])
    kernel = looprl.compile(nest)
    plan = kernel.plan
    assert kernel.nest == nest and kernel.problem == plan.problem and kernel.tensors == plan.tensors
    assert kernel.layouts == dict(plan.layouts) and kernel.packed_inputs == plan.packed
    assert kernel.workspace_elements == plan.workspace_elements and not kernel.runtime_rows
