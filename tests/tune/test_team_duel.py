"""Issue 61, item 2: a team is returned only where it beats the serial best in a duel of
interleaved rounds (looprl.tune.winner.team_or_serial), in measured tune and in the fast
path's split alike. Every timer here is scripted: no wall-clock time is asserted."""

import importlib

import pytest

import looprl
from looprl.backend.threads import available_cores
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.duels import DUEL_MAX_ROUNDS
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.measurement.timing import Timing
from looprl.search.parallel import parallel_variant
from looprl.tune.winner import CONTENDER_ROUNDS, CONTENDER_WITHIN, TEAM_MARGIN, team_or_serial
from tests.policies import random_policy

needs_two = pytest.mark.skipif(available_cores() < 2, reason="needs two cores")

# The subject: on a 2-vCPU Zen 3, tune(threads=2) returned a team at 38.9 GFLOPS where
# its own one-thread answer ran at 55.3.
SUBJECT = looprl.matmul(32, 1000, 1280)
SERIAL_GFLOPS = 100.0


class ScriptedTimer:
    """Stands in for the evaluator's kernel timer: every serial kernel runs at
    :data:`SERIAL_GFLOPS`; a team at ``lucky`` GFLOPS the first time its schedule is timed and
    at ``team`` GFLOPS after that. Records the threads of each timing, in order."""

    def __init__(self, lucky: float, team: float, serial: float = SERIAL_GFLOPS):
        self.lucky, self.team, self.serial = lucky, team, serial
        self.seen: set[str] = set()
        self.threads: list[int] = []

    def __call__(self, kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        self.threads.append(threads)
        if threads == 1:
            gflops = self.serial
        else:
            gflops = self.team if kernel.nest.key in self.seen else self.lucky
            self.seen.add(kernel.nest.key)
        return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)

    def duel(self) -> list[int]:
        """The threads of the trailing timings that alternate a team and a serial kernel (the
        duel's rounds)."""
        tail = []
        for threads in reversed(self.threads):
            if tail and (threads == 1) == (tail[-1] == 1):
                break
            tail.append(threads)
        return tail[::-1][len(tail) % 2:]


def tuned(monkeypatch, timer: ScriptedTimer, measure: bool = True):
    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    return looprl.tune(SUBJECT, random_policy(seed=1), measure=measure, cache=":memory:", budget_s=0.3, measure_budget_s=0.002, threads=2,
                       remember=False)


@needs_two
@pytest.mark.parametrize("measure", [True, False], ids=["measured", "fast path"])
def test_a_team_that_times_fast_once_and_slower_than_one_thread_after_is_not_returned(monkeypatch, measure):
    """The cause on 32x1000x1280: a team on a 2-vCPU machine is timed at its full speed only
    while the other vCPU is free, and at its serial speed or below otherwise (on a busy Zen 4
    its best sample was 207 GFLOPS, its median 105, the serial best 113). Tune ranked the team
    and the serial best by their best samples, the team's from one or two timings, each in
    another moment than the serial best's, and re-timed the two together only within 2x of
    each other and in two rounds that could only raise a best sample: one lucky timing of the
    team returned it. Now the two are timed in interleaved rounds until a sign test tells them
    apart, and the team loses every round."""
    timer = ScriptedTimer(lucky=2 * SERIAL_GFLOPS, team=0.7 * SERIAL_GFLOPS)
    result = tuned(monkeypatch, timer, measure)
    assert not result.nest.is_parallel and result.kernel.threads == 2
    assert result.gflops == result.serial_gflops == SERIAL_GFLOPS
    duel = timer.duel()
    assert duel == [2, 1] * 4  # four rounds lost: it could no longer win enough of 15


@needs_two
@pytest.mark.parametrize("measure", [True, False], ids=["measured", "fast path"])
def test_a_team_that_wins_the_rounds_is_returned(monkeypatch, measure):
    timer = ScriptedTimer(lucky=1.9 * SERIAL_GFLOPS, team=1.9 * SERIAL_GFLOPS)
    result = tuned(monkeypatch, timer, measure)
    assert result.nest.is_parallel and result.kernel.threads == 2
    assert result.gflops == pytest.approx(1.9 * SERIAL_GFLOPS) and result.serial_gflops == pytest.approx(SERIAL_GFLOPS)
    assert timer.duel() == [2, 1] * 5  # five of five: the sign test is 0.95 sure


