"""Integer arguments: Python ints and numpy integers alike, never bools or floats."""

from __future__ import annotations

import operator

INT64_MAX = 2**63 - 1  # the generated code indexes and counts with signed 64-bit integers


def as_int(value, what: str) -> int:
    """``value`` as a Python ``int``.

    Python ints, numpy integers and 0-d numpy integer arrays qualify (anything with
    ``__index__``); bools (Python or numpy), floats (even ``8.0``), strings and ``None`` are a
    :class:`ValueError` naming ``what``.
    """
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b":
        raise ValueError(f"{what} must be an integer, got the bool {value!r}")
    try:
        return int(operator.index(value))
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r} ({type(value).__name__})") from None
