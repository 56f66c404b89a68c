"""Output paths checked before the work that fills them: a bad path is a ValueError at once,
naming the path, and nothing is left behind.

A path is checked by doing what writing it will do, then undoing it: the missing folders are
created, the file is created (or an existing one opened for appending, which changes nothing)
and what the check created is removed again. Permission bits alone cannot tell (root may
write anywhere they allow, yet not in ``/proc``, on a read-only file system or into an
immutable file).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _missing_folders(folder: Path, what: str, path: Path) -> list[Path]:
    """The folders from the nearest existing ancestor of ``folder`` down to it that do not
    exist, outermost first; a ValueError if that ancestor is not a folder."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"{what} {path}: cannot be created, {folder} is not a folder")
    return missing[::-1]


@contextlib.contextmanager
def _created_for_the_check(folders: list[Path]):
    """Create ``folders`` (outermost first) for the block, and remove them after it."""
    made = []
    try:
        for folder in folders:
            os.mkdir(folder)
            made.append(folder)
        yield
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path if a file can be written there, missing folders included; else a
    ValueError starting with ``what`` (e.g. ``--csv``, ``tuned records``). Nothing is changed."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file path")
    if os.path.lexists(path):
        if not path.is_file():
            raise ValueError(f"{what} {path} is not a regular file")
        try:  # O_NONBLOCK: never wait on a FIFO swapped in since the check above
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as error:
            raise ValueError(f"{what} {path} is not writable: {_reason(error)}") from None
        return path
    try:
        with _created_for_the_check(_missing_folders(path.parent, what, path)):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.remove(path)
    except OSError as error:
        raise ValueError(f"{what} {path} is not writable (creating it failed: {_reason(error)})") from None
    return path


def check_output_folder(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path if files can be written in that folder, existing or not; else a
    ValueError starting with ``what``. Nothing is changed."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{what} {path} is not a folder")
    try:
        with _created_for_the_check(_missing_folders(path, what, path)):
            descriptor, probe = tempfile.mkstemp(prefix=".looprl-check-", dir=path)
            os.close(descriptor)
            os.remove(probe)
    except OSError as error:
        raise ValueError(f"{what} {path} is not writable: {_reason(error)}") from None
    return path