@needs_two
def test_teams_are_timed_however_long_the_serial_stages_took(monkeypatch):
    """512x11008x4096 on two threads came back serial (0.49x the libraries): its one untuned
    execution took longer than the whole scaled budget, and every team, predicted from the
    serial best's speed, was refused before one was timed. Here the serial kernels run so slowly
    that a team's predicted cost is past the team stage's share of the budget: teams are still
    timed (looprl.tune.teams.TEAM_REFINEMENTS), and the faster one is returned."""
    slow = 0.25  # GFLOPS: one serial call of the subject takes 0.33 s, past the 0.3 s budget
    timer = ScriptedTimer(lucky=4 * slow, team=4 * slow, serial=slow)
    result = tuned(monkeypatch, timer)
    assert 2 in timer.threads
    assert result.nest.is_parallel and result.gflops == pytest.approx(4 * slow)


@needs_two
def test_a_team_no_faster_than_the_serial_best_is_timed_once_more_beside_it_and_not_duelled(monkeypatch):
    timer = ScriptedTimer(lucky=SERIAL_GFLOPS, team=SERIAL_GFLOPS)
    result = tuned(monkeypatch, timer)
    assert not result.nest.is_parallel and result.gflops == result.serial_gflops == SERIAL_GFLOPS
    assert timer.duel() == [2, 1]  # the team and the serial best once more, side by side; no round after that


@needs_two
@pytest.mark.parametrize("team", [1.9, 0.9])
def test_a_team_timed_below_the_serial_best_is_timed_again_beside_it_and_duelled_where_it_is_above_now(monkeypatch, team):
    """4x960x2560 on a Zen 3 (AVX2, 2026-11-30): one of three tunes on two threads came back
    serial at 40 GFLOPS, its teams timed in a slow moment below the serial best, where the other
    two returned teams at 71-75. A team whose figure is not above the serial best's is timed
    once more beside it; above it now, the duel decides; still below, the serial best is
    returned without a duel."""
    timer = ScriptedTimer(lucky=team * SERIAL_GFLOPS, team=team * SERIAL_GFLOPS)
    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    slow_moment = ScheduleRecord(parallel_variant(serial_nest, 2)[0], 0.8 * SERIAL_GFLOPS, ())
    chosen, serial_gflops = team_or_serial(evaluator, serial, [slow_moment], retries=0)
    assert (chosen.nest is slow_moment.nest) is (team > 1) and serial_gflops == SERIAL_GFLOPS
    assert timer.threads == [2, 1] * (6 if team > 1 else 1)  # timed again side by side (then five rounds won)


@needs_two
@pytest.mark.parametrize("team, returned", [(1.04, False), (1.2, True)])
def test_a_team_must_win_by_the_margin(monkeypatch, team, returned):
    monkeypatch.setattr(evaluator_module, "time_kernel", ScriptedTimer(lucky=team * SERIAL_GFLOPS, team=team * SERIAL_GFLOPS))
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial_nest, 2)[0], team * SERIAL_GFLOPS, ())
    chosen, serial_gflops = team_or_serial(evaluator, serial, [team_record])
    assert (chosen.nest is team_record.nest) is returned and serial_gflops == SERIAL_GFLOPS
    assert TEAM_MARGIN == 0.05 and evaluator.compiled <= 2 * DUEL_MAX_ROUNDS


def test_a_serial_best_alone_is_returned_as_it_is():
    problem = looprl.matmul(24, 16, 8)
    serial = ScheduleRecord(looprl.initial_nest(problem), 3.0, ())
    assert team_or_serial(None, serial, []) == (serial, 3.0)  # nothing timed: no evaluator needed
    failed = ScheduleRecord(parallel_variant(serial.nest, 2)[0], 0.0, ())
    assert team_or_serial(None, serial, [failed]) == (serial, 3.0)


