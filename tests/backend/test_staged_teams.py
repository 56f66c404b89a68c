"""Issue 61, item 2: teams whose threads stage their own panels. A stage at or inside the compute
nest's parallel loop is private (``kernel_plan.Stage.private``): each thread of the team copies
the blocks its own iterations read into its own buffer in the workspace and reads only that
one; a stage outside the parallel loop is copied by the calling thread before each team starts,
its threads only reading it.

Checked, on 1, 2 and 3 threads and on sizes no split divides: random schedules with a stage and
a parallel loop in either order compute what their serial twin computes (the comparison rule of
``test_parallel_codegen.agreement``: bit for bit where both sum in one order) and what numpy
computes, with inputs, output and workspace flush against guard pages; the plan's placement of
each thread's buffers; the legality rules that remain (no parallel reduction loop); and tune's
team proposal of a staged serial answer, which replays and is correct."""

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.backend.threads import available_cores
from looprl.ir.cache_blocks import Blocks, blocked_steps
from looprl.ir.schedules import cache_blocks
from looprl.ir.step import Step
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.parallel import split_proposals
from looprl.search.tiles import staged_path
from looprl.target import TARGET_NAMES, Target
from tests.backend.test_bfloat16 import assert_within_bound, bf16_inputs
from tests.backend.test_codegen_correctness import random_inputs, reference
from tests.backend.test_parallel_codegen import agreement, regions
from tests.conftest import examples
from tests.guarded import GuardedArray
from tests.schedules import action_steps, pack_every_tiled_loop, walk

pytestmark = pytest.mark.target_dependent  # parallel kernels on the default target's vectors

PROBLEMS = [
    looprl.matmul(37, 50, 29),  # no split divides these
    looprl.matmul(67, 100, 50),
    looprl.contraction("bmk,bkn->bmn", b=3, m=17, k=9, n=35),
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19),  # A @ B.T (dot products)
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]
TEAMS = (1, 2, 3)
SMALL = looprl.matmul(130, 300, 150)  # blocks of 64, 32, 128 leave a tail in every one
TENSORS = ("in0", "in1")


@contextmanager
def cores(count: int):
    """Kernels compiled inside get workspace for ``count`` threads' stage buffers (as on a host
    of ``count`` cores), so that teams larger than this host's run within their buffers."""
    with mock.patch("looprl.backend.kernel.available_cores", return_value=count):
        yield


def legal(nest, op: str, **kwargs) -> list[int]:
    return [i for i in range(len(nest.compute)) if nest.why_not(Step(op, i, **kwargs)) is None]


def staged_team(nest, tensor: str, stage_pick: int, parallel_pick: int, stage_first: bool, private: bool):
    """``nest`` with ``tensor`` staged at a legal loop and a legal compute loop made parallel
    (``stage_first``: the stage is placed first), each the ``pick``-th legal one (modulo their
    count); with ``private``, the parallel loop is taken at or outside the stage where one may
    be. None where no loop takes the stage."""
    def stage(n):
        places = legal(n, "stage", tensor=tensor)
        return n.stage(places[stage_pick % len(places)], tensor) if places else None

    def parallel(n):
        places = legal(n, "parallel")
        at = n.staged_at(tensor)
        if private and at is not None and any(i <= at for i in places):
            places = [i for i in places if i <= at]
        return n.parallel(places[parallel_pick % len(places)]) if places else n

    if stage_first:
        nest = stage(nest)
        return None if nest is None else parallel(nest)
    return stage(parallel(nest))


def guarded_run(kernel, a, b, team: int, side: str) -> np.ndarray:
    """``kernel`` on ``team`` threads (the core count unchecked), its inputs, output and a
    workspace of exactly :attr:`workspace_elements` flush against guard pages on ``side``."""
    problem = kernel.problem
    storage = problem.dtype.storage
    shapes = ((problem.input_shapes[0], storage), (problem.input_shapes[1], storage), (problem.output_shape, storage),
              ((kernel.workspace_elements,), np.float32))
    guards = [GuardedArray(shape, side, dtype) for shape, dtype in shapes]
    try:
        ga, gb, out, work = (g.array for g in guards)
        ga[...], gb[...] = a, b
        out[...] = 0
        kernel.raw_call((ga.ctypes.data, gb.ctypes.data, out.ctypes.data, work.ctypes.data), 2, team)
        return out.copy()
    finally:
        for g in guards:
            g.release()


def assert_private_where_inside_the_team(nest, plan):
    """Every stage the plan carries out is private exactly where the parallel loop is at or
    outside it, and the private buffers sit after every shared one, thread_stride apart."""
    parallel = next((i for i, lp in enumerate(nest.compute) if lp.parallel), None)
    for stage in plan.stages.values():
        assert stage.private == (parallel is not None and parallel <= stage.level)
    private = [t for t, stage in plan.stages.items() if stage.private]
    shared_end = max(offset + count for t, (offset, count) in plan.workspace.items() if t not in private)
    assert all(plan.workspace[t][0] >= shared_end for t in private)
    assert plan.thread_stride >= sum(plan.workspace[t][1] for t in private)
    assert (plan.thread_stride == 0) == (not private)


