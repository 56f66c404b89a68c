"""What the command lines share: bad input as one line on stderr, and paths checked up front.

Every command runs its body through :func:`run_command`: a ``ValueError`` from anywhere inside
(a bad policy, problem, size or path) prints ``looprl-tune: error: <message>`` and exits with
status 2, argparse's status for bad usage. argparse's own usage errors are left as they are.
A command stopped by Ctrl-C or SIGTERM saves what it has done and exits with status 130.
The output and cache paths are checked before a run starts (:func:`writable_file`,
:func:`writable_folder`, :func:`cache_path`), so that a long run does not fail at its end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
_SQLITE_HEADER = b"SQLite format 3\x00"


def run_command(prog: str, body: Callable[[], int]) -> int:
    """``body()``; a ValueError becomes one line ``<prog>: error: <message>`` on stderr and exit status 2."""
    try:
        return body()
    except ValueError as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT


def one_line(error: BaseException) -> str:
    """The error's message on one line (its type's name if it has none)."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def _check_creatable(path: Path, option: str) -> None:
    """That ``path`` (which does not exist) can be created, missing folders included."""
    ancestor = path.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{option} {path}: cannot be created, {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot be created, folder {ancestor} is not writable")


def writable_file(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path if a file can be written there (None passes); else a ValueError naming ``option``."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path")
    if os.path.lexists(path):
        if not path.is_file():
            raise ValueError(f"{option} {path} is not a regular file")
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option} {path} is not writable")
        return path
    _check_creatable(path, option)
    return path


def writable_folder(path: str | Path | None, option: str) -> Path | None:
    """``path`` as a Path if files can be written in that folder, existing or not (None passes)."""
    if path is None:
        return None
    path = Path(path)
    if os.path.lexists(path):
        if not path.is_dir():
            raise ValueError(f"{option} {path} is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{option} {path} is not writable")
        return path
    _check_creatable(path, option)
    return path


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
