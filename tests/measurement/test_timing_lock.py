import os
import signal
import subprocess
import sys
import threading

import pytest

import looprl
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.lock import LockWaitTimeout, TimingLock

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


# -- every wait is bounded and names the holder ------------------------------------------------
HOLDER = (
    "import sys, time\n"
    "from looprl.measurement.lock import TimingLock\n"
    "TimingLock(sys.argv[1]).__enter__()\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def stopped_holder(tmp_path):
    """A process that holds the timing lock at ``tmp_path / "timing.lock"`` and is stopped (SIGSTOP)."""
    path = tmp_path / "timing.lock"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "stopped-holder-marker"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        os.kill(process.pid, signal.SIGSTOP)
        yield path, process.pid
    finally:
        process.kill()  # SIGKILL ends a stopped process too
        process.wait()
        process.stdout.close()


def test_a_lock_held_by_a_stopped_process_is_waited_for_a_bounded_time_and_the_error_names_it(stopped_holder):
    path, pid = stopped_holder
    lock = TimingLock(path, wait_s=0.3)
    with pytest.raises(LockWaitTimeout) as caught:
        with lock:
            pytest.fail("took a lock another process holds")
    message = str(caught.value)
    assert f"pid {pid} (" in message and "stopped-holder-marker" in message and "stopped" in message and " since " in message
    assert "0.3 s" in message and str(path) in message


def test_a_holder_that_stays_stopped_is_not_waited_for_the_whole_bound(stopped_holder, monkeypatch):
    from looprl.measurement import lock as lock_module

    path, pid = stopped_holder
    monkeypatch.setattr(lock_module, "STOPPED_HOLDER_WAIT_S", 0.3)
    with pytest.raises(LockWaitTimeout, match=f"it stays stopped; it is held by pid {pid} "):
        with TimingLock(path, wait_s=600):
            pytest.fail("took a lock another process holds")


def test_a_lock_released_during_the_wait_is_taken_and_released_again(tmp_path):
    path = tmp_path / "timing.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("time.sleep(120)", "time.sleep(0.5)"), str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = TimingLock(path, wait_s=60)
        with lock:
            assert probe(path) == "busy"
            assert f"pid {os.getpid()} " in lock.holder()  # the holder is recorded for others
        assert probe(path) == "free"
        lock.close()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_lock_got_too_late_is_let_go(stopped_holder):
    path, pid = stopped_holder
    with pytest.raises(LockWaitTimeout):
        with TimingLock(path, wait_s=0.1):
            pass
    os.kill(pid, signal.SIGKILL)  # the holder goes: the abandoned wait gets the lock, and must let it go
    for _ in range(200):
        if probe(path) == "free":
            break
    assert probe(path) == "free"


def test_threads_of_one_process_wait_for_each_other_within_the_bound(tmp_path):
    lock = TimingLock(tmp_path / "timing.lock", wait_s=0.2)
    entered, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            entered.set()
            release.wait(60)

    worker = threading.Thread(target=hold, name="the-holding-thread")
    worker.start()
    try:
        assert entered.wait(60)
        with pytest.raises(LockWaitTimeout, match="thread 'the-holding-thread' of this process"):
            with lock:
                pass
    finally:
        release.set()
        worker.join()
    with lock:  # free again
        pass
    lock.close()


def test_tune_command_gives_up_on_a_stopped_holder_in_one_line(stopped_holder, tmp_path, monkeypatch, capsys):
    """The defect: looprl-tune waited forever, silently, for a stopped looprl-search."""
    from looprl.cli import tune as tune_cli
    from looprl.measurement import lock as lock_module

    path, pid = stopped_holder
    monkeypatch.setattr(lock_module, "default_lock_path", lambda: path)
    monkeypatch.setattr(lock_module, "STOPPED_HOLDER_WAIT_S", 0.5)  # WAIT_NOTICE_S (2 s) not reached: no warning
    status = tune_cli.main(["24", "16", "8", "--fresh", "--budget", "0.4", "--no-numpy", "--cache", str(tmp_path / "c.sqlite")])
    lines = capsys.readouterr().err.splitlines()
    assert status == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"looprl-tune: error: gave up waiting for the machine-wide timing lock {path} after ")
    assert f"it stays stopped; it is held by pid {pid} (" in lines[0] and "stopped-holder-marker, stopped) since " in lines[0]
