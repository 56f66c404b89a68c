"""Tune's answers are stored as their schedule's steps (the cache's schema 0.5, tuned-records files
of version 3): a cache of 0.4 (the records written at a56e7ac, ``tests/data/records_a56e7ac.json``,
as its rows) is upgraded when it is opened and its answers replay to the same kernels, with no
action replayed; an answer written now goes through the cache and a file with its steps; a row
whose steps do not read is a damaged row, never a crash."""

from __future__ import annotations

import json
import sqlite3

import pytest

import looprl
from looprl import parse_problem
from looprl.actions import ActionSet
from looprl.ir.action import action_steps
from looprl.ir.nest import LoopNest, initial_nest
from looprl.measurement import schedule_record, tuned_records
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import key_target, measurement_key
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.measurement.tuned_records import read_tuned_records, write_tuned_records
from looprl.target import TARGET_NAMES, Target
from tests.measurement.test_cache_schema import SCHEMA_0_4, _crc
from tests.measurement.test_records_replay import CHECKS, DOCUMENT, FIXTURE, expected_facts, kernel_facts, skip_unless_runnable, target_of

ENTRIES = DOCUMENT["records"]
# the fixture's records that name a step path: an action path replaying from the problem's own untuned nest
WITH_STEPS = [index for index, entry in enumerate(ENTRIES) if entry["actions"] is not None and entry["replays_on"] is None]


def _named_here(index: int) -> bool:
    """Whether record ``index``'s target is one this host's keys name exactly (its own or a named
    one): the others (the generating host's own, on another CPU) may get no steps when a file is
    upgraded here (:func:`~looprl.measurement.keys.key_target` gives their ISA's named target,
    whose plans may differ) and are then read as before, their action names replayed."""
    return target_of(CHECKS[index]["target"]) in (Target.host(), *map(Target.named, TARGET_NAMES))


def _host(index: int) -> str:
    """Record ``index``'s host key on this machine (the fixture's name another one's)."""
    check = CHECKS[index]
    return measurement_key(target_of(check["target"]), check["timing_budget_s"], check["threads"])


def _old_checksum(host, problem, tuner, schedule, gflops, budget, actions, replays_on, found_by):
    """A records row's checksum as looprl 0.4 wrote it (no reference, no steps), written out
    independently of the code."""
    return _crc("records", (host, problem, tuner, schedule, repr(budget), actions or "", replays_on or "", found_by), gflops)


def _steps_checksum(row: dict) -> int:
    """A records row's checksum with its steps (0.5): 0.4's fields, then ``"steps"`` and the text."""
    key = (row["host"], row["problem"], row["tuner"], row["schedule"], repr(row["budget"]), row["actions"] or "",
           row["replays_on"] or "", row["found_by"], "steps", row["steps"])
    return _crc("records", key, row["gflops"])


@pytest.fixture
def file_of_0_4(tmp_path):
    """A cache file of looprl 0.4 holding the fixture's records, keyed to this host."""
    path = tmp_path / "v0_4.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1280266064")
    for ddl in SCHEMA_0_4:
        connection.execute(ddl)
    for index, entry in enumerate(ENTRIES):
        actions = None if entry["actions"] is None else json.dumps(entry["actions"])
        fields = (_host(index), entry["problem"], entry["tuner"], entry["schedule"], float(entry["gflops"]), float(entry["budget_s"]),
                  actions, entry["replays_on"], entry["found_by"])
        connection.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (*fields, 1.7e9, _old_checksum(*fields), None))
    connection.commit()
    connection.close()
    return path


def _stored(path) -> dict:
    """The records table's rows by problem and host: dicts of its columns."""
    with sqlite3.connect(path) as connection:
        connection.row_factory = sqlite3.Row
        return {(row["problem"], row["host"]): dict(row) for row in connection.execute("SELECT * FROM records")}


