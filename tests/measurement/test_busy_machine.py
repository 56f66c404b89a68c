"""A busy moment is not remembered as the machine's speed (issue 60, item 2).

The machine's load is simulated with a slowed timer: the common timing rule
(``looprl.measurement.timing.best_time``) is replaced by one that runs the computation once and
reports it at :data:`SPEED` GFLOPS divided by a slowdown the test sets (3: other work makes every
kernel look 3x slower). No wall-clock figure is asserted."""

import sqlite3
import struct
import zlib
from dataclasses import replace

import pytest

import looprl
from looprl.cli import tune as tune_cli
from looprl.measurement import load, numpy_baseline, timing
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.keys import measurement_key
from looprl.measurement.load import BUSY_RATIO, LoadReading, busiest, check_load, retime_remembered
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target
from tests.policies import random_policy

SPEED = 100.0  # GFLOPS every kernel runs at on the quiet simulated machine
HOST = Target.resolve(None)


class SlowedTimer:
    """Stands in for ``timing.best_time``: runs ``call`` once, reports ``SPEED / slowdown``."""

    def __init__(self):
        self.slowdown = 1.0
        self.calls = 0

    def __call__(self, call, budget_s, *, flops=0, min_runs=3, lock=None):
        call(1)
        self.calls += 1
        return timing.Timing(flops / (SPEED * 1e9) * self.slowdown, 1, 1, flops)


@pytest.fixture
def timer(monkeypatch):
    fake = SlowedTimer()
    monkeypatch.setattr(timing, "best_time", fake)
    return fake


@pytest.fixture
def cache():
    with MeasurementCache(":memory:") as store:
        yield store


def _nest():
    return looprl.initial_nest(looprl.matmul(16, 16, 16)).split(0, 4)


def _answer(reference=None, gflops=40.0):
    return ScheduleRecord(_nest(), gflops, ("split_4",), "guided", HOST, 1, 0.4, "tune-vX", reference_gflops=reference)


# -- readings ----------------------------------------------------------------------------------
def test_a_reading_under_a_3x_slowed_timer_says_busy(timer, cache):
    quiet = check_load(HOST, cache)
    assert (quiet.reference_gflops, quiet.quiet_gflops, quiet.ratio, quiet.busy) == (pytest.approx(SPEED), pytest.approx(SPEED), 1.0, False)
    timer.slowdown = 3.0
    busy = check_load(HOST, cache)
    assert busy.busy and busy.ratio == pytest.approx(1 / 3)
    assert busy.quiet_gflops == pytest.approx(SPEED) == cache.get_quiet(HOST)  # a slow reading leaves the quiet figure
    assert busy.describe() == "reference kernel at 0.33x its quiet speed"
    assert timer.calls == 2  # the reference kernel went through the common timing rule


def test_the_first_reading_is_the_quiet_figure_until_a_faster_one_is_seen(timer, cache):
    timer.slowdown = 3.0
    first = check_load(HOST, cache)  # taken under load: nothing to compare it with yet
    assert not first.busy and cache.get_quiet(HOST) == pytest.approx(SPEED / 3)
    timer.slowdown = 1.0
    assert not check_load(HOST, cache).busy and cache.get_quiet(HOST) == pytest.approx(SPEED)  # the best seen wins
    timer.slowdown = 3.0
    assert check_load(HOST, cache).busy


def test_the_quiet_figure_is_kept_per_thread_count_and_timing_key(timer, cache):
    check_load(HOST, cache)
    assert cache.get_quiet(HOST, threads=1) == pytest.approx(SPEED)
    assert cache.get_quiet(HOST, threads=2) is None and cache.get_quiet(HOST, budget_s=0.5) is None


def test_busiest_is_the_lowest_ratio_and_bad_readings_are_refused():
    calm, loaded = LoadReading(90.0, 100.0), LoadReading(40.0, 100.0)
    assert busiest(calm, loaded) is loaded and busiest(calm) is calm
    assert not calm.busy and loaded.busy and LoadReading(BUSY_RATIO * 100, 100.0).busy is False
    for bad in [(0.0, 1.0), (-1.0, 1.0), (1.0, float("nan")), (True, 1.0), ("1", 1.0), (2.0, 1.0)]:
        with pytest.raises(ValueError):
            LoadReading(*bad)
    with pytest.raises(ValueError):
        busiest()
    with pytest.raises(ValueError):
        busiest(calm, 0.5)


def test_a_real_reading_is_a_share_of_the_best_seen(cache):
    readings = [check_load(HOST, cache) for _ in range(2)]
    assert all(0 < reading.ratio <= 1 and reading.reference_gflops > 0 for reading in readings)
    assert readings[1].quiet_gflops == max(r.reference_gflops for r in readings) == cache.get_quiet(HOST)


