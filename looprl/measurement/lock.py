"""A machine-wide lock around everything that times code, and how long anyone waits for a lock.

Several processes evaluate at once during training (env runners) and when searches run side
by side; a kernel timed while another process compiles or times on the other vCPU runs
measurably slower (on this 2-vCPU machine per-run GFLOPS split into two modes, ~1.5x apart).
Holding an exclusive ``flock`` on one file while compiling and timing serialises the
evaluations of every looprl process of this user on this machine. Where the lock
file cannot be created, timing goes on unlocked (with one warning).

No wait is unbounded. The process holding the lock writes into the lock file who it is (process
id, when it took the lock, its command line). A process that finds the lock held waits (asleep,
in a blocking ``flock``) up to :data:`TIMING_LOCK_WAIT_S` seconds (or the lock's ``wait_s``),
but only :data:`STOPPED_HOLDER_WAIT_S` for a holder that stays stopped (Ctrl-Z, SIGSTOP); after
:data:`WAIT_NOTICE_S` it warns who holds the lock, and when it gives up it raises
:class:`LockWaitTimeout` naming the holder: process id, command line, since when, and whether
it is stopped. The threads of one process share one lock object and wait for each other within
the same bound. :func:`locked_descriptor` is that wait for any ``flock`` (the search CSV's too);
the measurement cache's SQLite locks are bounded by its timeout and their holders named the
same way (:func:`describe_holders`).

``flock`` locks belong to an open file, so two lock objects on the same path in one process
would wait for each other: :func:`machine_lock` hands every caller of a process the same one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from looprl import checks
from looprl.errors import LoopRLError

# How long a timing waits for another process's before giving up (a module constant, read at
# each wait: a lock made with ``wait_s`` uses its own). One timing holds the lock for
# milliseconds to seconds, a timing of a huge untuned kernel (which runs it whole) for minutes.
TIMING_LOCK_WAIT_S = 600.0
# A holder that stays stopped (Ctrl-Z, SIGSTOP) this long is not waited for any longer: it
# will not let go until someone resumes it.
STOPPED_HOLDER_WAIT_S = 5.0
# After this long waiting, say once who holds the lock.
WAIT_NOTICE_S = 2.0
CHECK_INTERVAL_S = 0.5  # how often a wait looks whether the holders are stopped
_COMMAND_CHARS = 300  # of the holder's command line recorded in the lock file


class LockWaitTimeout(LoopRLError):
    """A lock stayed held by someone else past the time allowed to wait for it; the message
    names the holder."""


def default_lock_path() -> Path:
    """One lock per user and machine, whatever measurement cache a process uses."""
    return Path(tempfile.gettempdir()) / f"looprl-timing-{os.getuid()}.lock"


def _command_line(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return _one_line(raw.replace(b"\0", b" ").decode("utf-8", "replace")) or None


def _one_line(command: str) -> str:
    return " ".join(command.split())[:_COMMAND_CHARS]


def _process_state(pid: int) -> str | None:
    """'stopped' or 'being traced' for such a process, 'gone' if there is none, else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    state = stat.rpartition(")")[2].split()[:1]  # the field after the command name
    return {"T": "stopped", "t": "being traced"}.get(state[0] if state else "")


def describe_process(pid: int, command: str | None = None) -> str:
    """``pid 123 (python -m looprl.cli.search ..., stopped)``: what can be found about a process."""
    details = [part for part in (command or _command_line(pid), _process_state(pid)) if part]
    return f"pid {pid}" + (f" ({', '.join(details)})" if details else "")


def lock_holders(*paths: str | os.PathLike, writers_only: bool = False) -> list[int]:
    """The other processes holding a ``flock`` or POSIX lock on any of ``paths`` (as the
    kernel lists them in ``/proc/locks``; empty where it cannot be read). ``writers_only``:
    only exclusive (write) locks."""
    inodes = set()
    for path in paths:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(path).st_ino)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    holders = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":  # "->": a process waiting for the lock, not holding it
            continue
        kind, pid, device = fields[3], fields[4], fields[5]
        inode = device.rpartition(":")[2]
        if not (pid.isdigit() and inode.isdigit()) or int(inode) not in inodes or (writers_only and kind != "WRITE"):
            continue
        if int(pid) != os.getpid() and int(pid) not in holders:
            holders.append(int(pid))
    return holders