@settings(max_examples=examples(35), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(("split", "split", "swap_down", "swap_up"), max_size=10),
       pack=st.booleans(), tensor=st.sampled_from(TENSORS), stage_pick=st.integers(0, 20), parallel_pick=st.integers(0, 20),
       stage_first=st.booleans(), private=st.integers(0, 3).map(bool), seed=st.integers(0, 2**16),
       target=st.sampled_from(HOST_TARGETS), side=st.sampled_from(["start", "end"]))
@example(problem=PROBLEMS[1], steps=[(2, "split_16"), (1, "split_7"), (0, "split_8"), (1, "swap_down"), (0, "swap_down")],
         pack=True, tensor="in1", stage_pick=0, parallel_pick=0, stage_first=True, private=True, seed=1,
         target=Target.default(), side="end")
def test_random_staged_teams_match_their_serial_twin_and_numpy_within_bounds(problem, steps, pack, tensor, stage_pick,
                                                                             parallel_pick, stage_first, private, seed, target, side):
    nest = walk(problem, steps)
    nest = pack_every_tiled_loop(nest, seed) if pack else nest
    nest = staged_team(nest, tensor, stage_pick, parallel_pick, stage_first, private)
    if nest is None:
        return
    with cores(max(TEAMS)):
        kernel = looprl.compile(nest, target=target)
    assert_private_where_inside_the_team(nest, kernel.plan)
    assert not (tensor in kernel.plan.stages and tensor in kernel.packed_inputs)
    a, b = random_inputs(problem, seed)
    expected = looprl.compile(nest.serial(), target=target)(a, b)
    np.testing.assert_allclose(expected, reference(problem, a, b), rtol=1e-4, atol=1e-4)
    same = agreement(nest, target, a, b)
    teams = TEAMS if regions(nest) <= 8 else (1, min(2, available_cores()))  # oversubscribed teams form slowly
    for team in teams:
        assert same(guarded_run(kernel, a, b, team, side), expected), team


def blocked_team(problem, stage_at: str, parallel_at: str, blocks: Blocks = Blocks(64, 32, 128)):
    """The BLIS-ordered blocked schedule of ``problem`` (4x16 tiles, ``blocks``, by default k 64,
    m 32, n 128: loops n-block, k-block, m-block, ...), B packed in panels, staged at the
    ``stage_at`` block loop, the ``parallel_at`` block loop parallel."""
    nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 4, 16, blocks))
    first = {var: next(i for i, lp in enumerate(nest.compute) if lp.var == var) for var in "nkm"}
    return nest.stage(first[stage_at], "in1").parallel(first[parallel_at])


@pytest.mark.parametrize("stage_at", ["k", "n"])
@pytest.mark.parametrize("side", ["start", "end"])
def test_each_thread_of_an_n_panel_team_stages_its_own_panels(stage_at, side):
    """``for n-panel (parallel): for k-block (stage B): for m-block: tile`` and the panel staged
    at the parallel loop itself, on 130x1000x700 (a tail in every block): 8 panels (7 and a
    tail), one B block per thread, bit-identical to the serial kernel on teams of 1 to 3, within
    the buffers."""
    problem = looprl.matmul(130, 1000, 700)
    nest = blocked_team(problem, stage_at, "n")
    with cores(3):
        kernel = looprl.compile(nest)
    plan = kernel.plan
    stage = plan.stages["in1"]
    assert stage.private and kernel.packed_inputs == () and plan.stage_team == 8
    block_floats = (64 if stage_at == "k" else 700) * 128
    assert plan.workspace["in1"][1] == block_floats and plan.thread_stride == block_floats
    extra = [plan.workspace_for(t) - plan.workspace_elements for t in (1, 2, 3, 8, 9)]
    assert extra == [0, block_floats, 2 * block_floats, 7 * block_floats, 7 * block_floats]  # a team never outnumbers 8 panels
    assert kernel.workspace_elements == plan.workspace_for(3)
    a, b = random_inputs(problem, 3)
    expected = looprl.compile(nest.serial())(a, b)
    np.testing.assert_allclose(expected, reference(problem, a, b), rtol=1e-4, atol=1e-3)
    for team in TEAMS:
        assert np.array_equal(guarded_run(kernel, a, b, team, side), expected), team


def test_a_stage_outside_the_team_is_one_buffer_the_threads_only_read():
    """B staged at the k-block loop, the m-block loop inside it parallel: the calling thread
    copies each block before the team that reads it starts; one buffer, no private copies."""
    problem = looprl.matmul(130, 1000, 700)
    nest = blocked_team(problem, "k", "m")
    kernel = looprl.compile(nest)
    assert not kernel.plan.stages["in1"].private and kernel.plan.thread_stride == 0
    assert kernel.workspace_elements == looprl.compile(nest.serial()).workspace_elements
    a, b = random_inputs(problem, 4)
    expected = looprl.compile(nest.serial())(a, b)
    for team in TEAMS:
        assert np.array_equal(guarded_run(kernel, a, b, team, "end"), expected), team


