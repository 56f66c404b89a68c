"""The measurement cache refuses files that are not its own, and never returns a damaged value."""

import contextlib
import os
import pickle
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
import warnings

import pytest

import looprl
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.keys import measurement_key, peak_key
from looprl.measurement.store import APPLICATION_ID


def _nests(count):
    """Distinct schedules (one problem each)."""
    return [looprl.initial_nest(looprl.matmul(4 + i, 4, 4)) for i in range(count)]


def _value(i):
    return 1000.0 + i / 7.0  # not integral: SQLite stores it as an 8-byte big-endian double


def _header(path):
    with open(path, "rb") as handle:
        header = handle.read(100)
    return header[:16], int.from_bytes(header[68:72], "big", signed=True)


def _filled_cache(path, count):
    nests = _nests(count)
    with MeasurementCache(path) as cache:
        for i, nest in enumerate(nests):
            cache.put(nest, _value(i))
    assert not os.path.exists(path + "-wal")  # checkpointed into the file by the last close
    return nests


def _flip_a_bit_of(path, value):
    """Flip the lowest mantissa bit of the one stored copy of ``value`` in the file."""
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    stored = struct.pack(">d", value)
    assert data.count(stored) == 1
    data[data.index(stored) + 7] ^= 0x01
    with open(path, "wb") as handle:
        handle.write(data)


def _folder_snapshot(folder):
    return {
        name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name))
    }


# -- whose file is it --------------------------------------------------------
def test_a_device_is_refused_and_left_in_place(tmp_path):
    device = tmp_path / "null"
    try:
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    with pytest.raises(ValueError, match=rf"cannot use {device} as the measurement cache: it is a character device"):
        MeasurementCache(device)
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["null"]


@pytest.mark.parametrize("kind", ["directory", "fifo", "link to a directory"])
def test_other_non_regular_files_are_refused(tmp_path, kind):
    path = tmp_path / "cache.sqlite"
    if kind == "directory":
        path.mkdir()
        expected = "a directory"
    elif kind == "fifo":
        os.mkfifo(path)
        expected = "a FIFO"
    else:
        (tmp_path / "folder").mkdir()
        path.symlink_to(tmp_path / "folder")
        expected = "a directory"
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match=rf"{path} as the measurement cache: it is {expected}, not a regular file"):
        MeasurementCache(path)
    assert sorted(os.listdir(tmp_path)) == before


def test_a_file_that_is_not_a_cache_is_refused_and_left_alone(tmp_path):
    results = tmp_path / "results.csv"
    results.write_text("problem,gflops\nmatmul,1.5\n")
    with pytest.raises(ValueError, match=rf"{results} exists and is not a looprl measurement cache: it is not an SQLite database"):
        MeasurementCache(results)
    assert os.listdir(tmp_path) == ["results.csv"]
    assert results.read_text() == "problem,gflops\nmatmul,1.5\n"


def test_a_damaged_cache_whose_header_is_gone_is_refused_not_moved(cache_path):
    _filled_cache(cache_path, 2)
    with open(cache_path, "r+b") as handle:
        handle.write(b"\x00" * 100)  # no magic, no mark: looprl cannot tell it is its own
    before = _folder_snapshot(os.path.dirname(cache_path))
    with pytest.raises(ValueError, match="is not an SQLite database"):
        MeasurementCache(cache_path)
    assert _folder_snapshot(os.path.dirname(cache_path)) == before


@pytest.mark.parametrize("application_id", [0, 1234])
def test_another_applications_database_is_refused(tmp_path, application_id):
    path = str(tmp_path / "other.sqlite")
    connection = sqlite3.connect(path)
    connection.execute(f"PRAGMA application_id = {application_id}")
    connection.execute("CREATE TABLE notes (text TEXT)")
    connection.execute("INSERT INTO notes VALUES ('keep me')")
    connection.commit()
    connection.close()
    before = _folder_snapshot(tmp_path)
    with pytest.raises(ValueError, match=rf"{path} exists and is not a looprl measurement cache: it is an SQLite database"):
        MeasurementCache(path)
    assert _folder_snapshot(tmp_path) == before


def test_a_corrupt_unmarked_database_is_refused_not_moved(tmp_path):
    path = str(tmp_path / "other.sqlite")
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE notes (text TEXT)")
    connection.commit()
    connection.close()
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(bytes(range(256)) * 15)
    before = _folder_snapshot(tmp_path)
    with pytest.raises(ValueError, match="reports as damaged .* and carries no looprl mark"):
        MeasurementCache(path)
    assert _folder_snapshot(tmp_path) == before


