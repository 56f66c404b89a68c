import numpy as np
import pytest

import looprl
from looprl.ir.problem import as_problem, parse_problem, parse_problems
from looprl.ir.rewrites import fused_view


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
        ("mk,kn->mn", dict(m=2, k=2, n=0), "size of 'n' must be a positive integer, got 0"),
        ("mk,kn->mn", dict(m=2, k=2, n=2, q=3), "unknown dimension"),
        ("mk,kn->mn", dict(m=2, k=2.5, n=2), "size of 'k' must be a positive integer, got 2.5"),
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


# -- sizes: memory limit and i64 overflow, checked exactly at construction ---------------------


def test_problems_over_the_memory_limit_are_refused_at_construction():
    from looprl import defaults

    with pytest.raises(
        ValueError,
        match=r"m=65536, k=65536, n=65536 is too large.*need 68719476736 bytes \(64 GiB\).*MAX_BUFFER_BYTES = 8589934592 \(8 GiB\)",
    ):
        looprl.matmul(65536, 65536, 65536)  # 4 x 16 GiB of float32 buffers
    with pytest.raises(ValueError, match="MAX_BUFFER_BYTES"):
        parse_problem("100000x100000x100000")
    with pytest.raises(ValueError, match="MAX_BUFFER_BYTES"):
        looprl.contraction("bmk,bkn->bmn", b=1024, m=1024, k=2048, n=8)  # the first input alone is 8 GiB
    assert defaults.MAX_BUFFER_BYTES == 8 * 2**30
    looprl.matmul(2**14, 2**15, 2**14)  # 4 x (2**28 + 3 x 2**29) bytes = 7 GiB
    # a Problem built directly is checked too
    with pytest.raises(ValueError, match="MAX_BUFFER_BYTES"):
        looprl.Problem("mk,kn->mn", (("m", 65536), ("k", 65536), ("n", 65536)))


def test_limit_is_read_at_construction(monkeypatch):
    from looprl import defaults

    # the limit counts both inputs, the output and the accumulator, all float32
    monkeypatch.setattr(defaults, "MAX_BUFFER_BYTES", 1024)
    looprl.matmul(8, 8, 8)  # 4 bytes x (64 + 64 + 64 + 64): exactly the limit
    with pytest.raises(ValueError, match=r"need 1088 bytes \(1.062 KiB\), more than looprl.defaults.MAX_BUFFER_BYTES = 1024 \(1 KiB\)"):
        looprl.matmul(8, 8, 9)  # 4 bytes x (72 + 72 + 64 + 64)
    with pytest.raises(ValueError, match="MAX_BUFFER_BYTES"):
        looprl.contraction("mk,k->m", m=128, k=1)  # 4 bytes x (128 + 1 + 128 + 128)


def test_index_and_flop_overflow_name_the_sizes(monkeypatch):
    from looprl import defaults

    monkeypatch.setattr(defaults, "MAX_BUFFER_BYTES", 2**200)  # only the i64 checks remain
    with pytest.raises(ValueError, match=r"m=4294967296, k=1, n=4294967296: the output 'mn' has 18446744073709551616 elements"):
        looprl.matmul(2**32, 2**32, 1)
    with pytest.raises(ValueError, match=r"m=2, k=4611686018427387904, n=1: the first input 'mk'.*64-bit"):
        looprl.matmul(2, 1, 2**62)
    # the flop count bounds every tensor's size: just below the boundary passes, at it fails
    assert looprl.contraction("m,n->mn", m=2**31, n=2**31 - 1).flops == 2**63 - 2**32
    with pytest.raises(ValueError, match=r"m=2147483648, n=2147483648: its flop count 2 x 4611686018427387904"):
        looprl.contraction("m,n->mn", m=2**31, n=2**31)
    with pytest.raises(ValueError, match=r"m=2097152, k=2097152, n=2097152: its flop count .* overflows a signed 64-bit"):
        looprl.matmul(2**21, 2**21, 2**21)  # tensors of 2**42 elements, 2**64 flops
    # exact, not wrapped: 2**64 + 2 is refused although it is 2 modulo 2**64
    with pytest.raises(ValueError, match="64-bit"):
        looprl.contraction("m,n->mn", m=2**64 + 2, n=1)


