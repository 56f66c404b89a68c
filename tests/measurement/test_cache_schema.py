"""Users' cache files outlive looprl versions: today's schema, key strings and checksums are
pinned here, and a file written from literal SQL of today's schema is read by the code."""

import sqlite3
import struct
import zlib

import pytest

import looprl
from looprl.backend.codegen import CODEGEN_VERSION
from looprl.backend.host import host_fingerprint
from looprl.target import Target
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import measurement_key, peak_key, tuned_problem
from looprl.measurement.store import APPLICATION_ID, row_checksum
from looprl.measurement.timing import TIMING_PROTOCOL_VERSION

# The schema of the cache file as of looprl 0.1.0 (written out here, not imported: a change to
# the code's schema must show as a failure below, not silently move this copy along).
SCHEMA_0_1 = [
    """CREATE TABLE measurements (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        samples INTEGER,
        PRIMARY KEY (host, problem, schedule)
    )""",
    """CREATE TABLE peaks (
        host TEXT PRIMARY KEY,
        gflops REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER
    )""",
    """CREATE TABLE tuned (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        budget REAL NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        PRIMARY KEY (host, problem)
    )""",
]


# 0.2: looprl.tune's answers keep the action path that reaches them (a column added to 0.1's
# table when an older file is opened).
SCHEMA_0_2 = SCHEMA_0_1[:2] + [SCHEMA_0_1[2].replace("checksum INTEGER,\n", "checksum INTEGER,\n        actions TEXT,\n")]

# 0.3: looprl.tune's answers are schedule records, a field a column (0.2's tuned rows are copied
# into it when an older file is opened; its table is left in place).
SCHEMA_0_3 = SCHEMA_0_2[:2] + [
    """CREATE TABLE records (
        host TEXT NOT NULL,
        problem TEXT NOT NULL,
        tuner TEXT NOT NULL,
        schedule TEXT NOT NULL,
        gflops REAL NOT NULL,
        budget REAL NOT NULL,
        actions TEXT,
        replays_on TEXT,
        found_by TEXT NOT NULL,
        created REAL NOT NULL,
        checksum INTEGER,
        PRIMARY KEY (host, problem, tuner)
    )""",
]


# 0.4: each answer keeps the load's reference kernel's GFLOPS while it was found (NULL in older
# rows: a final answer), so that one found on a busy machine is judged provisional.
SCHEMA_0_4 = SCHEMA_0_3[:2] + [SCHEMA_0_3[2].replace("checksum INTEGER,\n", "checksum INTEGER,\n        reference REAL,\n")]

# 0.5: each answer keeps its schedule's steps (a JSON list of step names), what it is read from
# (filled from the action path of 0.4's rows when such a file is first opened).
SCHEMA_0_5 = SCHEMA_0_4[:2] + [SCHEMA_0_4[2].replace("reference REAL,\n", "reference REAL,\n        steps TEXT,\n")]


def _crc(table, key, value):
    """The row checksum's definition, written independently of the code: CRC32 over the
    table name and key fields, each prefixed by its UTF-8 length (4 bytes, big-endian), then
    the value as a big-endian IEEE-754 double."""
    data = b"".join(len(field.encode()).to_bytes(4, "big") + field.encode() for field in (table, *key))
    return zlib.crc32(data + struct.pack(">d", value))


def _normalised(sql):
    return " ".join(sql.split())


def test_key_strings_keep_their_form():
    target = Target.resolve("avx2")
    base = f"{host_fingerprint()}|{target.key}|codegen-{CODEGEN_VERSION}|timing-v{TIMING_PROTOCOL_VERSION}"
    assert measurement_key("avx2", 0.008) == f"{base}-8ms"
    assert measurement_key("avx2", 0.015, threads=1) == f"{base}-15ms"
    assert measurement_key("avx2", 0.008, threads=4) == f"{base}-8ms|threads-4"
    assert peak_key("avx2") == f"{host_fingerprint()}|{target.key}|peak-timing-v{TIMING_PROTOCOL_VERSION}"
    assert peak_key("avx2", threads=2) == peak_key("avx2") + "|threads-2"
    assert tuned_problem("128x64x256", "") == "128x64x256" and tuned_problem("128x64x256", "v3") == "128x64x256|v3"
    assert target.key.startswith("avx2|x86-64-v3|")


def test_row_checksums_keep_their_values():
    # Values computed by looprl 0.1.0; every stored row's checksum depends on them.
    assert row_checksum("measurements", ("host|x", "mk,kn->mn:m=16,k=16,n=16", "m16s1,k16s1,n16s1|m16s1,n16s1"), 12.5) == 2214151338
    assert row_checksum("peaks", ("host|x",), 100.25) == 1436257180
    assert row_checksum("tuned", ("host|x", "p|t", "s", repr(2.0)), 7.0) == 1940444009
    assert row_checksum("peaks", ("any", "key"), 3.0) == _crc("peaks", ("any", "key"), 3.0)


