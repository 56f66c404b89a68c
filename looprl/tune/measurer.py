"""Tune's one measurer: every timing of a proposal goes through it.

It wraps the :class:`~looprl.measurement.evaluator.Evaluator` (compile, time with cold
rotation under the machine-wide lock, check against the reference, the measurement cache) on
one thread and on the threads offered, and opens the staged searches
(:class:`~looprl.search.staged.StagedSearch`: their contexts measure proposals within a
budget); the fast path's proposals are timed one at a time (:meth:`Measurer.timed`).
It also measures what a re-laid copy's comparison costs a call on this host
(:meth:`Measurer.comparison_seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from looprl.backend.host import cache_sizes
from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.roofline import memory_bandwidth
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.staged import StagedSearch
from looprl.target import Target


@dataclass(frozen=True)
class Measurer:
    """Times tune's proposals: ``evaluator`` on one thread (its cache and budget per
    schedule), ``threads`` the kernel may use."""

    evaluator: Evaluator
    threads: int

    @classmethod
    def open(cls, cache, measure_budget_s: float, target: Target, threads: int) -> "Measurer":
        """A measurer over the measurement cache ``cache`` (a path, ``":memory:"`` or None),
        timing each new schedule for ``measure_budget_s``."""
        return cls(Evaluator(cache, measure_budget_s, target=target, cold_threads=threads), threads)

    @property
    def target(self) -> Target:
        return self.evaluator.target

    @property
    def cache(self):
        return self.evaluator.cache

    @property
    def budget_s(self) -> float:
        """Timing budget per schedule."""
        return self.evaluator.budget_s

    @property
    def compiled(self) -> int:
        """Schedules compiled and timed on one thread so far."""
        return self.evaluator.compiled

    def on_threads(self) -> Evaluator:
        """An evaluator that times parallel schedules on the threads offered (the one-thread
        evaluator where there is one thread); a new one each call, sharing the buffers."""
        return self.evaluator.with_threads(self.threads) if self.threads > 1 else self.evaluator

    @cached_property
    def team(self) -> Evaluator:
        """The fast path's evaluator on the threads offered (one, kept: its count is the
        teams' timings)."""
        return self.on_threads()

    def policy_evaluator(self, parallel: bool) -> Evaluator:
        """The evaluator that times the fast path's episodes: :attr:`team` for a policy whose
        actions mark loops parallel (``parallel``: it decides the thread split itself), else
        the one-thread evaluator."""
        return self.team if parallel else self.evaluator

    def search(self, problem: Problem, budget_s: float | None, started: float | None = None) -> StagedSearch:
        """A staged search of ``problem`` timed by the one-thread evaluator, ``budget_s``
        counted from ``started``."""
        return StagedSearch(problem, self.evaluator, budget_s=budget_s, started=started)

    def timed(self, proposal: ScheduleRecord, evaluator: Evaluator) -> ScheduleRecord:
        """``proposal`` (a record with a nest and its path, no speed yet) timed through
        ``evaluator`` (one of this measurer's: a schedule the cache holds with enough samples
        is looked up, not timed): its schedule as compiled, the bfloat16 weight paired where the
        kernel can take pairs (as the record is, once made for the target)."""
        return replace(proposal, gflops=evaluator(with_pairs(proposal.nest, evaluator.target)).gflops)

    def comparison_seconds(self, constant_bytes: int, between: int = 0) -> float:
        """What comparing a re-laid copy of a problem's constant inputs (``constant_bytes``) with
        them costs a call: both read once, at the host's measured bandwidth from where they live
        (the last-level cache when both fit it with the ``between`` bytes other work reads
        between two calls, :attr:`Problem.between <looprl.ir.problem.Problem.between>`, else
        memory: a decode step's layer compares two copies its other layers have evicted)."""
        read = 2 * constant_bytes
        bandwidth = memory_bandwidth(self.target, self.cache, threads=self.threads)
        return read / (1e9 * bandwidth["llc" if read + between <= cache_sizes()[1] else "dram"])
