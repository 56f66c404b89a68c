"""The prefetch step (looprl.ir.step's ``prefetch``): written and read back by the one pair,
refused with reasons, carried by its loop through splits, swaps and merges, shown in the printed
nest and the key (a prefetching schedule's key differs from the same schedule's without, and
reads back), the ``prefetch_<bytes>`` action that takes it (never in the env's action set), and
records whose steps keep it."""

import pytest

import looprl
from looprl.actions import ActionSet
from looprl.ir.action import Action, action_steps
from looprl.ir.layers import linear
from looprl.ir.nest import LoopNest
from looprl.ir.nest_layouts import PREFETCH_MAX_BYTES
from looprl.ir.step import LAYOUT_OPS, PREFETCH, Step, parse_steps, steps_text
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target

LAYER = linear(1, 4096, 512, bias=False)  # k = 4096, n = 512
DOT = "n64s8,k256s16,m1s1,n8s1,k16s1|m1s1,n512s1"  # a dot-product tile: loop 1 reads 8 rows x 16 floats an iteration


def dot() -> LoopNest:
    return LoopNest.from_key(LAYER, DOT)


def test_a_prefetch_step_is_written_and_read_back_by_one_pair():
    step = Step(PREFETCH, 1, 1024, "in1")
    assert str(step) == "prefetch(1, in1, 1024)" and Step.parse(str(step)) == step and step.is_layout and PREFETCH in LAYOUT_OPS
    assert parse_steps(steps_text([step])) == (step,)
    for text in ("prefetch(1, in1)", "prefetch(1, 1024)", "prefetch(1, out2, 1024)", "prefetch(1,in1,1024)"):
        with pytest.raises(ValueError, match="step"):
            Step.parse(text)
    with pytest.raises(ValueError, match="one of in0, in1"):
        Step(PREFETCH, 1, 1024, "out")


def test_a_prefetch_marks_its_loop_in_the_printed_nest_and_the_key():
    nest = dot().prefetch(1, "in1", 1024)
    assert nest == dot().apply([Step(PREFETCH, 1, 1024, "in1")])
    assert "for k in 256 step 16 prefetch in1 +1024:" in str(nest)
    assert nest.key == "n64s8,k256s16>in1:1024,m1s1,n8s1,k16s1|m1s1,n512s1" != dot().key
    assert LoopNest.from_key(LAYER, nest.key) == nest and nest.prefetched_at("in1") == 1 and dot().prefetched_at("in1") is None
    assert nest.key != dot().prefetch(1, "in1", 2048).key  # the distance is part of the key
    both = dot().prefetch(1, "in1", 64).prefetch(1, "in0", 512)
    assert LoopNest.from_key(LAYER, both.key) == both


@pytest.mark.parametrize("key, reason", [
    ("n64s8,k256s16>in1:100,m1s1,n8s1,k16s1|m1s1,n512s1", "multiple of 64"),
    ("n64s8,k256s16>in1:0,m1s1,n8s1,k16s1|m1s1,n512s1", "positive multiple"),
    (f"n64s8,k256s16>in1:{PREFETCH_MAX_BYTES + 64},m1s1,n8s1,k16s1|m1s1,n512s1", "up to"),
    ("n64s8,k256s16>in1:64,m1s1,n8s1,k16s1|m1s1>in1:64,n512s1", "only a compute loop"),
    ("n64s8>in1:64,k256s16>in1:64,m1s1,n8s1,k16s1|m1s1,n512s1", "two loops"),
    ("n64s8,k256s16+in1>in1:64,m1s1,n8s1,k16s1|m1s1,n512s1", "one it stages"),
])
def test_a_key_with_a_bad_prefetch_mark_is_refused(key, reason):
    with pytest.raises(ValueError, match=reason):
        LoopNest.from_key(LAYER, key)


