"""The target description at the bottom layer: one register-fit rule, which the code
generator's register planning and the tile choices of schedules both follow."""

import pytest

import looprl
from looprl.backend.register_plan import plan
from looprl.ir.register_tiles import tile_shapes
from looprl.ir.schedules import expert_matmul
from looprl.target import TARGET_NAMES, Target


def test_a_tile_fits_with_its_shared_input_row_and_a_broadcast():
    avx2 = Target.named("avx2")  # 16 registers
    assert avx2.fits(6, 2) and not avx2.fits(7, 2)  # 12 + 2 + 1 = 15; 14 + 2 + 1 = 17
    assert avx2.fits(4, 3) and not avx2.fits(4, 4)  # 12 + 3 + 1 = 16; 16 + 4 + 1 = 21
    assert avx2.fits(1, 14) and not avx2.fits(1, 15)  # one row reuses no input: 14 + 1 + 1
    assert avx2.holds(14) and not avx2.holds(15)  # scalars: the accumulators, two inputs
    assert avx2.holds(5, 3) == (5 + 3 + 1 <= 16) and not avx2.holds(13, 3)
    assert (avx2.most_rows(2), avx2.most_vectors(4), avx2.most_vectors(1)) == (6, 3, 14)
    assert Target.named("avx512").most_rows(2) == 14 and Target.named("avx512").most_rows(40) == 0


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_register_tiles_are_the_largest_that_fit(name):
    target = Target.named(name)
    expected = {"avx512": [(14, 2), (9, 3), (4, 6), (6, 4)], "avx2": [(4, 3), (6, 2), (2, 4)], "sse4": [(4, 3), (6, 2), (2, 4)]}
    assert target.register_tiles() == expected[name]
    for rows, vectors in target.register_tiles():
        assert target.fits(rows, vectors)
        assert not target.fits(rows + 1, vectors) or rows == 4  # the widest 4-row tile


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_the_code_generator_keeps_whole_exactly_the_tiles_that_fit(name):
    target = Target.named(name)
    lanes = target.vector_width
    for rows in range(2, 12):
        for vectors in range(1, 7):
            decision = plan(expert_matmul(looprl.matmul(64, 256, 64), rows, vectors * lanes), target)
            assert (decision.blocks == 1 and decision.zero_init) == target.fits(rows, vectors), (rows, vectors)


def test_a_single_row_tile_is_widened_to_what_fits():
    avx2 = Target.named("avx2")
    assert tile_shapes(looprl.matmul(1, 4096, 256), avx2) == [(1, avx2.most_vectors(1) * 8)]
    assert tile_shapes(looprl.matmul(2, 4096, 256), avx2)[0] == (2, avx2.most_vectors(2) * 8)


def test_inner_functions_refuse_a_target_that_is_not_resolved():
    assert Target.required(Target.named("sse4"), "x") == Target.named("sse4")
    for wrong in (None, "avx2", 16):
        with pytest.raises(ValueError, match="tile_shapes: expected a looprl Target"):
            tile_shapes(looprl.matmul(8, 8, 8), wrong)
