"""The measurement cache: GFLOPS of schedules, the peak of each target and :func:`looprl.tune`'s
answers, stored per host in an SQLite file that concurrent processes share safely.

A value is stored under its key (:mod:`looprl.measurement.keys`): a value measured under other
rules is never reused. A value is not final: a state measured again keeps the best of its
samples, and the row counts them (``samples``), because timing on a shared machine is bimodal
and noise only ever slows a run down. The default location is ``$LOOPRL_CACHE_DIR`` or the
per-user cache directory (``$XDG_CACHE_HOME/looprl`` or ``~/.cache/looprl``), read when a
cache is created. How the file is opened, recognised, migrated and checksummed:
:mod:`looprl.measurement.store`; its rows as a cost model's training data:
:mod:`looprl.measurement.records`.
"""

from __future__ import annotations

import json
import os
import time
from typing import NamedTuple

from looprl import checks, defaults
from looprl.target import Target
from looprl.ir.nest import LoopNest
from looprl.measurement.keys import bandwidth_key, measurement_host, measurement_key, peak_key, schedule_threads, tuned_problem, tuned_problem_name
from looprl.measurement.store import CachedValue, CacheStore, row_checksum, stored_value


def _like_prefix(text: str) -> str:
    """A LIKE pattern matching strings that start with ``text``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class TunedRow(NamedTuple):
    """:func:`looprl.tune`'s remembered answer for a problem: the schedule key, its GFLOPS, the
    search budget spent, the action names that reach it (None when not known: a row an older
    looprl wrote) and, when they reach it through an equivalent problem, that rewrite's kind
    (:mod:`looprl.ir.rewrites`)."""

    schedule: str
    gflops: float
    budget_s: float
    actions: tuple[str, ...] | None
    replays_on: str | None = None


class MeasurementCache:
    """``get``/``put`` GFLOPS of schedules on this host; ``path`` defaults to
    ``default_cache_dir() / "measurements.sqlite"``. Use ``":memory:"`` for a private cache.

    ``hits``/``misses`` count ``get`` calls; ``damaged`` counts rows discarded because their
    checksum did not match."""

    def __init__(self, path: str | os.PathLike | None = None, timeout_s: float = 30.0):
        self._store = CacheStore(path, timeout_s)
        self.path = self._store.path
        self.hits = 0
        self.misses = 0

    @property
    def damaged(self) -> int:
        return self._store.damaged

    # -- schedules ------------------------------------------------------------
    @staticmethod
    def _key(nest: LoopNest, target: Target | None, budget_s: float, threads: int = 1) -> tuple[str, str, str]:
        if not isinstance(nest, LoopNest):
            raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
        return (measurement_key(target, budget_s, schedule_threads(nest, threads)), nest.problem.name, nest.key)

    def lookup(
        self, nest: LoopNest, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1
    ) -> CachedValue | None:
        """The stored measurement of ``nest`` for ``target`` (None: the host's) timed with
        ``budget_s`` per state on ``threads`` threads (one, if it has no parallel loop), or None."""
        value = self._store.read("measurements", self._key(nest, target, budget_s, threads))
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def get(
        self, nest: LoopNest, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1
    ) -> float | None:
        """GFLOPS stored for ``nest`` (see :meth:`lookup`), or None."""
        value = self.lookup(nest, target, budget_s, threads)
        return None if value is None else value.gflops

    def put(
        self, nest: LoopNest, gflops: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, samples: int = 1,
        threads: int = 1,
    ) -> None:
        """Store ``gflops`` as the best of ``samples`` timings of ``nest`` (replacing what was there)."""
        samples = checks.positive_int(samples, "samples")
        self._store.write("measurements", self._key(nest, target, budget_s, threads), gflops, samples)

    def add_sample(
        self, nest: LoopNest, gflops: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1
    ) -> CachedValue:
        """Record one more timing of ``nest``: the row keeps the best of its samples and
        counts them. Read and write happen in one transaction, so concurrent processes that
        add samples of the same state lose none."""
        key = self._key(nest, target, budget_s, threads)
        stored_value(gflops)  # refuse a non-finite value before opening the transaction
        with self._store.transaction():
            known = self._store.read("measurements", key)
            merged = CachedValue(gflops, 1) if known is None else CachedValue(max(known.gflops, gflops), known.samples + 1)
            self._store.write("measurements", key, merged.gflops, merged.samples)
        return merged

    def records(
        self, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, exclude_problem: str | None = None, threads: int = 1
    ) -> list[tuple[str, str, float]]:
        """Every valid ``(problem name, schedule key, GFLOPS)`` measured on this host for
        ``target`` with ``budget_s`` per state (a learned cost model's training data), in
        insertion order; rows failing their checksum are skipped. ``threads`` > 1: the
        parallel schedules measured on that many threads."""
        host = measurement_key(target, budget_s, threads)
        rows = self._store.rows("SELECT problem, schedule, gflops, checksum FROM measurements WHERE host = ? ORDER BY rowid", (host,))
        return [
            (problem, schedule, value)
            for problem, schedule, value, checksum in rows
            if problem != exclude_problem and isinstance(value, float) and checksum == row_checksum("measurements", (host, problem, schedule), value)
        ]

    def __len__(self) -> int:
        """Schedules stored for this host (every target and protocol)."""
        return self._store.one("SELECT count(*) FROM measurements WHERE host LIKE ? ESCAPE '\\'", (_like_prefix(measurement_host()),))[0]

    # -- peak -----------------------------------------------------------------
    def get_peak(self, target: Target | None = None, threads: int = 1) -> float | None:
        """The stored peak of ``target`` (None: the host's) on ``threads`` threads of this
        host, or None."""
        value = self._store.read("peaks", (peak_key(target, threads),))
        return None if value is None else value.gflops

    def put_peak(self, gflops: float, target: Target | None = None, threads: int = 1) -> None:
        self._store.write("peaks", (peak_key(target, threads),), gflops)

    def get_bandwidth(self, level: str, target: Target, threads: int = 1) -> float | None:
        """The stored bandwidth (GB/s) from ``level`` of this host, or None."""
        value = self._store.read("peaks", (bandwidth_key(level, target, threads),))
        return None if value is None else value.gflops

    def put_bandwidth(self, gbs: float, level: str, target: Target, threads: int = 1) -> None:
        self._store.write("peaks", (bandwidth_key(level, target, threads),), gbs)

    # -- tuned results ---------------------------------------------------------
    def get_tuned(self, problem_name: str, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
                  tuner: str = "", threads: int = 1) -> TunedRow | None:
        """The :class:`TunedRow` that :func:`looprl.tune` remembered for the problem on this host
        and ``target`` with ``budget_s`` per state and ``threads`` threads offered (the answer
        may be serial), or None (also when the row fails its checksum). ``tuner`` names the
        tuning procedure's version: an answer stored by another version is not returned."""
        host = measurement_key(target, budget_s, threads)
        problem_name = tuned_problem(problem_name, tuner)
        row = self._store.one("SELECT schedule, gflops, budget, checksum, actions FROM tuned WHERE host = ? AND problem = ?",
                              (host, problem_name))
        if row is None:
            return None
        schedule, gflops, budget, checksum, actions = row
        if not (isinstance(gflops, float) and isinstance(budget, float) and isinstance(schedule, str)):
            return None
        if not _tuned_row_intact(host, problem_name, schedule, gflops, budget, checksum, actions):
            self._store.damaged += 1
            return None
        return TunedRow(schedule, gflops, budget, *_action_path(actions))

    def put_tuned(
        self, nest: LoopNest, gflops: float, search_budget_s: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
        tuner: str = "", threads: int = 1, actions: tuple[str, ...] | None = None, replays_on: str | None = None,
    ) -> None:
        """Remember ``nest`` as :func:`looprl.tune`'s answer for its problem (and ``tuner``)
        when ``threads`` threads were offered; ``actions``: the names that reach it (from the
        untuned nest of the rewrite ``replays_on`` names, if given)."""
        host = measurement_key(target, budget_s, threads)
        self._write_tuned(host, tuned_problem(nest.problem.name, tuner), nest.key, stored_value(gflops), float(search_budget_s),
                          _actions_text(actions, replays_on))

    def _write_tuned(self, host: str, problem: str, schedule: str, value: float, budget: float, actions: str | None = None) -> None:
        """One row of the tuned table, checksummed (replacing the host's row for the problem)."""
        checksum = row_checksum("tuned", _tuned_key(host, problem, schedule, budget, actions), value)
        self._store.one(
            "INSERT OR REPLACE INTO tuned (host, problem, schedule, gflops, budget, created, checksum, actions) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (host, problem, schedule, value, budget, time.time(), checksum, actions),
        )

    def export_tuned(self, problem_names=None) -> list[dict]:
        """:func:`looprl.tune`'s remembered answers as plain records (every host's, or only
        those of ``problem_names``): ``{"host", "problem", "schedule", "gflops", "budget_s"}``
        with the stored text as it is (``host`` names the CPU, the target, the code generator's
        and the timing's versions and the threads; ``problem`` the problem and the tuner's
        version). Rows failing their checksum are left out. :meth:`import_tuned` stores them in
        another cache, where an answer is returned only on a host whose key is the same."""
        wanted = None if problem_names is None else set(problem_names)
        rows = self._store.rows("SELECT host, problem, schedule, gflops, budget, checksum, actions FROM tuned ORDER BY rowid")
        records = []
        for host, problem, schedule, gflops, budget, checksum, actions in rows:
            if not (isinstance(gflops, float) and isinstance(budget, float) and isinstance(schedule, str)):
                continue
            if not _tuned_row_intact(host, problem, schedule, gflops, budget, checksum, actions):
                continue
            if wanted is not None and tuned_problem_name(problem) not in wanted:
                continue
            record = {"host": host, "problem": problem, "schedule": schedule, "gflops": gflops, "budget_s": budget}
            if actions is not None and _action_path(actions)[0] is not None:
                record["actions"] = json.loads(actions)
            records.append(record)
        return records

    def import_tuned(self, records) -> int:
        """Store records of :meth:`export_tuned` (replacing this cache's answer for the same
        host and problem); how many were stored. A record that is not such a dict is a
        ValueError naming what is wrong with it, and nothing is stored."""
        checked = []
        for index, record in enumerate(records):
            if not isinstance(record, dict):
                raise ValueError(f"tuned record {index} is not a dict: {record!r}")
            for key in ("host", "problem", "schedule"):
                if not isinstance(record.get(key), str):
                    raise ValueError(f"tuned record {index}: {key!r} must be a str, got {record.get(key)!r}")
            gflops = checks.positive_float(record.get("gflops"), f"tuned record {index}: gflops")
            budget = checks.seconds(record.get("budget_s"), f"tuned record {index}: budget_s", allow_zero=True)
            actions = record.get("actions")
            text = None if actions is None else json.dumps(actions)
            if text is not None and _action_path(text)[0] is None:
                raise ValueError(f"tuned record {index}: 'actions' must be a list of action names or "
                                 f"{{'names': [...], 'replays_on': '...'}}, got {actions!r:.200}")
            checked.append((record["host"], record["problem"], record["schedule"], stored_value(gflops), budget, text))
        with self._store.transaction():
            for row in checked:
                self._write_tuned(*row)
        return len(checked)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> "MeasurementCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        # Picklable for worker processes: reopen the same file there.
        return {"path": self.path, "timeout_s": self._store.timeout_s}

    def __setstate__(self, state) -> None:
        self.__init__(state["path"], state["timeout_s"])


def _tuned_key(host: str, problem: str, schedule: str, budget: float, actions: str | None) -> tuple[str, ...]:
    """The checksummed fields of a tuned row (a row without an action path: as before there was one)."""
    fields = (host, problem, schedule, repr(budget))
    return fields if actions is None else fields + (actions,)


def _tuned_row_intact(host: str, problem: str, schedule: str, gflops: float, budget: float, checksum, actions=None) -> bool:
    """Whether a tuned row's checksum matches its values."""
    if actions is not None and not isinstance(actions, str):
        return False
    return checksum == row_checksum("tuned", _tuned_key(host, problem, schedule, budget, actions), gflops)


def _actions_text(actions: tuple[str, ...] | None, replays_on: str | None = None) -> str | None:
    """The stored form of an action path: a JSON list of names, or with the rewrite it replays
    on, ``{"names": [...], "replays_on": kind}``."""
    if actions is None:
        return None
    return json.dumps(list(actions) if replays_on is None else {"names": list(actions), "replays_on": replays_on})


def _action_path(text: str | None) -> tuple[tuple[str, ...] | None, str | None]:
    """``(names, replays_on)`` of a stored action path; ``(None, None)`` when none is stored or
    the text is not one (another version's)."""
    if text is None:
        return None, None
    try:
        value = json.loads(text)
    except ValueError:
        return None, None
    replays_on = None
    if isinstance(value, dict) and set(value) == {"names", "replays_on"} and isinstance(value["replays_on"], str):
        value, replays_on = value["names"], value["replays_on"]
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return tuple(value), replays_on
    return None, None
