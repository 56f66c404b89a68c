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

import json
import os
from pathlib import Path

from looprl.backend.host import cpu_model_name

FORMAT = "looprl-tuned-records"
VERSION = 1


def write_tuned_records(path: str | os.PathLike, records: list[dict]) -> Path:
    """Write ``records`` to ``path`` (JSON, replaced atomically); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "version": VERSION, "cpu": cpu_model_name(), "records": list(records)}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
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
