"""Checks of public arguments: one function per kind of value, used wherever one is taken.

Each function returns the value in its plain Python form (an ``int``, a ``float``, a ``bool`` or
a ``str``) or raises a :class:`ValueError` that names the argument (``what``), says what it
must be and shows the value given. Python and numpy numbers are accepted alike (a 0-d numpy
integer array too, where an integer is wanted); a bool is never a number and a number never a
bool, so ``True`` is refused as a count and ``1`` as a flag. Floats are never integers, not
even ``8.0``. This module is the bottom layer of the package: it imports nothing of looprl.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import numpy as np

INT64_MAX = 2**63 - 1  # the generated code indexes and counts with signed 64-bit integers

_REAL_TYPES = (int, float, np.integer, np.floating)


def integer(value, what: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``minimum..maximum`` (either bound may be None: unbounded).

    Anything with ``__index__`` qualifies (Python ints, numpy integers, 0-d integer arrays);
    bools, floats, strings and None do not."""
    if type(value) is int:  # the common case, checked on every env step: no conversion needed
        number = value
    elif _is_bool(value):
        raise ValueError(f"{what} must be {_integer_requirement(minimum, maximum)}, got the bool {value!r}")
    else:
        try:
            number = int(operator.index(value))
        except TypeError:
            raise ValueError(f"{what} must be {_integer_requirement(minimum, maximum)}, got {value!r} ({type(value).__name__})") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ValueError(f"{what} must be {_integer_requirement(minimum, maximum)}, got {number}")
    return number


def positive_int(value, what: str, maximum: int | None = None) -> int:
    """``value`` as an ``int`` >= 1 (and <= ``maximum`` when given): :func:`integer`."""
    return integer(value, what, 1, maximum)


def count(value, what: str, maximum: int | None = None) -> int:
    """``value`` as an ``int`` >= 0 (and <= ``maximum`` when given): :func:`integer`."""
    return integer(value, what, 0, maximum)


def finite_float(value, what: str, minimum: float | None = None, maximum: float | None = None) -> float:
    """``value`` (a Python or numpy real number, not a bool) as a finite ``float`` in
    ``[minimum, maximum]`` (either bound may be None: unbounded)."""
    requirement = "a finite number"
    if minimum is not None and maximum is not None:
        requirement += f" in [{minimum:g}, {maximum:g}]"
    elif minimum is not None:
        requirement += f" >= {minimum:g}"
    elif maximum is not None:
        requirement += f" <= {maximum:g}"
    number = _real(value, what, requirement)
    if not math.isfinite(number) or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ValueError(f"{what} must be {requirement}, got {value!r}")
    return number


def positive_float(value, what: str, *, unit: str | None = None, allow_zero: bool = False, allow_none: bool = False,
                   allow_inf: bool = False) -> float | None:
    """``value`` as a finite ``float`` > 0 (>= 0 with ``allow_zero``; None passes with
    ``allow_none``; a float ``inf``, not an integer too large for a float, with ``allow_inf``).
    ``unit`` (e.g. ``"GFLOPS"``) is named in the message."""
    if value is None and allow_none:
        return None
    requirement = f"{'a non-negative' if allow_zero else 'a positive'}, finite number{f' of {unit}' if unit else ''}"
    requirement += (", math.inf" if allow_none else " or math.inf") if allow_inf else ""
    requirement += " or None" if allow_none else ""
    number = _real(value, what, requirement)
    infinite = allow_inf and number == math.inf and isinstance(value, (float, np.floating))
    if not (math.isfinite(number) or infinite) or number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"{what} must be {requirement}, got {value!r}")
    return number


def seconds(value, what: str, *, allow_zero: bool = False, allow_none: bool = False, allow_inf: bool = False) -> float | None:
    """A time budget or duration: :func:`positive_float` in seconds (``allow_inf``: a budget
    that may be ``math.inf``, no time limit)."""
    return positive_float(value, what, unit="seconds", allow_zero=allow_zero, allow_none=allow_none, allow_inf=allow_inf)


def fraction(value, what: str, *, allow_zero: bool = True, allow_one: bool = True) -> float:
    """``value`` as a ``float`` in ``[0, 1]``; ``allow_zero=False`` or ``allow_one=False`` open
    that end of the interval."""
    requirement = f"a number in {'[' if allow_zero else '('}0, 1{']' if allow_one else ')'}"
    number = _real(value, what, requirement)
    above_zero = number >= 0 if allow_zero else number > 0
    below_one = number <= 1 if allow_one else number < 1
    if not (above_zero and below_one):  # NaN fails both
        raise ValueError(f"{what} must be {requirement}, got {value!r}")
    return number


def flag(value, what: str) -> bool:
    """``value`` as a ``bool``: only ``True``, ``False`` and numpy bools qualify (not 0 or 1)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def one_of(value, what: str, choices: Iterable[str], *, allow_none: bool = False) -> str | None:
    """``value`` if it is one of the strings ``choices`` (or None, with ``allow_none``); else a
    ValueError ``unknown <what> <value>; expected one of ...``."""
    if value is None and allow_none:
        return None
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        expected = f"{'None or ' if allow_none else ''}one of {', '.join(choices)}"
        raise ValueError(f"unknown {what} {value!r}; expected {expected}")
    return str(value)


def _is_bool(value) -> bool:
    """A Python or numpy bool, or a numpy bool array (which ``operator.index`` would take)."""
    return isinstance(value, (bool, np.bool_)) or getattr(getattr(value, "dtype", None), "kind", None) == "b"


def _real(value, what: str, requirement: str) -> float:
    """``value`` as a float if it is a Python or numpy real number (not a bool); an integer too
    large for a float becomes ``inf``, which the callers refuse as not finite."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL_TYPES):
        raise ValueError(f"{what} must be {requirement}, got {value!r} ({type(value).__name__})")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _integer_requirement(minimum: int | None, maximum: int | None) -> str:
    """What :func:`integer` asks for, in words: "a positive integer", "an integer in 2..512", ..."""
    if minimum is not None and maximum is not None:
        return f"an integer in {minimum}..{maximum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