def describe_holders(*paths: str | os.PathLike) -> str:
    """Who holds a lock on ``paths``, for a message: the processes with write locks (or any
    locks) there, or that it cannot be told."""
    pids = lock_holders(*paths, writers_only=True) or lock_holders(*paths)
    if not pids:
        return "another process (which one cannot be told here)"
    return "; ".join(describe_process(pid) for pid in pids)


def locked_descriptor(path: str | os.PathLike, flags: int, operation: int, wait_s: float, what: str,
                      holder: Callable[[], str] | None = None, advice: str = "") -> int:
    """A new descriptor of ``path`` (opened with ``flags``) holding ``flock(operation)``
    (``fcntl.LOCK_EX`` or ``LOCK_SH``), waited for at most ``wait_s`` seconds, or
    :data:`STOPPED_HOLDER_WAIT_S` while every holder is stopped; else
    :class:`LockWaitTimeout` naming ``what`` and its holder (``holder()``, default: the
    processes :func:`describe_holders` finds), then ``advice``. After :data:`WAIT_NOTICE_S`
    of waiting it warns once who holds the lock.

    The wait sleeps in a blocking ``flock`` (woken as soon as the lock is free, unlike polling)
    in a helper thread: a lock it gets in time is handed over; one it gets too late is let go
    at once (its descriptor closed)."""
    describe = holder or (lambda: describe_holders(path))
    descriptor = os.open(path, flags, 0o644)
    try:
        fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
        return descriptor
    except BlockingIOError:
        pass
    except BaseException:
        os.close(descriptor)
        raise
    outcome: dict = {}
    decided = threading.Lock()  # the helper's result and the waiter's giving up exclude each other
    got = threading.Event()

    def take() -> None:
        try:
            fcntl.flock(descriptor, operation)
        except OSError as error:
            outcome["error"] = error
        with decided:
            if outcome.get("abandoned"):
                os.close(descriptor)  # too late: closing lets the lock go
                return
            got.set()

    threading.Thread(target=take, name="looprl-lock-wait", daemon=True).start()
    started = time.monotonic()
    deadline, stopped_since, noticed = started + wait_s, None, False
    while not got.wait(max(0.0, min(CHECK_INTERVAL_S, deadline - time.monotonic()))):
        now = time.monotonic()
        if now >= deadline:
            why = f"gave up after waiting {wait_s:g} s for {what}"
            break
        holders = lock_holders(path)
        if holders and all(_process_state(pid) == "stopped" for pid in holders):
            stopped_since = now if stopped_since is None else stopped_since
            if now - stopped_since >= STOPPED_HOLDER_WAIT_S:
                why = f"gave up waiting for {what} after {now - started:.0f} s: it stays stopped"
                break
        else:
            stopped_since = None
        if not noticed and now - started >= WAIT_NOTICE_S:
            noticed = True
            warnings.warn(f"waiting for {what}, held by {describe()}; giving up after {wait_s:g} s", RuntimeWarning, stacklevel=3)
    with decided:
        if not got.is_set():
            outcome["abandoned"] = True
            raise LockWaitTimeout(f"{why}; it is held by {describe()}" + (f". {advice}" if advice else ""))
    if "error" in outcome:
        os.close(descriptor)
        raise outcome["error"]
    return descriptor


