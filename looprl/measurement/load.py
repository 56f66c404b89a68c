"""The machine's load: whether other work slows the kernels timed now, so that a busy moment is
not remembered as this machine's speed.

A reading (:func:`check_load`) times a small fixed reference kernel (the peak kernel of
:mod:`looprl.measurement.peak` with as many chains as the registers hold, for
:data:`REFERENCE_BUDGET_S`, a few milliseconds) on the threads the work will use, and compares it
with its quiet figure: the best reading seen under the same cache key (this host, the target,
the code generator's and timing's versions and the threads:
:func:`~looprl.measurement.keys.reference_key`), kept in the measurement cache. The machine is
busy when the reading is below :data:`BUSY_RATIO` of the quiet figure.

The first reading under a key becomes its quiet figure. One taken under load is corrected by
the first quieter reading after it (the best seen wins), and what was judged against it is judged
again: a tuned answer keeps the reference kernel's GFLOPS during its search
(:attr:`ScheduleRecord.reference_gflops
<looprl.measurement.schedule_record.ScheduleRecord.reference_gflops>`), not a verdict, and
:meth:`MeasurementCache.get_tuned <looprl.measurement.cache.MeasurementCache.get_tuned>`
compares it with the quiet figure of the moment it is read. An answer found during a busy first
run is served as final until a quiet reading is seen, and provisional from then on.

How ``tune`` uses it:

* :func:`check_load` before and after a measured search; the answer is stored with the busier
  reading's reference (:func:`measured_under`), so an answer found on a busy machine is
  remembered as provisional: ``get_tuned`` does not return it (unless asked for provisional
  answers too) and the next tune searches again; the measurements that search wrote are made
  to count one sample (:meth:`MeasurementCache.unsettle
  <looprl.measurement.cache.MeasurementCache.unsettle>`), so the next search times them again
  rather than ranking by busy figures;
* before serving a remembered answer while the machine is quiet, :func:`retime_remembered`:
  an answer that now runs below :data:`BUSY_RATIO` of its recorded speed is not served as final;
* a baseline timed between two readings of which one is busy is printed with
  :meth:`LoadReading.describe`, as not a fair figure (``looprl-tune``).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace

from looprl import checks, defaults
from looprl.backend.peak_kernel import peak_chain_counts
from looprl.backend.placement import placed_team
from looprl.backend.threads import before_parallel_call, check_threads
from looprl.measurement import timing
from looprl.measurement.peak import chain_kernel
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target

# Busy: the reference kernel runs below this share of its quiet figure. Noise on a quiet machine
# only slows a run down by a few percent; another process on the same physical core slows a
# kernel by about 1.5x (looprl.measurement.lock).
BUSY_RATIO = 0.8
REFERENCE_BUDGET_S = 0.01  # one reading's timing budget (a rep of the kernel takes microseconds)
RETIME_TRIES = 2  # timings of a remembered answer before it is judged slower than its record
# A team's reading below BUSY_RATIO is taken again after the team ran this long: after the process
# started another (a baseline's child), a two-thread kernel ran at half speed for its next
# calls, its threads sharing a core until the scheduler spread them; 0.02 s of running did not
# restore it, 0.05 s did (Zen 4, 2 vCPUs, 2026-11-29).
TEAM_SETTLE_S = 0.1


# A team of ``threads`` runs its threads together now where the reference kernel on them runs at
# least this share of ``threads`` times its one-thread speed (team_runs_now). On a 2-vCPU KVM guest
# (AMD EPYC Zen 4, 2026-11-30), with every other process idle and each thread of the team held to
# a core of its own, 6 of 60 readings of the two-thread reference, in runs of about a second,
# came out at exactly its one-thread speed (118.0 GFLOPS against 236): the pool thread, asleep
# between calls, woke only after the calling thread had done its share (with the pool threads
# spinning, OMP_WAIT_POLICY=ACTIVE, none of 60 did). A team timed then is timed at one thread's
# speed, and in one run of the models benchmark six problems came back serial so.
TEAM_SCALING = 0.75
TEAM_WAIT_S = 2.0  # how long team_runs_now is waited for (wait_for_teams), polled every TEAM_POLL_S
TEAM_POLL_S = 0.1
# Where other processes keep this share of a core busy or more (others_busy, read over
# OTHERS_WINDOW_S), a team that does not run together is slowed by them, not by a thread woken
# late: waiting for it would wait on their work (a test run's other worker, a user's job).
OTHERS_BUSY_CORES = 0.5
OTHERS_WINDOW_S = 0.05


@dataclass(frozen=True)
class LoadReading:
    """One reading of the machine's load: the reference kernel's GFLOPS now, and its quiet
    figure (the best seen, this reading included)."""

    reference_gflops: float
    quiet_gflops: float

    def __post_init__(self) -> None:
        for name in ("reference_gflops", "quiet_gflops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive, finite number of GFLOPS, got {value!r:.80}")
        if self.reference_gflops > self.quiet_gflops:
            raise ValueError(f"the quiet figure is the best reading seen: {self.quiet_gflops!r} is below this reading "
                             f"{self.reference_gflops!r}")

    @property
    def ratio(self) -> float:
        """The reference kernel's speed now as a share of its quiet figure (at most 1)."""
        return self.reference_gflops / self.quiet_gflops

    @property
    def busy(self) -> bool:
        """Whether other work slowed the reference kernel below :data:`BUSY_RATIO` of its quiet figure."""
        return self.ratio < BUSY_RATIO

    def describe(self) -> str:
        """The reading in words, e.g. ``"reference kernel at 0.45x its quiet speed"``."""
        return f"reference kernel at {self.ratio:.2f}x its quiet speed"


