"""Issue 61, item 2: the team proposer's partition of a one-row kernel whose output loop sits
inside a reduction loop (a weight streamed row by row): one share of the columns per thread,
moved outermost, each thread walking its share in the serial schedule's order."""

import numpy as np
import pytest

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.backend.threads import available_cores
from looprl.search.parallel import hoisted_variant, proposed_variants, shares_variant, split_proposals, teams_per_call
from looprl.ir.step import SPLIT, SWAP, Step
from looprl.measurement.schedule_record import ScheduleRecord

GEMV = looprl.matmul(1, 4864, 896)
# k112s8, n19s256, m1s1, n4s64, k8s1, n64s1: tune's one-thread answer on a Zen 4 (rows of 8 of the
# weight, each streamed across every column).
STEPS = (Step(SPLIT, 2, 256), Step(SPLIT, 3, 64), Step(SPLIT, 1, 8), Step(SWAP, 0), Step(SWAP, 2), Step(SWAP, 1), Step(SWAP, 3))


def streamed():
    return looprl.initial_nest(GEMV).apply(STEPS)


def streamed_record() -> ScheduleRecord:
    """The streamed schedule, with the actions that reach it."""
    actions = ActionSet.covering(["split_256", "split_64", "split_8", "swap_up", "swap_down"])
    path, state = actions.path(State(looprl.initial_nest(GEMV), 0), STEPS)
    assert state.nest == streamed()
    return ScheduleRecord(state.nest, 38.0, actions.named(path), "tiles")


def test_the_serial_schedule_is_the_one_described():
    assert [(loop.var, loop.size, loop.step) for loop in streamed().compute] == [
        ("k", 112, 8), ("n", 19, 256), ("m", 1, 1), ("n", 4, 64), ("k", 8, 1), ("n", 64, 1)]


def test_the_columns_are_shared_out_one_block_per_thread_outermost():
    nest = streamed()
    marked, steps, indices = shares_variant(nest, 2)
    outer = marked.loops[0]
    assert (outer.var, outer.iterations, outer.parallel, indices[0]) == ("n", 2, True, 0) and teams_per_call(marked, 0) == 1
    assert [(loop.var, loop.size, loop.step) for loop in marked.compute[1:3]] == [("k", 112, 8), ("n", 10, 256)]
    assert marked.serial() == nest.serial().apply(steps).parallel(0).serial()  # the split and swaps, then the marks
    assert shares_variant(hoisted_variant(nest, 2)[0], 2) is None  # outermost already: nothing to share out
    assert shares_variant(looprl.initial_nest(looprl.matmul(64, 48, 32)), 2) is None
    record = streamed_record()
    found = [variant for variant in split_proposals(record, 2, None) if variant.nest == marked]
    assert len(found) == 1  # proposed with the others
    assert reach(ActionSet.covering(found[0].actions), State(looprl.initial_nest(GEMV), 0), found[0].actions).nest == marked


@pytest.mark.parametrize("threads", [2, 3])
def test_a_shared_out_team_computes_the_serial_kernel_s_result(threads):
    problem = looprl.matmul(1, 200, 48)
    nest = looprl.initial_nest(problem).swap(0)  # k, m, n: the columns inside the reduction
    nest = nest.split(2, 8)  # k48, m1, n25s8, n8
    marked, _, _ = shares_variant(nest, threads)
    assert marked.loops[0].var == "n" and marked.loops[0].parallel and marked.loops[0].iterations == threads
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in problem.input_shapes)
    expected = looprl.compile(nest)(a, b)
    for count in range(1, min(threads, available_cores()) + 1):
        assert np.array_equal(looprl.compile(marked, threads=count)(a, b), expected)


def test_proposed_variants_name_the_steps_that_reach_them():
    nest = streamed()
    for marked, steps, indices in proposed_variants(nest, 2, serial_copy=True):
        reached = nest.serial().apply(steps)
        for index in indices:
            reached = reached.parallel(index)
        assert reached == marked