def test_a_new_cache_has_todays_schema(tmp_path):
    path = tmp_path / "new.sqlite"
    MeasurementCache(path).close()
    with sqlite3.connect(path) as connection:
        stored = dict(connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
        assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID == 0x4C4F4F50
    assert {name: _normalised(sql) for name, sql in stored.items()} == {
        sql.split()[2]: _normalised(sql) for sql in SCHEMA_0_5
    }


@pytest.fixture
def todays_file(tmp_path):
    """A cache file written from today's SQL, holding one row of each table."""
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16)).split(0, 4)
    host, peak_host = measurement_key("avx2", 0.008), peak_key("avx2")
    problem, schedule = nest.problem.name, nest.key
    path = tmp_path / "v0_1.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1280266064")
    for ddl in SCHEMA_0_1:
        connection.execute(ddl)
    connection.execute(
        "INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
        (host, problem, schedule, 12.5, 1.7e9, _crc("measurements", (host, problem, schedule), 12.5), 3),
    )
    connection.execute("INSERT INTO peaks VALUES (?, ?, ?, ?)", (peak_host, 100.25, 1.7e9, _crc("peaks", (peak_host,), 100.25)))
    tuned_row = (host, f"{problem}|v1", schedule)
    connection.execute(
        "INSERT INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?)",
        (*tuned_row, 11.0, 2.0, 1.7e9, _crc("tuned", (*tuned_row, repr(2.0)), 11.0)),
    )
    connection.commit()
    connection.execute("PRAGMA journal_mode = WAL")
    connection.close()
    return path, nest


def test_a_file_written_with_todays_schema_is_read(todays_file):
    path, nest = todays_file
    with MeasurementCache(path) as cache:
        value = cache.lookup(nest, "avx2", 0.008)
        assert (value.gflops, value.samples) == (12.5, 3)
        assert cache.get_peak("avx2") == 100.25
        known = cache.get_tuned(nest.problem, "avx2", 0.008, tuner="v1")
        assert (known.nest.key, known.gflops, known.budget_s, known.actions, known.replays_on) == (nest.key, 11.0, 2.0, None, None)  # no path stored
        assert cache.records("avx2", 0.008) == [(nest.problem.name, nest.key, 12.5)]
        assert len(cache) == 1 and cache.damaged == 0
        assert cache.add_sample(nest, 13.0, "avx2", 0.008).samples == 4
    with sqlite3.connect(path) as connection:  # opening it migrated nothing
        columns = [row[1] for row in connection.execute("PRAGMA table_info(measurements)")]
        assert columns == ["host", "problem", "schedule", "gflops", "created", "checksum", "samples"]


def test_a_file_of_0_2_has_its_tuned_answers_migrated_to_records(tmp_path):
    nest = looprl.initial_nest(looprl.matmul(16, 16, 16)).split(0, 4)
    host, problem = measurement_key("avx2", 0.008), nest.problem.name
    path = tmp_path / "v0_2.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1280266064")
    for ddl in SCHEMA_0_2:
        connection.execute(ddl)
    rows = [(f"{problem}|v1", '["down", "split_4"]', 11.0), (f"{problem}|v2", '{"names": ["up"], "replays_on": "relaid twin"}', 12.0),
            (f"{problem}|v3", '["down"]', 13.0)]
    for column, actions, gflops in rows:
        checksum = _crc("tuned", (host, column, nest.key, repr(2.0), actions), gflops)
        connection.execute("INSERT INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (host, column, nest.key, gflops, 2.0, 1.7e9, checksum + (column.endswith("v3")), actions))
    connection.commit()
    connection.close()
    with MeasurementCache(path) as cache:
        first, second = (cache.get_tuned(nest.problem, "avx2", 0.008, tuner=tuner) for tuner in ("v1", "v2"))
        assert (first.nest, first.gflops, first.actions, first.replays_on, first.tuner) == (nest, 11.0, ("down", "split_4"), None, "v1")
        assert (second.gflops, second.actions, second.replays_on) == (12.0, ("up",), "relaid twin")
        assert cache.get_tuned(nest.problem, "avx2", 0.008, tuner="v3") is None  # failed its checksum: not copied
    with sqlite3.connect(path) as connection:  # 0.2's table is left for an older looprl sharing the file
        assert connection.execute("SELECT count(*) FROM tuned").fetchone()[0] == 3
