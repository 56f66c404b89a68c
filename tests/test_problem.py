import pytest

import looprl
from looprl.ir.problem import parse_problem


def test_matmul_names_dimensions_explicitly():
    p = looprl.matmul(m=8, n=16, k=4)
    assert p.spec == "mk,kn->mn"
    assert p.dims == ("m", "k", "n")  # first-appearance order
    assert p.input_shapes == ((8, 4), (4, 16))
    assert p.output_shape == (8, 16)
    assert p.reduction_dims == ("k",)
    assert p.flops == 2 * 8 * 16 * 4


def test_contraction_batched_and_multi_index():
    p = looprl.contraction("bmk,bkn->bmn", b=2, m=3, k=4, n=5)
    assert p.dims == ("b", "m", "k", "n")
    assert p.output_shape == (2, 3, 5)
    q = looprl.contraction("abcd,cde->abe", a=2, b=3, c=4, d=5, e=6)
    assert q.reduction_dims == ("c", "d")


def test_problems_are_values():
    assert looprl.matmul(4, 5, 6) == looprl.contraction("mk,kn->mn", m=4, n=5, k=6)
    assert len({looprl.matmul(4, 5, 6), looprl.matmul(4, 5, 6)}) == 1


@pytest.mark.parametrize(
    "spec, sizes, message",
    [
        ("mk,kn", dict(m=2, k=2, n=2), "expected two inputs"),
        ("mk,kn,nj->mj", dict(m=2, k=2, n=2, j=2), "expected two inputs"),
        ("mm,mn->mn", dict(m=2, n=2), "repeats a dimension"),
        ("mk,kn->mz", dict(m=2, k=2, n=2), "appear in no input"),
        ("mk,kn->mn", dict(m=2, k=2), "no size given"),
        ("mk,kn->mn", dict(m=2, k=2, n=0), "must be >= 1"),
        ("mk,kn->mn", dict(m=2, k=2, n=2, q=3), "unknown dimension"),
        ("mk,kn->mn", dict(m=2, k=2.5, n=2), "must be an integer"),
        ("MK,KN->MN", dict(M=2, K=2, N=2), "lower-case"),
        ("mk,kn->", dict(m=2, k=2, n=2), "no dimensions"),
    ],
)
def test_bad_specs_raise_value_error(spec, sizes, message):
    with pytest.raises(ValueError, match=message):
        looprl.contraction(spec, **sizes)


def test_parse_problem():
    assert parse_problem("128x256x64") == looprl.matmul(128, 256, 64)
    p = looprl.contraction("bmk,bkn->bmn", b=2, m=3, k=4, n=5)
    assert parse_problem(p.name) == p
    with pytest.raises(ValueError, match="cannot parse"):
        parse_problem("12x3")
