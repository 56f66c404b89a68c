"""The one record of a schedule found: every search stage returns them, ``looprl.search.run``
and ``looprl.tune`` answer with one, the measurement cache remembers tune's as one, and the
tuned-records files ship them.

A :class:`ScheduleRecord` is a value: the schedule (a :class:`~looprl.ir.nest.LoopNest`, so
its problem too) and the steps that build it from the problem's untuned nest
(``initial_nest(problem).apply(record.steps)`` is ``record.nest``: a record replays without an
action set; None where no step path is known), its GFLOPS, the action names that reach it from
the untuned nest (None when no action path does, e.g. from a re-laid layout start), how it was found (a stage or a mode:
``"rollout"``, ``"tiles"``, ``"guided"``, ``"parallel"``, ``"policy"``, an algorithm's name),
the target and threads it was measured for, the search budget it was found with and the
tuner's version, and how fast the machine's reference kernel ran while it was found (its load,
:mod:`looprl.measurement.load`). Where its actions replay on an equivalent problem rather than its own
(:mod:`looprl.ir.rewrites`), ``replays_on`` names that rewrite.

A record made for a target carries the pair step of its bfloat16 weight where its kernel can
pair (:func:`~looprl.measurement.pair_steps.with_pairs`, added in
:meth:`ScheduleRecord.__post_init__`), so records of before schedules were steps, and of before
pairs were steps (whose kernels the code generator paired then), are upgraded as they are made,
in one place: the steps of their action names (replayed once) and that pair step, so the kernel
stays the same.

Stored (the cache's ``records`` table, a tuned-records file) a record is a flat dict of
:data:`STORED_FIELDS`, with the host key it was measured under: :func:`checked_entry` is the
one check of such a dict, GFLOPS against :data:`MAX_GFLOPS` included. A stored dict carries no
load: only final answers are exported (:meth:`~looprl.measurement.cache.MeasurementCache.export_tuned`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from looprl.ir.action import action_steps
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.step import Step, parse_steps
from looprl.measurement.pair_steps import added_pairs, with_pairs
from looprl.target import Target

# A fixed physical bound on a measured figure: 100 TFLOPS of fp32. The largest CPU sockets peak
# several times lower (128 AVX-512 cores at 2 GHz: 128 x 2 FMA units x 16 lanes x 2 flops x 2e9 =
# 16 TFLOPS), so a stored figure above it is not a measurement (a damaged or forged record).
MAX_GFLOPS = 100_000.0

# A stored record: the host key it was measured under (CPU, target, code generator and timing
# versions, threads), the problem's name, the tuner's version, the schedule's key, its GFLOPS,
# the search budget, the action names (a list, or None), the rewrite they replay on, how it
# was found and its steps (a list of step names, str(Step); absent or None in a record written
# before schedules were steps, whose steps are its action names replayed: ScheduleRecord).
STORED_FIELDS = ("host", "problem", "tuner", "schedule", "gflops", "budget_s", "actions", "replays_on", "found_by", "steps")


@dataclass(frozen=True)
class ScheduleRecord:
    """A measured schedule and how it was found."""

    nest: LoopNest
    gflops: float
    actions: tuple[str, ...] | None = None  # from the untuned nest (of ``replays_on``'s problem, if set)
    found_by: str = ""  # the stage or mode that found it
    target: Target | None = None
    threads: int = 1  # threads offered: its parallel loops (if any) run on as many
    budget_s: float = 0.0  # the search budget it was found with
    tuner: str = ""  # the tuning procedure's version (looprl.tune's answers)
    replays_on: str | None = None  # the rewrite whose searched problem ``actions`` replay on
    # The load's reference kernel's GFLOPS while this was found (the busiest reading of the search,
    # looprl.measurement.load); against the quiet figure it says whether the machine was busy then,
    # so whether the answer is final. None: not checked (a final answer).
    reference_gflops: float | None = None
    # The schedule as steps from the problem's untuned nest (looprl.ir.step): ``initial_nest(
    # problem).apply(steps)`` is ``nest``. Given none (or steps that do not reach ``nest``: a
    # record replaced with another nest), they are the action names' steps
    # (looprl.ir.action.action_steps: how a record written as action names is read), or None
    # where no step path is known (no actions, actions replaying on another problem).
    steps: tuple[Step, ...] | None = None

    def __post_init__(self):
        steps = self.steps
        if steps is not None and not (isinstance(steps, tuple) and all(isinstance(step, Step) for step in steps)):
            raise ValueError(f"a record's steps are a tuple of Step values, got {steps!r:.200}")
        nest = with_pairs(self.nest, self.target)  # a bfloat16 weight's pairs, where its kernel for the target can take them
        if steps is None or not _reaches(nest, steps):
            steps = _steps_of(nest, None if self.actions is None else tuple(self.actions), self.target, self.replays_on)
        object.__setattr__(self, "nest", nest)
        object.__setattr__(self, "steps", steps)

    @property
    def problem(self) -> Problem:
        return self.nest.problem

    def with_gflops(self, gflops: float) -> "ScheduleRecord":
        return replace(self, gflops=gflops)


@lru_cache(maxsize=4096)  # a record is made again by every dataclasses.replace: derive its steps once per schedule
def _steps_of(nest: LoopNest, actions, target, replays_on) -> tuple[Step, ...] | None:
    """The steps of a record given as action names (the one upgrade of a record without
    steps): its actions' steps, and the pair step :func:`~looprl.measurement.pair_steps.with_pairs`
    adds (:func:`~looprl.measurement.pair_steps.added_pairs`), where they reach its schedule;
    else None."""
    if actions is None or replays_on is not None:
        return None
    steps = action_steps(nest.problem, tuple(actions), target)
    if steps is None:
        return None
    if not _reaches(nest, steps):
        steps = steps + added_pairs(initial_nest(nest.problem).apply(steps), target)
    return steps if _reaches(nest, steps) else None


@lru_cache(maxsize=4096)
def _reaches(nest: LoopNest, steps: tuple[Step, ...]) -> bool:
    try:
        return initial_nest(nest.problem).apply(steps).key == nest.key
    except ValueError:
        return False


class BestOf:
    """The old names of a result's best schedule (``best_nest``, ``best_gflops``,
    ``best_actions``), read from its ``best`` record: the one place a result that holds a
    :class:`ScheduleRecord` as ``best`` answers them."""

    best: ScheduleRecord

    @property
    def best_nest(self) -> LoopNest:
        return self.best.nest

    @property
    def best_gflops(self) -> float:
        return self.best.gflops

    @property
    def best_actions(self) -> tuple[str, ...] | None:
        return self.best.actions


def check_gflops(value, where: str) -> float:
    """``value`` as a positive, finite figure no larger than :data:`MAX_GFLOPS`, else a ValueError
    naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_GFLOPS:
        raise ValueError(f"{where}: gflops must be a positive number of at most {MAX_GFLOPS:g} (a physical bound), got {value!r:.80}")
    return float(value)


