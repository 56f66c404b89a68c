"""Tuned-records files: what they hold, the version-1 files they replace, and what reading one
refuses (anything but a regular file under the size limit, deep JSON, impossible figures)."""

import json
import os

import pytest

import looprl
from looprl.measurement import tuned_records
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.schedule_record import MAX_GFLOPS, ScheduleRecord
from looprl.measurement.tuned_records import read_tuned_records, write_tuned_records


def _entry(**changes):
    return {"host": "cpu|avx2", "problem": "mm", "tuner": "tune-v8", "schedule": "s", "gflops": 12.5, "budget_s": 0.4,
            "actions": ["down"], "replays_on": None, "found_by": "tiles", **changes}


def test_records_go_through_a_file_and_back_into_a_cache(tmp_path):
    nest = looprl.initial_nest(looprl.matmul(8, 16, 8)).split(2, 8)
    source = MeasurementCache(":memory:")
    source.put_tuned(ScheduleRecord(nest, 12.5, ("down", "split_8"), "guided", budget_s=0.4, tuner="tune-vX"))
    path = write_tuned_records(tmp_path / "records.json", source.export_tuned())
    assert json.loads(path.read_text())["version"] == tuned_records.VERSION == 3
    destination = MeasurementCache(":memory:")
    assert destination.import_tuned(read_tuned_records(path)) == 1
    known = destination.get_tuned(nest.problem, tuner="tune-vX")
    assert (known.nest, known.gflops, known.actions, known.found_by, known.budget_s) == (nest, 12.5, ("down", "split_8"), "guided", 0.4)


def test_a_version_1_file_is_upgraded_on_read(tmp_path):
    path = tmp_path / "old.json"
    old = {"host": "h", "problem": "mm|tune-v8", "schedule": "s", "gflops": 3.0, "budget_s": 0.4,
           "actions": {"names": ["down"], "replays_on": "relaid twin"}}
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": 1, "records": [old, {**old, "actions": ["up"]}]}))
    first, second = read_tuned_records(path)
    assert first == {"host": "h", "problem": "mm", "tuner": "tune-v8", "schedule": "s", "gflops": 3.0, "budget_s": 0.4,
                     "actions": ["down"], "replays_on": "relaid twin", "found_by": "measured"}
    assert second["actions"] == ["up"] and second["replays_on"] is None
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": 7, "records": []}))
    with pytest.raises(ValueError, match=f"{path}: version 7"):
        read_tuned_records(path)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_only_a_regular_file_is_read(tmp_path, special):
    if special == "fifo":
        special = tmp_path / "fifo"
        os.mkfifo(special)  # opened without blocking: nobody writes to it
    elif special == "folder":
        special = tmp_path
    with pytest.raises(ValueError, match="not a regular file"):
        read_tuned_records(special)


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    path = write_tuned_records(tmp_path / "records.json", [_entry()] * 50)
    monkeypatch.setattr(tuned_records, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(ValueError, match=f"{path}: larger than"):
        read_tuned_records(path)


def test_deeply_nested_json_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"{path}: JSON nested deeper than"):
        read_tuned_records(path)
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": 2, "records": [_entry(host="[[[[[[[[[[")]}))
    assert read_tuned_records(path)[0]["host"] == "[[[[[[[[[["  # brackets inside strings do not count


@pytest.mark.parametrize("gflops", [1e12, MAX_GFLOPS * 1.01, float("nan"), 0.0, -3.0, "12"])
def test_an_impossible_figure_is_refused(tmp_path, gflops):
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": 2, "records": [_entry(gflops=gflops)]}))
    with pytest.raises(ValueError, match=f"{path}: record 0: gflops"):
        read_tuned_records(path)
