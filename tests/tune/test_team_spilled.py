"""Issue 61, item 3: the team of a few-row streaming tile that divides its columns into one share
per thread is also proposed with the output spilled at its reduction block loop
(looprl.search.parallel.spilled_team): a thread's share can fit the code generator's
register-blocked tile where the whole row did not, and unspilled the register blocks would then
each run the whole reduction. Its action path replays it; it computes what numpy does."""

import numpy as np

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.ir.nest import LoopNest
from looprl.ir.schedules import stream_steps
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.parallel import proposed_variants, split_proposals, spilled_team
from tests.backend.test_staged_teams import cores

PROBLEM = looprl.matmul(4, 90, 201)  # no split divides these


def streaming(problem=PROBLEM) -> tuple[LoopNest, tuple[str, ...]]:
    """The (8, 16) streaming tile of ``problem`` and an action path that reaches it."""
    steps = stream_steps(problem, 8, 16)
    actions = ActionSet.covering(["split_8", "split_16", "swap_up", "swap_down"])
    found = actions.path(State(looprl.initial_nest(problem), 0), steps)
    assert found is not None
    return looprl.initial_nest(problem).apply(steps), actions.named(found[0])


def test_the_column_shares_team_of_a_streaming_tile_is_also_proposed_spilled():
    nest, _ = streaming()
    variants = proposed_variants(nest, 2, serial_copy=False)
    spilled = [(marked, steps) for marked, steps, _ in variants if marked.spilled_loop is not None]
    assert spilled, [marked.key for marked, _, _ in variants]
    for marked, steps in spilled:
        parallel = next(i for i, loop in enumerate(marked.compute) if loop.parallel)
        assert parallel < marked.spilled_loop and marked.compute[marked.spilled_loop].var == "k"
        assert str(steps[-1]).startswith("spill(")


def test_no_spilled_team_where_the_tile_stays_in_registers_or_the_problem_has_many_rows():
    shares = LoopNest.from_key(PROBLEM, "n1s48t42p,k25s8t1,n3s16,m4s1,k8s1,n16s1|m4s1p,n90s1")
    assert spilled_team(shares, 0) is not None  # (the same team, few rows: spilled)
    hoisted = LoopNest.from_key(PROBLEM, "n5s16t10p,k25s8t1,m4s1,k8s1,n16s1|m4s1p,n90s1")
    assert spilled_team(hoisted, 0) is None  # no loop over output tiles inside the block loop
    many = looprl.matmul(64, 90, 201)
    shares = LoopNest.from_key(many, "n1s48t42p,k25s8t1,n3s16,m64s1,k8s1,n16s1|m64s1p,n90s1")
    assert spilled_team(shares, 0) is None  # not a few-row problem


def test_the_spilled_team_s_path_replays_it_and_it_computes_what_numpy_does():
    nest, path = streaming()
    record = ScheduleRecord(nest, 50.0, path, "tiles")
    spilled = [v for v in split_proposals(record, 2, None) if v.nest.spilled_loop is not None]
    assert spilled
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 201), dtype=np.float32), rng.standard_normal((201, 90), dtype=np.float32)
    for variant in spilled:
        replayed = reach(ActionSet.covering(variant.actions), State(looprl.initial_nest(PROBLEM), 0), variant.actions).nest
        assert replayed == variant.nest
        with cores(2):
            kernel = looprl.compile(variant.nest, threads=2)
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_the_first_team_proposals_are_measured_whatever_the_budget():
    """4x960x2560 (AVX2 code) came back serial at 97 GFLOPS having timed only its first team
    proposal, where the third (its panels) ran at 135: the team stage measures its first
    looprl.tune.teams.TEAM_MINIMUM proposals even past the budget."""
    from looprl.search.context import SearchContext
    from looprl.search.parallel import parallel_proposals
    from looprl.tune.teams import TEAM_MINIMUM

    nest, path = streaming()
    timed = []

    def evaluator(candidate):
        timed.append(candidate.key)
        return looprl.Measurement(60.0, False)

    context = SearchContext(PROBLEM, ActionSet(), evaluator, max_evaluations=0)  # no measurement left in the budget
    assert parallel_proposals([ScheduleRecord(nest, 50.0, path)], context, 2) == [] and timed == []
    proposals = parallel_proposals([ScheduleRecord(nest, 50.0, path)], context, 2, at_least=TEAM_MINIMUM)
    assert TEAM_MINIMUM == 3 and len(proposals) == len(timed) == 3
    assert any(record.nest.spilled_loop is not None for record in proposals)
