"""Tuned answers in a file, to ship with a model: what :func:`looprl.tune` found, reused elsewhere.

``write_tuned_records(path, records)`` writes records of
:meth:`MeasurementCache.export_tuned <looprl.measurement.cache.MeasurementCache.export_tuned>`
as JSON (``{"format": "looprl-tuned-records", "version": 3, "cpu": ..., "records": [...]}``, each
record a stored :class:`~looprl.measurement.schedule_record.ScheduleRecord` with its
schedule's steps, ``steps``: a list of step names, null where no step path is known);
``read_tuned_records(path)`` reads them back, checked, for
:meth:`~looprl.measurement.cache.MeasurementCache.import_tuned`. Each record keeps the host key
it was measured under (CPU model and features, target, code generator and timing versions,
threads) and the tuner's version, so an imported answer is returned by ``tune`` only on a CPU of
the same kind with the same looprl; anywhere else the problem is tuned again (measured there),
not trusted.

Version 1 (looprl 0.2) kept the tuner's version in the problem's name (``"name|tuner"``) and the
rewrite an action path replays on inside its actions: its files are read and their records
upgraded (:func:`~looprl.measurement.schedule_record.upgraded_entry`). Version 2 kept no steps:
its records (and version 1's) are given the steps of their action names when they are read
(:func:`~looprl.measurement.records.with_steps`). Any other version is a ValueError. A file is read only if it
is a regular file of at most :data:`MAX_BYTES`, its JSON nested at most :data:`MAX_DEPTH` deep,
and every record passes :func:`~looprl.measurement.schedule_record.checked_entry` (GFLOPS at
most :data:`~looprl.measurement.schedule_record.MAX_GFLOPS`); anything else is a ValueError
naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from pathlib import Path

import numpy as np

from looprl.backend.host import cpu_model_name
from looprl.measurement.records import with_steps
from looprl.measurement.schedule_record import checked_entry, upgraded_entry
from looprl.output_paths import check_output_file

FORMAT = "looprl-tuned-records"
# 3: records with their steps; 2: records of looprl.measurement.schedule_record without them; 1: looprl
# 0.2's (both upgraded on read)
VERSION = 3
MAX_BYTES = 64 * 2**20  # a model's records take kilobytes
MAX_DEPTH = 8  # {"records": [{"actions": [...]}]} is 3 deep
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def write_tuned_records(path: str | os.PathLike, records: list[dict]) -> Path:
    """Write ``records`` (stored records, as
    :meth:`~looprl.measurement.cache.MeasurementCache.export_tuned` gives them) to ``path``
    (JSON, replaced atomically, missing folders created); the path. A path that cannot be written (a folder, a read-only place) is a ValueError naming
    it, and nothing is written."""
    path = check_output_file(path, "tuned records")
    text = json.dumps({"format": FORMAT, "version": VERSION, "cpu": cpu_model_name(), "records": list(records)}, indent=1) + "\n"
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.remove(temporary)
        raise ValueError(f"tuned records {path}: cannot be written: {error.strerror or error}") from None
    return path


def read_tuned_records(path: str | os.PathLike) -> list[dict]:
    """The records of a file :func:`write_tuned_records` wrote (this version's, or version 1's
    or 2's upgraded), each checked; a ValueError naming the file and what is wrong when it is not such
    a file."""
    path = Path(path)
    try:
        document = json.loads(_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"tuned records {path}: not a JSON file ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"tuned records {path}: not a {FORMAT} file")
    version = document.get("version")
    if type(version) is not int or version not in (1, 2, VERSION):  # an integer: JSON's true is Python's True, which equals 1
        raise ValueError(f"tuned records {path}: version {version!r}, this looprl reads versions 1 to {VERSION}")
    records = document.get("records")
    if not isinstance(records, list):
        raise ValueError(f"tuned records {path}: 'records' must be a list")
    if version == 1:
        records = [upgraded_entry(record) for record in records]
    checked = [checked_entry(record, f"tuned records {path}: record {index}") for index, record in enumerate(records)]
    return checked if version == VERSION else [with_steps(record) for record in checked]


def _text(path: Path) -> str:
    """The file's text, if it is a regular file of at most :data:`MAX_BYTES` (opened without
    blocking: a FIFO put in its place after the check is not waited on) whose JSON nests at most
    :data:`MAX_DEPTH` deep."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(f"tuned records {path}: no such file") from None
    except OSError as error:
        raise ValueError(f"tuned records {path}: cannot be read: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ValueError(f"tuned records {path}: not a regular file")
    with os.fdopen(descriptor, "rb") as handle:
        try:
            data = handle.read(MAX_BYTES + 1)
        except OSError as error:
            raise ValueError(f"tuned records {path}: cannot be read: {error.strerror or error}") from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"tuned records {path}: larger than {MAX_BYTES // 2**20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"tuned records {path}: not a JSON file ({error})") from None
    if _depth(text) > MAX_DEPTH:
        raise ValueError(f"tuned records {path}: JSON nested deeper than {MAX_DEPTH} levels")
    return text


def _depth(text: str, chunk: int = 2**20) -> int:
    """How deep the brackets of JSON ``text`` nest (strings left out), counted in C in chunks."""
    brackets = np.frombuffer(_NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii"), np.uint8)
    deepest = depth = 0
    for start in range(0, len(brackets), chunk):
        part = brackets[start:start + chunk]
        running = depth + np.cumsum(np.where((part == ord("[")) | (part == ord("{")), 1, -1), dtype=np.int64)
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest
