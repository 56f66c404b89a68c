"""Parallel loops in the IR: which loops may be parallel, how splits and swaps treat the mark,
the printed nest and the schedule key."""

import pytest

import looprl
from looprl.ir.nest import LoopNest
from looprl.ir.step import Step


@pytest.fixture
def nest():
    return looprl.initial_nest(looprl.matmul(64, 48, 32))  # m, k, n | m, n


def test_parallel_returns_a_new_nest_and_marks_one_loop(nest):
    marked = nest.parallel(0)
    assert marked is not nest and not nest.is_parallel
    assert marked.is_parallel and marked.parallel_loops == (0,)
    assert marked.compute[0].parallel and not any(lp.parallel for lp in marked.loops[1:])
    assert marked.serial() == nest
    assert nest.serial() is nest


def test_only_output_dimensions_may_be_parallel(nest):
    with pytest.raises(ValueError, match="reduction dimension"):
        nest.parallel(1)  # k
    nest.parallel(2)  # n: an output dimension, even innermost
    nest.parallel(3).parallel(0)  # one loop of each nest


def test_nested_parallel_loops_are_refused(nest):
    marked = nest.parallel(0)
    with pytest.raises(ValueError, match="nested parallel loops are refused"):
        marked.parallel(2)
    with pytest.raises(ValueError, match="parallel already"):
        marked.parallel(0)
    write_back = marked.parallel(4)
    with pytest.raises(ValueError, match="write-back nest is parallel already"):
        write_back.parallel(3)
    assert marked.why_not_parallel(2) is not None and nest.why_not_parallel(2) is None


def test_bad_indices_are_value_errors(nest):
    for index in (-1, 5, "0", 1.0, True):
        with pytest.raises(ValueError):
            nest.parallel(index)


def test_split_keeps_the_mark_on_the_outer_loop(nest):
    split = nest.parallel(0).split(0, 5)
    assert [lp.parallel for lp in split.compute] == [True, False, False, False]
    assert split.compute[0].size == 12 and split.compute[0].tail == 4
    # splitting the inner loop of a parallel loop's dimension leaves the mark where it was
    again = split.split(1, 2)
    assert again.parallel_loops == (0,)


def test_swap_moves_the_mark_with_its_loop(nest):
    marked = nest.parallel(0).swap(0)  # k, m(parallel), n
    assert [lp.var for lp in marked.compute] == ["k", "m", "n"]
    assert marked.parallel_loops == (1,)
    assert marked.swap(1).parallel_loops == (2,)


def test_key_round_trips_and_serial_keys_are_unchanged(nest):
    serial = nest.split(2, 16).split(0, 4).swap(2).swap(1)
    assert serial.key == "m16s4,n3s16,m4s1,k32s1,n16s1|m64s1,n48s1"  # as before parallel loops existed
    marked = serial.parallel(1).parallel(len(serial.compute))
    assert marked.key == "m16s4,n3s16p,m4s1,k32s1,n16s1|m64s1p,n48s1"
    assert LoopNest.from_key(nest.problem, marked.key) == marked
    tailed = nest.split(0, 5).parallel(0)
    assert tailed.key.startswith("m12s5t4p,")
    assert LoopNest.from_key(nest.problem, tailed.key) == tailed


def test_a_dimension_named_p_is_not_a_mark():
    problem = looprl.contraction("pk,kq->pq", p=10, k=6, q=7)
    nest = looprl.initial_nest(problem).parallel(0)
    assert nest.key == "p10s1p,k6s1,q7s1|p10s1,q7s1"
    assert LoopNest.from_key(problem, nest.key) == nest
    assert LoopNest.from_key(problem, "p10s1,k6s1,q7s1|p10s1,q7s1") == looprl.initial_nest(problem)


@pytest.mark.parametrize(
    "key, message",
    [
        ("m64s1p,k32s1,n48s1p|m64s1,n48s1", "2 parallel loops"),
        ("m64s1,k32s1,n48s1|m64s1p,n48s1p", "2 parallel loops"),
        ("m64s1pp,k32s1,n48s1|m64s1,n48s1", "bad loop"),
    ],
)
def test_from_key_refuses_bad_marks(nest, key, message):
    with pytest.raises(ValueError, match=message):
        LoopNest.from_key(nest.problem, key)


def test_a_marked_reduction_loop_in_a_key_is_a_split_k(nest):
    assert LoopNest.from_key(nest.problem, "m64s1,k32s1p,n48s1|m64s1,n48s1") == looprl.initial_nest(nest.problem).ksplit(1)


def test_printed_nest_shows_the_mark(nest):
    text = nest.parallel(2).parallel(3).to_text()
    assert "    parallel for n in 48:" in text
    assert "\nparallel for m in 64:" in text
    assert "parallel" not in nest.to_text()


def test_apply_takes_parallel_steps(nest):
    assert nest.apply([Step("split", 0, 4), Step("parallel", 0)]) == nest.split(0, 4).parallel(0)
