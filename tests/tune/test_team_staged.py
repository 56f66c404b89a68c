"""Issue 61, item 2 ("each thread packing its own panels"): a team whose calling thread would
pack a changing right operand whole on every call, where its parallel loop walks the operand's
panels, is also proposed staging the operand at that loop, so each thread packs the panels it
reads; a team divided over rows, a constant weight and an operand used as stored are not."""

import numpy as np
import pytest

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.backend.threads import available_cores
from looprl.ir.register_tiles import packed_right, tile_steps
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.parallel import proposed_variants, split_proposals, staged_team

PROBLEM = looprl.matmul(40, 70, 50)  # no split divides 70 by the panel width: a tail panel


def panels(problem=PROBLEM):
    """A register tile of 4 rows x 16 columns, columns outermost, the right operand packed."""
    nest = looprl.initial_nest(problem).apply(tile_steps(problem, 4, 16))
    packed = packed_right(nest)
    assert packed is not None and "in1" in dict(packed.layouts)
    return packed


def test_a_team_over_the_panels_is_also_proposed_packing_its_own_panels():
    nest = panels()
    variants = proposed_variants(nest, 2, serial_copy=False)
    staged = [marked for marked, _, _ in variants if any("in1" in loop.staged for loop in marked.compute)]
    assert staged, [marked.key for marked, _, _ in variants]
    for marked in staged:
        parallel = next(loop for loop in marked.compute if loop.parallel)
        assert parallel.staged == ("in1",) and parallel.var == "n"  # staged at the loop the team divides
        assert marked.serial().key != nest.key


def test_no_staged_team_where_the_team_divides_rows_or_the_operand_is_not_packed_per_call():
    nest = panels()
    row_loop = next(i for i, loop in enumerate(nest.compute) if loop.var == "m")
    assert staged_team(nest.serial().parallel(row_loop), row_loop) is None  # every thread reads every panel
    plain = looprl.initial_nest(PROBLEM).apply(tile_steps(PROBLEM, 4, 16))
    column_loop = next(i for i, loop in enumerate(plain.compute) if loop.var == "n")
    assert staged_team(plain.parallel(column_loop), column_loop) is None  # read as stored: nothing packed
    weight = looprl.matmul(40, 70, 50, constant=("b",))
    packed = packed_right(looprl.initial_nest(weight).apply(tile_steps(weight, 4, 16)))
    loop = next(i for i, lp in enumerate(packed.compute) if lp.var == "n")
    assert staged_team(packed.parallel(loop), loop) is None  # converted once, when bound


def test_the_staged_team_s_path_replays_it():
    nest = panels()
    actions = ActionSet.covering(["split_4", "split_16", "swap_up", "swap_down", "pack"])
    path = _path_to(nest, actions)
    assert path is not None
    record = ScheduleRecord(nest, 50.0, path, "tiles")
    staged = [v for v in split_proposals(record, 2, None) if any("in1" in loop.staged for loop in v.nest.compute)]
    assert staged
    for variant in staged:
        replayed = reach(ActionSet.covering(variant.actions), State(looprl.initial_nest(PROBLEM), 0), variant.actions).nest
        assert replayed == variant.nest


def _path_to(nest, actions):
    """The action path of the register tile, then the pack (the tile stage's own way to it)."""
    from looprl.search.tiles import packed_path

    found = actions.path(State(looprl.initial_nest(PROBLEM), 0), tuple(tile_steps(PROBLEM, 4, 16)))
    if found is None:
        return None
    packed = packed_path(PROBLEM, actions.named(found[0]), actions)
    return None if packed is None or packed[1].nest != nest else packed[0]


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
@pytest.mark.parametrize("threads", [2])
def test_a_staged_team_computes_numpy_s_result(threads):
    nest = panels()
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(shape).astype(np.float32) for shape in PROBLEM.input_shapes)
    for marked, _, _ in proposed_variants(nest, threads, serial_copy=True):
        if any("in1" in loop.staged for loop in marked.compute):
            kernel = looprl.compile(marked, threads=threads)
            np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_a_column_strip_schedule_is_also_proposed_with_its_rows_divided_and_the_strip_shared():
    """A strip schedule (the right operand staged at the column block loop) gets, beside the
    team that divides its strips (each thread packing its own), the team that divides the row
    tiles inside each strip: the strip packed once by the calling thread, read by every thread.
    Both rank as one team a call (a staged loop's iterations do not count: each packs a block
    and computes all that reads it), so tune's first team timings reach both. On two threads
    it computes the serial kernel's bits, tails in every dimension (no strip divides 70
    columns nor a tile 40 rows), and replays from its actions."""
    from looprl.ir.cache_blocks import Blocks, blocked_steps
    from looprl.search.parallel import teams_per_call
    from looprl.search.tiles import staged_path

    strips = looprl.initial_nest(PROBLEM).apply(blocked_steps(PROBLEM, 4, 16, Blocks(None, None, 32), stage="n"))
    assert strips.compute[0].staged == ("in1",)
    variants = proposed_variants(strips, 2, serial_copy=False)
    inside = [(marked, indices) for marked, _, indices in variants if marked.compute[indices[0]].var == "m"]
    assert len(inside) == 1 and any(marked.compute[indices[0]].var == "n" for marked, _, indices in variants)
    rows, indices = inside[0]
    assert not rows.compute[0].parallel and rows.compute[0].staged == ("in1",)  # one shared strip buffer
    assert teams_per_call(rows, indices[0]) == 1
    if available_cores() >= 2:
        rng = np.random.default_rng(2)
        a, b = (rng.standard_normal(shape).astype(np.float32) for shape in PROBLEM.input_shapes)
        serial = looprl.compile(strips)(a, b)
        assert np.array_equal(looprl.compile(rows, threads=2)(a, b), serial)
        np.testing.assert_allclose(serial, a @ b, rtol=1e-4, atol=1e-4)
    actions = ActionSet.covering(["split_2", "split_4", "split_16", "swap_up", "swap_down", "pack", "stage"])
    path = staged_path(PROBLEM, 4, 16, Blocks(None, None, 32), actions, "n")
    assert path is not None and path[1].nest == strips
    record = ScheduleRecord(strips, 50.0, path[0], "tiles")
    proposed = [v for v in split_proposals(record, 2, None) if v.nest.key == rows.key]
    assert proposed
    replayed = reach(ActionSet.covering(proposed[0].actions), State(looprl.initial_nest(PROBLEM), 0), proposed[0].actions).nest
    assert replayed == rows
