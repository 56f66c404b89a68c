"""A schedule is its problem and a list of steps (issue 59, item 1): layout steps, the one writer
and parser of step names, action paths as steps, and records that replay without an action set."""

import json
from pathlib import Path

import numpy as np
import pytest

import looprl
import looprl.ir.register_tiles
from looprl import MeasurementCache, parse_problem
from looprl.actions import ActionSet, State, follow
from looprl.ir.action import action_steps
from looprl.ir.nest import initial_nest
from looprl.ir.plans import Plan, plan_catalogue, plan_nest, plan_steps
from looprl.ir.step import ALL_OPS, PACK, PAD, PAIR, SPLIT, Step, parse_steps
from looprl.measurement.keys import measurement_key
from looprl.measurement.schedule_record import ScheduleRecord, checked_entry
from looprl.measurement.tuned_records import read_tuned_records
from looprl.target import Target

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "records_a56e7ac.json"
MATMUL = looprl.matmul(64, 48, 80)
BF16_WEIGHT = parse_problem("mk,kn->mn:m=64,k=512,n=256;const=in1;epilogue=bias;dtype=bfloat16")


@pytest.mark.parametrize("step", [Step(SPLIT, 3, 16), Step("swap", 0), Step("merge", 2), Step("parallel", 1), Step(PACK, 4, 16, "in1"),
                                  Step(PAD, 1, 16, "out"), Step(PAIR, 3, tensor="in1"), Step("innermost", 2, tensor="in0")])
def test_a_step_is_written_and_read_back_by_one_pair(step):
    assert Step.parse(str(step)) == step
    assert parse_steps([str(step)]) == (step,)


@pytest.mark.parametrize("text", ["split(3)", "split(3, in1, 16)", "pack(4, 16)", "pack(4, in2, 16)", "pair(3, in0)", "swap(1, 2)",
                                  "turn(1)", "split(3,16)", "split(-1, 4)", "", "pad(1, out, x)"])
def test_a_bad_step_name_is_a_value_error_naming_it(text):
    with pytest.raises(ValueError, match="step"):
        Step.parse(text)


def test_only_layout_ops_name_a_tensor_and_only_some_take_an_argument():
    with pytest.raises(ValueError, match="not a tensor"):
        Step(SPLIT, 0, 4, "in1")
    with pytest.raises(ValueError, match="one of in1"):
        Step(PAIR, 0, tensor="in0")
    with pytest.raises(ValueError, match="takes an argument"):
        Step(PAIR, 0, 2, "in1")
    assert set(ALL_OPS) >= {SPLIT, PACK, PAD, PAIR}


def test_layout_steps_change_the_nest_as_its_layout_methods_do():
    nest = initial_nest(MATMUL).apply([Step(SPLIT, 2, 16)])  # m, k, n/16, n16
    packed = nest.apply([Step(PACK, 3, 16, "in1")])
    assert packed == nest.layout_pack("in1", "n", 16)
    assert nest.why_not(Step(PACK, 3, 16, "in0")) is not None  # in0 (mk) has no n
    assert nest.why_not(Step(PACK, 5, 16, "in1")) is not None  # a write-back loop
    padded = nest.apply([Step(PAD, 1, 32, "in0")])  # k (80) is in0's inner dimension
    assert padded == nest.layout_pad("in0", 1, 32)
    assert "outermost" in nest.why_not(Step(PAD, 0, 16, "in0"))
    assert nest.why_not(Step(PAIR, 1, tensor="in1")) is not None  # float32 takes no pairs
    bf16 = initial_nest(BF16_WEIGHT)
    paired = bf16.apply([Step(PAIR, 1, tensor="in1")])
    assert paired.layout("in1").is_paired("k") and paired.layout("in1").unpaired() == bf16.layout("in1")
    assert paired.why_not(Step(PAIR, 1, tensor="in1")) is not None  # paired already