class BimodalTimer:
    """A team that runs at twice the serial speed in its first timing and then at the serial
    speed, as long as its timings alternate with the serial kernel's (the other core taken half
    the time), and at twice the serial speed once it has run several timings in a row (its
    threads spread over the cores): ``settles`` says whether that ever happens."""

    def __init__(self, settles: bool, lucky_first: bool = True):
        self.settles, self.lucky_first, self.run, self.settled, self.timings = settles, lucky_first, 0, False, 0

    def __call__(self, kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        if threads == 1:
            self.run, gflops = 0, SERIAL_GFLOPS
        else:
            self.run += 1
            self.timings += 1
            self.settled = self.settled or (self.settles and self.run >= 3)
            gflops = 2 * SERIAL_GFLOPS if self.settled or (self.lucky_first and self.timings == 1) else SERIAL_GFLOPS
        return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)


@needs_two
@pytest.mark.parametrize("settles", [True, False])
def test_a_team_that_loses_its_duel_far_ahead_at_best_is_duelled_once_more_settled(monkeypatch, settles):
    """In one run of the models benchmark on a quiet Zen 4, three GEMMs whose teams ran at twice
    their serial speed alone came back serial (their duels lost to a moment when the other core
    was taken, their best rounds far ahead): such a team runs alone for TEAM_SETTLE_S and is
    duelled again; that duel decides."""
    monkeypatch.setattr(evaluator_module, "time_kernel", BimodalTimer(settles))
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial_nest, 2)[0], 2 * SERIAL_GFLOPS, ())
    chosen, serial_gflops = team_or_serial(evaluator, serial, [team_record])
    assert (chosen.nest is team_record.nest) is settles and serial_gflops == SERIAL_GFLOPS
    assert chosen.gflops == (2 * SERIAL_GFLOPS if settles else SERIAL_GFLOPS)


@needs_two
@pytest.mark.parametrize("settles", [True, False])
def test_a_team_far_ahead_in_its_stage_that_loses_every_round_is_duelled_once_more_settled(monkeypatch, settles):
    """1x2560x960 on a quiet Zen 4 (2026-11-30): its team timed 73.1 GFLOPS in the team stage
    against the serial best's 42.4, then ran at the serial speed in every round of its duel, and
    the answer came back serial (0.54x the libraries at two threads); alone it returns the team.
    The team's figure from its stage (the record's) counts as far ahead as a best round does:
    the team runs alone for TEAM_SETTLE_S and is duelled again; that duel decides."""
    monkeypatch.setattr(evaluator_module, "time_kernel", BimodalTimer(settles, lucky_first=False))
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial_nest, 2)[0], 2 * SERIAL_GFLOPS, ())
    chosen, serial_gflops = team_or_serial(evaluator, serial, [team_record])
    assert (chosen.nest is team_record.nest) is settles and serial_gflops == SERIAL_GFLOPS


@needs_two
@pytest.mark.parametrize("teams_come_back", [True, False])
def test_teams_timed_while_their_threads_did_not_run_together_are_timed_again_once_they_do(monkeypatch, teams_come_back):
    """A 2-vCPU guest (Zen 4, 2026-11-30) ran whole seconds of two-thread timings at exactly one
    thread's speed (a pool thread woken late), every team of a problem then timed no faster than
    its serial best and returned serial. Where the serial best is returned with teams timed and
    a team's threads do not run together now, tune waits until they do, times the fastest teams
    again and judges again; where they never do, the serial best stands."""
    from looprl.measurement import load

    winner = importlib.import_module("looprl.tune.winner")
    state = {"together": False}
    monkeypatch.setattr(winner, "team_runs_now", lambda target, threads, lock=None: state["together"])
    monkeypatch.setattr(winner, "others_busy", lambda window_s=None: 0.0)
    monkeypatch.setattr(winner, "places_teams", lambda: True)

    def wait(target, threads, lock=None, timeout_s=load.TEAM_WAIT_S):
        state["together"] = teams_come_back
        return teams_come_back

    monkeypatch.setattr(winner, "wait_for_teams", wait)

    class Timer:  # a team at one thread's speed until its threads run together, then at twice
        def __call__(self, kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
            gflops = 2 * SERIAL_GFLOPS if threads != 1 and state["together"] else SERIAL_GFLOPS
            return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)

    monkeypatch.setattr(evaluator_module, "time_kernel", Timer())
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial_nest, 2)[0], SERIAL_GFLOPS * 0.99, ())  # timed at one thread's speed
    chosen, serial_gflops = team_or_serial(evaluator, serial, [team_record])
    assert (chosen.nest is team_record.nest) is teams_come_back and serial_gflops == SERIAL_GFLOPS
    assert chosen.gflops == (2 * SERIAL_GFLOPS if teams_come_back else SERIAL_GFLOPS)
    state["together"] = False
    assert team_or_serial(evaluator, serial, [team_record], retries=0)[0].nest is serial.nest  # the rule alone: serial


