"""What the command lines share: bad input as one line on stderr, and paths checked up front.

Every command runs its body through :func:`run_command`: a ``ValueError`` from anywhere inside
(a bad policy, problem, size or path) prints ``looprl-tune: error: <message>`` and exits with
status 2, argparse's status for bad usage. argparse's own usage errors are left as they are.
A lock held by another process past the time allowed to wait for it
(:class:`~looprl.measurement.lock.LockWaitTimeout`) is one line too, with exit status 1.
Ctrl-C or SIGTERM stops a command with one line and exit status 130 (a command that saves
partial results does so first). The output and cache paths are checked before a run starts
(:func:`writable_file`, :func:`writable_folder`, :func:`cache_path`; see
:mod:`looprl.output_paths`), so that a long run does not fail at its end.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from looprl.interrupts import terminate_as_interrupt
from looprl.measurement.lock import LockWaitTimeout
from looprl.output_paths import check_output_file, check_output_folder

EXIT_FAILED = 1  # the command could not do its work (not bad input)
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
_SQLITE_HEADER = b"SQLite format 3\x00"


def run_command(prog: str, body: Callable[[], int]) -> int:
    """``body()`` with SIGTERM handled as Ctrl-C; a ValueError becomes one line
    ``<prog>: error: <message>`` on stderr and exit status 2, a LockWaitTimeout the same with
    status 1, and Ctrl-C or SIGTERM one line ``<prog>: interrupted`` and status 130."""
    try:
        with terminate_as_interrupt():
            return body()
    except ValueError as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except LockWaitTimeout as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def one_line(error: BaseException) -> str:
    """The error's message on one line (its type's name if it has none)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def writable_file(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path if a file can be written there (None passes); else a ValueError naming ``option``."""
    return None if path is None else check_output_file(path, option)


def writable_folder(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path if files can be written in that folder, existing or not (None passes)."""
    return None if path is None else check_output_folder(path, option)


def cache_path(cache: str | None, option: str = "--cache") -> str | None:
    """``cache`` if it can be a measurement cache: None (the per-user cache), ``:memory:``, a new
    file or an existing SQLite database. Anything else is refused rather than moved aside."""
    if cache is None or cache == ":memory:":
        return cache
    path = writable_file(cache, option)
    if path.exists() and path.stat().st_size > 0:
        try:
            with path.open("rb") as handle:
                header = handle.read(len(_SQLITE_HEADER))
        except OSError as error:
            raise ValueError(f"{option} {path} is unreadable: {error}") from error
        if header != _SQLITE_HEADER:
            raise ValueError(f"{option} {path} exists and is not an SQLite database")
    return cache