def _read(cache: MeasurementCache, index: int) -> ScheduleRecord | None:
    check = CHECKS[index]
    return cache.get_tuned(parse_problem(check["problem"]), target_of(check["target"]), check["timing_budget_s"], tuner=check["tuner"],
                           threads=check["threads"])


def _as_read_before(index: int) -> ScheduleRecord:
    """Record ``index`` as looprl read it before records kept steps: its schedule's key, its steps
    its action names replayed."""
    entry, check = ENTRIES[index], CHECKS[index]
    nest = LoopNest.from_key(parse_problem(entry["problem"]), entry["schedule"])
    actions = None if entry["actions"] is None else tuple(entry["actions"])
    return ScheduleRecord(nest, 1.0, actions, target=target_of(check["target"]), replays_on=entry["replays_on"])


def _forbid_action_replay(monkeypatch):
    """Make every way of replaying action names raise: an action set, and the records' upgrade
    from action names (its memo cleared, so that an earlier replay is not reused)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a record was read by replaying its action names")
    monkeypatch.setattr(ActionSet, "__init__", refuse)
    monkeypatch.setattr(ActionSet, "covering", classmethod(refuse))
    monkeypatch.setattr(schedule_record, "action_steps", refuse)
    for memo in ("_steps_of", "_reaches"):
        getattr(getattr(schedule_record, memo, None), "cache_clear", lambda: None)()


# -- a cache of 0.4 ------------------------------------------------------------------------------
def test_a_0_4_file_gets_the_steps_of_its_action_paths_when_opened(file_of_0_4):
    MeasurementCache(file_of_0_4).close()
    rows = _stored(file_of_0_4)
    assert len(rows) == len(ENTRIES)
    for index, entry in enumerate(ENTRIES):
        row = rows[(entry["problem"], _host(index))]
        if index not in WITH_STEPS:  # no action path, or one from another start: read from its schedule's key
            assert row["steps"] is None and row["schedule"] == entry["schedule"], CHECKS[index]["case"]
            continue
        if row["steps"] is None and not _named_here(index):
            continue
        before = _as_read_before(index)
        assert json.loads(row["steps"]) == [str(step) for step in before.steps], CHECKS[index]["case"]
        assert row["schedule"] == before.nest.key  # the schedule the steps reach (a bfloat16 weight's pair step added)
        assert row["checksum"] == _steps_checksum(row)
    with MeasurementCache(file_of_0_4) as cache:  # opened again: nothing left to fill
        assert cache.damaged == 0
    assert _stored(file_of_0_4) == rows


def test_the_answers_of_a_0_4_file_read_back_as_before_without_replaying_an_action(file_of_0_4, monkeypatch):
    MeasurementCache(file_of_0_4).close()  # upgraded (the action paths replayed once, here)
    before = {index: _as_read_before(index) for index in range(len(ENTRIES)) if _named_here(index)}
    _forbid_action_replay(monkeypatch)
    with MeasurementCache(file_of_0_4) as cache:
        for index, expected in before.items():
            record = _read(cache, index)
            assert record is not None, CHECKS[index]["case"]
            assert (record.nest.key, record.steps, record.actions) == (expected.nest.key, expected.steps, expected.actions)
            if record.steps is not None:
                assert initial_nest(record.problem).apply(record.steps) == record.nest
        assert cache.damaged == 0


# a plan with packed operands, a cursor path with pack and pad, a bfloat16 weight whose pair step the upgrade adds
@pytest.mark.parametrize("index", [4, 5, 15], ids=[CHECKS[index]["case"] for index in (4, 5, 15)])
def test_an_upgraded_answer_compiles_to_the_same_kernel(file_of_0_4, index):
    check = CHECKS[index]
    target = target_of(check["target"])
    skip_unless_runnable(target, check["threads"])
    with MeasurementCache(file_of_0_4) as cache:
        record = _read(cache, index)
    assert record.steps is not None and kernel_facts(record.nest, target, check["threads"]) == expected_facts(check)


def test_a_damaged_row_of_a_0_4_file_is_left_to_read_as_damaged(tmp_path):
    path = tmp_path / "v0_4.sqlite"
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16)).split(0, 4)
    host = measurement_key("avx2", 0.008)
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1280266064")
    for ddl in SCHEMA_0_4:
        connection.execute(ddl)
    fields = (host, nest.problem.name, "v1", nest.key, 11.0, 2.0, '["split_4"]', None, "guided")
    damaged = (*fields, 1.7e9, _old_checksum(*fields) ^ 1, None)
    connection.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", damaged)
    connection.commit()
    connection.close()
    with MeasurementCache(path) as cache:
        assert cache.get_tuned(nest.problem, "avx2", 0.008, tuner="v1") is None and cache.damaged == 1
    assert next(iter(_stored(path).values()))["steps"] is None


# -- an answer written now -----------------------------------------------------------------------
def _packed_answer(actions: bool = True) -> ScheduleRecord:
    """Record 5's schedule (a cursor path with a pack and a pad), made now for AVX2."""
    problem, target = parse_problem(ENTRIES[5]["problem"]), Target.named("avx2")
    steps = action_steps(problem, tuple(ENTRIES[5]["actions"]), target)
    assert any(step.is_layout for step in steps)
    return ScheduleRecord(initial_nest(problem).apply(steps), 5.0, tuple(ENTRIES[5]["actions"]) if actions else None, "rollout", target,
                          budget_s=0.4, tuner="tune-vX", steps=steps)