def test_a_plan_is_its_steps():
    target = Target.named("avx2")
    for plan in plan_catalogue(target):
        steps = plan_steps(MATMUL, target, plan)
        if isinstance(steps, str):
            continue
        assert initial_nest(MATMUL).apply(steps) == plan_nest(MATMUL, target, plan)
        assert (steps[-1].op == PACK) == plan.packed
        assert Plan.parse(plan.name) == plan


@pytest.mark.parametrize("seed", range(6))
def test_an_action_path_is_its_steps(seed):
    """Random valid paths (every kind of action, plans and layouts included) take the steps
    action_steps names: the steps reach the state the action set reaches."""
    rng = np.random.default_rng(seed)
    target = Target.named("avx2")
    problem = (MATMUL, BF16_WEIGHT)[seed % 2]
    actions = ActionSet.for_target(target, layouts=True, parallel=True, plans=True)
    state, names = State(initial_nest(problem), 0), []
    for _ in range(30):
        valid = np.flatnonzero(actions.mask(state))
        action = int(rng.choice(valid))
        state = actions.apply(state, action)
        names.append(actions.names[action])
    steps = action_steps(problem, tuple(names), target)
    assert steps is not None and initial_nest(problem).apply(steps) == state.nest, names


def test_a_path_that_does_not_replay_has_no_steps():
    target = Target.named("avx2")
    assert action_steps(MATMUL, ("up",), target) is None  # past the first loop
    assert action_steps(MATMUL, ("plan_6x2",), None) is None  # a plan needs its target
    assert action_steps(MATMUL, ("jump",), target) is None


def test_a_record_given_as_actions_holds_their_steps():
    nest = initial_nest(MATMUL).split(2, 8)
    record = ScheduleRecord(nest, 12.5, ("down", "down", "split_8"))
    assert record.steps == (Step(SPLIT, 2, 8),)
    assert ScheduleRecord(nest, 12.5, ("down", "split_8")).steps is None  # does not reach its schedule
    assert ScheduleRecord(nest, 12.5).steps is None
    with pytest.raises(ValueError, match="tuple of Step"):
        ScheduleRecord(nest, 12.5, steps=["split(2, 8)"])


def test_a_stored_records_steps_are_checked_and_kept():
    entry = {"host": "h", "problem": "mm", "tuner": "t", "schedule": "s", "gflops": 1.0, "budget_s": 0.1, "actions": None,
             "replays_on": None, "found_by": "tiles"}
    assert "steps" not in checked_entry(entry, "e")
    assert checked_entry({**entry, "steps": ["split(2, 8)"]}, "e")["steps"] == ["split(2, 8)"]
    with pytest.raises(ValueError, match="'steps'"):
        checked_entry({**entry, "steps": ["split(2)"]}, "e")


def test_records_written_at_a56e7ac_replay_from_their_steps_without_an_action_set():
    document = json.loads(FIXTURE.read_text(encoding="utf-8"))
    upgraded = 0
    for entry, check in zip(read_tuned_records(FIXTURE), document["replay"]["records"]):
        target = Target.named(check["target"]) if isinstance(check["target"], str) else Target.from_dict(check["target"])
        entry = dict(entry, host=measurement_key(target, check["timing_budget_s"], check["threads"]))
        with MeasurementCache(":memory:") as cache:
            cache.import_tuned([entry])
            record = cache.get_tuned(parse_problem(check["problem"]), target, check["timing_budget_s"], tuner=check["tuner"],
                                     threads=check["threads"])
        if record.actions is not None and record.replays_on is None:
            assert record.steps is not None, check["case"]
        if record.steps is not None:
            upgraded += 1
            assert initial_nest(record.problem).apply(record.steps) == record.nest, check["case"]
    assert upgraded >= 10


