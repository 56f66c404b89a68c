"""A persistent measurement cache (SQLite), shared safely by concurrent processes.

Keyed by host fingerprint (CPU, LLVM, code-generator version), problem and schedule, so a
schedule is measured once per machine. A corrupt or unreadable database is moved aside and
rebuilt with a warning. The default location is ``$LOOPRL_CACHE_DIR`` or the per-user cache
directory (``$XDG_CACHE_HOME/looprl`` or ``~/.cache/looprl``), read when a cache is created.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from pathlib import Path

from looprl.backend.codegen import CODEGEN_VERSION
from looprl.backend.jit import host_fingerprint
from looprl.ir.nest import LoopNest

_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    host TEXT NOT NULL,
    problem TEXT NOT NULL,
    schedule TEXT NOT NULL,
    gflops REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (host, problem, schedule)
);
CREATE TABLE IF NOT EXISTS peaks (
    host TEXT PRIMARY KEY,
    gflops REAL NOT NULL,
    created REAL NOT NULL
);
"""


def default_cache_dir() -> Path:
    explicit = os.environ.get("LOOPRL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "looprl"


def measurement_host() -> str:
    """The cache's host key: the machine plus the code generator's version."""
    return f"{host_fingerprint()}|codegen-{CODEGEN_VERSION}"


class MeasurementCache:
    """``get``/``put`` GFLOPS of schedules on this host; ``path`` defaults to
    ``default_cache_dir() / "measurements.sqlite"``. Use ``":memory:"`` for a private cache."""

    def __init__(self, path: str | os.PathLike | None = None, timeout_s: float = 30.0):
        if path is None:
            path = default_cache_dir() / "measurements.sqlite"
        self.path = str(path)
        self.host = measurement_host()
        self._timeout_s = timeout_s
        self.hits = 0
        self.misses = 0
        self._connection = self._open()

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
        connection.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
        if self.path != ":memory:":
            connection.execute("PRAGMA journal_mode = WAL")
        connection.executescript(_SCHEMA)
        connection.execute("SELECT count(*) FROM measurements").fetchone()
        return connection

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
                raise
            return self._rebuild(error)

    def _rebuild(self, error: Exception) -> sqlite3.Connection:
        if self.path == ":memory:":
            raise error
        aside = f"{self.path}.corrupt-{int(time.time())}-{os.getpid()}"
        warnings.warn(f"measurement cache {self.path} is unreadable ({error}); moved it to {aside} and starting a new one", RuntimeWarning, stacklevel=3)
        for suffix in ("", "-wal", "-shm"):
            try:
                os.replace(self.path + suffix, aside + suffix)
            except FileNotFoundError:
                pass
        return self._connect()

    def _execute(self, sql: str, params: tuple = ()):
        try:
            return self._connection.execute(sql, params)
        except sqlite3.DatabaseError as error:
            if isinstance(error, sqlite3.OperationalError) and "locked" in str(error):
                raise
            self._connection.close()
            self._connection = self._rebuild(error)
            return self._connection.execute(sql, params)

    # -- schedules ------------------------------------------------------------
    def get(self, nest: LoopNest) -> float | None:
        row = self._execute(
            "SELECT gflops FROM measurements WHERE host = ? AND problem = ? AND schedule = ?",
            (self.host, nest.problem.name, nest.key),
        ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return float(row[0])

    def put(self, nest: LoopNest, gflops: float) -> None:
        self._execute(
            "INSERT OR REPLACE INTO measurements (host, problem, schedule, gflops, created) VALUES (?, ?, ?, ?, ?)",
            (self.host, nest.problem.name, nest.key, float(gflops), time.time()),
        )

    def __len__(self) -> int:
        return self._execute("SELECT count(*) FROM measurements WHERE host = ?", (self.host,)).fetchone()[0]

    # -- peak -----------------------------------------------------------------
    def get_peak(self) -> float | None:
        row = self._execute("SELECT gflops FROM peaks WHERE host = ?", (self.host,)).fetchone()
        return None if row is None else float(row[0])

    def put_peak(self, gflops: float) -> None:
        self._execute(
            "INSERT OR REPLACE INTO peaks (host, gflops, created) VALUES (?, ?, ?)", (self.host, float(gflops), time.time())
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
