"""Tuned answers in a file, to ship with a model: what :func:`looprl.tune` found, reused elsewhere.

``write_tuned_records(path, records)`` writes records of
:meth:`MeasurementCache.export_tuned <looprl.measurement.cache.MeasurementCache.export_tuned>`
as JSON (``{"format": "looprl-tuned-records", "version": 1, "cpu": ..., "records": [...]}``);
``read_tuned_records(path)`` reads them back for
:meth:`~looprl.measurement.cache.MeasurementCache.import_tuned`. Each record keeps the host key
it was measured under (CPU model and features, target, code generator and timing versions,
threads) and the tuner's version, so an imported answer is returned by ``tune`` only on a CPU of
the same kind with the same looprl; anywhere else the problem is tuned again (measured there),
not trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from looprl.backend.host import cpu_model_name
from looprl.output_paths import check_output_file

FORMAT = "looprl-tuned-records"
VERSION = 1


def write_tuned_records(path: str | os.PathLike, records: list[dict]) -> Path:
    """Write ``records`` to ``path`` (JSON, replaced atomically, missing folders created); the
    path. A path that cannot be written (a folder, a read-only place) is a ValueError naming
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
    """The records of a file :func:`write_tuned_records` wrote; a ValueError naming the file and
    what is wrong when it is not such a file (checked record by record on import)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"tuned records {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"tuned records {path}: not a JSON file ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"tuned records {path}: not a {FORMAT} file")
    if document.get("version") != VERSION:
        raise ValueError(f"tuned records {path}: version {document.get('version')!r}, this looprl reads version {VERSION}")
    records = document.get("records")
    if not isinstance(records, list):
        raise ValueError(f"tuned records {path}: 'records' must be a list")
    return records
