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
    scripted(monkeypatch, [100.0, 100.0, 200.0])
    assert load.wait_for_teams(TARGET, 2, timeout_s=60.0)
    scripted(monkeypatch, [100.0] * 1000)
    assert not load.wait_for_teams(TARGET, 2, timeout_s=0.0)  # one reading, then the time is up


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True])
def test_a_bad_wait_is_a_value_error(monkeypatch, bad):
    scripted(monkeypatch, [100.0])
    with pytest.raises(ValueError, match="timeout_s"):
        load.wait_for_teams(TARGET, 2, timeout_s=bad)
