"""The measurement cache: GFLOPS of schedules, the peak of each target and :func:`looprl.tune`'s
answers, stored per host in an SQLite file that concurrent processes share safely.

A value is stored under its key (:mod:`looprl.measurement.keys`): a value measured under other
rules is never reused. A value is not final: a state measured again keeps the best of its
samples, and the row counts them (``samples``), because timing on a shared machine is bimodal
and noise only ever slows a run down. The default location is ``$LOOPRL_CACHE_DIR`` or the
per-user cache directory (``$XDG_CACHE_HOME/looprl`` or ``~/.cache/looprl``), read when a
cache is created. How the file is opened and recognised: :mod:`looprl.measurement.store`; its
tables, checksums and migrations: :mod:`looprl.measurement.schema`; its rows as a cost model's
training data: :mod:`looprl.measurement.records`.

A tuned answer is stored as its schedule's steps (and the schedule's key, which they must reach)
and read back by applying them to the problem's untuned nest: no action set replays it. Its
action path is kept beside them (what reached it; :func:`looprl.tune`'s store serves an answer
only where one is known). A row without steps (written before they were stored, with no step
path: :mod:`looprl.measurement.schema`) is read from its schedule's key.

Tuned answers found while the machine was busy are provisional (:mod:`looprl.measurement.load`):
the cache keeps the load's reference figures beside the answers and judges each answer when it
is read, against the quiet figure of that moment.
"""

from __future__ import annotations

import json
import math
import os
import time
from looprl import checks, defaults
from looprl.target import Target
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.step import parse_steps, steps_text
from looprl.measurement.keys import bandwidth_key, measurement_host, measurement_key, peak_key, reference_key, schedule_threads
from looprl.measurement.load import LoadReading
from looprl.measurement.schedule_record import STORED_FIELDS, ScheduleRecord, check_gflops, checked_entry
from looprl.measurement.records import with_steps
from looprl.measurement.schema import column_steps, record_checksum, row_checksum, stored_value, steps_column
from looprl.measurement.store import CachedValue, CacheStore