def test_a_bad_reading_is_refused_by_the_cache(cache):
    for bad in (float("nan"), 0.0, -3.0, float("inf")):
        with pytest.raises(ValueError, match="reference reading"):
            cache.note_reference(bad, HOST)


# -- answers remembered ------------------------------------------------------------------------------
def test_an_answer_found_on_a_busy_machine_is_not_served_as_final(timer, cache):
    check_load(HOST, cache)
    timer.slowdown = 3.0
    busy = check_load(HOST, cache)
    cache.put_tuned(_answer(busy.reference_gflops))
    assert cache.get_tuned(_nest().problem, tuner="tune-vX") is None  # so tune searches again
    provisional = cache.get_tuned(_nest().problem, tuner="tune-vX", provisional=True)
    assert provisional.reference_gflops == pytest.approx(SPEED / 3) and provisional.nest == _nest()
    assert cache.tuned_load(provisional).busy and cache.tuned_load(provisional).ratio == pytest.approx(1 / 3)
    assert cache.export_tuned() == []  # a provisional answer is not shipped as final
    timer.slowdown = 1.0
    cache.put_tuned(_answer(check_load(HOST, cache).reference_gflops))  # searched again, quiet: replaces it
    final = cache.get_tuned(_nest().problem, tuner="tune-vX")
    assert final is not None and not cache.tuned_load(final).busy
    assert [entry["problem"] for entry in cache.export_tuned()] == [_nest().problem.name]
    assert "reference" not in cache.export_tuned()[0]


def test_an_answer_of_a_busy_first_run_turns_provisional_once_a_quiet_reading_is_seen(timer, cache):
    timer.slowdown = 3.0
    cache.put_tuned(_answer(check_load(HOST, cache).reference_gflops))
    assert cache.get_tuned(_nest().problem, tuner="tune-vX") is not None  # nothing showed the load yet
    timer.slowdown = 1.0
    check_load(HOST, cache)
    assert cache.get_tuned(_nest().problem, tuner="tune-vX") is None


def test_an_answer_not_checked_for_load_is_final(timer, cache):
    check_load(HOST, cache)
    cache.put_tuned(_answer(None))
    known = cache.get_tuned(_nest().problem, tuner="tune-vX")
    assert known.reference_gflops is None and cache.tuned_load(known) is None


def test_a_bad_reference_is_refused_and_nothing_is_stored(cache):
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="reference_gflops"):
            cache.put_tuned(_answer(bad))
    assert cache.get_tuned(_nest().problem, tuner="tune-vX", provisional=True) is None


def test_the_reference_is_checksummed_and_survives_a_reopen(tmp_path):
    path = tmp_path / "c.sqlite"
    with MeasurementCache(path) as store:
        store.note_reference(SPEED, HOST)
        store.put_tuned(_answer(SPEED / 2))
    with MeasurementCache(path) as store:
        assert store.get_tuned(_nest().problem, tuner="tune-vX") is None
        assert store.get_tuned(_nest().problem, tuner="tune-vX", provisional=True).reference_gflops == SPEED / 2
    with sqlite3.connect(path) as connection:  # a flipped figure could turn a provisional answer final
        connection.execute("UPDATE records SET reference = ?", (SPEED,))
    with MeasurementCache(path) as store:
        assert store.get_tuned(_nest().problem, tuner="tune-vX", provisional=True) is None and store.damaged == 1


def _crc(table, key, value):
    """The row checksum, written out independently of the code (see tests/measurement/test_cache_schema.py)."""
    data = b"".join(len(field.encode()).to_bytes(4, "big") + field.encode() for field in (table, *key))
    return zlib.crc32(data + struct.pack(">d", value))


# The records table as looprl 0.3 wrote it (written out here: the code's schema has moved on).
RECORDS_0_3 = """CREATE TABLE records (
    host TEXT NOT NULL, problem TEXT NOT NULL, tuner TEXT NOT NULL, schedule TEXT NOT NULL, gflops REAL NOT NULL,
    budget REAL NOT NULL, actions TEXT, replays_on TEXT, found_by TEXT NOT NULL, created REAL NOT NULL, checksum INTEGER,
    PRIMARY KEY (host, problem, tuner))"""