def test_a_bfloat16_weights_record_carries_its_pair_step_and_reads_back_with_it():
    """A record of before pair steps (its schedule paired by the code generator then) is
    upgraded: its schedule and steps gain the pair step, so its kernel stays the paired one, and
    it goes through a cache and back with its steps."""
    from looprl.backend.layout_plan import layouts_applied
    from looprl.backend.pairs import kernel_pairing, pair_step, pairing

    target = Target.named("avx2")
    nest = initial_nest(BF16_WEIGHT).apply(looprl.ir.register_tiles.tile_steps(BF16_WEIGHT, 4, 16))
    pair = pair_step(nest, target)
    assert pair is not None and pair.op == PAIR
    paired = nest.apply((pair,))
    assert pairing(nest, target) is None  # the code generator reads the schedule: no pair step, no pairs
    assert pairing(paired, target) is not None and kernel_pairing(paired, target)[0]["in1"] == paired.layout("in1")
    assert kernel_pairing(nest, target) == (layouts_applied(nest), None)
    assert paired.without_pairs("in1") == nest and nest.without_pairs("in1") is nest  # the rule reads the nest before its pair step
    names = ActionSet.for_target(target).path(State(initial_nest(BF16_WEIGHT), 0), looprl.ir.register_tiles.tile_steps(BF16_WEIGHT, 4, 16))
    assert names is not None
    actions = tuple(ActionSet.for_target(target).names[a] for a in names[0])
    record = ScheduleRecord(nest, 10.0, actions, "tiles", target)
    assert record.nest == paired and record.steps[-1] == pair
    assert initial_nest(BF16_WEIGHT).apply(record.steps) == record.nest
    with MeasurementCache(":memory:") as cache:
        cache.put_tuned(record)
        back = cache.get_tuned(BF16_WEIGHT, target)
    assert back.nest == paired and back.steps == record.steps
    assert ScheduleRecord(nest, 10.0, actions, "tiles").nest == nest  # no target, no pairs to read


def test_a_layout_start_is_the_untuned_nest_and_its_innermost_steps():
    from looprl.ir.schedules import column_last_layout, layout_start_steps, layout_starts

    problem = parse_problem("bmk,bnk->bmn:b=2,m=8,k=16,n=32")
    steps = layout_start_steps(problem)
    assert [str(step) for step in steps] == ["innermost(3, in1)"]
    root, relaid = layout_starts(problem)
    assert relaid == root.apply(steps) and relaid.layout("in1") == column_last_layout(problem, "in1")
    assert layout_start_steps(MATMUL) == () and layout_starts(MATMUL) == [initial_nest(MATMUL)]


def test_an_action_set_writes_a_path_as_names():
    actions = ActionSet((4, 8))
    assert actions.named([0, 1, actions.index("split_8")]) == ("up", "down", "split_8")
    with pytest.raises(ValueError, match="action"):
        actions.named([len(actions)])


def test_a_pair_step_the_kernel_cannot_take_leaves_a_correct_kernel():
    """Pairs are a layout the schedule carries: where the kernel cannot take the reduction in
    pairs (the reduction innermost: no register tile along an output dimension), the paired weight is
    a layout like any other, and the kernel computes the same product."""
    from looprl.backend.pairs import pairing
    from looprl.ir.dtypes import error_bound, from_bfloat16, to_bfloat16
    from looprl.measurement.pair_steps import with_pairs

    problem = parse_problem("mk,kn->mn:m=6,k=10,n=12;const=in1;dtype=bfloat16")
    target = Target.host()
    unpaired = initial_nest(problem).apply([Step("swap", 1)])  # m, n, k
    nest = unpaired.apply([Step(PAIR, 2, tensor="in1")])
    assert pairing(unpaired, target) is None and pairing(nest, target) is None
    assert pairing(with_pairs(initial_nest(problem), target), target) is not None  # the untiled nest's kernel (n innermost) can pair
    rng = np.random.default_rng(3)
    a, b = (to_bfloat16(rng.uniform(-1, 1, size=shape)) for shape in problem.input_shapes)
    out = looprl.compile(nest, target=target)(a, b)
    exact = np.einsum(problem.spec, from_bfloat16(a).astype(np.float64), from_bfloat16(b).astype(np.float64))
    bound = error_bound(problem.spec, from_bfloat16(a), from_bfloat16(b), problem.size("k"), problem.dtype)
    assert (np.abs(from_bfloat16(out).astype(np.float64) - exact) <= bound).all()