def busiest(*readings: LoadReading) -> LoadReading:
    """The reading of the busiest moment (the lowest ratio) of ``readings`` (at least one)."""
    if not readings or not all(isinstance(reading, LoadReading) for reading in readings):
        raise ValueError(f"busiest() takes one or more LoadReadings, got {readings!r:.200}")
    return min(readings, key=lambda reading: reading.ratio)


def measured_under(record: ScheduleRecord, *readings: LoadReading) -> ScheduleRecord:
    """``record`` with the reference reading of the busiest of ``readings`` (those taken around
    its search), to be stored by :meth:`~looprl.measurement.cache.MeasurementCache.put_tuned`."""
    if not isinstance(record, ScheduleRecord):
        raise ValueError(f"measured_under() takes a ScheduleRecord, got {type(record).__name__}")
    return replace(record, reference_gflops=busiest(*readings).reference_gflops)


def time_reference(target: Target, threads: int = 1, lock=None, settle_s: float = 0.0) -> float:
    """GFLOPS of the reference kernel for ``target`` (which must run on this host) on ``threads``
    threads now: the peak kernel with as many chains as the registers hold, timed by the common
    rule (:func:`~looprl.measurement.timing.best_time`, under ``lock``: None, the machine-wide
    lock) for :data:`REFERENCE_BUDGET_S`, after running untimed for ``settle_s`` seconds.
    Compiled once per process."""
    threads = check_threads(threads)
    target.check_runs_on_host()
    kernel = chain_kernel(target, max(peak_chain_counts(target)), threads)
    before_parallel_call(threads)
    with placed_team(threads):
        settled = time.perf_counter() + settle_s
        while time.perf_counter() < settled:
            kernel.run(100)
        return timing.best_time(kernel.run, REFERENCE_BUDGET_S, flops=kernel.flops, lock=lock).gflops


def team_runs_now(target: Target, threads: int, lock=None) -> bool:
    """Whether a team of ``threads`` threads runs its threads together now: the reference kernel
    (:func:`time_reference`) on ``threads`` threads at least :data:`TEAM_SCALING` x ``threads``
    times its speed on one, the two read one after the other (see :data:`TEAM_SCALING`)."""
    threads = check_threads(threads)
    if threads == 1:
        return True
    return time_reference(target, threads, lock) >= TEAM_SCALING * threads * time_reference(target, 1, lock)


def wait_for_teams(target: Target, threads: int, lock=None, timeout_s: float = TEAM_WAIT_S) -> bool:
    """Wait until :func:`team_runs_now` (polled every :data:`TEAM_POLL_S`) for at most
    ``timeout_s`` seconds: whether it does. False at once where other processes keep
    :data:`OTHERS_BUSY_CORES` of a core busy (:func:`others_busy`): their work, not a late
    thread, keeps the team apart."""
    deadline = time.perf_counter() + checks.seconds(timeout_s, "timeout_s", allow_zero=True)
    while True:
        if team_runs_now(target, threads, lock):
            return True
        if others_busy() >= OTHERS_BUSY_CORES or time.perf_counter() + TEAM_POLL_S > deadline:
            return False
        time.sleep(TEAM_POLL_S)


