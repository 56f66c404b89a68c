"""A persistent measurement cache (SQLite), shared safely by concurrent processes.

Keyed by what makes two measurements comparable — the host (CPU model, LLVM, features), the
target the code was generated for, the code generator's version and the timing protocol (its
version and budget), and for a schedule with a parallel loop the thread count it ran on — then
the problem and the schedule: a value measured under other rules is never reused. A schedule
without a parallel loop runs on one thread whatever the caller's thread count, so it is stored
under the one-thread key (the key of every measurement made before threads existed). A value is not final: a state measured again keeps the best of its samples, and
the row counts them (``samples``), because timing on a shared machine is bimodal and noise only
ever slows a run down. The default location is ``$LOOPRL_CACHE_DIR`` or the
per-user cache directory (``$XDG_CACHE_HOME/looprl`` or ``~/.cache/looprl``), read when a
cache is created.

Whose file is it? looprl marks its databases with :data:`APPLICATION_ID` (SQLite's
``application_id``, stored at byte offset 68 of the file header), so a database can be
recognised from its first 100 bytes even when SQLite can no longer read it. The cache opens:

* a missing file: built beside the path and linked into place, so that other processes never
  see a half-made cache;
* a 0-byte file: initialised in place, with a warning;
* a file carrying the mark: used; if SQLite reports it corrupt, it is moved aside (with its
  ``-wal``/``-shm`` files) and a new cache started, with a warning naming both paths;
* an SQLite file without a mark (``application_id`` 0) holding looprl's ``measurements``
  table: a cache of an older looprl, adopted (marked and migrated, see below).

Anything else (a directory, device, FIFO, socket, a link to one, a non-empty file that is
not a looprl cache, a location that cannot be written) is a ``ValueError`` naming the path:
looprl never renames or deletes a file it did not create.

Every row carries a CRC32 ``checksum`` over its table, key and the exact 8 bytes of its value,
so that corruption SQLite does not notice (a flipped bit in a stored float) cannot return a
wrong measurement: a row that fails its checksum reads as missing, is deleted and counted in
``damaged`` (one warning per cache object); the rows still valid are kept. Migration of an
older cache adds the column and checksums its existing rows at that moment (they were
trusted before, and measurements are expensive to repeat); a row written afterwards without a
checksum (by an older looprl sharing the file) reads as missing, so it is measured again and
overwritten.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import sqlite3
import stat
import struct
import time
import warnings
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from looprl import defaults
from looprl.backend.codegen import CODEGEN_VERSION
from looprl.backend.host import host_fingerprint
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem, parse_problem
from looprl.measurement.timing import TIMING_PROTOCOL_VERSION, check_budget
from looprl.target import Target

APPLICATION_ID = 0x4C4F4F50  # b"LOOP": the mark of looprl's databases
_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_SIZE = 100

_TABLES = {
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
    # looprl.tune's answers: the best schedule found for a problem, and the search budget spent.
    "tuned": """CREATE TABLE tuned (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        budget REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        PRIMARY KEY (host, problem)
    )""",
}
_KEYS = {"measurements": ("host", "problem", "schedule"), "peaks": ("host",), "tuned": ("host", "problem")}
# The columns an older looprl's tables had: how an unmarked database is recognised as ours.
_LEGACY_COLUMNS = {"measurements": {"host", "problem", "schedule", "gflops", "created"}, "peaks": {"host", "gflops", "created"}}

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


def default_cache_dir() -> Path:
    explicit = os.environ.get("LOOPRL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "looprl"


def measurement_host() -> str:
    """The machine part of every key (CPU model, LLVM CPU and features, llvmlite)."""
    return host_fingerprint()


def _threads_suffix(threads) -> str:
    """The key's thread part: nothing for one thread (keys from before threads existed)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    return "" if threads == 1 else f"|threads-{threads}"


def measurement_key(target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1) -> str:
    """The cache's key for schedules measured on this host for ``target`` (None: the host's)
    by the timing protocol with ``budget_s`` seconds per state, on ``threads`` threads."""
    return _measurement_key(target, budget_s) + _threads_suffix(threads)  # checked outside the memo: True == 1


@lru_cache(maxsize=64)
def _measurement_key(target: Target | None, budget_s: float) -> str:
    target = Target.resolve(target)
    budget_ms = check_budget(budget_s) * 1000
    return f"{host_fingerprint()}|{target.key}|codegen-{CODEGEN_VERSION}|timing-v{TIMING_PROTOCOL_VERSION}-{budget_ms:g}ms"