class TimingLock:
    """``with lock:`` holds the lock file exclusively (re-entrant within one object, and safe
    to share between the threads of a process). Waits at most ``wait_s`` seconds (None:
    :data:`TIMING_LOCK_WAIT_S`) for another holder, then raises :class:`LockWaitTimeout`."""

    def __init__(self, path: str | os.PathLike | None = None, wait_s: float | None = None):
        wait_s = checks.seconds(wait_s, "wait_s", allow_zero=True, allow_none=True)
        self.path = Path(path) if path is not None else default_lock_path()
        self.wait_s = wait_s
        self._fd: int | None = None
        self._depth = 0
        self._broken = False
        self._thread_lock = threading.RLock()
        self._owner: tuple[str, float] | None = None  # (thread name, since) while a thread holds it

    def _wait_limit(self) -> float:
        return TIMING_LOCK_WAIT_S if self.wait_s is None else float(self.wait_s)

    def __enter__(self) -> "TimingLock":
        self._enter_thread()
        try:
            if self._depth == 0 and not self._broken:
                try:
                    if self._fd is None:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                    self._take_file_lock()
                except OSError as error:
                    self._broken = True
                    warnings.warn(f"timing without the machine-wide lock ({self.path}: {error})", RuntimeWarning, stacklevel=2)
        except BaseException:
            self._leave_thread()
            raise
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._leave_thread()

    # -- between the threads of this process -------------------------------------------
    def _enter_thread(self) -> None:
        if self._thread_lock.acquire(blocking=False):
            self._note_owner()
            return
        limit = self._wait_limit()
        if self._thread_lock.acquire(timeout=limit):
            self._note_owner()
            return
        owner = self._owner
        who = "another thread of this process" if owner is None else (
            f"thread {owner[0]!r} of this process since {_clock(owner[1])} ({time.time() - owner[1]:.0f} s ago)")
        raise LockWaitTimeout(f"gave up after waiting {limit:g} s for the timing lock {self.path}; it is held by {who}")

    def _note_owner(self) -> None:
        if self._depth == 0:
            self._owner = (threading.current_thread().name, time.time())

    def _leave_thread(self) -> None:
        if self._depth == 0:
            self._owner = None
        self._thread_lock.release()

    # -- between processes ----------------------------------------------------------------
    def _take_file_lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            locked = locked_descriptor(self.path, os.O_RDWR | os.O_CREAT, fcntl.LOCK_EX, self._wait_limit(),
                                       f"the machine-wide timing lock {self.path}", self.holder,
                                       "Resume that process if it is stopped (kill -CONT), or end it")
            os.close(self._fd)  # it held nothing: the new descriptor holds the lock
            self._fd = locked
        self._record_holder()

    def _record_holder(self) -> None:
        """Write who holds the lock into the lock file, for processes that find it held."""
        command = _one_line(" ".join(getattr(sys, "orig_argv", sys.argv)))
        record = f"{os.getpid()} {time.time():.3f} {command}\n".encode("utf-8", "replace")
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, record, 0)

    def holder(self) -> str:
        """Who holds the lock file now, as far as can be told: the process it names (if that
        process does hold it), when it took the lock and its command line."""
        try:
            with open(self.path, "rb") as handle:
                pid_text, _, rest = handle.read(4096).decode("utf-8", "replace").partition(" ")
            since_text, _, command = rest.partition(" ")
            pid, since = int(pid_text), float(since_text)
        except (OSError, ValueError):
            return describe_holders(self.path)
        holders = lock_holders(self.path)
        if holders and pid not in holders:  # stale record: someone holds it without saying so
            return describe_holders(self.path)
        return f"{describe_process(pid, command.strip() or None)} since {_clock(since)} ({time.time() - since:.0f} s ago)"

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __getstate__(self):  # a lock travels to other processes as its path only
        return {"path": self.path, "wait_s": self.wait_s}

    def __setstate__(self, state) -> None:
        self.__init__(state["path"], state.get("wait_s"))


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


@functools.cache
def _lock_for(path: Path, pid: int) -> TimingLock:
    # Keyed by process id too: a forked child must open its own file (a lock inherited
    # through fork would be the parent's lock, held or released for both).
    return TimingLock(path)


def machine_lock(path: str | os.PathLike | None = None) -> TimingLock:
    """This process's lock object for ``path`` (default: the per-user machine-wide lock file)."""
    return _lock_for(Path(path) if path is not None else default_lock_path(), os.getpid())