def others_busy(window_s: float = OTHERS_WINDOW_S) -> float:
    """Cores' worth of CPU time that other processes used over the next ``window_s`` seconds
    (this process sleeps meanwhile): the machine's busy time (``/proc/stat``) less this
    process's own (``/proc/self/stat``), in jiffies of the clock tick; 0.0 where those files
    cannot be read (not Linux)."""
    before = _busy_jiffies()
    time.sleep(window_s)
    after = _busy_jiffies()
    if before is None or after is None:
        return 0.0
    others = (after[0] - before[0]) - (after[1] - before[1])  # (read from /proc: Linux, which has sysconf)
    return max(0.0, others / os.sysconf("SC_CLK_TCK") / window_s)


def _busy_jiffies() -> tuple[int, int] | None:
    """(the machine's busy jiffies over all cores, this process's), or None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        with open("/proc/self/stat", encoding="ascii") as own:
            mine = own.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    steal = fields[7] if len(fields) > 7 else 0
    return sum(fields[:8]) - idle - steal, int(mine[11]) + int(mine[12])


def check_load(target: Target | str | None = None, cache=None, *, threads: int = 1, budget_s: float = defaults.STATE_BUDGET_S,
               lock=None) -> LoadReading:
    """A reading of the machine's load for work on ``threads`` threads of code for ``target``
    (None: the host's), against the quiet figure in ``cache`` (a
    :class:`~looprl.measurement.cache.MeasurementCache`, a path, or None: the per-user cache)
    under the key of measurements timed with ``budget_s`` per state (tune's evaluator's
    budget, so that its answers are judged against the same figure); a reading faster than
    the quiet figure becomes it. ``lock``: held while timing (None: the machine-wide lock)."""
    from looprl.measurement.evaluator import open_cache  # (the evaluator's module imports the cache, which imports this one)

    target = Target.resolve(target)
    threads = check_threads(threads)
    store = open_cache(cache)
    try:
        reference = time_reference(target, threads, lock)
        known = store.get_quiet(target, budget_s, threads)
        if threads > 1 and known is not None and reference < BUSY_RATIO * known:  # a team not yet spread over the cores?
            reference = max(reference, time_reference(target, threads, lock, settle_s=TEAM_SETTLE_S))
        quiet = store.note_reference(reference, target, budget_s, threads)
    finally:
        if store is not cache:
            store.close()
    return LoadReading(reference, max(quiet, reference))


def retime_remembered(record, evaluator) -> bool:
    """Whether a remembered answer (a :class:`~looprl.measurement.schedule_record.ScheduleRecord`
    of :meth:`~looprl.measurement.cache.MeasurementCache.get_tuned`) still runs at its recorded
    speed: its schedule timed again by ``evaluator`` (an :class:`~looprl.measurement.evaluator.Evaluator`
    of its target; on its threads), up to :data:`RETIME_TRIES` times, until one timing reaches
    :data:`BUSY_RATIO` of ``record.gflops``. False: it ran slower every time (or failed), so it
    is not to be served as final; tune searches again and stores what it finds. Each timing is
    added to the measurement cache's samples. Ask only while :func:`check_load` says the
    machine is quiet: on a busy machine every answer runs slow."""
    from looprl.measurement.evaluator import Evaluator  # (the evaluator's module imports the cache, which imports this one)

    if not isinstance(record, ScheduleRecord):
        raise ValueError(f"retime_remembered() takes a ScheduleRecord, got {type(record).__name__}")
    if not isinstance(evaluator, Evaluator):
        raise ValueError(f"retime_remembered() takes an Evaluator, got {type(evaluator).__name__}")
    if record.target is not None and record.target != evaluator.target:
        raise ValueError(f"the record was measured for {record.target.isa}, the evaluator measures {evaluator.target.isa}")
    timed = evaluator if evaluator.threads == record.threads else evaluator.with_threads(record.threads)
    for _ in range(RETIME_TRIES):
        measured = timed.remeasure(record.nest)
        if measured.ok and measured.sample_gflops >= BUSY_RATIO * record.gflops:
            return True
    return False
