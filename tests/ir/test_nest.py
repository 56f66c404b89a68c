import numpy as np
import pytest

import looprl
from looprl.ir.nest import COMPUTE, WRITE_BACK
from looprl.ir.step import Step


def test_initial_nest_is_first_appearance_order_plus_write_back():
    nest = looprl.initial_nest(looprl.matmul(64, 48, 32))
    assert [(lp.var, lp.size, lp.step, lp.tail, lp.nest) for lp in nest.loops] == [
        ("m", 64, 1, 0, COMPUTE),
        ("k", 32, 1, 0, COMPUTE),
        ("n", 48, 1, 0, COMPUTE),
        ("m", 64, 1, 0, WRITE_BACK),
        ("n", 48, 1, 0, WRITE_BACK),
    ]


def test_split_outer_floor_plus_tail_inner_factor():
    nest = looprl.initial_nest(looprl.matmul(67, 16, 16)).split(0, 16)
    outer, inner = nest.loops[0], nest.loops[1]
    assert (outer.size, outer.step, outer.tail) == (4, 16, 3)
    assert (inner.size, inner.step, inner.tail) == (16, 1, 0)
    # splitting the inner loop again keeps the coverage of its parent's step
    again = nest.split(1, 5)
    assert [(lp.size, lp.step, lp.tail) for lp in again.loops[:3]] == [(4, 16, 3), (3, 5, 1), (5, 1, 0)]
    # splitting the outer loop: tails accumulate in elements
    outer_split = nest.split(0, 3)
    assert [(lp.size, lp.step, lp.tail) for lp in outer_split.loops[:3]] == [(1, 48, 19), (3, 16, 0), (16, 1, 0)]
    assert outer_split.loops[0].budget == 67


def test_transforms_return_new_values():
    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    split = nest.split(0, 2)
    assert len(nest) == 5 and len(split) == 6
    assert split == nest.split(0, 2) and hash(split) == hash(nest.split(0, 2))
    assert split != nest
    swapped = nest.swap(0)
    assert [lp.var for lp in swapped.compute] == ["k", "m", "n"]
    assert swapped.swap(0) == nest


def test_swap_refusals():
    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    with pytest.raises(ValueError, match="innermost loop of the compute nest"):
        nest.swap(2)  # would cross into the write-back nest
    with pytest.raises(ValueError, match="innermost loop of the write_back nest"):
        nest.swap(4)
    with pytest.raises(ValueError, match="both walk 'm'"):
        nest.split(0, 2).swap(0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda n: n.split(0, 1), ">= 2"),
        (lambda n: n.split(0, 9), "exceeds its size"),
        (lambda n: n.split(7, 2), "out of range"),
        (lambda n: n.split(-1, 2), "out of range"),
        (lambda n: n.split(0, 2.0), "must be an integer"),
        (lambda n: n.swap("0"), "must be an integer"),
        (lambda n: n.apply([Step("fuse", 0)]), "unknown transform"),
    ],
)
def test_invalid_arguments_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(looprl.initial_nest(looprl.matmul(8, 8, 8)))


def test_text_is_readable_pseudo_code():
    text = looprl.initial_nest(looprl.matmul(67, 16, 8)).split(0, 16).to_text(cursor=1)
    assert "for m in 4 step 16 tail 3:" in text
    assert "for m in 16:  <-" in text
    assert "acc[mn] += in0[mk] * in1[kn]" in text
    assert "out[mn] = acc[mn]" in text


def test_key_distinguishes_schedules():
    base = looprl.initial_nest(looprl.matmul(16, 16, 16))
    keys = {base.key, base.swap(0).key, base.split(0, 4).key, base.split(0, 8).key, base.split(3, 4).key}
    assert len(keys) == 5


def test_numpy_integers_are_accepted_as_indices_and_factors():

    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    split = nest.split(np.int64(1), np.int32(4))
    assert split == nest.split(1, 4) and split.key == nest.split(1, 4).key
    assert all(type(value) is int for lp in split.loops for value in (lp.size, lp.step, lp.tail))
    assert nest.split(np.array(1), np.array(4)) == split  # 0-d integer arrays too
    assert nest.split(np.uint8(1), np.uint64(4)) == split
    assert nest.swap(np.int64(0)) == nest.swap(0)
    assert nest.swap(np.array(0)) == nest.swap(0)
    assert nest.apply([Step("split", np.int64(1), np.int16(4)), Step("swap", np.int8(0))]) == nest.apply([Step("split", 1, 4), Step("swap", 0)])
    with pytest.raises(ValueError, match="out of range"):
        nest.swap(np.int64(-1))


@pytest.mark.parametrize("bad", [True, False, np.True_, 4.0, np.float32(4), np.array([4]), np.array(4.0), None, "4"])
def test_bools_floats_and_arrays_are_refused(bad):
    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    with pytest.raises(ValueError, match="split factor must be an integer"):
        nest.split(0, bad)
    with pytest.raises(ValueError, match="loop index must be an integer"):
        nest.split(bad, 4)
    with pytest.raises(ValueError, match="loop index must be an integer"):
        nest.swap(bad)