def test_the_iteration_count_of_the_parallel_loop_bounds_the_copies():
    """37x200x29 blocked so that the parallel loop has 2 iterations: a team never outnumbers them,
    so the workspace holds 2 copies whatever the cores."""
    problem = looprl.matmul(37, 200, 29)
    nest = blocked_team(problem, "k", "n", Blocks(8, 8, 128))
    assert [(lp.var, lp.iterations) for lp in nest.compute][:3] == [("n", 2), ("k", 4), ("m", 5)]
    with cores(16):
        kernel = looprl.compile(nest)
    assert kernel.plan.stage_team == 2 and kernel.workspace_elements == kernel.plan.workspace_for(2)
    a, b = random_inputs(problem, 5)
    expected = looprl.compile(nest.serial())(a, b)
    for team in (1, 2, 5):
        assert np.array_equal(guarded_run(kernel, a, b, team, "end"), expected), team


def test_a_call_on_more_threads_than_the_workspace_holds_runs_on_fewer():
    """A raw call skips the core check: a kernel whose workspace holds 2 threads' buffers, called
    on 5, runs on 2 (the workspace exactly its size, flush against a guard page)."""
    problem = SMALL
    nest = blocked_team(problem, "k", "n")
    with cores(2):
        kernel = looprl.compile(nest)
    assert kernel.workspace_elements == kernel.plan.workspace_for(2) < kernel.plan.workspace_for(5)
    a, b = random_inputs(problem, 6)
    assert np.array_equal(guarded_run(kernel, a, b, 5, "end"), looprl.compile(nest.serial())(a, b))


@pytest.mark.parametrize("team", [2, 3])
def test_bfloat16_threads_stage_their_own_panels(team):
    """bfloat16 blocks (half the floats of workspace per element): each thread's buffer lies
    thread_stride floats after the previous one's; bit-identical to the serial kernel."""
    problem = SMALL.with_dtype("bfloat16")
    nest = blocked_team(problem, "k", "n")
    with cores(3):
        kernel = looprl.compile(nest)
    plan = kernel.plan
    assert plan.stages["in1"].private and plan.elements["stage_in1"] == "i16"
    assert plan.private_strides == {"stage_in1": 2 * plan.thread_stride}
    a, b = bf16_inputs(problem, 7)
    out = guarded_run(kernel, a, b, team, "end")
    assert np.array_equal(out, looprl.compile(nest.serial())(a, b))
    assert_within_bound(problem, out, a, b)


def test_what_stays_refused():
    """A stage is no reason to refuse a parallel loop, in either order; a reduction loop is still
    never parallel, nor a second loop of the compute nest."""
    problem = looprl.matmul(130, 1000, 700)
    nest = looprl.initial_nest(problem).apply(blocked_steps(problem, 4, 16, Blocks(64, 32, 128)))
    staged = nest.stage(1, "in1")  # the k-block loop
    assert staged.why_not_parallel(0) is None and staged.why_not_parallel(2) is None  # outside and inside it
    assert nest.parallel(0).why_not_stage(1, "in1") is None and nest.parallel(2).why_not_stage(1, "in1") is None
    assert "reduction" in staged.why_not_parallel(1)
    assert "parallel already" in staged.parallel(0).why_not_parallel(2)
    team = staged.parallel(0)  # n-block parallel, k-block staged: the key says both and reads back
    assert looprl.LoopNest.from_key(problem, team.key) == team


def test_a_staged_serial_answer_gets_a_team_proposal_that_replays_and_is_correct():
    """Tune's staged tile (B packed in panels block by block at the k-block loop) as a serial
    answer: the team proposal for 2 threads makes its outermost loop, the n-block around the
    stage, parallel (each thread staging its own panels); the proposal's actions replay it from
    the untuned nest and its kernel on 2 threads computes what the serial answer does."""
    target = Target.default()
    problem = looprl.matmul(130, 1000, 700)
    actions = ActionSet.for_target(target)
    names, state = staged_path(problem, 4, 16, cache_blocks(problem, 4, 16)[0], actions)
    record = ScheduleRecord(state.nest, 50.0, names, "tiles", target, 1)
    stage_level = state.nest.staged_at("in1")
    proposals = split_proposals(record, 2, target)
    outermost = [p for p in proposals if p.nest.compute[0].parallel]  # with and without a parallel write-back
    assert outermost and stage_level > 0 and all(p.threads == 2 for p in outermost)
    for proposal in outermost:
        replayed = reach(ActionSet.covering(proposal.actions), State(looprl.initial_nest(problem), 0), proposal.actions)
        assert replayed.nest == proposal.nest
    team = outermost[0]
    with cores(2):
        kernel = looprl.compile(team.nest, target=target)
    assert kernel.plan.stages["in1"].private
    a, b = random_inputs(problem, 8)
    expected = looprl.compile(state.nest, target=target)(a, b)
    np.testing.assert_allclose(expected, reference(problem, a, b), rtol=1e-4, atol=1e-3)
    assert np.array_equal(guarded_run(kernel, a, b, 2, "end"), expected)