def peak_key(target: Target | None = None, threads: int = 1) -> str:
    """The cache's key for the measured peak of ``target`` (None: the host's) on this host,
    on ``threads`` threads."""
    return _peak_key(target) + _threads_suffix(threads)


@lru_cache(maxsize=16)
def _peak_key(target: Target | None) -> str:
    return f"{host_fingerprint()}|{Target.resolve(target).key}|peak-timing-v{TIMING_PROTOCOL_VERSION}"


def schedule_threads(nest: LoopNest, threads: int) -> int:
    """The threads ``nest`` runs on when a caller offers ``threads``: 1 without a parallel loop."""
    return threads if nest.is_parallel else 1


@dataclass(frozen=True)
class CachedValue:
    """A stored measurement: the best GFLOPS of ``samples`` timings."""

    gflops: float
    samples: int


def row_checksum(table: str, key: tuple[str, ...], gflops: float) -> int:
    """CRC32 over the table name, the key fields (each length-prefixed, so fields cannot run
    into each other) and the value's exact IEEE-754 bytes."""
    data = bytearray()
    for field in (table, *key):
        encoded = field.encode("utf-8", "surrogatepass")
        data += len(encoded).to_bytes(4, "big") + encoded
    data += struct.pack(">d", gflops)
    return zlib.crc32(data)