def test_the_answers_of_a_0_3_file_read_as_final(tmp_path, timer):
    """A file written before answers kept their load (no ``reference`` column): its rows are
    final answers, the column is added when it is opened, and their checksums still hold."""
    nest = _nest()
    host = measurement_key(HOST, 0.008)
    path = tmp_path / "v0_3.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1280266064")
    connection.execute(RECORDS_0_3)
    key = (host, nest.problem.name, "v1", nest.key, repr(2.0), '["split_4"]', "", "guided")
    row = (host, nest.problem.name, "v1", nest.key, 11.0, 2.0, '["split_4"]', None, "guided", 1.7e9, _crc("records", key, 11.0))
    connection.execute("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    connection.commit()
    connection.close()
    with MeasurementCache(path) as store:
        timer.slowdown = 3.0
        check_load(HOST, store, budget_s=0.008)  # busy now: an answer found earlier is not judged by it
        known = store.get_tuned(nest.problem, HOST, 0.008, tuner="v1")
        assert (known.nest, known.gflops, known.actions, known.reference_gflops) == (nest, 11.0, ("split_4",), None)
        assert store.damaged == 0 and len(store.export_tuned()) == 1
    with sqlite3.connect(path) as connection:
        assert [row[1] for row in connection.execute("PRAGMA table_info(records)")][-2:] == ["reference", "steps"]


# -- a remembered answer re-timed ----------------------------------------------------------------
def test_a_remembered_answer_retimed_slow_on_a_quiet_machine_is_flagged(timer, cache):
    evaluator = Evaluator(cache, 0.005, target=HOST)
    record = replace(_answer(), gflops=SPEED)
    timer.slowdown = 3.0
    assert retime_remembered(record, evaluator) is False
    assert cache.lookup(record.nest, HOST, 0.005).samples == load.RETIME_TRIES  # timed that often, each timing kept
    timer.slowdown = 1.0 / BUSY_RATIO * 0.99  # a little slower than its record: within the rule
    assert retime_remembered(record, evaluator) is True
    timer.slowdown = 1.0
    assert retime_remembered(record, evaluator) is True


def test_retime_remembered_refuses_what_it_cannot_time(cache):
    evaluator = Evaluator(cache, 0.005, target=HOST)
    with pytest.raises(ValueError, match="ScheduleRecord"):
        retime_remembered(_nest(), evaluator)
    with pytest.raises(ValueError, match="Evaluator"):
        retime_remembered(_answer(), cache)
    other = next((Target.resolve(name) for name in ("sse4", "avx2") if Target.resolve(name) != HOST), None)
    if other is not None:
        with pytest.raises(ValueError, match="measured for"):
            retime_remembered(replace(_answer(), target=other), evaluator)


# -- the command line's baseline ------------------------------------------------------------------
@pytest.mark.parametrize("busy_during_baseline", [False, True])
def test_looprl_tune_says_when_its_baseline_was_timed_on_a_busy_machine(busy_during_baseline, timer, monkeypatch, tmp_path, capsys):
    def baseline(kernel, problem, budget_s, isa=None, threads=1, rounds=3):
        if busy_during_baseline:
            timer.slowdown = 3.0  # other work starts while numpy is timed
        return 10.0, 5.0

    monkeypatch.setattr(numpy_baseline, "in_turn_with_numpy", baseline)
    policy = random_policy().save(tmp_path / "p")
    assert tune_cli.main(["16", "16", "16", "--policy", str(policy), "--budget", "0", "--threads", "1", "--cache", ":memory:"]) == 0
    out = capsys.readouterr().out
    assert "the tuned kernel 10.0 GFLOPS, timed in turn (best of 3 rounds each); looprl / numpy = 2.00" in out
    note = "timed while the machine was busy (reference kernel at 0.33x its quiet speed): not a fair figure"
    assert (note in out) is busy_during_baseline


def test_an_answer_is_stored_with_the_busiest_reading_around_its_search(timer, cache):
    before = check_load(HOST, cache)
    timer.slowdown = 3.0
    after = check_load(HOST, cache)
    record = load.measured_under(_answer(), before, after)
    assert record.reference_gflops == after.reference_gflops and record.nest == _answer().nest
    cache.put_tuned(record)
    assert cache.get_tuned(_nest().problem, tuner="tune-vX") is None
    with pytest.raises(ValueError):
        load.measured_under(_answer())
    with pytest.raises(ValueError, match="ScheduleRecord"):
        load.measured_under(_nest(), before)


def test_the_measurements_of_a_busy_search_are_timed_again_by_the_next_one(timer, cache):
    import time

    nest, settled = _nest(), _nest().split(1, 4)
    evaluator = Evaluator(cache, 0.005, target=HOST, samples=3)
    for _ in range(3):
        evaluator(settled)  # measured on a quiet machine, before the search
    started = time.time()
    timer.slowdown = 3.0
    for _ in range(3):
        evaluator(nest)
    assert evaluator.is_final(nest) and cache.get(nest, HOST, 0.005) == pytest.approx(SPEED / 3)
    assert cache.unsettle(started, HOST, 0.005) == 1  # the search ran busy: its figures are not final
    assert not evaluator.is_final(nest) and evaluator.is_final(settled)
    timer.slowdown = 1.0
    assert evaluator(nest).gflops == pytest.approx(SPEED)  # timed again, the best kept
    with pytest.raises(ValueError, match="since"):
        cache.unsettle("yesterday")


# -- looprl.tune: what it remembers and serves (looprl.tune.store) --------------------------
TUNED = looprl.matmul(24, 24, 24)


def _tune(path, **kwargs):
    return looprl.tune(TUNED, policy=random_policy(), cache=path, threads=1, budget_s=0.05, **kwargs)


def test_a_tune_on_a_busy_machine_is_not_served_again_and_the_next_quiet_tune_searches_again(timer, tmp_path):
    path = str(tmp_path / "m.sqlite")
    check_load(HOST, path)  # the quiet figure: SPEED
    timer.slowdown = 3.0
    busy = _tune(path)
    assert busy.mode == "measured" and busy.load is not None and busy.load.busy
    with MeasurementCache(path) as store:  # kept, but provisional: not an answer to serve
        assert store.get_tuned(TUNED, HOST, tuner=_tuner(), threads=1) is None
        assert store.get_tuned(TUNED, HOST, tuner=_tuner(), threads=1, provisional=True) is not None
    timer.slowdown = 1.0
    quiet = _tune(path)
    assert quiet.mode == "measured" and not quiet.load.busy  # searched again, not the busy moment's answer
    assert _tune(path).mode == "remembered"  # a quiet answer, re-timed at its speed: served


def test_a_remembered_answer_slower_now_than_its_record_is_not_served_on_a_quiet_machine(timer, tmp_path):
    path = str(tmp_path / "m.sqlite")
    first = _tune(path)
    assert first.mode == "measured" and not first.load.busy
    with MeasurementCache(path) as store:  # the record claims three times the speed its kernel runs at now
        known = store.get_tuned(TUNED, HOST, tuner=_tuner(), threads=1)
        store.put_tuned(replace(known, gflops=3 * known.gflops, reference_gflops=SPEED))
    calls = timer.calls
    again = _tune(path)
    assert again.mode == "measured"  # re-timed, found slow, searched again
    assert timer.calls > calls


def test_a_remembered_answer_is_served_without_re_timing_its_search_on_a_busy_machine(timer, tmp_path):
    path = str(tmp_path / "m.sqlite")
    assert _tune(path).mode == "measured"
    timer.slowdown = 3.0  # busy now: the answer cannot be judged, it is served as remembered
    assert _tune(path).mode == "remembered"


def test_looprl_tune_says_when_its_answer_was_found_on_a_busy_machine(timer, tmp_path, capsys):
    path = str(tmp_path / "m.sqlite")
    check_load(HOST, path)
    timer.slowdown = 3.0
    assert tune_cli.main(["24", "24", "24", "--cache", path, "--threads", "1", "--budget", "0.05", "--no-numpy"]) == 0
    out = capsys.readouterr().out
    assert "tuned while the machine was busy (reference kernel at 0.33x its quiet speed)" in out


def _tuner():
    from looprl.tune.store import TUNER

    return TUNER


def test_a_team_reading_below_the_quiet_figure_is_taken_again_after_the_team_ran_a_while(timer, cache, monkeypatch):
    """A two-thread kernel ran at half speed for its first calls after the process started a
    child (its threads on one core until the scheduler spread them): such a reading is taken
    again after :data:`~looprl.measurement.load.TEAM_SETTLE_S` of running, and only a reading
    that stays low says busy."""
    check_load(HOST, cache, threads=2)  # the quiet figure: SPEED
    settled = []

    def half_until_settled(target, threads=1, lock=None, settle_s=0.0):
        settled.append(settle_s)
        return SPEED if settle_s >= load.TEAM_SETTLE_S else SPEED / 2

    monkeypatch.setattr(load, "time_reference", half_until_settled)
    assert not check_load(HOST, cache, threads=2).busy and settled == [0.0, load.TEAM_SETTLE_S]
    monkeypatch.setattr(load, "time_reference", lambda target, threads=1, lock=None, settle_s=0.0: SPEED / 2)
    assert check_load(HOST, cache, threads=2).busy  # still slow after running: busy
