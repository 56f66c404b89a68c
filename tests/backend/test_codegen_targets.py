"""Code for every named target: correct where the host runs it, never wider than its target,
refused before compiling where the host cannot run it."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl import target as target_module
from looprl.backend import codegen, jit, register_plan
from looprl.backend import kernel as kernel_module
from looprl.ir.schedules import expert_candidates, expert_matmul
from looprl.target import TARGET_NAMES, Target
from tests.conftest import examples
from tests.schedules import action_steps, walk
from tests.backend.test_codegen_correctness import PROBLEMS, assert_matches, random_inputs

pytestmark = pytest.mark.target_dependent  # the code generated for each target and the default one

RUNNABLE = [name for name in TARGET_NAMES if not Target.named(name).missing_on_host()]

ZMM = re.compile(r"%zmm\d+")
YMM = re.compile(r"%ymm\d+")
HIGH_REGISTER = re.compile(r"%[xyz]mm(1[6-9]|2\d|3[01])\b")  # registers 16-31 exist only with AVX-512
VECTOR_FMA = re.compile(r"\bvfn?m(add|sub)\w*p[sd]\b")
ANY_FMA = re.compile(r"\bvfn?m(add|sub)")
FMA_CALL = re.compile(r"\bcall[a-z]*\s+\*?fmaf?\b")


def _nests():
    """Schedules that exercise full vectors, masked tails, tail functions, register blocks,
    streaming and scalar code."""
    square = looprl.matmul(256, 256, 256)
    odd = looprl.matmul(67, 100, 250)
    return [
        looprl.initial_nest(square),  # blocked over k
        expert_matmul(square, 4, 32),
        expert_matmul(square, 6, 64),
        expert_matmul(odd, 4, 24, 4),  # tails and masks
        looprl.initial_nest(looprl.matmul(8, 4096, 8)),  # streaming
        looprl.initial_nest(looprl.matmul(64, 64, 64)).swap(1),  # reduction innermost: scalar
        looprl.initial_nest(looprl.contraction("mk,k->m", m=37, k=50)),
    ]


def assert_no_wider_than(assembly: str, target: Target) -> None:
    if target.isa != "avx512":
        assert not ZMM.search(assembly), f"{target.isa} code uses zmm registers"
        assert not HIGH_REGISTER.search(assembly), f"{target.isa} code uses registers 16-31"
    if target.isa == "sse4":
        assert not YMM.search(assembly), "sse4 code uses ymm registers"
        assert not ANY_FMA.search(assembly), "sse4 code uses FMA instructions"
        assert not re.search(r"^\s+v[a-z]", assembly, re.MULTILINE), "sse4 code uses VEX/EVEX instructions"
    assert not FMA_CALL.search(assembly), "the kernel calls fmaf"


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_cross_target_assembly_is_no_wider_than_its_target(name):
    target = Target.named(name)
    for nest in _nests():
        ir = codegen.generate_ir(nest, target)
        assembly = jit.assembly(ir, target)
        assert_no_wider_than(assembly, target)
        if target.fma:
            assert VECTOR_FMA.search(assembly) or "vfmadd231ss" in assembly
        else:
            assert "llvm.fma" not in ir


@pytest.mark.parametrize("name", RUNNABLE)
def test_kernel_target_and_assembly_follow_the_requested_target(name):
    target = Target.named(name)
    kernel = looprl.compile(expert_matmul(looprl.matmul(64, 96, 32), 4, 32), name)
    assert kernel.target == target
    assembly = kernel.assembly()  # the kernel's own target, not the host's
    assert_no_wider_than(assembly, target)
    assert f"<{target.vector_width} x float>" in kernel.ir
    if target.isa == "avx512":
        assert ZMM.search(assembly)
    elif target.isa == "avx2":
        assert YMM.search(assembly)
    a, b = random_inputs(kernel.problem, 0)
    assert_matches(kernel.problem, kernel, a, b)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), name=st.sampled_from(RUNNABLE), seed=st.integers(0, 2**16))
def test_random_schedules_match_numpy_on_every_runnable_target(problem, steps, name, seed):
    nest = walk(problem, steps)
    a, b = random_inputs(problem, seed)
    kernel = looprl.compile(nest, name)
    assert kernel.target == Target.named(name)
    assert_matches(problem, kernel, a, b)


@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("rows, cols", [(4, 32), (6, 32), (4, 24), (6, 64), (3, 40)])
def test_register_blocked_tiles_match_numpy(name, rows, cols):
    """Tiles larger than a register file run block by block: same results."""
    problem = looprl.matmul(37, 150, 45)
    for k_unroll in (None, 4):
        nest = expert_matmul(problem, rows, cols, k_unroll)
        a, b = random_inputs(problem, rows * cols)
        assert_matches(problem, looprl.compile(nest, name), a, b)


def test_named_targets_resolve_from_strings():
    nest = looprl.initial_nest(looprl.matmul(8, 16, 8))
    for name in RUNNABLE:
        assert looprl.compile(nest, name).target == Target.named(name)
        assert looprl.compile(nest, name.upper()).target == Target.named(name)
    host = Target.default()  # the host's, unless LOOPRL_TARGET names another
    assert looprl.compile(nest, "host").target == host
    assert looprl.compile(nest).target == host
    assert looprl.compile(nest, host).target == host


def _pretend_host(monkeypatch, features: str) -> None:
    """The host's CPU reads as ``features`` (the tests pass their targets explicitly)."""
    monkeypatch.setattr(target_module, "host_cpu", lambda: ("x86-64-v3", features))


