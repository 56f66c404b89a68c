"""Stored rows read back: the measurement cache's as a learned cost model's training data
(``(nest, GFLOPS)``), and the steps of a stored record written before records kept steps.

:meth:`MeasurementCache.records <looprl.measurement.cache.MeasurementCache.records>` gives the
stored text (problem name, schedule key, GFLOPS); :func:`measured_nests` reads it back into
nests. The text may come from another looprl version sharing the file, whose syntax this one
cannot read: such rows are skipped, and counted in one warning, so that a parser that wrongly
refuses every row shows instead of silently leaving a cost model without data.

A stored record (the cache's ``records`` table, a tuned-records file) keeps its schedule's steps;
one written before (a cache before schema 0.5, a tuned-records file before version 3) kept only
the action names that reach it, and is given its steps once, when it is read
(:func:`upgraded_steps`, :func:`with_steps`): its names replayed as
:class:`~looprl.measurement.schedule_record.ScheduleRecord` replays them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem, parse_problem
from looprl.ir.step import Step, steps_text
from looprl.measurement.keys import key_target
from looprl.measurement.schedule_record import ScheduleRecord


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


def upgraded_steps(host: str, problem_name: str, schedule: str, actions, replays_on) -> tuple[str, tuple[Step, ...]] | None:
    """The schedule and steps of a stored record written before records kept steps: its action
    names (a list) replayed once, as a :class:`~looprl.measurement.schedule_record.
    ScheduleRecord` made for the target its host key names (:func:`~looprl.measurement.keys.
    key_target`) replays them, with the pair step such a record adds to a bfloat16 weight's
    schedule: ``(the schedule's key, the steps)``, the key the one the steps reach.
    None where no step path is known: no actions, actions that replay on another start
    (``replays_on``), a problem or schedule this looprl cannot read, names that do not reach
    the schedule."""
    if not (isinstance(actions, list) and all(isinstance(name, str) for name in actions)) or replays_on is not None:
        return None
    if not (isinstance(host, str) and isinstance(problem_name, str) and isinstance(schedule, str)):
        return None
    try:
        nest = LoopNest.from_key(parse_problem(problem_name), schedule)
        record = ScheduleRecord(nest, 1.0, tuple(actions), target=key_target(host))
    except ValueError:
        return None
    return None if record.steps is None else (record.nest.key, record.steps)


def with_steps(entry):
    """A stored record (a dict of :data:`~looprl.measurement.schedule_record.STORED_FIELDS`)
    with its steps: as it is where it has them (or where it is no such dict: refused by
    :func:`~looprl.measurement.schedule_record.checked_entry`), else with those of
    :func:`upgraded_steps` (and the schedule they reach) where its action names give them."""
    if not isinstance(entry, dict) or entry.get("steps") is not None:
        return entry
    found = upgraded_steps(entry.get("host"), entry.get("problem"), entry.get("schedule"), entry.get("actions"), entry.get("replays_on"))
    return entry if found is None else {**entry, "schedule": found[0], "steps": steps_text(found[1])}
