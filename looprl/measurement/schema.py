"""The measurement cache file's format: its tables, the checksum every row carries, and the
migration of the files earlier looprl versions wrote.

The tables below are what users' files hold: a change must stay readable by (and read) the
files of earlier versions (tests/measurement/test_cache_schema.py opens one written from today's SQL).
looprl marks its databases with :data:`APPLICATION_ID` (SQLite's ``application_id``); how a
file is recognised, opened and rebuilt is :mod:`looprl.measurement.store`'s job.

Every row carries a CRC32 ``checksum`` over its table, key and the exact 8 bytes of its value
(:func:`row_checksum`; a record of a tuned answer over all its columns, :func:`record_checksum`),
so that corruption SQLite does not notice (a flipped bit in a stored float) cannot return a
wrong measurement. Migration of an older cache (:func:`migrate`) adds the columns it lacks and
checksums its existing rows at that moment (they were trusted before, and measurements are
expensive to repeat); a row written afterwards without a checksum (by an older looprl sharing
the file) reads as missing, so it is measured again and overwritten.

Versions: 0.1 had ``measurements``, ``peaks`` and ``tuned``; 0.2 added the tuned answers' action
paths; 0.3 moved tuned answers to ``records`` (0.2's rows are copied there when such a file is
first opened; the old table is left for an older looprl sharing the file); 0.4 added the
records' ``reference`` column (the load of the machine an answer was found on,
:mod:`looprl.measurement.load`): NULL in the rows of earlier versions, which read as final
answers; 0.5 added the records' ``steps`` column (the schedule's steps, :func:`steps_column`,
what a record is read from): filled, when such a file is first opened, from the action path of
each row whose checksum holds (:func:`~looprl.measurement.records.upgraded_steps`, which also
gives the schedule's key the steps reach: a bfloat16 weight's pair step added), NULL where no
step path is known (no action path, or one that replays on another start: such a row is read
from its schedule's key). An older looprl sharing the file reads a row with steps as failing
its checksum (it tunes again and writes its own row); a row it writes has no steps, and is read
as before.
"""

from __future__ import annotations

import json
import math
import sqlite3
import struct
import time
import zlib

from looprl.ir.step import Step, parse_steps, steps_text
from looprl.measurement.records import upgraded_steps
from looprl.measurement.schedule_record import legacy_fields

APPLICATION_ID = 0x4C4F4F50  # b"LOOP": the mark of looprl's databases

TABLES = {
    "measurements": """CREATE TABLE measurements (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        samples INTEGER,
        PRIMARY KEY (host, problem, schedule)
    )""",
    "peaks": """CREATE TABLE peaks (
        host TEXT PRIMARY KEY,
        gflops REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER
    )""",
    # looprl.tune's answers, one schedule record (looprl.measurement.schedule_record) a row: the
    # best schedule found for a problem by a tuner's version, and how; ``reference``: the
    # reference kernel's GFLOPS while it was found (looprl.measurement.load), NULL if not checked;
    # ``steps``: the schedule's steps from the problem's untuned nest (steps_column), NULL where
    # none are known (the record is then read from its schedule's key).
    "records": """CREATE TABLE records (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        tuner TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        budget REAL NOT NULL,
        actions TEXT,
        replays_on TEXT,
        found_by TEXT NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        reference REAL,
        steps TEXT,
        PRIMARY KEY (host, problem, tuner)
    )""",
}
KEY_COLUMNS = {"measurements": ("host", "problem", "schedule"), "peaks": ("host",), "records": ("host", "problem", "tuner")}
# Columns added to a table after it first shipped: added (NULL in the rows already there) when
# an older file is opened.
ADDED_COLUMNS = {"measurements": (("samples", "INTEGER"),), "records": (("reference", "REAL"), ("steps", "TEXT"))}
# The columns an older looprl's tables had: how an unmarked database is recognised as ours.
_LEGACY_COLUMNS = {"measurements": {"host", "problem", "schedule", "gflops", "created"}, "peaks": {"host", "gflops", "created"}}