def test_new_caches_carry_the_mark(cache_path):
    MeasurementCache(cache_path).close()
    assert _header(cache_path) == (b"SQLite format 3\x00", APPLICATION_ID)
    assert os.listdir(os.path.dirname(cache_path)) == ["measurements.sqlite"]  # no scratch file left behind


def test_an_empty_file_is_initialised_in_place_with_a_warning(cache_path):
    open(cache_path, "wb").close()
    inode = os.stat(cache_path).st_ino
    nest = _nests(1)[0]
    with pytest.warns(RuntimeWarning, match=rf"{cache_path} is an empty \(0-byte\) file; initialising it in place"):
        cache = MeasurementCache(cache_path)
    cache.put(nest, 2.5)
    assert cache.get(nest) == 2.5
    cache.close()
    assert os.stat(cache_path).st_ino == inode
    assert _header(cache_path) == (b"SQLite format 3\x00", APPLICATION_ID)
    assert not any(".corrupt-" in name for name in os.listdir(os.path.dirname(cache_path)))


_OLD_SCHEMA = """
CREATE TABLE measurements (host TEXT NOT NULL, problem TEXT NOT NULL, schedule TEXT NOT NULL,
    gflops REAL NOT NULL, created REAL NOT NULL, PRIMARY KEY (host, problem, schedule));
CREATE TABLE peaks (host TEXT PRIMARY KEY, gflops REAL NOT NULL, created REAL NOT NULL);
"""


def test_a_cache_of_an_older_looprl_is_adopted_and_checksummed(cache_path):
    nest = _nests(1)[0]
    connection = sqlite3.connect(cache_path)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.executescript(_OLD_SCHEMA)
    connection.execute("INSERT INTO measurements VALUES (?, ?, ?, ?, 0)", (measurement_key(), nest.problem.name, nest.key, 7.25))
    connection.execute("INSERT INTO peaks VALUES (?, ?, 0)", (peak_key(), 99.5))
    connection.commit()
    connection.close()
    assert _header(cache_path)[1] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MeasurementCache(cache_path) as cache:
            assert cache.get(nest) == 7.25  # checksummed at migration, so still a hit
            assert cache.get_peak() == 99.5
            assert (cache.hits, cache.damaged) == (1, 0)
    assert _header(cache_path)[1] == APPLICATION_ID
    connection = sqlite3.connect(cache_path)
    assert connection.execute("SELECT count(*) FROM measurements WHERE checksum IS NULL").fetchone()[0] == 0
    assert "samples" in {row[1] for row in connection.execute("PRAGMA table_info(measurements)")}  # migrated too
    connection.close()


def test_a_row_written_without_a_checksum_reads_as_missing(cache_path):
    nest = _nests(1)[0]
    MeasurementCache(cache_path).close()
    connection = sqlite3.connect(cache_path)  # as an older looprl sharing the file would write it
    connection.execute(
        "INSERT INTO measurements (host, problem, schedule, gflops, created) VALUES (?, ?, ?, ?, 0)",
        (measurement_key(), nest.problem.name, nest.key, 3.0),
    )
    connection.commit()
    connection.close()
    with MeasurementCache(cache_path) as cache:
        assert cache.get(nest) is None and cache.damaged == 0
        cache.put(nest, 4.0)
        assert cache.get(nest) == 4.0