def _spells(monkeypatch, slow_retimes: int):
    """128x320x960 (Zen 4, 2026-11-30): its teams, timed again once a reading found the threads
    together, ran at the serial speed again (another spell had begun). This: team_or_serial of a team timed at one thread's speed whose first ``slow_retimes`` timings
    after a wait are slow too (a spell came back), then at twice the serial speed."""
    winner = importlib.import_module("looprl.tune.winner")
    state = {"waits": 0}
    monkeypatch.setattr(winner, "team_runs_now", lambda target, threads, lock=None: False)
    monkeypatch.setattr(winner, "others_busy", lambda window_s=None: 0.0)
    monkeypatch.setattr(winner, "places_teams", lambda: True)

    def wait(target, threads, lock=None, timeout_s=None):
        state["waits"] += 1
        return True

    monkeypatch.setattr(winner, "wait_for_teams", wait)

    def timer(kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        fast = threads != 1 and state["waits"] > slow_retimes
        gflops = 2 * SERIAL_GFLOPS if fast else SERIAL_GFLOPS
        return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)

    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial_nest, 2)[0], SERIAL_GFLOPS * 0.99, ())
    chosen, _ = team_or_serial(looprl.Evaluator(":memory:", 0.001, threads=2), serial, [team_record])
    return chosen.nest is team_record.nest, state["waits"]


@needs_two
@pytest.mark.parametrize("slow_retimes, returned, waits", [(0, True, 1), (2, True, 3), (3, False, 3)])
def test_a_spell_that_comes_back_is_waited_out_up_to_team_retries_times(monkeypatch, slow_retimes, returned, waits):
    from looprl.tune.winner import TEAM_RETRIES

    assert TEAM_RETRIES == 3
    assert _spells(monkeypatch, slow_retimes) == (returned, waits)


@needs_two
def test_teams_are_not_waited_for_where_other_processes_keep_a_core_busy(monkeypatch):
    """A busy machine's serial answer is its load's business (looprl.measurement.load): tune
    does not wait on another process's work."""
    winner = importlib.import_module("looprl.tune.winner")
    waited = []
    monkeypatch.setattr(winner, "team_runs_now", lambda target, threads, lock=None: False)
    monkeypatch.setattr(winner, "others_busy", lambda window_s=None: 1.0)
    monkeypatch.setattr(winner, "places_teams", lambda: True)
    monkeypatch.setattr(winner, "wait_for_teams", lambda *args, **kwargs: waited.append(1) or True)
    monkeypatch.setattr(evaluator_module, "time_kernel", ScriptedTimer(lucky=SERIAL_GFLOPS, team=SERIAL_GFLOPS))
    problem = looprl.matmul(24, 16, 8)
    serial = ScheduleRecord(looprl.initial_nest(problem), SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial.nest, 2)[0], SERIAL_GFLOPS * 0.99, ())
    assert team_or_serial(looprl.Evaluator(":memory:", 0.001, threads=2), serial, [team_record])[0].nest is serial.nest and waited == []