def checked_entry(entry, where: str) -> dict:
    """A stored record (:data:`STORED_FIELDS`) checked field by field: a ValueError naming
    ``where`` and what is wrong, else the entry with its fields in order (``steps`` only where
    the record has them)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a dict: {entry!r:.200}")
    unknown = set(entry) - set(STORED_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)!r:.200}")
    for key in ("host", "problem", "schedule"):
        if not isinstance(entry.get(key), str):
            raise ValueError(f"{where}: {key!r} must be a str, got {entry.get(key)!r:.200}")
    for key in ("tuner", "found_by"):
        if not isinstance(entry.get(key, ""), str):
            raise ValueError(f"{where}: {key!r} must be a str, got {entry.get(key)!r:.200}")
    if not isinstance(entry.get("replays_on"), (str, type(None))):
        raise ValueError(f"{where}: 'replays_on' must be a str or null, got {entry.get('replays_on')!r:.200}")
    actions = entry.get("actions")
    if actions is not None and not (isinstance(actions, list) and all(isinstance(name, str) for name in actions)):
        raise ValueError(f"{where}: 'actions' must be a list of action names or null, got {actions!r:.200}")
    steps = entry.get("steps")
    if steps is not None:
        try:
            parse_steps(steps)
        except ValueError as error:
            raise ValueError(f"{where}: 'steps' must be a list of step names or null: {error}") from None
    budget = entry.get("budget_s")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (math.isfinite(budget) and budget >= 0):
        raise ValueError(f"{where}: budget_s must be a finite number of seconds >= 0, got {budget!r:.80}")
    checked = {
        "host": entry["host"], "problem": entry["problem"], "tuner": entry.get("tuner", ""), "schedule": entry["schedule"],
        "gflops": check_gflops(entry.get("gflops"), where), "budget_s": float(budget),
        "actions": None if actions is None else list(actions), "replays_on": entry.get("replays_on"),
        "found_by": entry.get("found_by", ""),
    }
    if steps is not None:  # a record written before steps has none: ScheduleRecord replays its actions
        checked["steps"] = list(steps)
    return checked


def upgraded_entry(entry) -> dict:
    """A version-1 stored record (of a tuned-records file of version 1) as today's, for
    :func:`checked_entry`; anything else is returned as it is (and refused there)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("problem"), str):
        return entry
    name, tuner, actions, replays_on = legacy_fields(entry["problem"], entry.get("actions"))
    kept = {key: value for key, value in entry.items() if key not in ("problem", "actions")}
    return {**kept, "problem": name, "tuner": tuner, "actions": actions, "replays_on": replays_on, "found_by": "measured"}


def legacy_fields(problem: str, actions) -> tuple[str, str, list | None, str | None]:
    """What looprl 0.2 stored in two fields (its tuned table, tuned-records files of version 1)
    as today's four: ``problem`` (``"name|tuner"``) split, and ``actions`` (a list of names, or
    ``{"names": [...], "replays_on": kind}``) as ``(names, replays_on)``: ``(name, tuner,
    names, replays_on)``. Actions of another form are kept as they are (refused by
    :func:`checked_entry`)."""
    name, _, tuner = problem.partition("|")
    if isinstance(actions, dict) and set(actions) == {"names", "replays_on"} and isinstance(actions["replays_on"], str):
        return name, tuner, actions["names"], actions["replays_on"]
    return name, tuner, actions, None
