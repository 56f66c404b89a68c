"""The measurement cache's rows as a learned cost model's training data: ``(nest, GFLOPS)``.

:meth:`MeasurementCache.records <looprl.measurement.cache.MeasurementCache.records>` gives the
stored text (problem name, schedule key, GFLOPS); :func:`measured_nests` reads it back into
nests. The text may come from another looprl version sharing the file, whose syntax this one
cannot read: such rows are skipped, and counted in one warning, so that a parser that wrongly
refuses every row shows instead of silently leaving a cost model without data.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem, parse_problem


def stored_nest(problem_name: str, schedule_key: str, problems: dict[str, Problem | str] | None = None) -> LoopNest | str:
    """The nest a stored row names, or why this looprl cannot read it (the parser's message).

    ``problems`` memoises each problem name's parse (or the reason it failed) across rows.
    Only the two parsers' answer on the stored text is turned into a reason: they raise
    ``ValueError`` exactly for text that is not their syntax."""
    problem = None if problems is None else problems.get(problem_name)
    if problem is None:
        try:
            problem = parse_problem(problem_name)
        except ValueError as error:
            problem = f"problem {problem_name!r}: {error}"
        if problems is not None:
            problems[problem_name] = problem
    if isinstance(problem, str):
        return problem
    try:
        return LoopNest.from_key(problem, schedule_key)
    except ValueError as error:
        return str(error)


def measured_nests(records: Iterable[tuple[str, str, float]]) -> list[tuple[LoopNest, float]]:
    """``(nest, GFLOPS)`` of :meth:`MeasurementCache.records` rows (a cost model's training
    data); rows whose problem or schedule no longer parses (another looprl version's syntax)
    are skipped, with one ``RuntimeWarning`` that counts them and gives the first reason."""
    problems: dict[str, Problem | str] = {}
    result = []
    skipped: list[str] = []
    for name, key, gflops in records:
        nest = stored_nest(name, key, problems)
        if isinstance(nest, str):
            skipped.append(nest)
        else:
            result.append((nest, float(gflops)))
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} of {len(skipped) + len(result)} measurement records this looprl cannot read "
            f"(another version's syntax?); the first: {skipped[0]}",
            RuntimeWarning,
            stacklevel=2,
        )
    return result