def test_a_file_used_as_a_directory_is_a_value_error(tmp_path):
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "measurements.sqlite"
    with pytest.raises(ValueError, match=rf"cannot use {path} as the measurement cache: Not a directory"):
        MeasurementCache(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_read_only_directory_is_a_value_error(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ValueError, match=rf"cannot create the measurement cache {folder / 'measurements.sqlite'}"):
            MeasurementCache(folder / "measurements.sqlite")
    finally:
        folder.chmod(0o755)


@pytest.mark.skipif(sys.platform != "linux", reason="uses /proc, which no one can create files in")
def test_an_unwritable_location_is_a_value_error():
    path = f"/proc/{os.getpid()}/measurements.sqlite"
    with pytest.raises(ValueError, match=rf"cannot create the measurement cache {path}"):
        MeasurementCache(path)
    assert not os.path.exists(path)


# -- damage SQLite does not notice -------------------------------------------
def test_a_flipped_bit_in_a_stored_value_reads_as_missing(cache_path):
    nests = _filled_cache(cache_path, 20)
    _flip_a_bit_of(cache_path, _value(5))
    with MeasurementCache(cache_path) as cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get(nests[5]) is None
        expected = f"measurement cache {cache_path}: a stored value failed its checksum and was discarded (this cache object counts such rows in .damaged)"
        assert [str(w.message) for w in caught if w.category is RuntimeWarning] == [expected]
        assert cache.damaged == 1 and cache.misses == 1
        assert [cache.get(nest) for i, nest in enumerate(nests) if i != 5] == [_value(i) for i in range(20) if i != 5]
        assert len(cache) == 19  # the damaged row is deleted; the valid ones are kept
        cache.put(nests[5], 42.0)
        assert cache.get(nests[5]) == 42.0


def test_values_changed_behind_the_checksum_read_as_missing_with_one_warning(cache_path):
    nests = _filled_cache(cache_path, 4)
    connection = sqlite3.connect(cache_path)  # a valid SQLite update that leaves the checksum stale
    connection.execute(
        "UPDATE measurements SET gflops = gflops * 2 WHERE problem IN (?, ?)", (nests[0].problem.name, nests[2].problem.name)
    )
    connection.commit()
    connection.close()
    with MeasurementCache(cache_path) as cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [cache.get(nest) for nest in nests]
    assert values == [None, _value(1), None, _value(3)]
    assert cache.damaged == 2
    assert len([w for w in caught if "failed its checksum" in str(w.message)]) == 1


def test_a_flipped_bit_in_the_peak_reads_as_missing(cache_path):
    with MeasurementCache(cache_path) as cache:
        cache.put_peak(123.456)
    _flip_a_bit_of(cache_path, 123.456)
    with MeasurementCache(cache_path) as cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get_peak() is None
        assert any("failed its checksum" in str(w.message) for w in caught)
        assert cache.damaged == 1
        cache.put_peak(100.5)
        assert cache.get_peak() == 100.5


# -- what must keep working --------------------------------------------------
def test_memory_cache_and_pickling(cache_path):
    nest = _nests(1)[0]
    memory = MeasurementCache(":memory:")
    memory.put(nest, -0.0)
    assert memory.get(nest) == 0.0
    with MeasurementCache(cache_path) as cache:
        cache.put(nest, 1.5)
        clone = pickle.loads(pickle.dumps(cache))
        assert clone.get(nest) == 1.5
        clone.close()


def test_a_bad_value_is_a_value_error_and_keeps_the_cache(cache_path):
    nest = _nests(1)[0]
    with MeasurementCache(cache_path) as cache:
        cache.put(nest, 1.5)
        with pytest.raises(ValueError, match="gflops must be a finite number, got nan"):
            cache.put(nest, float("nan"))
        assert cache.get(nest) == 1.5
    assert os.listdir(os.path.dirname(cache_path)) == ["measurements.sqlite"]


# -- read-only caches and locks held too long -----------------------------------------------
@contextlib.contextmanager
def read_only(path):
    """``path`` cannot be opened for writing within the block: mode 0444, or for root (whom
    modes do not stop) the immutable attribute; skipped where neither is possible."""
    if os.geteuid() != 0:
        os.chmod(path, 0o444)
        try:
            yield
        finally:
            os.chmod(path, 0o644)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a file read-only for root here (chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_cache_is_a_value_error_when_opened_not_at_the_first_write(cache_path):
    _filled_cache(cache_path, 1)
    with read_only(cache_path):
        with pytest.raises(ValueError, match=f"cannot use {cache_path} as the measurement cache: it cannot be opened for writing"):
            MeasurementCache(cache_path)


def test_a_write_the_file_refuses_later_is_a_value_error_naming_it(cache_path, monkeypatch):
    """SQLite opened the file read-only (as it silently does when it cannot write it)."""
    from looprl.measurement.store import CacheStore

    _filled_cache(cache_path, 1)
    read_only_connect = lambda self, target: sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=self.timeout_s, isolation_level=None)
    monkeypatch.setattr(CacheStore, "_connect", read_only_connect)
    cache = MeasurementCache(cache_path)
    with pytest.raises(ValueError, match=f"cannot write the measurement cache {cache_path}: attempt to write a readonly database"):
        cache.put_peak(1.0)
    cache.close()


WRITER = (
    "import sqlite3, sys, time\n"
    "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "connection.execute('BEGIN IMMEDIATE')\n"
    "print('writing', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_cache_locked_past_the_timeout_names_the_process_holding_it(cache_path, tmp_path):
    from looprl.measurement.lock import LockWaitTimeout

    _filled_cache(cache_path, 1)
    cache = MeasurementCache(cache_path, timeout_s=0.2)
    script = tmp_path / "cache_writer_marker.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), cache_path], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        with pytest.raises(LockWaitTimeout) as caught:
            cache.put_peak(1.0)
        with pytest.raises(LockWaitTimeout):  # opening takes a write transaction too
            MeasurementCache(cache_path, timeout_s=0.2)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    message = str(caught.value)
    assert f"gave up after waiting 0.2 s for the measurement cache {cache_path}" in message
    assert f"pid {writer.pid} (" in message and "cache_writer_marker.py" in message
    cache.put_peak(1.0)  # free again
    cache.close()
