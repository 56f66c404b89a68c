"""Issue 61, item 2: split-k teams in tune (looprl.search.ksplit). Where a problem's output is
too small to share out among the threads (fewer than MANY of the target's largest register tiles
a thread) and its reduction long enough (MIN_SHARE terms a thread), tune's team stage proposes
its best serial schedules with the reduction divided among the threads; the winner rule decides
by measurement as for every team (a team slower than one thread is never returned). Every timer
here is scripted: no wall-clock time is asserted."""

import numpy as np
import pytest

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.backend.threads import available_cores
from looprl.ir.step import KSPLIT, SPLIT, SWAP, Step
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.measurement.timing import Timing
from looprl.search.ksplit import (
    MIN_SHARE, ksplit_records, ksplit_split_proposals, ksplit_variant, shares_out, splits_reduction, tile_elements,
)
from looprl.search.parallel import MANY
from looprl.target import Target
from tests.policies import random_policy

needs_two = pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
AVX512, AVX2 = Target.named("avx512"), Target.named("avx2")
SUBJECT = looprl.matmul(8, 64, 2048)  # 512 outputs, 2048 terms each
SERIAL_GFLOPS = 50.0


def test_the_rule_is_the_output_per_thread_against_the_target_s_register_tiles():
    assert tile_elements(AVX512) == 14 * 2 * 16 and tile_elements(AVX2) == 6 * 2 * 8  # the largest tiles: 14x2 and 6x2 vectors
    assert MANY == 4 and MIN_SHARE == 256
    for target in (AVX512, AVX2):
        assert not shares_out(SUBJECT, target, 2) and splits_reduction(SUBJECT, target, 2)
        assert not splits_reduction(SUBJECT, target, 1)  # one thread: nothing to split
        assert not splits_reduction(looprl.matmul(8, 64, 511), target, 2)  # under 256 terms a thread
        assert splits_reduction(looprl.matmul(8, 64, 512), target, 2)
        assert shares_out(looprl.matmul(64, 3072, 768), target, 2)  # a large output: its teams divide it
    # 16x128 on two threads: 1024 outputs a thread, below 4 AVX-512 tiles (1792), above 4 AVX2 ones (384)
    assert splits_reduction(looprl.matmul(16, 128, 16384), AVX512, 2) and not splits_reduction(looprl.matmul(16, 128, 16384), AVX2, 2)
    assert not splits_reduction(looprl.contraction("m,n->mn", m=2, n=3), AVX2, 2)  # no reduction


def test_the_variant_marks_an_outermost_reduction_loop_or_shares_one_out():
    nest = looprl.initial_nest(SUBJECT)  # m8, k2048, n64
    marked, steps = ksplit_variant(nest, 2)
    assert steps == (Step(SPLIT, 1, 512), Step(SWAP, 0), Step(KSPLIT, 0))  # 1024 a share is past 512: shares of 512
    assert [(lp.var, lp.size, lp.step, lp.parallel) for lp in marked.compute] == [("k", 4, 512, True), ("m", 8, 1, False),
                                                                                     ("k", 512, 1, False), ("n", 64, 1, False)]
    assert nest.apply(steps) == marked and not any(lp.parallel for lp in marked.write_back)
    outer = nest.split(1, 256).swap(0)  # k8s256 outermost already
    assert ksplit_variant(outer, 2) == (outer.ksplit(0), (Step(KSPLIT, 0),))
    assert ksplit_variant(outer.parallel(1), 2)[0] == outer.ksplit(0)  # a team is made serial first
    small = looprl.initial_nest(looprl.matmul(8, 64, 600))
    assert ksplit_variant(small, 3)[1][0] == Step(SPLIT, 1, 200)  # one share a thread
    assert ksplit_variant(looprl.initial_nest(looprl.contraction("m,n->mn", m=2, n=3)), 2) is None


