"""Issue 61, item 2: the split-k step (``ksplit``): a compute loop over a reduction dimension
divided among the threads, each summing into a partial output (looprl.ir.nest_threads). A typed
step that is written and read back, refused with a reason where it does not apply, kept by the
other transforms as ``parallel`` is, in the key and the printed nest, and taken by an action
that only a set extended by a path naming it has (never the env's)."""

import pytest

import looprl
from looprl.actions import ActionSet, State, reach
from looprl.ir.action import action_steps
from looprl.ir.nest import LoopNest
from looprl.ir.step import KSPLIT, PARALLEL, Step, parse_steps
from looprl.measurement.schedule_record import ScheduleRecord

PROBLEM = looprl.matmul(8, 64, 1000)  # loops m, k, n | m, n


def test_a_ksplit_step_is_written_and_read_back():
    step = Step(KSPLIT, 1)
    assert str(step) == "ksplit(1)" and Step.parse("ksplit(1)") == step and parse_steps(["ksplit(1)"]) == (step,)
    for bad in ("ksplit(1, 4)", "ksplit(1, in1)", "ksplit()"):
        with pytest.raises(ValueError, match="step"):
            Step.parse(bad)
    with pytest.raises(ValueError, match="argument"):
        Step(KSPLIT, 1, 4)


def test_only_a_compute_loop_over_a_reduction_takes_it_and_only_ksplit_marks_one():
    nest = looprl.initial_nest(PROBLEM)
    assert nest.why_not_ksplit(1) is None
    assert "output dimension" in nest.why_not_ksplit(0) and "output dimension" in nest.why_not_ksplit(3)  # m; the write-back's m
    assert "ksplit" in nest.why_not_parallel(1)  # parallel refuses the reduction, naming the step that takes it
    marked = nest.ksplit(1)
    assert marked.split_reduction == 1 and marked.is_parallel and nest.split_reduction is None
    assert "parallel already" in marked.why_not_ksplit(1)
    assert "compute nest is parallel already" in marked.why_not_parallel(0)  # one parallel loop per nest, either kind
    assert marked.why_not_parallel(3) is None  # the write-back nest is another nest
    assert "compute nest is parallel already" in nest.parallel(0).why_not_ksplit(1)
    with pytest.raises(ValueError, match=r"cannot make loop 0 .*output dimension"):
        nest.ksplit(0)
    with pytest.raises(ValueError, match="loop index 9 out of range"):
        nest.ksplit(9)
    assert marked.serial() == nest
    assert looprl.initial_nest(looprl.contraction("m,n->mn", m=4, n=5)).why_not_ksplit(1) is not None  # no reduction at all


def test_the_mark_follows_splits_swaps_and_merges_and_reads_back_from_its_key():
    nest = looprl.initial_nest(PROBLEM).split(1, 64).swap(0)  # k15s64 t40, m8, k64, n64
    marked = nest.ksplit(0)
    assert [lp.parallel for lp in marked.compute] == [True, False, False, False]
    assert marked.split(0, 4).compute[0].parallel and not marked.split(0, 4).compute[1].parallel  # the outer part keeps it
    assert marked.swap(0).compute[1].parallel and marked.swap(0).split_reduction == 1
    assert marked.swap(0).swap(0) == marked
    assert marked.swap(0).merge(1).compute[1] == looprl.initial_nest(PROBLEM).ksplit(1).compute[1]  # k15s64, k64 merged again, parallel
    assert marked.key == "k15s64t40p,m8s1,k64s1,n64s1|m8s1,n64s1" and nest.key == marked.key.replace("p", "", 1)
    assert LoopNest.from_key(PROBLEM, marked.key) == marked
    with pytest.raises(ValueError, match="2 parallel loops"):
        LoopNest.from_key(PROBLEM, "k15s64t40p,m8s1p,k64s1,n64s1|m8s1,n64s1")


def test_the_printed_nest_says_the_threads_sum_partials():
    text = looprl.initial_nest(PROBLEM).ksplit(1).to_text()
    assert "parallel for k in 1000" in text and "acc_thread[mn] += in0[mk] * in1[kn]" in text
    assert "acc[mn] = sum of acc_thread[mn] over the threads" in text
    assert "acc_thread" not in looprl.initial_nest(PROBLEM).parallel(0).to_text()


def test_the_ksplit_action_is_only_in_a_set_extended_by_a_path_that_names_it():
    assert "ksplit" not in ActionSet().names and "ksplit" not in ActionSet(parallel=True).names
    names = ("down", "ksplit")
    actions = ActionSet.covering(names)
    assert actions.names[-1] == "ksplit" and actions.extended(["ksplit"]) is actions
    state = reach(actions, State(looprl.initial_nest(PROBLEM), 0), names)
    assert state.nest == looprl.initial_nest(PROBLEM).ksplit(1) and state.cursor == 1
    index = actions.index("ksplit")
    assert "output dimension" in actions.why_not(State(state.nest.serial(), 0), index)
    assert action_steps(PROBLEM, names) == (Step(KSPLIT, 1),)
    assert actions.with_splits([3]).ksplit  # kept by the sets made from it


def test_a_record_of_a_split_k_replays_from_its_steps_and_its_actions():
    nest = looprl.initial_nest(PROBLEM).split(1, 500).swap(0).ksplit(0)
    steps = (Step("split", 1, 500), Step("swap", 0), Step(KSPLIT, 0))
    record = ScheduleRecord(nest, 10.0, None, "parallel", threads=2, steps=steps)
    assert record.steps == steps and looprl.initial_nest(PROBLEM).apply(record.steps) == nest
    actions = ("down", "split_500", "swap_up", "ksplit")
    from_actions = ScheduleRecord(nest, 10.0, actions, "parallel", threads=2)
    assert from_actions.steps == steps
    assert Step(PARALLEL, 0) not in record.steps
