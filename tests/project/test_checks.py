"""looprl.checks: each check takes Python and numpy values alike, refuses bools as numbers and
numbers as bools, enforces its bounds, and names the argument and the bad value."""

import math

import numpy as np
import pytest

from looprl import checks

NOT_NUMBERS = [True, False, np.True_, np.bool_(False), "1", None, [1], object()]
NOT_INTEGERS = NOT_NUMBERS + [1.0, np.float64(1.0), np.float32(2.5), math.nan, math.inf, np.array(1.0), np.array([1]), np.array(True)]


# -- integers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [3, np.int64(3), np.int8(3), np.uint16(3), np.array(3)])
def test_integers_accept_python_and_numpy_integers(value):
    for check in (checks.integer, checks.positive_int, checks.count):
        result = check(value, "n")
        assert result == 3 and type(result) is int


@pytest.mark.parametrize("bad", NOT_INTEGERS)
def test_integers_refuse_bools_floats_and_everything_else(bad):
    for check, requirement in ((checks.integer, "an integer"), (checks.positive_int, "a positive integer"), (checks.count, "a non-negative integer")):
        with pytest.raises(ValueError, match=f"^n must be {requirement}, got "):
            check(bad, "n")


def test_integer_bounds_are_inclusive_and_named():
    assert checks.integer(-5, "n") == -5 and checks.integer(2**70, "n") == 2**70
    assert checks.integer(2, "factor", 2, 512) == 2 and checks.integer(512, "factor", 2, 512) == 512
    with pytest.raises(ValueError, match=r"^factor must be an integer in 2\.\.512, got 513$"):
        checks.integer(513, "factor", 2, 512)
    with pytest.raises(ValueError, match=r"^factor must be an integer in 2\.\.512, got 1$"):
        checks.integer(np.int64(1), "factor", 2, 512)
    with pytest.raises(ValueError, match="^pad must be an integer >= 2, got 1$"):
        checks.integer(1, "pad", minimum=2)
    with pytest.raises(ValueError, match="^level must be an integer <= 3, got 4$"):
        checks.integer(4, "level", maximum=3)
    assert checks.count(0, "steps") == 0
    with pytest.raises(ValueError, match="^steps must be a non-negative integer, got -1$"):
        checks.count(-1, "steps")
    with pytest.raises(ValueError, match="^reps must be a positive integer, got 0$"):
        checks.positive_int(0, "reps")
    with pytest.raises(ValueError, match=r"^reps must be an integer in 1\.\.10, got 11$"):
        checks.positive_int(11, "reps", 10)
    with pytest.raises(ValueError, match=r"^action must be an integer in 0\.\.6, got 7$"):
        checks.count(7, "action", 6)


def test_integer_messages_show_the_bad_value_and_its_type():
    with pytest.raises(ValueError, match=r"^size must be a positive integer, got the bool True$"):
        checks.positive_int(True, "size")
    with pytest.raises(ValueError, match=r"^size must be a positive integer, got 8\.0 \(float\)$"):
        checks.positive_int(8.0, "size")
    with pytest.raises(ValueError, match=r"^size must be a positive integer, got '8' \(str\)$"):
        checks.positive_int("8", "size")


# -- real numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.5, np.float32(0.5), np.float64(0.5)])
def test_real_checks_accept_python_and_numpy_numbers(value):
    for result in (checks.finite_float(value, "x"), checks.positive_float(value, "x"), checks.seconds(value, "x"), checks.fraction(value, "x")):
        assert result == 0.5 and type(result) is float
    assert checks.seconds(np.int64(2), "x") == 2.0 and type(checks.seconds(2, "x")) is float


@pytest.mark.parametrize("bad", NOT_NUMBERS + [np.array(0.5)])
def test_real_checks_refuse_bools_and_non_numbers(bad):
    for check in (checks.finite_float, checks.positive_float, checks.seconds, checks.fraction):
        with pytest.raises(ValueError, match="^x must be a"):
            check(bad, "x")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan"), 10**400, -(10**400)])
def test_real_checks_refuse_non_finite_numbers(bad):
    for check in (checks.finite_float, checks.positive_float, checks.seconds, checks.fraction):
        with pytest.raises(ValueError, match="^x must be a"):
            check(bad, "x")