@pytest.mark.parametrize("actions", [True, False], ids=["with its actions", "steps alone"])
def test_an_answer_goes_through_the_cache_and_a_file_with_its_steps(tmp_path, monkeypatch, actions):
    answer = _packed_answer(actions)
    path = tmp_path / "cache.sqlite"
    with MeasurementCache(path) as cache:
        cache.put_tuned(answer, 0.008)
        exported = cache.export_tuned()
    (row,) = _stored(path).values()
    assert json.loads(row["steps"]) == [str(step) for step in answer.steps] and row["checksum"] == _steps_checksum(row)
    assert exported[0]["steps"] == [str(step) for step in answer.steps] and exported[0]["schedule"] == answer.nest.key
    shipped = write_tuned_records(tmp_path / "records.json", exported)
    assert json.loads(shipped.read_text())["version"] == tuned_records.VERSION == 3
    _forbid_action_replay(monkeypatch)
    with MeasurementCache(path) as cache, MeasurementCache(":memory:") as elsewhere:
        assert elsewhere.import_tuned(read_tuned_records(shipped)) == 1
        for known in (cache.get_tuned(answer.problem, "avx2", 0.008, tuner="tune-vX"),
                      elsewhere.get_tuned(answer.problem, "avx2", 0.008, tuner="tune-vX")):
            assert (known.nest, known.steps, known.actions, known.gflops) == (answer.nest, answer.steps, answer.actions, 5.0)


def _tamper(path, steps: str, checksummed: bool) -> None:
    """Replace the only records row's steps with ``steps``, its checksum made to match or left."""
    with sqlite3.connect(path) as connection:
        connection.row_factory = sqlite3.Row
        row = dict(connection.execute("SELECT * FROM records").fetchone())
        row["steps"] = steps
        checksum = _steps_checksum(row) if checksummed else row["checksum"]
        connection.execute("UPDATE records SET steps = ?, checksum = ?", (steps, checksum))


@pytest.mark.parametrize("steps", ["not json", '{"split": 1}', '["split(0, 4)", "bogus(1)"]', '["split(0,4)"]', "[1]", '"split(0, 4)"'])
@pytest.mark.parametrize("checksummed", [True, False], ids=["checksum matches", "checksum fails"])
def test_a_row_whose_steps_do_not_read_is_a_damaged_row(tmp_path, steps, checksummed):
    path = tmp_path / "cache.sqlite"
    answer = _packed_answer()
    with MeasurementCache(path) as cache:
        cache.put_tuned(answer, 0.008)
    _tamper(path, steps, checksummed)
    with MeasurementCache(path) as cache:
        assert cache.get_tuned(answer.problem, "avx2", 0.008, tuner="tune-vX") is None and cache.damaged == 1
        assert cache.export_tuned() == []
        cache.put_tuned(answer, 0.008)  # tuned again: the row is replaced
        assert cache.get_tuned(answer.problem, "avx2", 0.008, tuner="tune-vX").steps == answer.steps


