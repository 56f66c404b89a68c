"""Tune's prefetch proposals for few-row problems: the fastest in-place dot-product tile and the
fastest streaming tile each get their weight prefetched at every distance of
``PREFETCH_DISTANCES`` (at most 4 measurements more), measured through the same search context,
as records whose actions replay to their schedule; a problem of many rows gets none."""

import hashlib
import math
from dataclasses import replace

import pytest

import looprl
from looprl.actions import ActionSet
from looprl.ir.action import action_steps
from looprl.ir.layers import linear
from looprl.measurement.evaluator import Measurement
from looprl.search.context import SearchContext
from looprl.search.dots import PREFETCH_DISTANCES, dot_proposals, in_place_actions, prefetch_variants
from looprl.search.tiles import measure_tiles
from looprl.ir.schedules import STREAM_TILES, stream_steps, why_not_stream
from looprl.target import Target

TARGET = Target.named("avx512")


class FakeEvaluator:
    """A deterministic figure per schedule (no kernel is compiled); records what it measured."""

    budget_s = 0.001
    target = TARGET

    def __init__(self):
        self.measured = []

    @staticmethod
    def value(nest) -> float:
        return 1.0 + int(hashlib.sha256(nest.key.encode()).hexdigest()[:6], 16) % 1000 / 100.0

    def __call__(self, nest):
        self.measured.append(nest)
        return Measurement(self.value(nest), from_cache=False)


def prefetching(nests) -> list:
    return [nest for nest in nests if nest.prefetched_at("in1") is not None]


def without_prefetch(nest):
    return replace(nest, compute=tuple(replace(loop, prefetched=()) for loop in nest.compute))


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_a_few_row_layer_s_dot_proposals_include_its_best_prefetched(rows):
    problem = linear(rows, 896, 4864, bias=False)
    evaluator, actions = FakeEvaluator(), in_place_actions(TARGET)
    records = dot_proposals(SearchContext(problem, actions, evaluator, budget_s=math.inf), actions)
    plain = [r for r in records if r.nest.prefetched_at("in1") is None]
    best = max(plain, key=lambda r: r.gflops)
    variants = [r for r in records if r.nest.prefetched_at("in1") is not None]
    assert len(variants) == len(PREFETCH_DISTANCES) == len(prefetching(evaluator.measured))  # 4 measurements more
    assert sorted(r.nest.compute[r.nest.prefetched_at("in1")].prefetched[0][1] for r in variants) == sorted(PREFETCH_DISTANCES)
    for record in variants:
        assert without_prefetch(record.nest) == best.nest  # the fastest plan's
        assert looprl.initial_nest(problem).apply(action_steps(problem, record.actions, TARGET)) == record.nest  # replays
        assert record.steps[-1].op == "prefetch"


def test_a_many_row_layer_gets_no_prefetch_proposal():
    problem = linear(64, 896, 4864, bias=False)
    evaluator, actions = FakeEvaluator(), in_place_actions(TARGET)
    records = dot_proposals(SearchContext(problem, actions, evaluator, budget_s=math.inf), actions)
    assert records and not prefetching(r.nest for r in records) and not prefetching(evaluator.measured)
    assert prefetch_variants(problem, records[0].actions, actions) == []


def test_a_few_row_matmul_s_streaming_tiles_include_the_fastest_prefetched():
    problem = looprl.matmul(1, 4864, 896)
    evaluator = FakeEvaluator()
    measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet())
    found = prefetching(evaluator.measured)
    assert len(found) == len(PREFETCH_DISTANCES)
    streaming = [looprl.initial_nest(problem).apply(stream_steps(problem, k, columns)) for k, columns in STREAM_TILES
                 if why_not_stream(problem, k, columns) is None]
    assert {without_prefetch(nest) for nest in found} == {max(streaming, key=FakeEvaluator.value)}  # the fastest streaming tile's
    many = FakeEvaluator()
    measure_tiles(SearchContext(looprl.matmul(256, 512, 384), ActionSet(), many, budget_s=math.inf), ActionSet())
    assert many.measured and not prefetching(many.measured)


def test_a_few_row_matmul_s_streaming_tiles_are_measured_right_after_the_flat_tiles():
    """Four rows of 4864x896: measured after the flat tiles' cache blocks, the streaming tiles
    came too late in two tunes of four, the budget spent on a block timed at 0.7 GFLOPS, and tune
    returned a register tile at 15 GFLOPS where the streams ran at 38-44 (looprl.search.tiles)."""
    from looprl.ir.register_tiles import tile_of, tile_shapes, tile_steps
    from looprl.search.streams import spilled_stream_steps, spilled_tiles, stream_tiles

    class TwoRowsFastest(FakeEvaluator):
        """Two-row register tiles the fastest: the flat tile refined reads the rows twice, so its
        cache blocks are proposed (as the 2x32 tile's were in those tunes)."""

        def __call__(self, nest):
            self.measured.append(nest)
            tile = tile_of(nest)
            return Measurement(50.0 if tile is not None and tile[0] == 2 else self.value(nest), from_cache=False)

    problem = looprl.matmul(4, 4864, 896)
    evaluator = TwoRowsFastest()
    lead = (2, 32)  # the tile the policy's rollout built in those tunes (AVX2)
    measure_tiles(SearchContext(problem, ActionSet(), evaluator, budget_s=math.inf), ActionSet(), lead=lead)
    start = looprl.initial_nest(problem)
    flats = {start.apply(tile_steps(problem, rows, columns)).key for rows, columns in [lead, *tile_shapes(problem, TARGET)]}
    streams = {start.apply(stream_steps(problem, k, columns)).key for k, columns in stream_tiles(problem)}
    streams |= {start.apply(spilled_stream_steps(problem, k, columns)).key for k, columns in spilled_tiles(problem)}
    order = [nest.key for nest in evaluator.measured]
    assert streams and streams <= set(order)
    last_stream = max(order.index(key) for key in streams)
    others = [key for key in order[:last_stream] if key not in flats | streams]
    assert not others, f"measured before the last streaming tile: {others}"
    assert len(set(order)) > last_stream + 1  # the blocks (and the prefetched streams) come after
