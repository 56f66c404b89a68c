import subprocess
import sys

import pytest

import looprl
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.lock import TimingLock

PROBE = (
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
    "\ntry:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')"
    "\nexcept BlockingIOError:\n    print('busy')"
)


def probe(path) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=60).stdout.strip()


def test_lock_excludes_other_processes_while_held(tmp_path):
    lock = TimingLock(tmp_path / "timing.lock")
    with lock:
        with lock:  # re-entrant
            assert probe(lock.path) == "busy"
        assert probe(lock.path) == "busy"
    assert probe(lock.path) == "free"
    lock.close()


def test_evaluator_times_under_the_lock(tmp_path):
    seen = []

    class SpyLock(TimingLock):
        def __enter__(self):
            result = super().__enter__()
            seen.append(probe(self.path))
            return result

    evaluator = Evaluator(":memory:", budget_s=0.001, timing_lock=SpyLock(tmp_path / "t.lock"), samples=1)
    measurement = evaluator(looprl.initial_nest(looprl.matmul(8, 8, 8)))
    assert measurement.ok and seen and set(seen) == {"busy"}
    count = len(seen)
    assert evaluator(looprl.initial_nest(looprl.matmul(8, 8, 8))).from_cache and len(seen) == count  # cache hit: no timing


def test_unusable_lock_path_warns_and_times_anyway(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    evaluator = Evaluator(":memory:", budget_s=0.001, timing_lock=TimingLock(blocker / "sub" / "t.lock"))
    with pytest.warns(RuntimeWarning, match="without the machine-wide lock"):
        assert evaluator(looprl.initial_nest(looprl.matmul(8, 8, 8))).ok