def test_steps_that_do_not_reach_the_schedule_are_not_served(tmp_path):
    """Steps that read but reach another schedule than the row's (another IR version's
    meaning of them): not served, as a schedule this looprl cannot read is not."""
    path = tmp_path / "cache.sqlite"
    answer = _packed_answer()
    with MeasurementCache(path) as cache:
        cache.put_tuned(answer, 0.008)
    _tamper(path, json.dumps([str(step) for step in answer.steps[:-1]]), checksummed=True)
    with MeasurementCache(path) as cache:
        assert cache.get_tuned(answer.problem, "avx2", 0.008, tuner="tune-vX") is None


# -- tuned-records files -------------------------------------------------------------------------
def test_a_version_2_file_gets_the_steps_of_its_action_paths_when_read():
    entries = read_tuned_records(FIXTURE)
    for index, entry in enumerate(entries):
        if index in WITH_STEPS and ("steps" in entry or _named_here(index)):
            expected = _as_read_before(index)
            names = [str(step) for step in expected.steps]
            assert (entry["steps"], entry["schedule"]) == (names, expected.nest.key), CHECKS[index]["case"]
        else:
            assert "steps" not in entry and entry["schedule"] == ENTRIES[index]["schedule"]


def test_a_record_of_another_machines_own_target_gets_steps_only_where_its_isas_plans_give_them(monkeypatch):
    """Read where this host is another machine (its own target an AVX2 one): the fixture's records
    of the generating host's own target are upgraded with the named AVX-512 target's plans. A
    register-tile plan is the same there (steps); a bfloat16 dot-product plan is not (no
    AVX512_BF16 there: no steps), and that record is read as before, its names replayed for its
    own target when it is asked for."""
    monkeypatch.setattr(Target, "host", classmethod(lambda cls: Target.named("avx2")))
    cases = [check.get("case") for check in CHECKS]
    tile, dot = cases.index("linear64-bf16-twin-host"), cases.index("linear4-bf16-dot-host")
    entries = read_tuned_records(FIXTURE)
    assert entries[tile]["steps"] == [str(step) for step in _as_read_before(tile).steps]
    assert "steps" not in entries[dot] and entries[dot]["schedule"] == ENTRIES[dot]["schedule"]
    with MeasurementCache(":memory:") as cache:
        cache.import_tuned([dict(entries[dot], host=_host(dot))])
        record = _read(cache, dot)
    before = _as_read_before(dot)
    assert (record.nest.key, record.steps) == (before.nest.key, before.steps) and record.steps is not None


@pytest.mark.parametrize("version", [4, 0, -3])
def test_a_file_of_another_version_is_refused(tmp_path, version):
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": version, "records": []}))
    with pytest.raises(ValueError, match=f"{path}: version {version}, this looprl reads versions 1 to 3"):
        read_tuned_records(path)


def test_the_target_of_a_host_key():
    for name in ("avx2", "avx512", "sse4"):
        assert key_target(measurement_key(name, 0.008, threads=2)) == Target.named(name)
    assert key_target(measurement_key(Target.host(), 0.008)) == Target.host()
    foreign = "Some CPU|znver9|0123456789ab|x86_64|llvmlite-0.1|avx512|znver9|ba9876543210|fma|codegen-1|timing-v2-8ms"
    assert key_target(foreign) == Target.named("avx512")  # another machine's own target: its ISA's lanes and registers
    assert key_target("not a key") is None and key_target("a|b|codegen-1") is None
    assert key_target("h|x|y|z|w|avx9|c|d|fma|codegen-1") is None
