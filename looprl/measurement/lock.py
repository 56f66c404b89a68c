"""A machine-wide lock around everything that times code.

Several processes evaluate at once during training (env runners) and when searches run side
by side; a kernel timed while another process compiles or times on the other vCPU runs
measurably slower (on this 2-vCPU machine per-run GFLOPS split into two modes, ~1.5x apart).
Holding an exclusive ``flock`` on one file while compiling and timing serialises the
evaluations of every looprl process of this user on this machine. Where the lock
file cannot be created, timing goes on unlocked (with one warning).

``flock`` locks belong to an open file, so two lock objects on the same path in one process
would wait for each other: :func:`machine_lock` hands every caller of a process the same one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import tempfile
import threading
import warnings
from pathlib import Path


def default_lock_path() -> Path:
    """One lock per user and machine, whatever measurement cache a process uses."""
    return Path(tempfile.gettempdir()) / f"looprl-timing-{os.getuid()}.lock"


class TimingLock:
    """``with lock:`` holds the lock file exclusively (re-entrant within one object, and safe
    to share between the threads of a process)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_lock_path()
        self._fd: int | None = None
        self._depth = 0
        self._broken = False
        self._thread_lock = threading.RLock()

    def __enter__(self) -> "TimingLock":
        self._thread_lock.acquire()
        if self._depth == 0 and not self._broken:
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError as error:
                self._broken = True
                warnings.warn(f"timing without the machine-wide lock ({self.path}: {error})", RuntimeWarning, stacklevel=2)
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __getstate__(self):  # a lock travels to other processes as its path only
        return {"path": self.path}

    def __setstate__(self, state) -> None:
        self.__init__(state["path"])


@functools.cache
def _lock_for(path: Path, pid: int) -> TimingLock:
    # Keyed by process id too: a forked child must open its own file (a lock inherited
    # through fork would be the parent's lock, held or released for both).
    return TimingLock(path)


def machine_lock(path: str | os.PathLike | None = None) -> TimingLock:
    """This process's lock object for ``path`` (default: the per-user machine-wide lock file)."""
    return _lock_for(Path(path) if path is not None else default_lock_path(), os.getpid())