@needs_two
def test_teams_are_not_waited_for_where_looprl_does_not_place_them(monkeypatch):
    """Unplaced (a user's GOMP_SPINCOUNT, torch's shared pool, LOOPRL_PLACE_TEAMS=0), a team may
    share one core for good on a guest that stacks them: waiting would not end it."""
    winner = importlib.import_module("looprl.tune.winner")
    waited = []
    monkeypatch.setattr(winner, "places_teams", lambda: False)
    monkeypatch.setattr(winner, "team_runs_now", lambda target, threads, lock=None: False)
    monkeypatch.setattr(winner, "others_busy", lambda window_s=None: 0.0)
    monkeypatch.setattr(winner, "wait_for_teams", lambda *args, **kwargs: waited.append(1) or True)
    monkeypatch.setattr(evaluator_module, "time_kernel", ScriptedTimer(lucky=SERIAL_GFLOPS, team=SERIAL_GFLOPS))
    problem = looprl.matmul(24, 16, 8)
    serial = ScheduleRecord(looprl.initial_nest(problem), SERIAL_GFLOPS, ())
    team_record = ScheduleRecord(parallel_variant(serial.nest, 2)[0], SERIAL_GFLOPS * 0.99, ())
    assert team_or_serial(looprl.Evaluator(":memory:", 0.001, threads=2), serial, [team_record])[0].nest is serial.nest and waited == []


class PerTeamTimer:
    """Every serial kernel at :data:`SERIAL_GFLOPS`; each team at the speeds its script gives,
    one timing after another (the last repeated). Records the team timings' schedules."""

    def __init__(self, scripts: dict[str, list[float]]):
        self.scripts = {key: list(speeds) for key, speeds in scripts.items()}
        self.teams: list[str] = []

    def __call__(self, kernel, budget_s, workspace=None, lock=None, threads=None, min_runs=3, cold_threads=None):
        if threads == 1:
            gflops = SERIAL_GFLOPS
        else:
            self.teams.append(kernel.nest.key)
            script = self.scripts[kernel.nest.key]
            gflops = script.pop(0) if len(script) > 1 else script[0]
        return Timing(kernel.problem.flops / (gflops * 1e9), 3, 1, kernel.problem.flops)


@needs_two
def test_the_team_that_duels_is_the_one_faster_in_interleaved_rounds_not_the_one_with_a_lucky_figure(monkeypatch):
    """On a 2-vCPU Zen 3 six tunes of 1x4864x896 on two threads (informal, 2026-12-01) returned
    five teams that ran at 24 to 40 GFLOPS and one serial answer: the fastest team by one timing
    each duelled the serial best. Teams close to the fastest are timed again in interleaved
    rounds first (looprl.tune.winner.CONTENDER_ROUNDS), and the best by paired scores duels:
    here team a's figure from the team stage (250) was lucky, b runs at 200 every time, a at 120."""
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    a = parallel_variant(serial_nest, 2)[0]
    b = parallel_variant(serial_nest.split(0, 4), 2)[0]
    timer = PerTeamTimer({a.key: [120.0], b.key: [200.0]})
    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    chosen, serial_gflops = team_or_serial(evaluator, serial, [ScheduleRecord(a, 250.0, ()), ScheduleRecord(b, 200.0, ())])
    assert chosen.nest.key == b.key and chosen.gflops == pytest.approx(200.0) and serial_gflops == SERIAL_GFLOPS
    assert timer.teams[:2 * CONTENDER_ROUNDS] == [a.key, b.key] * CONTENDER_ROUNDS  # the rounds, interleaved, before the duel
    assert set(timer.teams[2 * CONTENDER_ROUNDS:]) == {b.key}  # b duelled the serial best


@needs_two
def test_a_team_far_ahead_of_the_others_duels_without_rounds_among_teams(monkeypatch):
    problem = looprl.matmul(24, 16, 8)
    serial_nest = looprl.initial_nest(problem)
    a = parallel_variant(serial_nest, 2)[0]
    b = parallel_variant(serial_nest.split(0, 4), 2)[0]
    timer = PerTeamTimer({a.key: [200.0], b.key: [100.0]})
    monkeypatch.setattr(evaluator_module, "time_kernel", timer)
    evaluator = looprl.Evaluator(":memory:", 0.001, threads=2)
    serial = ScheduleRecord(serial_nest, SERIAL_GFLOPS, ())
    chosen, _ = team_or_serial(evaluator, serial, [ScheduleRecord(a, 200.0, ()), ScheduleRecord(b, 140.0, ())])
    assert 140.0 < CONTENDER_WITHIN * 200.0
    assert chosen.nest.key == a.key and b.key not in timer.teams  # not a contender: never timed again
