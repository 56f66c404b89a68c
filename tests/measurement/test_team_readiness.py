"""Whether a team's threads run together now (looprl.measurement.load.team_runs_now) and waiting
for them (wait_for_teams): the reference kernel on the team's threads against its speed on one,
both scripted here (no wall-clock figure is asserted)."""

import pytest

from looprl.measurement import load
from looprl.target import Target

TARGET = Target.default()


def scripted(monkeypatch, team_readings: list[float], one: float = 100.0) -> list[int]:
    """Make the reference kernel read ``one`` on one thread and the next of ``team_readings`` on
    more; the thread counts asked, in order."""
    asked = []

    def reference(target, threads=1, lock=None, settle_s=0.0):
        asked.append(threads)
        return one if threads == 1 else team_readings.pop(0)

    monkeypatch.setattr(load, "time_reference", reference)
    monkeypatch.setattr(load.time, "sleep", lambda seconds: None)
    return asked


@pytest.mark.parametrize("team, together", [(200.0, True), (150.0, True), (149.0, False), (100.0, False)])
def test_a_team_runs_together_where_its_reference_scales_by_three_quarters_of_its_threads(monkeypatch, team, together):
    asked = scripted(monkeypatch, [team])
    assert load.team_runs_now(TARGET, 2) is together and load.TEAM_SCALING == 0.75
    assert asked == [2, 1]


def test_one_thread_always_runs_together(monkeypatch):
    asked = scripted(monkeypatch, [])
    assert load.team_runs_now(TARGET, 1) and asked == []


def test_waiting_for_teams_polls_until_they_run_together_or_the_time_is_up(monkeypatch):
    monkeypatch.setattr(load, "others_busy", lambda window_s=load.OTHERS_WINDOW_S: 0.0)
    scripted(monkeypatch, [100.0, 100.0, 200.0])
    assert load.wait_for_teams(TARGET, 2, timeout_s=60.0)
    scripted(monkeypatch, [100.0] * 1000)
    assert not load.wait_for_teams(TARGET, 2, timeout_s=0.0)  # one reading, then the time is up


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True])
def test_a_bad_wait_is_a_value_error(monkeypatch, bad):
    scripted(monkeypatch, [100.0])
    with pytest.raises(ValueError, match="timeout_s"):
        load.wait_for_teams(TARGET, 2, timeout_s=bad)


def test_waiting_for_teams_stops_at_once_where_other_processes_keep_a_core_busy(monkeypatch):
    """Their work, not a thread woken late, keeps the team apart (a test run's other worker)."""
    monkeypatch.setattr(load, "others_busy", lambda window_s=load.OTHERS_WINDOW_S: 1.0)
    asked = scripted(monkeypatch, [100.0] * 10)
    assert not load.wait_for_teams(TARGET, 2, timeout_s=60.0) and asked == [2, 1]
    assert load.OTHERS_BUSY_CORES == 0.5


def test_other_processes_busy_cores_are_counted_and_this_process_s_own_left_out():
    """A child spinning on one core reads as about one core busy; this process's own work (the
    same machine's busy time) is left out; an idle moment reads below one core."""
    import subprocess
    import sys
    import time

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = max(load.others_busy(0.2) for _ in range(3))
    finally:
        spinner.kill()
        spinner.wait()
    assert busy >= 0.5