def row_checksum(table: str, key: tuple[str, ...], gflops: float) -> int:
    """CRC32 over the table name, the key fields (each length-prefixed, so fields cannot run
    into each other) and the value's exact IEEE-754 bytes."""
    data = bytearray()
    for field in (table, *key):
        encoded = field.encode("utf-8", "surrogatepass")
        data += len(encoded).to_bytes(4, "big") + encoded
    data += struct.pack(">d", gflops)
    return zlib.crc32(data)


def stored_value(gflops: float) -> float:
    """``gflops`` as it will be stored (and checksummed); a ``ValueError`` unless finite."""
    value = float(gflops)
    if not math.isfinite(value):
        raise ValueError(f"gflops must be a finite number, got {gflops!r}")
    return value + 0.0  # SQLite stores -0.0 as 0.0: checksum what will read back


def record_checksum(host: str, problem: str, tuner: str, schedule: str, gflops: float, budget: float, actions: str | None,
                    replays_on: str | None, found_by: str, reference: float | None = None, steps: str | None = None) -> int:
    """The checksum of a row of the records table: over every column but ``created`` (a NULL
    as the empty string, which neither text column ever holds; a NULL ``reference`` or
    ``steps`` left out, so that the rows of files older than those columns keep their
    checksums; ``steps`` marked apart, so that it cannot pass for a ``reference``)."""
    key = (host, problem, tuner, schedule, repr(budget), actions or "", replays_on or "", found_by)
    key += (() if reference is None else (repr(reference),)) + (() if steps is None else ("steps", steps))
    return row_checksum("records", key, gflops)


def steps_column(steps) -> str:
    """The records table's ``steps`` text of ``steps`` (Step values): the JSON list of their
    names (:func:`~looprl.ir.step.steps_text`, ``str(step)``)."""
    return json.dumps(steps_text(steps))


def column_steps(text: str) -> tuple[Step, ...]:
    """The steps a ``steps`` text (:func:`steps_column`) names; a ValueError where it is not
    such a text (a corrupt row)."""
    try:
        names = json.loads(text)
    except (TypeError, ValueError):
        raise ValueError(f"a records row's steps must be a JSON list of step names, got {text!r:.200}") from None
    return parse_steps(names)


def quoted(name: str) -> str:
    """An SQL identifier (a table name read from a database that may not be ours)."""
    return '"' + name.replace('"', '""') + '"'


