"""What the generator decides for known nests (host-independent: targets are explicit)."""

import looprl
from looprl.backend.codegen import generate_ir
from looprl.backend.register_plan import FMA_CHAINS, holds, plan, register_room
from looprl.ir.schedules import expert_matmul
from looprl.target import TARGET_NAMES, Target

AVX512 = Target.named("avx512")
AVX2 = Target.named("avx2")
SSE4 = Target.named("sse4")


def test_expert_schedule_keeps_a_register_tile_over_the_reduction():
    nest = expert_matmul(looprl.matmul(256, 256, 256), 4, 64)
    decision = plan(nest, AVX512)
    assert [lp.var for lp in nest.compute] == ["n", "m", "k", "m", "n"]
    assert decision.vector_var == "n"
    assert decision.scope_start == 2  # k, m_in, n_in: the 4 x 64 tile stays in registers
    assert decision.tile_registers == 16 and decision.blocks == 1 and decision.block_registers == 16
    assert decision.zero_init  # the whole reduction happens inside the tile: no zeroing pass
    ir = generate_ir(nest, AVX512)
    assert "@llvm.fma.v16f32" in ir
    assert "llvm.memset" not in ir
    assert ir.count("phi <16 x float>") == 16  # one accumulator per register across the k loop


def test_avx2_uses_eight_lanes_and_register_blocks_a_tile_too_large_for_its_file():
    nest = expert_matmul(looprl.matmul(256, 256, 256), 4, 64)
    decision = plan(nest, AVX2)
    # 4 x 8 ymm registers do not fit in 16: the k loop still runs in registers, on blocks
    assert decision.scope_start == 2 and not decision.streaming and decision.zero_init
    assert decision.tile_registers == 32 and decision.blocks == 3
    assert FMA_CHAINS <= decision.block_registers <= 12
    ir = generate_ir(nest, AVX2)
    assert "@llvm.fma.v8f32" in ir and "<16 x float>" not in ir
    assert ir.count("phi <8 x float>") == 32  # every accumulator carried across k, block by block


def test_a_tile_that_just_misses_the_avx2_register_file_keeps_register_blocks():
    """4 x 32 and 6 x 32 tiles (4 ymm per row) do not fit in 16 registers with their inputs:
    they are split into blocks of rows x vectors that do, each with enough accumulators."""
    for rows in (4, 6):
        nest = expert_matmul(looprl.matmul(252, 256, 256), rows, 32)  # 252: no tail of rows
        decision = plan(nest, AVX2)
        assert not decision.streaming
        assert decision.scope_start == 2  # k, m_in, n_in: the reduction runs in registers
        assert decision.zero_init and decision.tile_registers == rows * 4
        assert decision.blocks >= 2 and FMA_CHAINS <= decision.block_registers < AVX2.registers
        ir = generate_ir(nest, AVX2)
        assert "llvm.memset" not in ir
        assert ir.count("phi <8 x float>") == rows * 4


def test_a_tile_that_fits_is_not_blocked():
    nest = expert_matmul(looprl.matmul(256, 256, 256), 4, 24)  # 4 x 3 ymm + 3 + 1 = 16 registers
    decision = plan(nest, AVX2)
    assert decision.scope_start == 2 and decision.blocks == 1 and decision.block_registers == 12


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


def test_too_wide_innermost_loop_is_blocked_over_the_reduction_or_streams():
    nest = looprl.initial_nest(looprl.matmul(8, 1024, 8))  # n = 1024: 64 zmm, over 2 register files
    decision = plan(nest, AVX512)
    assert not decision.streaming and decision.scope_start == 1 and decision.blocks >= 3
    wide = looprl.initial_nest(looprl.matmul(8, 4096, 8))  # 256 zmm: too large to block
    assert plan(wide, AVX512).streaming
    no_reduction_inside = looprl.initial_nest(looprl.matmul(8, 1024, 8)).swap(0)  # k, m, n: nothing to gain
    assert plan(no_reduction_inside, AVX512).streaming


def test_without_fma_the_code_multiplies_then_adds():
    ir = generate_ir(expert_matmul(looprl.matmul(64, 64, 64), 4, 16), SSE4)
    assert "llvm.fma" not in ir
    assert "fmul <4 x float>" in ir and "fadd <4 x float>" in ir


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


def test_the_register_room_answers_as_the_targets_rule_for_every_tile():
    # The planning asks a target's register file once (register_room): every tile, rows wider
    # than the file included, fits exactly where Target.holds says it does.
    for name in TARGET_NAMES:
        target = Target.named(name)
        room = register_room(target)
        for accumulators in range(0, 2 * target.registers + 2):
            for row_vectors in range(1, 2 * target.registers + 2):
                assert holds(room, accumulators, row_vectors) == target.holds(accumulators, row_vectors), (name, accumulators, row_vectors)