@pytest.mark.parametrize("name", ["avx512", "host"])
def test_a_target_the_host_cannot_run_is_refused_before_compiling(monkeypatch, name):
    target = Target.named("avx512") if name == "avx512" else Target.host()
    if target.isa != "avx512":
        pytest.skip("the host target is not AVX-512 here")
    _pretend_host(monkeypatch, "+sse4.2,+avx,+avx2,+fma,-avx512f")  # an AVX2-only machine
    monkeypatch.setattr(codegen, "kernel_ir", lambda *args: pytest.fail("compiled for a target the host cannot run"))
    with pytest.raises(ValueError, match="cannot run code for target 'avx512'.*avx512f"):
        looprl.compile(looprl.initial_nest(looprl.matmul(8, 16, 8)), target)


def test_sse_host_refuses_avx2_and_names_the_missing_features(monkeypatch):
    _pretend_host(monkeypatch, "+sse4.2,-avx,-avx2,-fma,-avx512f")
    monkeypatch.setattr(codegen, "kernel_ir", lambda *args: pytest.fail("compiled for a target the host cannot run"))
    with pytest.raises(ValueError, match="avx2, fma"):
        looprl.compile(looprl.initial_nest(looprl.matmul(8, 16, 8)), "avx2")


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_register_tiles_fit_the_register_file(name):
    target = Target.named(name)
    tiles = target.register_tiles()
    assert tiles
    for rows, vectors in tiles:
        assert rows * vectors + vectors + 1 <= target.registers and target.fits(rows, vectors)
        assert not target.fits(rows + 1, vectors) or vectors == target.most_vectors(4)
        assert rows * vectors >= register_plan.FMA_CHAINS
    problem = looprl.matmul(256, 256, 256)
    candidates = expert_candidates(problem, target)
    assert candidates
    for nest in candidates:
        n_tile = nest.compute[-1].budget
        assert n_tile % target.vector_width == 0 and n_tile // target.vector_width <= max(v for _, v in tiles)
        decision = register_plan.plan(nest, target)
        assert decision.blocks == 1 and decision.zero_init  # expert tiles fit their target whole


def test_expert_candidates_need_a_target():
    problem = looprl.matmul(64, 64, 64)
    with pytest.raises(ValueError, match="expert_candidates: expected a looprl Target, got int 16"):
        expert_candidates(problem, 16)
    with pytest.raises(ValueError, match="expected a looprl Target"):
        expert_candidates(problem, "avx2")


def test_codegen_has_no_isa_constants():
    """Lanes, registers and FMA come from the Target only."""
    import inspect

    from looprl.bench import codegen as bench_codegen
    from looprl.ir import schedules
    from looprl.measurement import peak

    for module in (codegen, schedules, peak, bench_codegen, kernel_module, jit):
        source = inspect.getsource(module)
        assert not re.search(r"Target\(\s*\d", source), module.__name__
        assert not re.search(r"(vector_width|registers|lanes)\s*(==|=|<=|>=)\s*(4|8|16|32)\b", source), module.__name__
        assert not re.search(r"\"(avx512f|avx2)\" in", source), module.__name__


@pytest.mark.parametrize("name", RUNNABLE)
def test_results_are_bit_identical_whether_blocked_or_not(monkeypatch, name):
    """Register blocking changes which outputs are accumulated when, never the order of one
    output's accumulation: the results equal those of the unblocked code bit for bit."""
    target = Target.named(name)
    problem = looprl.matmul(32, 5 * target.vector_width + 3, 48)
    nest = expert_matmul(problem, 6, 5 * target.vector_width)
    assert register_plan.plan(nest, target).blocks > 1
    a, b = random_inputs(problem, 9)
    blocked = looprl.compile(nest, target)(a, b)
    monkeypatch.setattr(register_plan, "BLOCKED_TILE_FLOATS", 0)  # no blocking: k runs outside the register scope
    assert register_plan.plan(nest, target).blocks == 1 and not register_plan.plan(nest, target).zero_init
    np.testing.assert_array_equal(looprl.compile(nest, target)(a, b), blocked)


@pytest.mark.parametrize("name", ["avx512", "avx2"])
def test_a_tile_of_four_rows_across_a_wide_row_is_register_blocked_on_avx2_as_on_avx512(name):
    """m/4, k, m4, n with n = 139 (72 AVX2 vectors): the reduction runs with accumulators in
    registers on both (the bound counts floats and vectors of tile, not register files: AVX2
    used to stream this tile through memory)."""
    target = Target.named(name)
    nest = looprl.initial_nest(looprl.matmul(67, 139, 229)).split(0, 4).swap(1)
    plan = register_plan.plan(nest, target)
    assert plan.blocks > 1 and not plan.streaming
    assert plan.scope_start == 1  # the scope reaches out to k
