"""What measured tuning may spend: a budget that grows with the problem, and measurements
whose cost is predicted before they are made.

A new schedule costs a compile plus a timing, and a timing costs at least one execution of
the kernel (the timing rule stops after the warm-up call once that call alone spends the
per-state budget). For a 256^3 matmul an execution is ~0.1 ms, so the per-state budget
(8 ms) dominates and tune measures ~20 schedules in 0.4 s; for a 1024^3 one it is ~8 ms at
peak and ~50 ms untuned, so the same 0.4 s buys a handful. :func:`scaled_budget` therefore
sizes the search for a fixed number of measurements of a good kernel of this problem, within
bounds; :class:`DeadlineEvaluator` refuses a measurement predicted to end after the deadline,
so that one slow candidate cannot carry the call past it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from looprl.ir.nest import LoopNest
from looprl.measurement.evaluator import Evaluator, Measurement

# A search that can afford this many measurements of a good kernel (compile + one execution
# or the per-state budget) finds the register tile and its cache-blocked variants.
MEASUREMENTS_WANTED = 24
# Measurements a scaled budget leaves for refining the rollout's tile (canonical order, two
# cache blocks, packing), however long the rollout's own measurements took.
REFINEMENTS = 4
MIN_BUDGET_S = 0.4  # the small problems' budget: enough for ~20 states of mm64-256
MAX_BUDGET_S = 1.5  # with the result's compile, tune stays under 2 s on the largest problems
COMPILE_GUESS_S = 0.02  # a compile before any was seen (measured 7-45 ms per state)


def state_cost_s(flops: int, gflops: float, measure_budget_s: float, compile_s: float = COMPILE_GUESS_S) -> float:
    """Predicted seconds to compile and time one schedule running at ``gflops``."""
    execution = flops / (max(gflops, 1e-3) * 1e9)
    return compile_s + max(measure_budget_s, execution)


def scaled_budget(flops: int, best_gflops: float, measure_budget_s: float) -> float:
    """Search seconds for a problem of ``flops`` where ``best_gflops`` is the best speed seen so
    far (e.g. the untuned nest's): the small problems' :data:`MIN_BUDGET_S` (which pays for the
    compiles and the per-state timing budgets) plus :data:`MEASUREMENTS_WANTED` executions of a
    kernel twice that fast, at most :data:`MAX_BUDGET_S`. A 256^3 matmul gets 0.41 s, 1024^3
    about 1 s."""
    execution = flops / (max(2 * best_gflops, 1e-3) * 1e9)
    extra = MEASUREMENTS_WANTED * max(0.0, execution - measure_budget_s / 8)
    return min(MAX_BUDGET_S, MIN_BUDGET_S + extra)


@dataclass
class DeadlineEvaluator:
    """An :class:`Evaluator` that refuses what it predicts would end after ``deadline``.

    The prediction takes the schedule to run at half the speed of the last schedule measured
    (a proposal changes one part of a schedule; it is rarely more than 2x slower than the one it
    came from) plus a compile as long as the longest one seen. A refused schedule is a failed
    :class:`Measurement` (``error`` says why), which the rollout and the guided search treat
    as a schedule that could not be built. A schedule already in the cache costs nothing and is
    never refused. ``deadline`` None: nothing is refused. Time spent waiting for the
    machine-wide timing lock (another looprl process timing) moves the deadline by as much: a
    search on a busy machine takes longer rather than returning whatever it had measured."""

    evaluator: Evaluator
    deadline: float | None
    reference_gflops: float = 0.0
    longest_compile_s: float = COMPILE_GUESS_S
    refused: int = 0
    waited_s: float = 0.0  # time spent waiting for the timing lock, added to the deadline
    _known: dict = field(default_factory=dict)  # schedule key -> Measurement made through this object

    @property
    def target(self):
        return self.evaluator.target

    @property
    def cache(self):
        return self.evaluator.cache

    @property
    def budget_s(self) -> float:
        return self.evaluator.budget_s

    @property
    def compiled(self) -> int:
        return self.evaluator.compiled

    def predicted_cost_s(self, flops: int) -> float:
        """Predicted seconds of one new measurement of a problem of ``flops``."""
        return state_cost_s(flops, max(self.reference_gflops, 1e-3) / 2, self.evaluator.budget_s, self.longest_compile_s)

    def predicted_s(self, nest: LoopNest) -> float:
        if nest.key in self._known:
            return 0.0
        known = self.evaluator.cache.lookup(nest, self.evaluator.target, self.evaluator.budget_s, getattr(self.evaluator, "threads", 1))
        if known is not None and known.samples >= self.evaluator.samples:
            return 0.0
        if self.reference_gflops <= 0:
            return 0.0  # nothing measured yet: the first (untuned) state is always measured
        return self.predicted_cost_s(nest.problem.flops)

    def __call__(self, nest: LoopNest) -> Measurement:
        """Measure ``nest`` once per object (a state met again keeps its first figure, as
        within one search), unless predicted to end after the deadline."""
        if nest.key in self._known:
            return self._known[nest.key]
        predicted = self.predicted_s(nest) if self.deadline is not None else 0.0
        if predicted > 0 and time.perf_counter() + predicted > self.deadline:
            self.refused += 1
            return Measurement(0.0, False, error="not measured: predicted to end after the deadline")
        asked = time.perf_counter()
        measurement = self.evaluator(nest)
        waited = time.perf_counter() - asked - measurement.compile_s - measurement.measure_s
        if waited > 0.005 and measurement.ok and not measurement.from_cache:
            # Another process held the machine-wide timing lock: that time is not this search's.
            self.waited_s += waited
            if self.deadline is not None:
                self.deadline += waited
        if measurement.ok:
            self._known[nest.key] = measurement
            if measurement.gflops > 0:
                self.reference_gflops = measurement.gflops
            self.longest_compile_s = max(self.longest_compile_s, measurement.compile_s)
        return measurement

    def remeasure(self, nest: LoopNest) -> Measurement:
        """Time ``nest`` again (its samples keep the best), unless predicted to end after the
        deadline; what it returns replaces the figure this object knew."""
        if self.deadline is not None and nest.key in self._known:
            cost = state_cost_s(nest.problem.flops, self._known[nest.key].gflops, self.evaluator.budget_s, 0.0)
            if time.perf_counter() + cost > self.deadline:
                self.refused += 1
                return Measurement(0.0, False, error="not measured: predicted to end after the deadline")
        measurement = self.evaluator.remeasure(nest)
        if measurement.ok:
            self._known[nest.key] = measurement
        return measurement

    def remaining_s(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()