# -- integer sizes: numpy ints as Python ints; no floats, bools or None ------------------------


def test_numpy_integer_sizes_are_stored_as_python_ints():
    p = looprl.matmul(np.int64(8), np.int32(8), np.uint16(8))
    assert p == looprl.matmul(8, 8, 8) and hash(p) == hash(looprl.matmul(8, 8, 8))
    assert all(type(size) is int for _, size in p.sizes)
    assert p.name == "mk,kn->mn:m=8,k=8,n=8"
    q = looprl.contraction("bmk,bkn->bmn", {"b": np.array(2)}, m=np.int8(3), k=4, n=5)
    assert all(type(size) is int for _, size in q.sizes) and q == looprl.contraction("bmk,bkn->bmn", b=2, m=3, k=4, n=5)
    # a Problem built directly is canonical too: Python ints, first-appearance order
    r = looprl.Problem("mk,kn->mn", (("n", np.int64(8)), ("m", 8), ("k", 8)))
    assert r == looprl.matmul(8, 8, 8) and r.sizes == (("m", 8), ("k", 8), ("n", 8))


@pytest.mark.parametrize("bad", [None, 8.0, 8.5, np.float64(8.0), "8", True, np.True_, np.array([8]), np.array(8.0)])
def test_non_integer_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="size of 'm' must be a positive integer"):
        looprl.matmul(bad, 1, 1)


# -- spec and text syntax: junk is an error, never part of a Problem ---------------------------


@pytest.mark.parametrize("spec", ["mk,kn->mn\n", "mk,kn->mn\r\n", "\nmk,kn->mn", "mk,kn\n->mn", "mk,kn->mn\t", "mk,kn->mn;", "mk,kn->mñ"])
def test_specs_with_junk_are_refused(spec):
    with pytest.raises(ValueError, match="unsupported contraction spec"):
        looprl.contraction(spec, m=2, k=2, n=2)
    with pytest.raises(ValueError, match="unsupported contraction spec"):
        looprl.Problem(spec, (("m", 2), ("k", 2), ("n", 2)))


def test_spaces_in_specs_are_ignored():
    assert looprl.contraction(" mk, kn -> mn ", m=2, k=3, n=4) == looprl.matmul(2, 4, 3)


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "expected a problem string"),
        (128, "expected a problem string"),
        ("", "cannot parse"),
        ("8x8x8x8", "cannot parse"),
        ("8x8x", "cannot parse"),
        ("8x8x8 junk", "cannot parse"),
        ("8x-8x8", "cannot parse"),
        ("8.0x8x8", "cannot parse"),
        ("²x1x1", "cannot parse"),
        ("mk,kn->mn:m=1,k=1,n=1,", "bad size ''"),
        ("mk,kn->mn:m=1,,k=1,n=1", "bad size ''"),
        ("mk,kn->mn:m=1,k=1,n=1.5", "bad size"),
        ("mk,kn->mn:m=1,k=1,n=²", "bad size"),
        ("mk,kn->mn:m=1,k=1,n", "bad size"),
        ("mk,kn->mn:m=1,m=2,k=1,n=1", "'m' given twice"),
        ("mk,kn->mn:m=1,k=1,n=0", "size of 'n' must be a positive integer"),
        ("mk,kn->mn:m=1,k=1,n=1,q=1", "unknown dimension"),
        ("mk,kn->mn\n:m=1,k=1,n=1", "unsupported contraction spec"),
    ],
)
def test_parse_problem_refuses_bad_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse_problem(text)


def test_parse_problem_tolerates_surrounding_whitespace():
    assert parse_problem(" 8 x 16X4\n") == looprl.matmul(8, 16, 4)
    assert parse_problem("mk,kn->mn: m = 8, k = 4, n = 16\n") == looprl.matmul(8, 16, 4)


