"""Every cache block offered around a register tile is a schedule the actions can build: its
loop over tiles is split by a count a split step can name (at most MAX_FACTOR). A 32-row LM
head (32000 columns) on AVX2 was offered a 16008-column block of 24-column tiles, a split by
667: tune_module's default path raised "split factor must be an integer in 2..512, got 667"."""

from dataclasses import replace

import pytest

import looprl
from looprl.ir.cache_blocks import Blocks, Caches, block_candidates, blocked_steps, why_not_blocked
from looprl.ir.step import MAX_FACTOR, MIN_FACTOR, SPLIT
from looprl.ir.register_tiles import tile_shapes
from looprl.target import Target

CACHES = (Caches(32 * 1024, 512 * 1024, 32 * 1024 * 1024), Caches(48 * 1024, 1024 * 1024, 32 * 1024 * 1024),
          Caches(32 * 1024, 2 * 1024 * 1024, 0))


def test_a_block_of_more_tiles_than_a_split_can_name_is_refused_with_its_reason():
    head = replace(looprl.matmul(32, 32000, 512), constant=("in1",))
    why = why_not_blocked(head, 4, 24, Blocks(k=128, m=None, n=16008))
    assert why is not None and "667 tiles" in why and str(MAX_FACTOR) in why
    with pytest.raises(ValueError, match="more than a split can name"):
        blocked_steps(head, 4, 24, Blocks(k=128, m=None, n=16008))
    assert why_not_blocked(head, 4, 24, Blocks(k=128, m=None, n=32016)) is None  # not smaller than n: no block loop, no split


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("m, n, k", [(32, 32000, 512), (1, 50257, 768), (16, 49152, 960), (512, 11008, 4096), (96, 4096, 24000)])
def test_every_block_offered_splits_by_counts_an_action_names(isa, m, n, k):
    problem = replace(looprl.matmul(m, n, k), constant=("in1",))
    for rows, columns in tile_shapes(problem, Target.named(isa)):
        for caches in CACHES:
            for blocks in block_candidates(problem, rows, columns, caches):
                factors = [step.arg for step in blocked_steps(problem, rows, columns, blocks) if step.op == SPLIT]
                assert all(MIN_FACTOR <= factor <= MAX_FACTOR for factor in factors), (rows, columns, blocks, factors)