def _like_prefix(text: str) -> str:
    """A LIKE pattern matching strings that start with ``text``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


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

    def unsettle(self, since: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1) -> int:
        """Make the measurements written since ``since`` (a ``time.time()``) for ``target`` with
        ``budget_s`` per state, serial or on ``threads`` threads, count one sample each: an
        evaluator that needs more times them again and keeps the best. For the measurements of a
        search that ran while the machine was busy (:mod:`looprl.measurement.load`), so that the
        next search does not rank schedules by them. The count is advisory (not checksummed),
        the figures are kept. Returns how many rows changed."""
        if isinstance(since, bool) or not isinstance(since, (int, float)) or not math.isfinite(since):
            raise ValueError(f"since must be a time (seconds since the epoch, as time.time() gives), got {since!r:.80}")
        hosts = sorted({measurement_key(target, budget_s, 1), measurement_key(target, budget_s, threads)})
        where = f"host IN ({', '.join('?' * len(hosts))}) AND created >= ? AND samples > 1"
        with self._store.transaction():
            changed = self._store.one(f"SELECT count(*) FROM measurements WHERE {where}", (*hosts, since))[0]
            self._store.one(f"UPDATE measurements SET samples = 1 WHERE {where}", (*hosts, since))
        return changed

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
    def get_peak(self, target: Target | None = None, threads: int = 1, dtype: str = "float32") -> float | None:
        """The stored peak of ``target`` (None: the host's) on ``threads`` threads of this
        host, or None."""
        value = self._store.read("peaks", (peak_key(target, threads, dtype),))
        return None if value is None else value.gflops

    def put_peak(self, gflops: float, target: Target | None = None, threads: int = 1, dtype: str = "float32") -> None:
        self._store.write("peaks", (peak_key(target, threads, dtype),), gflops)

    def get_bandwidth(self, level: str, target: Target, threads: int = 1) -> float | None:
        """The stored bandwidth (GB/s) from ``level`` of this host, or None."""
        value = self._store.read("peaks", (bandwidth_key(level, target, threads),))
        return None if value is None else value.gflops

    def put_bandwidth(self, gbs: float, level: str, target: Target, threads: int = 1) -> None:
        self._store.write("peaks", (bandwidth_key(level, target, threads),), gbs)

    # -- the load's reference kernel (looprl.measurement.load) ---------------------------
    def get_quiet(self, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1) -> float | None:
        """The quiet figure (the best reading seen, GFLOPS) of the load's reference kernel for
        ``target`` on ``threads`` threads, under the key of measurements timed with ``budget_s``
        per state, or None."""
        return self._quiet(measurement_key(target, budget_s, threads))

    def _quiet(self, host: str) -> float | None:
        value = self._store.read("peaks", (reference_key(host),))
        return None if value is None else value.gflops

    def note_reference(self, gflops: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
                       threads: int = 1) -> float:
        """Record one reading of the reference kernel (see :meth:`get_quiet`): the quiet figure
        becomes the best of it and the stored one; returns the quiet figure. Read and write
        happen in one transaction, so concurrent readings lose none."""
        gflops = check_gflops(gflops, "reference reading")
        key = (reference_key(measurement_key(target, budget_s, threads)),)
        with self._store.transaction():
            known = self._store.read("peaks", key)
            if known is not None and known.gflops >= gflops:
                return known.gflops
            self._store.write("peaks", key, gflops)
        return gflops

    def _load(self, host: str, reference: float | None) -> LoadReading | None:
        """The load of the machine an answer stored under ``host`` was found on (its
        ``reference`` GFLOPS against today's quiet figure), or None when it was not checked."""
        if reference is None:
            return None
        return LoadReading(reference, max(self._quiet(host) or reference, reference))

    # -- tuned answers (schedule records) ------------------------------------------
    def get_tuned(self, problem: Problem, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
                  tuner: str = "", threads: int = 1, *, provisional: bool = False) -> ScheduleRecord | None:
        """The :class:`~looprl.measurement.schedule_record.ScheduleRecord` that
        :func:`looprl.tune` remembered for ``problem`` on this host and ``target`` with
        ``budget_s`` per state and ``threads`` threads offered (the answer may be serial), or
        None (also when the row fails its checksum or its steps do not read, counted in
        ``damaged``, or its steps or schedule are not ``problem``'s: another IR version's). The
        schedule is the row's steps applied to ``problem``'s untuned nest (its schedule's key,
        where it has none). ``tuner`` names the tuning procedure's version: an answer stored
        by another version is not returned. An answer found while the machine was busy (its
        reference reading below :data:`~looprl.measurement.load.BUSY_RATIO` of today's quiet
        figure, :meth:`tuned_load`) is provisional: returned only with ``provisional=True``."""
        host = measurement_key(target, budget_s, threads)
        row = self._store.one(f"SELECT {_RECORD_COLUMNS} FROM records WHERE host = ? AND problem = ? AND tuner = ?",
                              (host, problem.name, tuner))
        entry = None if row is None else _entry(row)
        if entry is None:
            if row is not None:
                self._store.damaged += 1
            return None
        if not provisional and self._busy(host, entry["reference"]):
            return None
        steps = entry["steps"]
        try:
            nest = LoopNest.from_key(problem, entry["schedule"]) if steps is None else initial_nest(problem).apply(steps)
        except ValueError:
            return None
        if steps is not None and nest.key != entry["schedule"]:
            return None  # steps that do not reach its schedule: not this looprl's
        actions = None if entry["actions"] is None else tuple(entry["actions"])
        return ScheduleRecord(nest, entry["gflops"], actions, entry["found_by"], Target.resolve(target), threads, entry["budget_s"],
                              tuner, entry["replays_on"], entry["reference"], steps)

    def tuned_load(self, record: ScheduleRecord, budget_s: float = defaults.STATE_BUDGET_S) -> LoadReading | None:
        """The load of the machine ``record`` (an answer of :meth:`get_tuned`, timed with
        ``budget_s`` per state) was found on: its reference reading against today's quiet
        figure; None when it was not checked (a final answer)."""
        return self._load(measurement_key(record.target, budget_s, record.threads), record.reference_gflops)

    def _busy(self, host: str, reference: float | None) -> bool:
        load = self._load(host, reference)
        return load is not None and load.busy

    def put_tuned(self, record: ScheduleRecord, budget_s: float = defaults.STATE_BUDGET_S) -> None:
        """Remember ``record`` as :func:`looprl.tune`'s answer for its problem, target, threads
        offered and tuner (timed with ``budget_s`` per state), replacing what was there; with
        its ``reference_gflops``, the load it was found under (a busy one makes it provisional)."""
        host = measurement_key(record.target, budget_s, record.threads)
        reference = None if record.reference_gflops is None else check_gflops(record.reference_gflops, "reference_gflops")
        self._write_record({"host": host, "problem": record.problem.name, "tuner": record.tuner, "schedule": record.nest.key,
                            "gflops": stored_value(record.gflops), "budget_s": float(record.budget_s),
                            "actions": None if record.actions is None else list(record.actions), "replays_on": record.replays_on,
                            "found_by": record.found_by, "steps": None if record.steps is None else steps_text(record.steps),
                            "reference": reference})

    def _write_record(self, entry: dict) -> None:
        """One row of the records table (a stored record, :data:`STORED_FIELDS`, its steps names
        or None, and its ``reference``, if any: None for an imported one), checksummed."""
        actions = None if entry["actions"] is None else json.dumps(entry["actions"])
        steps = None if entry.get("steps") is None else steps_column(parse_steps(entry["steps"]))
        values = (entry["host"], entry["problem"], entry["tuner"], entry["schedule"], entry["gflops"], entry["budget_s"], actions,
                  entry["replays_on"], entry["found_by"])
        reference = entry.get("reference")
        self._store.one(f"INSERT OR REPLACE INTO records ({_RECORD_COLUMNS}, created) VALUES ({', '.join('?' * 13)})",
                        (*values, record_checksum(*values, reference, steps), reference, steps, time.time()))

    def export_tuned(self, problem_names=None) -> list[dict]:
        """:func:`looprl.tune`'s remembered final answers as stored records (every host's, or
        only those of ``problem_names``): dicts of :data:`~looprl.measurement.schedule_record.
        STORED_FIELDS` (``host`` names the CPU, the target, the code generator's and the
        timing's versions and the threads). Rows failing their checksum and provisional answers
        (found on a busy machine, see :meth:`get_tuned`) are left out.
        :meth:`import_tuned` stores them in another cache, where an answer is returned only on a
        host whose key is the same."""
        wanted = None if problem_names is None else set(problem_names)
        entries = (_entry(row) for row in self._store.rows(f"SELECT {_RECORD_COLUMNS} FROM records ORDER BY rowid"))
        kept = [entry for entry in entries if entry is not None and (wanted is None or entry["problem"] in wanted)]
        return [_stored(entry) for entry in kept if not self._busy(entry["host"], entry["reference"])]

    def import_tuned(self, records) -> int:
        """Store records of :meth:`export_tuned` (replacing this cache's answer for the same
        host, problem and tuner); how many were stored. A record that is not such a dict is a
        ValueError naming what is wrong with it
        (:func:`~looprl.measurement.schedule_record.checked_entry`), and nothing is stored. A
        record without steps (of before they were stored) is given those of its action names
        (:func:`~looprl.measurement.records.with_steps`)."""
        checked = [with_steps(checked_entry(record, f"tuned record {index}")) for index, record in enumerate(records)]
        with self._store.transaction():
            for entry in checked:
                self._write_record(entry)
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


def _stored(entry: dict) -> dict:
    """A record read from the table (:func:`_entry`) as a stored record: its
    :data:`STORED_FIELDS`, the steps as their names."""
    stored = {field: entry[field] for field in STORED_FIELDS}
    return {**stored, "steps": None if entry["steps"] is None else steps_text(entry["steps"])}


_RECORD_COLUMNS = "host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, checksum, reference, steps"


def _entry(row: tuple) -> dict | None:
    """A stored record (:data:`STORED_FIELDS`, its steps as Step values or None, and its
    ``reference``) from a row of the records table, or None when its checksum fails or its
    steps do not read (a corrupt row)."""
    host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, checksum, reference, steps = row
    texts = (host, problem, tuner, schedule, found_by)
    if not (all(isinstance(t, str) for t in texts) and isinstance(gflops, float) and isinstance(budget, float)
            and isinstance(actions, (str, type(None))) and isinstance(replays_on, (str, type(None)))
            and (reference is None or (isinstance(reference, float) and reference > 0)) and isinstance(steps, (str, type(None)))):
        return None
    if checksum != record_checksum(host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, reference, steps):
        return None
    try:
        parsed = None if steps is None else column_steps(steps)
    except ValueError:
        return None
    return {"host": host, "problem": problem, "tuner": tuner, "schedule": schedule, "gflops": gflops, "budget_s": budget,
            "actions": None if actions is None else json.loads(actions), "replays_on": replays_on, "found_by": found_by,
            "steps": parsed, "reference": reference}