def test_finite_float_bounds():
    assert checks.finite_float(-3, "x") == -3.0
    assert checks.finite_float(1, "diversity", minimum=1) == 1.0
    with pytest.raises(ValueError, match=r"^diversity must be a finite number >= 1, got 0\.5$"):
        checks.finite_float(0.5, "diversity", minimum=1)
    with pytest.raises(ValueError, match=r"^x must be a finite number <= 2, got 3$"):
        checks.finite_float(3, "x", maximum=2)
    with pytest.raises(ValueError, match=r"^x must be a finite number in \[0, 2\], got -1$"):
        checks.finite_float(-1, "x", 0, 2)


def test_positive_float_and_seconds_name_the_unit_zero_and_none():
    with pytest.raises(ValueError, match="^peak must be a positive, finite number of GFLOPS, got 0$"):
        checks.positive_float(0, "peak", unit="GFLOPS")
    with pytest.raises(ValueError, match="^budget_s must be a positive, finite number of seconds, got -1.0$"):
        checks.seconds(-1.0, "budget_s")
    with pytest.raises(ValueError, match="^budget_s must be a positive, finite number of seconds, got None"):
        checks.seconds(None, "budget_s")
    assert checks.seconds(0, "budget_s", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="^budget_s must be a non-negative, finite number of seconds, got -1$"):
        checks.seconds(-1, "budget_s", allow_zero=True)
    assert checks.seconds(None, "budget_s", allow_none=True) is None
    with pytest.raises(ValueError, match="^budget_s must be a positive, finite number of seconds or None, got 0$"):
        checks.seconds(0, "budget_s", allow_none=True)
    with pytest.raises(ValueError, match=r"^peak must be a positive, finite number or None, got True \(bool\)$"):
        checks.positive_float(True, "peak", allow_none=True)


def test_seconds_take_infinity_only_where_allowed():
    assert checks.seconds(math.inf, "budget_s", allow_none=True, allow_inf=True) == math.inf
    assert checks.seconds(np.float32("inf"), "budget_s", allow_inf=True) == math.inf
    with pytest.raises(ValueError, match="^budget_s must be a positive, finite number of seconds, math.inf or None, got -inf$"):
        checks.seconds(-math.inf, "budget_s", allow_none=True, allow_inf=True)
    for bad in (math.nan, 10**400, 0):
        with pytest.raises(ValueError, match="^budget_s must be a positive, finite number of seconds or math.inf, got"):
            checks.seconds(bad, "budget_s", allow_inf=True)


def test_fraction_bounds_open_and_closed():
    assert checks.fraction(0, "p") == 0.0 and checks.fraction(1, "p") == 1.0
    for bad in (-0.01, 1.01, math.nan):
        with pytest.raises(ValueError, match=r"^p must be a number in \[0, 1\], got"):
            checks.fraction(bad, "p")
    with pytest.raises(ValueError, match=r"^p must be a number in \(0, 1\), got 0$"):
        checks.fraction(0, "p", allow_zero=False, allow_one=False)
    with pytest.raises(ValueError, match=r"^p must be a number in \(0, 1\), got 1$"):
        checks.fraction(1, "p", allow_zero=False, allow_one=False)
    assert checks.fraction(1, "p", allow_zero=False) == 1.0
    with pytest.raises(ValueError, match=r"^p must be a number in \[0, 1\), got 1$"):
        checks.fraction(1, "p", allow_one=False)


# -- flags and choices ---------------------------------------------------------------------------


def test_flag_takes_only_bools():
    for value in (True, False, np.True_, np.bool_(False)):
        result = checks.flag(value, "layouts")
        assert result is bool(value)
    for bad in (0, 1, np.int64(1), 1.0, "True", None, np.array(True)):
        with pytest.raises(ValueError, match="^layouts must be True or False, got "):
            checks.flag(bad, "layouts")


def test_one_of_takes_only_the_named_strings():
    assert checks.one_of("test", "split", ("train", "test")) == "test"
    assert type(checks.one_of(np.str_("test"), "split", ("train", "test"))) is str
    assert checks.one_of(None, "activation", ("relu",), allow_none=True) is None
    for bad in ("Train", "", None, 1, ["train"], np.array(["train"])):
        with pytest.raises(ValueError, match="^unknown split .*; expected one of train, test$"):
            checks.one_of(bad, "split", ("train", "test"))
    with pytest.raises(ValueError, match="^unknown activation 'Relu'; expected None or one of relu, gelu$"):
        checks.one_of("Relu", "activation", ("relu", "gelu"), allow_none=True)


def test_the_i64_limit():
    assert checks.INT64_MAX == 2**63 - 1 == np.iinfo(np.int64).max


def test_checks_is_the_bottom_layer_and_imports_nothing_of_looprl():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(checks))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name == "looprl" or name.startswith("looprl.")]
