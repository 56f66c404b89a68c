"""The stage step in the IR: its name, its mark on a loop (printed, in the key, through splits,
swaps and merges), the block it copies, and why_not_stage's refusals with their reasons."""

import pytest

import looprl
from looprl.ir.cache_blocks import Blocks, blocked_steps
from looprl.ir.layout import Layout
from looprl.ir.nest import LoopNest
from looprl.ir.nest_layouts import STAGE_MAX_BYTES, stage_buffers
from looprl.ir.step import Step


def blocked_nest():
    """130x1000x700: n/128, k/64, m/4, n/16 tiles inside, B in panels of 16; B changes per call."""
    problem = looprl.matmul(130, 1000, 700)
    return LoopNest.initial(problem).apply(blocked_steps(problem, 4, 16, Blocks(64, None, 128)))


def test_stage_step_names_round_trip():
    step = Step.parse("stage(1, in1)")
    assert step == Step("stage", 1, tensor="in1") and str(step) == "stage(1, in1)" and step.is_layout
    for bad in ("stage(1)", "stage(1, out)", "stage(1, in1, 4)"):
        with pytest.raises(ValueError):
            Step.parse(bad)
    with pytest.raises(ValueError, match="one of in0, in1"):
        Step("stage", 1, tensor="out")


def test_stage_marks_its_loop_in_text_and_key():
    nest = blocked_nest()
    staged = nest.stage(1, "in1")
    assert staged.compute[1].staged == ("in1",) and "stage in1" in str(staged)
    assert "+in1" in staged.key and "+in1" not in nest.key  # keys without stages are unchanged
    assert LoopNest.from_key(staged.problem, staged.key) == staged
    assert staged.staged_at("in1") == 1 and staged.staged_at("in0") is None
    assert staged.stage_block(1, "in1") == (64, 128)  # k block by n block, in kn order
    assert staged.stage_block(0, "in1") == (700, 128)
    with pytest.raises(ValueError, match="two loops"):
        LoopNest.from_key(staged.problem, staged.key.replace("n7s128t104,", "n7s128t104+in1,"))


def test_stage_moves_with_its_loop():
    nest = LoopNest.initial(looprl.matmul(37, 50, 29)).swap(0).swap(1)  # n, k, m
    staged = nest.stage(1, "in1")  # at k: B's k-row by all of n... reused by the m loop inside
    assert staged.split(1, 4).compute[2].staged == ("in1",)  # the inner part reads the same blocks
    assert staged.split(1, 4).compute[1].staged == ()
    assert staged.swap(1).compute[2].staged == ("in1",)
    assert staged.split(1, 4).merge(1).compute[1].staged == ("in1",)


def test_layout_block_keeps_the_inner_pieces():
    layout = Layout.row_major("kn", (700, 1000)).pack("n", 16)
    block = layout.block((64, 100))
    assert block.key == "n16.k1.n1%16" and block.sizes == (64, 100) and block.elements == 7 * 64 * 16
    with pytest.raises(ValueError, match="not a block"):
        layout.block((701, 16))


def test_stage_buffers_lay_each_block_out_as_the_kernel_lays_its_tensor():
    """A stage step's buffer: the tensor's layout in the kernel's layouts (row-major where it has
    none) for the block one iteration of its loop reads, by (loop, tensor)."""
    nest = blocked_nest().stage(1, "in1")
    panels = nest.layout("in1")
    assert stage_buffers(nest, {"in1": panels}) == {(1, "in1"): panels.block((64, 128))}
    assert stage_buffers(nest, {}) == {(1, "in1"): Layout.row_major("kn", (700, 1000)).block((64, 128))}
    assert stage_buffers(blocked_nest(), {"in1": panels}) == {}


def test_why_not_stage_refuses_with_reasons():
    nest = blocked_nest()
    why = nest.why_not_stage
    assert why(1, "in1") is None and why(0, "in1") is None
    assert "only an input" in why(1, "out")
    assert "write-back" in why(len(nest.compute), "in1")
    assert "nothing would reuse" in why(len(nest.compute) - 1, "in1")  # the innermost loop
    assert "out of range" in why(99, "in1")
    assert "staged already" in nest.stage(0, "in1").why_not_stage(1, "in1")
    constant = LoopNest.initial(looprl.matmul(130, 1000, 700, constant="b")).apply(
        blocked_steps(looprl.matmul(130, 1000, 700, constant="b"), 4, 16, Blocks(64, None, 128)))
    assert "constant" in constant.why_not_stage(1, "in1")
    assert nest.parallel(0).why_not_stage(1, "in1") is None  # each thread stages its own blocks
    assert nest.stage(1, "in1").why_not_parallel(0) is None  # and the other way round
    assert nest.stage(1, "in1").why_not_parallel(2) is None  # a parallel loop inside is fine
    big = LoopNest.initial(looprl.matmul(64, 2048, 1024)).split(0, 8).swap(1).swap(2)  # m/8, k, n, m8: all of B, 8 MiB
    assert big.why_not_stage(0, "in1") is not None and str(STAGE_MAX_BYTES) in big.why_not_stage(0, "in1")
    with pytest.raises(ValueError, match="nothing would reuse"):
        nest.stage(len(nest.compute) - 1, "in1")


def test_blocked_steps_stage_the_right_operand_at_a_block_loop():
    problem = looprl.matmul(130, 1000, 700)
    plain = blocked_steps(problem, 4, 16, Blocks(64, 32, 128))
    for at, var in (("k", "k"), ("n", "n")):
        steps = blocked_steps(problem, 4, 16, Blocks(64, 32, 128), stage=at)
        assert steps[:-1] == plain and steps[-1].op == "stage"  # the same schedule, plus the stage
        nest = LoopNest.initial(problem).apply(steps)
        assert nest.compute[steps[-1].loop].var == var and nest.compute[steps[-1].loop].step in (64, 128)
    weight = looprl.matmul(130, 1000, 700, constant="b")
    with pytest.raises(ValueError, match="constant"):
        blocked_steps(weight, 4, 16, Blocks(64, 32, 128), stage="k")
    with pytest.raises(ValueError, match="no k block loop"):
        blocked_steps(problem, 4, 16, Blocks(None, 32, 128), stage="k")
    with pytest.raises(ValueError, match="with pack"):
        blocked_steps(problem, 4, 16, Blocks(64, 32, 128), pack=False, stage="k")