@pytest.mark.parametrize("item", [None, 12, 12.0, ("mk,kn->mn",), b"8x8x8"])
def test_as_problem_refuses_other_types(item):
    with pytest.raises(ValueError, match="expected a Problem or a problem string"):
        as_problem(item)


def test_contraction_argument_errors():
    with pytest.raises(ValueError, match="spec must be a string"):
        looprl.contraction(None, m=1)
    with pytest.raises(ValueError, match="sizes must be a mapping"):
        looprl.contraction("mk,kn->mn", [("m", 1)])
    with pytest.raises(ValueError, match="given both"):
        looprl.contraction("mk,kn->mn", {"m": 1, "k": 1, "n": 1}, m=2)
    with pytest.raises(ValueError, match="give a dimension twice"):
        looprl.Problem("mk,kn->mn", (("m", 1), ("m", 2), ("k", 1), ("n", 1)))
    with pytest.raises(ValueError, match=r"unknown dimension\(s\) \['q', 1\]"):
        looprl.contraction("mk,kn->mn", {1: 2, "q": 3}, m=1, k=1, n=1)
    with pytest.raises(ValueError, match="dimension names must be letters"):
        looprl.Problem("mk,kn->mn", ((["m"], 1), ("k", 1), ("n", 1)))
    with pytest.raises(ValueError, match=r"sizes must be \(dimension, size\) pairs"):
        looprl.Problem("mk,kn->mn", 8)


def test_parse_problems_takes_matmul_lists_and_names_with_commas():
    transposed = "mk,nk->mn:m=128,n=96,k=64"
    found = parse_problems(["64x48x80,16x16x16", transposed, "8x8x8"])
    assert [p.name for p in found] == [parse_problem(t).name for t in ("64x48x80", "16x16x16", transposed, "8x8x8")]
    assert found[2].operands == ("mk", "nk")
    assert parse_problems(f"64x48x80 {transposed}") == [parse_problem("64x48x80"), parse_problem(transposed)]


@pytest.mark.parametrize(("items", "message"), [
    ("", "no problems given"),
    ([" , "], "no problems given"),
    (["64x48"], "cannot parse problem '64x48'"),
    ([None], "expected problem strings, got NoneType"),
    (7, "expected problem strings, got int"),
])
def test_parse_problems_refuses_bad_input(items, message):
    with pytest.raises(ValueError, match=message):
        parse_problems(items)


@pytest.mark.parametrize("name, view", [
    ("nchw,oc->nohw:n=2,c=3,h=4,w=5,o=6", "nch,oc->noh:n=2,c=3,h=20,o=6"),  # 1x1 convolution, NCHW
    ("nhwc,oc->nhwo:n=2,h=4,w=5,c=3,o=6;const=in1", "nc,oc->no:n=40,c=3,o=6;const=in1"),  # NHWC
    ("abcd,cde->abe:a=3,b=4,c=5,d=6,e=7", "ac,ce->ae:a=12,c=30,e=7"),
    ("mk,kn->mn:m=1,k=5,n=6", None),  # an extent of 1 is kept: decode GEMMs stay GEMMs
    ("bmk,bnk->bmn:b=2,m=3,k=4,n=5", None),
    ("nhwc,oc->nhwo:n=1,h=2,w=3,c=4,o=5;epilogue=relu", None),  # an epilogue keeps the shapes
])
def test_fused_views_merge_dimensions_that_always_go_together(name, view):
    problem = parse_problem(name)
    fused = fused_view(problem)
    assert (fused.name if fused is not None else None) == view
    if fused is not None:  # the same elements in the same order: reshapes of the arrays
        rng = np.random.default_rng(0)
        a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in problem.input_shapes)
        expected = np.einsum(problem.spec, a, b)
        got = np.einsum(fused.spec, a.reshape(fused.input_shapes[0]), b.reshape(fused.input_shapes[1])).reshape(problem.output_shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
