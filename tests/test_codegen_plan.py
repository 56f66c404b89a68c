"""What the generator decides for known nests (host-independent: targets are explicit)."""

import looprl
from looprl.backend.codegen import generate_ir, plan
from looprl.backend.target import Target
from looprl.ir.schedules import expert_matmul

AVX512 = Target(16, 32)
AVX2 = Target(8, 16)


def test_expert_schedule_keeps_a_register_tile_over_the_reduction():
    nest = expert_matmul(looprl.matmul(256, 256, 256), 4, 64)
    decision = plan(nest, AVX512)
    assert [lp.var for lp in nest.compute] == ["n", "m", "k", "m", "n"]
    assert decision.vector_var == "n"
    assert decision.scope_start == 2  # k, m_in, n_in: the 4 x 64 tile stays in registers
    assert decision.tile_registers == 16
    assert decision.zero_init  # the whole reduction happens inside the tile: no zeroing pass
    ir = generate_ir(nest, AVX512)
    assert "@llvm.fma.v16f32" in ir
    assert "llvm.memset" not in ir
    assert ir.count("phi <16 x float>") == 16  # one accumulator per register across the k loop


def test_avx2_uses_eight_lanes_and_a_smaller_tile():
    nest = expert_matmul(looprl.matmul(256, 256, 256), 4, 64)
    decision = plan(nest, AVX2)
    assert decision.scope_start == 4  # 4 x 8 ymm registers do not fit in 16: only n_in
    assert "@llvm.fma.v8f32" in generate_ir(nest, AVX2)


def test_reduction_innermost_is_scalar():
    nest = looprl.initial_nest(looprl.matmul(64, 64, 64)).swap(1)  # m, n, k
    decision = plan(nest, AVX512)
    assert decision.vector_var is None
    assert "@llvm.fma.f32" in generate_ir(nest, AVX512)


def test_reduction_outside_the_tile_needs_zeroing():
    nest = looprl.initial_nest(looprl.matmul(64, 64, 64)).swap(0)  # k, m, n: 64 x 4 vectors do not fit
    decision = plan(nest, AVX512)
    assert decision.scope_start == 2 and not decision.zero_init
    assert "llvm.memset" in generate_ir(nest, AVX512)


def test_too_wide_innermost_loop_streams():
    nest = looprl.initial_nest(looprl.matmul(8, 1024, 8))  # n = 1024: 64 vectors
    decision = plan(nest, AVX512)
    assert decision.streaming


def test_vector_lengths_and_masks_follow_the_innermost_loop():
    ir20 = generate_ir(looprl.initial_nest(looprl.matmul(8, 20, 8)), AVX512)
    assert "@llvm.masked.store.v16f32" in ir20  # 20 = 16 + a 16-lane vector with 4 lanes on
    assert "<16 x i1> <i1 true, i1 true, i1 true, i1 true, i1 false" in ir20
    ir8 = generate_ir(looprl.initial_nest(looprl.matmul(8, 8, 8)), AVX512)
    assert "@llvm.fma.v8f32" in ir8 and "@llvm.masked" not in ir8  # short loop: short vectors
    ir7 = generate_ir(looprl.initial_nest(looprl.matmul(8, 7, 8)), AVX512)
    assert "@llvm.masked.load.v8f32" in ir7


def test_tails_become_shared_functions():
    nest = looprl.initial_nest(looprl.matmul(67, 64, 16)).split(0, 16)
    ir = generate_ir(nest, AVX512)
    assert ir.count("define internal void @tail") == 1