def migrate(connection: sqlite3.Connection, *, fresh: bool) -> bool:
    """Inside the caller's transaction: check that the database is looprl's (``fresh``: may be
    still empty; else a ``ValueError`` saying what it is), mark it, create missing tables and
    migrate older ones; whether anything changed."""
    changed = False
    application_id = connection.execute("PRAGMA application_id").fetchone()[0]
    tables = {
        name: {row[1] for row in connection.execute(f"PRAGMA table_info({quoted(name)})")}
        for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if application_id != APPLICATION_ID:
        if application_id != 0:
            raise ValueError(f"is an SQLite database of another application (application_id {application_id})")
        legacy = "measurements" in tables and all(columns <= tables[name] for name, columns in _LEGACY_COLUMNS.items() if name in tables)
        if not legacy and not (fresh and not tables):
            raise ValueError("is an SQLite database without looprl's measurements table")
        connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        changed = True
    for name, ddl in TABLES.items():
        if name not in tables:
            connection.execute(ddl)
            changed = True
            if name == "records" and "tuned" in tables:
                _copy_tuned_rows(connection, tables["tuned"])
                _fill_steps(connection)
            continue
        if "checksum" not in tables[name]:
            _add_checksums(connection, name)
            changed = True
        for column, kind in ADDED_COLUMNS.get(name, ()):
            if column not in tables[name]:
                connection.execute(f"ALTER TABLE {name} ADD COLUMN {column} {kind}")
                changed = True
                if (name, column) == ("records", "steps"):
                    _fill_steps(connection)
    for name in TABLES:  # reads the tables: most corruption shows here, not mid-run
        connection.execute(f"SELECT count(*) FROM {name}").fetchone()
    return changed


def _add_checksums(connection: sqlite3.Connection, table: str) -> None:
    """Migrate an older table: add the column and checksum the rows it holds."""
    keys = KEY_COLUMNS[table]
    connection.execute(f"ALTER TABLE {table} ADD COLUMN checksum INTEGER")
    rows = connection.execute(f"SELECT rowid, gflops, {', '.join(keys)} FROM {table}").fetchall()
    connection.executemany(
        f"UPDATE {table} SET checksum = ? WHERE rowid = ?",
        [
            (row_checksum(table, tuple(key), value), rowid)
            for rowid, value, *key in rows
            if isinstance(value, float) and all(isinstance(field, str) for field in key)
        ],
    )


def _copy_tuned_rows(connection: sqlite3.Connection, columns: set[str]) -> None:
    """Migrate 0.2's ``tuned`` table into the records table: each row whose checksum holds (a
    row of a table older than checksums is trusted, as :func:`_add_checksums` trusts it), its
    problem column ``"name|tuner"`` split, its action path (a JSON list, or
    ``{"names": [...], "replays_on": kind}``) split into the names and the rewrite."""
    checksum = "checksum" if "checksum" in columns else "NULL"
    actions = "actions" if "actions" in columns else "NULL"
    rows = connection.execute(f"SELECT host, problem, schedule, gflops, budget, {checksum}, {actions} FROM tuned").fetchall()
    copied = []
    for host, problem, schedule, gflops, budget, stored, path in rows:
        if not (all(isinstance(f, str) for f in (host, problem, schedule)) and isinstance(gflops, float) and isinstance(budget, float)):
            continue
        if path is not None and not isinstance(path, str):
            continue
        key = (host, problem, schedule, repr(budget)) + (() if path is None else (path,))
        if checksum != "NULL" and stored != row_checksum("tuned", key, gflops):
            continue
        try:
            name, tuner, names, replays_on = legacy_fields(problem, None if path is None else json.loads(path))
        except ValueError:
            name, tuner, names, replays_on = legacy_fields(problem, None)
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            names, replays_on = None, None  # no path known (another version's form): tune again finds one
        names = None if names is None else json.dumps(names)
        copied.append((host, name, tuner, schedule, gflops, budget, names, replays_on, "measured", time.time(),
                       record_checksum(host, name, tuner, schedule, gflops, budget, names, replays_on, "measured")))
    connection.executemany("INSERT OR IGNORE INTO records (host, problem, tuner, schedule, gflops, budget, actions, replays_on, "
                           "found_by, created, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", copied)


def _fill_steps(connection: sqlite3.Connection) -> None:
    """Migrate records of before 0.5: give each row without steps whose checksum holds the steps
    its action path replays to and the schedule's key they reach
    (:func:`~looprl.measurement.records.upgraded_steps`), checksummed anew; a row without a step
    path is left as it is (read from its schedule's key), a row failing its checksum too (it
    reads as damaged)."""
    rows = connection.execute("SELECT rowid, host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, checksum, "
                              "reference FROM records WHERE steps IS NULL").fetchall()
    filled = []
    for rowid, host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, checksum, reference in rows:
        texts = (host, problem, tuner, schedule, found_by)
        if not (all(isinstance(t, str) for t in texts) and isinstance(gflops, float) and isinstance(budget, float)
                and isinstance(actions, str) and replays_on is None and isinstance(reference, (float, type(None)))):
            continue
        if checksum != record_checksum(host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by, reference):
            continue
        try:
            names = json.loads(actions)
        except ValueError:
            continue
        found = upgraded_steps(host, problem, schedule, names, replays_on)
        if found is None:
            continue
        schedule, steps = found[0], steps_column(found[1])
        filled.append((schedule, steps, record_checksum(host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by,
                                                        reference, steps), rowid))
    connection.executemany("UPDATE records SET schedule = ?, steps = ?, checksum = ? WHERE rowid = ?", filled)
