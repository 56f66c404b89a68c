"""The measurement cache's SQLite file: where it lives, how it is opened (recognised,
created, adopted or rebuilt), and its rows read and written with their checksums.

Whose file is it? looprl marks its databases with
:data:`~looprl.measurement.schema.APPLICATION_ID` (SQLite's
``application_id``, stored at byte offset 68 of the file header), so a database can be
recognised from its first 100 bytes even when SQLite can no longer read it. The store opens:

* a missing file: built beside the path and linked into place, so that other processes never
  see a half-made cache;
* a 0-byte file: initialised in place, with a warning;
* a file carrying the mark: used; if SQLite reports it corrupt, it is moved aside (with its
  ``-wal``/``-shm`` files) and a new cache started, with a warning naming both paths;
* an SQLite file without a mark (``application_id`` 0) holding looprl's ``measurements``
  table: a cache of an older looprl, adopted (marked and migrated:
  :func:`~looprl.measurement.schema.migrate`).

Anything else (a directory, device, FIFO, socket, a link to one, a non-empty file that is
not a looprl cache, a location that cannot be written) is a ``ValueError`` naming the path:
looprl never renames or deletes a file it did not create; a file that cannot be opened for
writing is a ``ValueError`` too (SQLite would open it read-only and fail at the first write). The
file is used in WAL mode, and every connection waits up to its timeout (30 s by default) for
another process's lock, then raises :class:`~looprl.measurement.lock.LockWaitTimeout` naming
the processes that hold it.

A row that fails its checksum (:func:`~looprl.measurement.schema.row_checksum`) reads as
missing, is deleted and counted in ``damaged`` (one warning per store); the rows still valid are
kept. The tables, their checksums and the migration of older files:
:mod:`looprl.measurement.schema`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from looprl.measurement.lock import LockWaitTimeout, describe_holders
from looprl.measurement.schema import APPLICATION_ID, KEY_COLUMNS, migrate, row_checksum, stored_value

_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_SIZE = 100

_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CANTOPEN = 3, 8, 14  # the file cannot be written


def default_cache_dir() -> Path:
    """``$LOOPRL_CACHE_DIR``, or the per-user cache directory (``$XDG_CACHE_HOME/looprl`` or
    ``~/.cache/looprl``), read at each call."""
    explicit = os.environ.get("LOOPRL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "looprl"


@dataclass(frozen=True)
class CachedValue:
    """A stored measurement: the best GFLOPS of ``samples`` timings."""

    gflops: float
    samples: int


def _error_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)  # Python >= 3.11
    return None if code is None else code & 0xFF  # the primary code of an extended one


def _is_busy(error: sqlite3.Error) -> bool:
    code = _error_code(error)
    return code in (_SQLITE_BUSY, _SQLITE_LOCKED) if code is not None else "locked" in str(error)


def _is_unwritable(error: sqlite3.Error) -> bool:
    code = _error_code(error)
    return code in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CANTOPEN) if code is not None else "readonly" in str(error)


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


class CacheStore:
    """One open connection to a measurement cache file (``":memory:"``: a private database):
    statements that survive a corrupt file (:meth:`one`), transactions, and rows read and
    written with their checksums. ``damaged`` counts rows discarded because their checksum did
    not match."""

    def __init__(self, path: str | os.PathLike | None = None, timeout_s: float = 30.0):
        if path is None:
            path = default_cache_dir() / "measurements.sqlite"
        self.path = os.fspath(path)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"cache path must be a non-empty file path, got {path!r}")
        self.timeout_s = timeout_s
        self.damaged = 0
        self._warned_damage = False
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._connection = self._open()

    # -- opening --------------------------------------------------------------
    def _connect(self, target: str) -> sqlite3.Connection:
        connection = sqlite3.connect(target, timeout=self.timeout_s, isolation_level=None)
        connection.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
        return connection

    def _prepare(self, connection: sqlite3.Connection, *, fresh: bool) -> None:
        """Check that the database is looprl's (``fresh``: may be still empty), then mark it,
        create missing tables and migrate older ones (:func:`~looprl.measurement.schema.migrate`),
        in one transaction; then WAL mode."""
        connection.execute("BEGIN IMMEDIATE")
        try:
            changed = migrate(connection, fresh=fresh)
            connection.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            raise
        if self.path != ":memory:":
            connection.execute("PRAGMA journal_mode = WAL")
            if changed:  # write the mark into the file itself, not only the WAL
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()

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
            descriptor = os.open(target, os.O_RDWR | getattr(os, "O_NONBLOCK", 0))
        except OSError as error:  # read-only (SQLite would open it so, and fail at the first write)
            raise ValueError(f"cannot use {self.path} as the measurement cache: it cannot be opened for writing ({error.strerror}); "
                             "looprl stores every measurement it takes: make it writable or pass another cache path") from error
        with os.fdopen(descriptor, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise ValueError(f"cannot use {self.path} as the measurement cache: it is {_file_kind(status.st_mode)}, not a regular file")
            try:  # a file that cannot be read like one (/proc/self/mem: EIO)
                header = handle.read(_HEADER_SIZE)
            except OSError as error:
                raise ValueError(f"cannot use {self.path} as the measurement cache: its first bytes cannot be read "
                                 f"({error.strerror or error})") from error
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
                f"measurement cache {self.path} is an empty (0-byte) file; initialising it in place", RuntimeWarning, stacklevel=4
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
            if _is_busy(error) or _is_unwritable(error):
                raise self._explained(error) from error
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
                stacklevel=5,
            )
        return self._open(may_rebuild=False)

    def _explained(self, error: sqlite3.Error) -> Exception:
        """What an SQLite error that is not corruption means for the user: a lock held past
        the timeout (:class:`LockWaitTimeout` naming the holders), a file that cannot be
        written (ValueError naming it), or the error itself."""
        if _is_busy(error):
            target = os.path.realpath(self.path)
            return LockWaitTimeout(
                f"gave up after waiting {self.timeout_s:g} s for the measurement cache {self.path}; it is locked by "
                f"{describe_holders(target, target + '-wal', target + '-shm')}"
            )
        if _is_unwritable(error):
            return ValueError(f"cannot write the measurement cache {self.path}: {error}")
        return error

    def one(self, sql: str, params: tuple = ()):
        """Run one statement and fetch its (first) row; a corrupt cache is rebuilt and the
        statement run again."""
        try:
            return self._connection.execute(sql, params).fetchone()
        except sqlite3.DatabaseError as error:
            if not _is_corruption(error):
                explained = self._explained(error)
                if explained is error:
                    raise
                raise explained from error
            self._connection.close()
            self._connection = self._rebuild(error)
            return self._connection.execute(sql, params).fetchone()

    def read(self, table: str, key: tuple[str, ...]) -> CachedValue | None:
        """The stored value under ``key``, or None if there is none or it fails its checksum
        (then the row is deleted and counted in ``damaged``). The sample count is advisory
        (not checksummed): a damaged count only changes how soon a state is measured again."""
        where = " AND ".join(f"{column} = ?" for column in KEY_COLUMNS[table])
        samples = "samples" if table == "measurements" else "1"
        row = self.one(f"SELECT gflops, checksum, {samples} FROM {table} WHERE {where}", key)
        if row is None:
            return None
        value, checksum, count = row
        if checksum is None:  # written by an older looprl: measure it again
            return None
        if isinstance(value, float) and checksum == row_checksum(table, key, value):
            return CachedValue(value, count if isinstance(count, int) and count > 0 else 1)
        self.one(f"DELETE FROM {table} WHERE {where} AND gflops IS ? AND checksum IS ?", (*key, value, checksum))
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

    def write(self, table: str, key: tuple[str, ...], gflops: float, samples: int = 1) -> None:
        """Store ``gflops`` (the best of ``samples`` timings, for the measurements table)
        under ``key`` with its checksum, replacing what was there."""
        value = stored_value(gflops)
        columns = (*KEY_COLUMNS[table], "gflops", "created", "checksum") + (("samples",) if table == "measurements" else ())
        values = (*key, value, time.time(), row_checksum(table, key, value)) + ((samples,) if table == "measurements" else ())
        self.one(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", values)

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Every row of one query (no rebuild: a corrupt file shows at the next :meth:`one`)."""
        try:
            return self._connection.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as error:
            explained = self._explained(error)
            if explained is error:
                raise
            raise explained from error

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE``): committed at the end of the block,
        rolled back if it raises."""
        self.one("BEGIN IMMEDIATE")
        try:
            yield
            self.one("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                self._connection.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._connection.close()