def _like_prefix(text: str) -> str:
    """A LIKE pattern matching strings that start with ``text``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _error_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)  # Python >= 3.11
    return None if code is None else code & 0xFF  # the primary code of an extended one


def _is_busy(error: sqlite3.Error) -> bool:
    code = _error_code(error)
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED) if code is not None else "locked" in str(error)


def _is_corruption(error: sqlite3.Error) -> bool:
    code = _error_code(error)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    return "malformed" in str(error) or "not a database" in str(error)


def _file_kind(mode: int) -> str:
    for is_kind, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if is_kind(mode):
            return name
    return "not a regular file"


def _quoted(name: str) -> str:
    """An SQL identifier (a table name read from a database that may not be ours)."""
    return '"' + name.replace('"', '""') + '"'


def _stored_value(gflops: float) -> float:
    value = float(gflops)
    if not math.isfinite(value):
        raise ValueError(f"gflops must be a finite number, got {gflops!r}")
    return value + 0.0  # SQLite stores -0.0 as 0.0: checksum what will read back


class MeasurementCache:
    """``get``/``put`` GFLOPS of schedules on this host; ``path`` defaults to
    ``default_cache_dir() / "measurements.sqlite"``. Use ``":memory:"`` for a private cache.

    ``hits``/``misses`` count ``get`` calls; ``damaged`` counts rows discarded because their
    checksum did not match."""

    def __init__(self, path: str | os.PathLike | None = None, timeout_s: float = 30.0):
        if path is None:
            path = default_cache_dir() / "measurements.sqlite"
        self.path = os.fspath(path)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"cache path must be a non-empty file path, got {path!r}")
        self._timeout_s = timeout_s
        self.hits = 0
        self.misses = 0
        self.damaged = 0
        self._warned_damage = False
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._connection = self._open()

    # -- opening --------------------------------------------------------------
    def _connect(self, target: str) -> sqlite3.Connection:
        connection = sqlite3.connect(target, timeout=self._timeout_s, isolation_level=None)
        connection.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        return connection

    def _prepare(self, connection: sqlite3.Connection, *, fresh: bool) -> None:
        """Check that the database is looprl's (``fresh``: may be still empty), then mark it,
        create missing tables and migrate older ones, in one transaction; then WAL mode."""
        changed = False
        connection.execute("BEGIN IMMEDIATE")
        try:
            application_id = connection.execute("PRAGMA application_id").fetchone()[0]
            tables = {
                name: {row[1] for row in connection.execute(f"PRAGMA table_info({_quoted(name)})")}
                for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if application_id != APPLICATION_ID:
                if application_id != 0:
                    raise ValueError(f"is an SQLite database of another application (application_id {application_id})")
                legacy = "measurements" in tables and all(
                    columns <= tables[name] for name, columns in _LEGACY_COLUMNS.items() if name in tables
                )
                if not legacy and not (fresh and not tables):
                    raise ValueError("is an SQLite database without looprl's measurements table")
                connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                changed = True
            for name, ddl in _TABLES.items():
                if name not in tables:
                    connection.execute(ddl)
                    changed = True
                else:
                    if "checksum" not in tables[name]:
                        self._add_checksums(connection, name)
                        changed = True
                    if name == "measurements" and "samples" not in tables[name]:
                        connection.execute("ALTER TABLE measurements ADD COLUMN samples INTEGER")
                        changed = True
            for name in _TABLES:  # reads the tables: most corruption shows here, not mid-run
                connection.execute(f"SELECT count(*) FROM {name}").fetchone()
            connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise
        if self.path != ":memory:":
            connection.execute("PRAGMA journal_mode = WAL")
            if changed:  # write the mark into the file itself, not only the WAL
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

    @staticmethod
    def _add_checksums(connection: sqlite3.Connection, table: str) -> None:
        """Migrate an older table: add the column and checksum the rows it holds."""
        keys = _KEYS[table]
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

    def _inspect(self, target: str) -> tuple[os.stat_result, bytes] | None:
        """The existing file's status and header bytes, or None if there is none; a
        ``ValueError`` for anything but a regular file looprl may use."""
        try:
            status = os.stat(target)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise ValueError(f"cannot use {self.path} as the measurement cache: {error.strerror}") from error
        if not stat.S_ISREG(status.st_mode):
            raise ValueError(f"cannot use {self.path} as the measurement cache: it is {_file_kind(status.st_mode)}, not a regular file")
        try:  # O_NONBLOCK: never wait on a FIFO swapped in since the stat
            descriptor = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as error:
            raise ValueError(f"cannot use {self.path} as the measurement cache: {error.strerror}") from error
        with os.fdopen(descriptor, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise ValueError(f"cannot use {self.path} as the measurement cache: it is {_file_kind(status.st_mode)}, not a regular file")
            header = handle.read(_HEADER_SIZE)
        return status, header

    def _refuse(self, why: str) -> ValueError:
        return ValueError(
            f"{self.path} exists and is not a looprl measurement cache: it {why}. looprl never moves or overwrites "
            "files it did not create: pass another path (or remove the file yourself if it is a damaged cache)"
        )

    def _create(self, target: str) -> None:
        """Build an empty cache beside ``target`` and hard-link it into place: no process ever
        sees a half-made cache, and a cache that another process created first is kept."""
        scratch = f"{target}.new-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            connection = self._connect(scratch)
            try:
                self._prepare(connection, fresh=True)
            finally:
                connection.close()
            try:
                os.link(scratch, target)
            except FileExistsError:
                pass  # another process created it first: use theirs
            except OSError:  # a file system without hard links
                if not os.path.lexists(target):
                    os.replace(scratch, target)
        except (OSError, sqlite3.Error) as error:
            raise ValueError(f"cannot create the measurement cache {self.path}: {getattr(error, 'strerror', None) or error}") from error
        finally:
            for suffix in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.remove(scratch + suffix)

    def _open(self, may_rebuild: bool = True) -> sqlite3.Connection:
        if self.path == ":memory:":
            connection = self._connect(self.path)
            self._prepare(connection, fresh=True)
            return connection
        target = os.path.realpath(self.path)  # SQLite follows links too; move the file itself aside
        found = self._inspect(target)
        if found is None:
            self._create(target)
            found = self._inspect(target)
            if found is None:
                raise ValueError(f"cannot create the measurement cache {self.path}: it vanished after creation")
        status, header = found
        empty = len(header) == 0
        marked = False
        if empty:
            warnings.warn(
                f"measurement cache {self.path} is an empty (0-byte) file; initialising it in place", RuntimeWarning, stacklevel=3
            )
        elif len(header) < _HEADER_SIZE or not header.startswith(_SQLITE_MAGIC):
            raise self._refuse("is not an SQLite database")
        else:
            application_id = int.from_bytes(header[68:72], "big", signed=True)
            if application_id not in (0, APPLICATION_ID):
                raise self._refuse(f"is an SQLite database of another application (application_id {application_id})")
            marked = application_id == APPLICATION_ID
        self._identity = (status.st_dev, status.st_ino)
        try:
            connection = self._connect(target)
        except sqlite3.Error as error:
            raise ValueError(f"cannot open the measurement cache {self.path}: {error}") from error
        try:
            self._prepare(connection, fresh=empty)
        except ValueError as error:
            connection.close()
            raise self._refuse(str(error)) from None
        except sqlite3.Error as error:
            connection.close()
            if _is_busy(error):
                raise
            if not _is_corruption(error):
                raise ValueError(f"cannot open the measurement cache {self.path}: {error}") from error
            if not marked:
                raise self._refuse(f"is an SQLite database that SQLite reports as damaged ({error}) and carries no looprl mark") from error
            if not may_rebuild:
                raise ValueError(f"the rebuilt measurement cache {self.path} is corrupt at once ({error})") from error
            return self._rebuild(error)
        return connection

    def _rebuild(self, error: Exception) -> sqlite3.Connection:
        """Move the (recognised, corrupt) cache aside and start a new one, unless another
        process has replaced the file already."""
        if self.path == ":memory:":
            raise error
        target = os.path.realpath(self.path)
        try:
            current = os.stat(target)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == self._identity:
            aside = f"{target}.corrupt-{int(time.time())}-{os.getpid()}"
            try:
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(target + suffix, aside + suffix)
            except OSError as move_error:
                raise ValueError(
                    f"the measurement cache {self.path} is corrupt ({error}) and cannot be moved aside: {move_error.strerror}"
                ) from error
            warnings.warn(
                f"measurement cache {self.path} is corrupt ({error}); moved it to {aside} and started a new one",
                RuntimeWarning,
                stacklevel=4,
            )
        return self._open(may_rebuild=False)

    def _one(self, sql: str, params: tuple = ()):
        """Run one statement and fetch its (first) row; a corrupt cache is rebuilt and the
        statement run again."""
        try:
            return self._connection.execute(sql, params).fetchone()
        except sqlite3.DatabaseError as error:
            if not _is_corruption(error):
                raise
            self._connection.close()
            self._connection = self._rebuild(error)
            return self._connection.execute(sql, params).fetchone()

    # -- checked rows ---------------------------------------------------------
    def _read(self, table: str, key: tuple[str, ...]) -> CachedValue | None:
        """The stored value under ``key``, or None if there is none or it fails its checksum
        (then the row is deleted and counted in ``damaged``). The sample count is advisory
        (not checksummed): a damaged count only changes how soon a state is measured again."""
        where = " AND ".join(f"{column} = ?" for column in _KEYS[table])
        samples = "samples" if table == "measurements" else "1"
        row = self._one(f"SELECT gflops, checksum, {samples} FROM {table} WHERE {where}", key)
        if row is None:
            return None
        value, checksum, count = row
        if checksum is None:  # written by an older looprl: measure it again
            return None
        if isinstance(value, float) and checksum == row_checksum(table, key, value):
            return CachedValue(value, count if isinstance(count, int) and count > 0 else 1)
        self._one(f"DELETE FROM {table} WHERE {where} AND gflops IS ? AND checksum IS ?", (*key, value, checksum))
        self.damaged += 1
        if not self._warned_damage:
            self._warned_damage = True
            warnings.warn(
                f"measurement cache {self.path}: a stored value failed its checksum and was discarded "
                "(this cache object counts such rows in .damaged)",
                RuntimeWarning,
                stacklevel=3,
            )
        return None

    def _write(self, table: str, key: tuple[str, ...], gflops: float, samples: int = 1) -> None:
        value = _stored_value(gflops)
        columns = (*_KEYS[table], "gflops", "created", "checksum") + (("samples",) if table == "measurements" else ())
        values = (*key, value, time.time(), row_checksum(table, key, value)) + ((samples,) if table == "measurements" else ())
        self._one(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", values)

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
        value = self._read("measurements", self._key(nest, target, budget_s, threads))
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
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive integer, got {samples!r}")
        self._write("measurements", self._key(nest, target, budget_s, threads), gflops, samples)

    def add_sample(
        self, nest: LoopNest, gflops: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1
    ) -> CachedValue:
        """Record one more timing of ``nest``: the row keeps the best of its samples and
        counts them. Read and write happen in one transaction, so concurrent processes that
        add samples of the same state lose none."""
        key = self._key(nest, target, budget_s, threads)
        _stored_value(gflops)  # refuse a non-finite value before opening the transaction
        self._one("BEGIN IMMEDIATE")
        try:
            known = self._read("measurements", key)
            merged = CachedValue(gflops, 1) if known is None else CachedValue(max(known.gflops, gflops), known.samples + 1)
            self._write("measurements", key, merged.gflops, merged.samples)
            self._one("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._connection.execute("ROLLBACK")
            raise
        return merged

    def records(
        self, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, exclude_problem: str | None = None, threads: int = 1
    ) -> list[tuple[str, str, float]]:
        """Every valid ``(problem name, schedule key, GFLOPS)`` measured on this host for
        ``target`` with ``budget_s`` per state (a learned cost model's training data), in
        insertion order; rows failing their checksum are skipped. ``threads`` > 1: the
        parallel schedules measured on that many threads."""
        host = measurement_key(target, budget_s, threads)
        rows = self._connection.execute(
            "SELECT problem, schedule, gflops, checksum FROM measurements WHERE host = ? ORDER BY rowid", (host,)
        ).fetchall()
        return [
            (problem, schedule, value)
            for problem, schedule, value, checksum in rows
            if problem != exclude_problem and isinstance(value, float) and checksum == row_checksum("measurements", (host, problem, schedule), value)
        ]

    def __len__(self) -> int:
        """Schedules stored for this host (every target and protocol)."""
        return self._one("SELECT count(*) FROM measurements WHERE host LIKE ? ESCAPE '\\'", (_like_prefix(measurement_host()),))[0]

    # -- peak -----------------------------------------------------------------
    def get_peak(self, target: Target | None = None, threads: int = 1) -> float | None:
        """The stored peak of ``target`` (None: the host's) on ``threads`` threads of this
        host, or None."""
        value = self._read("peaks", (peak_key(target, threads),))
        return None if value is None else value.gflops

    def put_peak(self, gflops: float, target: Target | None = None, threads: int = 1) -> None:
        self._write("peaks", (peak_key(target, threads),), gflops)

    # -- tuned results ---------------------------------------------------------
    def get_tuned(self, problem_name: str, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
                  tuner: str = "", threads: int = 1) -> tuple[str, float, float] | None:
        """``(schedule key, GFLOPS, search budget)`` that :func:`looprl.tune` found for the
        problem on this host and ``target`` with ``budget_s`` per state and ``threads``
        threads offered (the answer may be serial), or None (also when the row fails its
        checksum). ``tuner`` names the tuning procedure's version: an answer stored by
        another version is not returned."""
        host = measurement_key(target, budget_s, threads)
        problem_name = _tuned_name(problem_name, tuner)
        row = self._one("SELECT schedule, gflops, budget, checksum FROM tuned WHERE host = ? AND problem = ?", (host, problem_name))
        if row is None:
            return None
        schedule, gflops, budget, checksum = row
        if not (isinstance(gflops, float) and isinstance(budget, float) and isinstance(schedule, str)):
            return None
        if checksum != row_checksum("tuned", (host, problem_name, schedule, repr(budget)), gflops):
            self.damaged += 1
            return None
        return schedule, gflops, budget

    def put_tuned(
        self, nest: LoopNest, gflops: float, search_budget_s: float, target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S,
        tuner: str = "", threads: int = 1,
    ) -> None:
        """Remember ``nest`` as :func:`looprl.tune`'s answer for its problem (and ``tuner``)
        when ``threads`` threads were offered."""
        host = measurement_key(target, budget_s, threads)
        value, budget = _stored_value(gflops), float(search_budget_s)
        problem_name = _tuned_name(nest.problem.name, tuner)
        checksum = row_checksum("tuned", (host, problem_name, nest.key, repr(budget)), value)
        self._one(
            "INSERT OR REPLACE INTO tuned (host, problem, schedule, gflops, budget, created, checksum) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (host, problem_name, nest.key, value, budget, time.time(), checksum),
        )

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "MeasurementCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        # Picklable for worker processes: reopen the same file there.
        return {"path": self.path, "timeout_s": self._timeout_s}

    def __setstate__(self, state) -> None:
        self.__init__(state["path"], state["timeout_s"])


def measured_nests(records) -> list[tuple[LoopNest, float]]:
    """``(nest, GFLOPS)`` of :meth:`MeasurementCache.records` rows (a cost model's training
    data); rows whose problem or schedule no longer parses (another looprl version's syntax)
    are skipped."""
    problems: dict[str, Problem] = {}
    result = []
    for name, key, gflops in records:
        try:
            problem = problems.get(name) or problems.setdefault(name, parse_problem(name))
            result.append((LoopNest.from_key(problem, key), float(gflops)))
        except ValueError:
            continue
    return result


def _tuned_name(problem_name: str, tuner: str) -> str:
    """The tuned table's problem column: the problem, and the tuner's version if given."""
    return f"{problem_name}|{tuner}" if tuner else problem_name