def test_a_proposal_replays_from_its_actions_and_its_steps_and_computes_the_product():
    actions = ("down", "split_64", "swap_up")  # k32s64, m8, k64, n64
    nest = reach(ActionSet.covering(actions), State(looprl.initial_nest(SUBJECT), 0), actions).nest
    record = ScheduleRecord(nest, SERIAL_GFLOPS, actions, "tiles", AVX2, 1)
    (team,) = ksplit_records([record, record], 2, AVX2)  # duplicates skipped
    assert team.nest == nest.ksplit(0) and team.threads == 2 and team.found_by == "parallel"
    assert team.actions == actions + ("ksplit",) and np.isnan(team.gflops)  # the cursor is on the k-blocks' loop already
    assert reach(ActionSet.covering(team.actions), State(looprl.initial_nest(SUBJECT), 0), team.actions).nest == team.nest
    assert looprl.initial_nest(SUBJECT).apply(team.steps) == team.nest
    (split,) = ksplit_split_proposals(record, 2, AVX2)
    assert split.nest == team.nest and split.found_by == "tiles" and ksplit_split_proposals(record, 1, AVX2) == []
    assert ksplit_records([ScheduleRecord(looprl.initial_nest(looprl.matmul(64, 3072, 768)), 1.0, ())], 2, AVX2) == []
    kernel = looprl.compile(team.nest, threads=min(2, available_cores()))
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in SUBJECT.input_shapes)
    np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b.astype(np.float64), atol=1e-3)


class ScriptedTimer:
    """Stands in for the evaluator's kernel timer: serial kernels at :data:`SERIAL_GFLOPS`,
    split-k teams at ``ksplit`` GFLOPS, other teams at ``others``."""

    def __init__(self, ksplit: float, others: float):
        self.ksplit, self.others = ksplit, others
        self.timed: list[str] = []

    def __call__(self, kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        nest = kernel.nest
        self.timed.append("serial" if threads == 1 else "ksplit" if nest.split_reduction is not None else "team")
        gflops = SERIAL_GFLOPS if threads == 1 else self.ksplit if nest.split_reduction is not None else self.others
        return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)


def tuned(monkeypatch, timer: ScriptedTimer, measure: bool):
    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    return looprl.tune(SUBJECT, random_policy(seed=1), measure=measure, cache=":memory:", budget_s=0.3, measure_budget_s=0.002, threads=2,
                       remember=False)


@needs_two
@pytest.mark.parametrize("measure", [True, False], ids=["measured", "fast path"])
def test_a_split_k_team_that_wins_its_duel_is_returned_and_replays(monkeypatch, measure):
    timer = ScriptedTimer(ksplit=1.9 * SERIAL_GFLOPS, others=0.6 * SERIAL_GFLOPS)
    result = tuned(monkeypatch, timer, measure)
    assert result.nest.split_reduction is not None and result.kernel.threads == 2
    assert result.gflops == pytest.approx(1.9 * SERIAL_GFLOPS) and result.serial_gflops == pytest.approx(SERIAL_GFLOPS)
    teams = [kind for kind in timer.timed if kind != "serial"]
    assert teams[0] == "ksplit"  # proposed before the teams that divide the output
    assert result.replayed() == result.nest and looprl.initial_nest(SUBJECT).apply(result.record.steps) == result.nest
    rng = np.random.default_rng(1)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in SUBJECT.input_shapes)
    np.testing.assert_allclose(result(a, b), a.astype(np.float64) @ b.astype(np.float64), atol=1e-3)


@needs_two
@pytest.mark.parametrize("measure", [True, False], ids=["measured", "fast path"])
def test_a_split_k_team_slower_than_one_thread_is_never_returned(monkeypatch, measure):
    timer = ScriptedTimer(ksplit=0.8 * SERIAL_GFLOPS, others=0.5 * SERIAL_GFLOPS)
    result = tuned(monkeypatch, timer, measure)
    assert not result.nest.is_parallel and result.gflops == result.serial_gflops == SERIAL_GFLOPS
    assert "ksplit" in timer.timed  # proposed and measured, then refused