def test_a_prefetch_is_refused_with_reasons():
    nest = dot()
    reasons = {
        (1, "out", 1024): "only an input",
        (1, "in1", 0): "positive multiple of 64",
        (1, "in1", 96): "multiple of 64",
        (1, "in1", PREFETCH_MAX_BYTES * 2): "up to",
        (5, "in1", 1024): "write-back loop",
        (4, "in1", 1024): "innermost compute loop",
        (2, "in1", 1024): "not a dimension of in1",  # m: every iteration reads the same block
        (0, "in1", 1024): "more than PREFETCH_MAX_LINES",  # 8 rows x 4096 floats
        (9, "in1", 1024): "out of range",
    }
    for (loop, tensor, ahead), reason in reasons.items():
        assert reason in nest.why_not_prefetch(loop, tensor, ahead)
        with pytest.raises(ValueError, match=reason):
            nest.prefetch(loop, tensor, ahead)
    once = nest.prefetch(1, "in1", 1024)
    assert "prefetched already" in once.why_not(Step(PREFETCH, 3, 512, "in1"))
    assert once.why_not(Step(PREFETCH, 1, 512, "in0")) is None  # the other input may be prefetched too
    staged = LoopNest.from_key(looprl.matmul(64, 256, 512), "n16s16,k512s1,m64s1,n16s1|m64s1,n256s1")  # stage B at n, read by m
    assert "prefetched" in staged.prefetch(1, "in1", 512).why_not(Step("stage", 0, tensor="in1"))
    assert "staged" in staged.stage(0, "in1").why_not(Step(PREFETCH, 1, 512, "in1"))


def test_the_mark_moves_with_its_loop():
    nest = dot().prefetch(1, "in1", 1024)
    split = nest.split(1, 4)  # k 64 x 64 over k 4 x 16: the inner loop reads the same blocks
    assert [lp.prefetched for lp in split.compute[1:3]] == [(), (("in1", 1024),)]
    assert split.merge(1) == nest
    swapped = nest.swap(1)
    assert swapped.compute[2].prefetched == (("in1", 1024),) and swapped.prefetched_at("in1") == 2
    assert nest.serial() == nest and nest.parallel(0).compute[1].prefetched == (("in1", 1024),)


def test_the_prefetch_action_takes_the_step_and_is_only_in_sets_that_name_it():
    action = Action.parse("prefetch_1024")
    assert action == Action(PREFETCH, 1024) and action.name == "prefetch_1024" and action.step(1) == Step(PREFETCH, 1, 1024, "in1")
    assert Action.parse("prefetch") is None and Action.parse("prefetch_0") is None
    with pytest.raises(ValueError, match="factor"):
        Action(PREFETCH)
    target = Target.named("avx512")
    env_set = ActionSet.for_target(target, layouts=True, parallel=True, plans=True)
    assert not any(name.startswith("prefetch") for name in env_set.names)
    extended = env_set.extended(["down", "prefetch_2048"])
    assert extended.names[: len(env_set.names)] == env_set.names and extended.names[-1] == "prefetch_2048"
    assert ActionSet.covering(["prefetch_512", "split_16"]).names[-1] == "prefetch_512"
    steps = action_steps(LAYER, ("plan_dot_1x8", "down", "prefetch_2048"), target)
    assert steps[-1] == Step(PREFETCH, 1, 2048, "in1") and looprl.initial_nest(LAYER).apply(steps) == dot().prefetch(1, "in1", 2048)
    assert action_steps(LAYER, ("plan_dot_1x8", "prefetch_2048"), target) is None  # loop 0's block: too many lines


def test_a_record_keeps_its_prefetch_step():
    target = Target.named("avx512")
    nest = dot().prefetch(1, "in1", 512)
    record = ScheduleRecord(nest, 1.0, ("plan_dot_1x8", "down", "prefetch_512"), "in place", target, 1)
    assert record.steps is not None and record.steps[-1] == Step(PREFETCH, 1, 512, "in1")
    assert looprl.initial_nest(LAYER).apply(parse_steps(steps_text(record.steps))) == nest
