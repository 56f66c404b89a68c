"""What a search may spend, in one place: a wall-clock deadline, a count of distinct schedules,
and a prediction of each new measurement's cost so that none starts that would end after the
deadline.

A new schedule costs a compile plus a timing, and a timing costs at least one execution of
the kernel (the timing rule stops after the warm-up call once that call alone spends the
per-state budget). For a 256^3 matmul an execution is ~0.1 ms, so the per-state budget
(8 ms) dominates and tune measures ~20 schedules in 0.4 s; for a 1024^3 one it is ~8 ms at
peak and ~50 ms untuned, so the same 0.4 s buys a handful. :func:`scaled_budget` therefore
sizes tune's search for a fixed number of measurements of a good kernel of this problem,
within bounds; :class:`Budget` refuses a measurement predicted to end after the deadline, so
that one slow candidate cannot carry a search past it, and moves the deadline by the time
spent waiting for another looprl process's timing (the machine-wide lock): a search on a busy
machine takes longer rather than returning whatever it had measured.

The limits' names: ``max_evaluations`` caps distinct schedules everywhere (``looprl.search.run``,
``looprl.tune``, whose former ``max_measurements`` still works with a DeprecationWarning).
``budget_s=None`` means one thing everywhere (``looprl.tune``, whose default it is,
``looprl.search.run`` and a :class:`~looprl.search.staged.StagedSearch`): a budget scaled to
the problem (:func:`scaled_budget`, from the untuned nest's speed, measured first). No time
limit is spelt ``math.inf`` (``looprl.search.run``, a StagedSearch's default; ``looprl-search
--budget inf``), which the budget checks (:func:`looprl.checks.seconds` with ``allow_inf``)
accept there; tune's ``budget_s=0`` is its rollout alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# A search that can afford this many measurements of a good kernel (compile + one execution
# or the per-state budget) finds the register tile and its cache-blocked variants.
MEASUREMENTS_WANTED = 24
# Measurements a scaled budget leaves for refining the rollout's tile (canonical order, two
# cache blocks, packing), however long the rollout's own measurements took.
REFINEMENTS = 4
MIN_BUDGET_S = 0.4  # the small problems' budget: enough for ~20 states of mm64-256
MAX_BUDGET_S = 1.5  # with the result's compile, tune stays under 2 s on the largest problems
COMPILE_GUESS_S = 0.02  # a compile before any was seen (measured 7-45 ms per state)
WAIT_NOTICED_S = 0.005  # lock waits shorter than this are not counted


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
class Budget:
    """A search's limits and what it has learnt of the cost of a measurement.

    ``deadline``: a ``time.perf_counter()`` value, or None for no time limit; ``max_evaluations``:
    distinct schedules, or None. The prediction takes a new schedule to run at half the speed
    of the last one measured (a proposal changes one part of a schedule; it is rarely more than
    2x slower than the one it came from) plus a compile as long as the longest seen; before
    anything is measured nothing is refused (the first, untuned state is always measured)."""

    deadline: float | None = None
    max_evaluations: int | None = None
    reference_gflops: float = 0.0
    longest_compile_s: float = COMPILE_GUESS_S
    waited_s: float = 0.0  # time spent waiting for the timing lock, added to the deadline
    refused: int = 0  # measurements not started because they were predicted to end too late

    def why_stop(self, evaluations: int) -> str | None:
        """Why nothing more may be evaluated now, or None."""
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "time budget"
        if self.max_evaluations is not None and evaluations >= self.max_evaluations:
            return "evaluation budget"
        return None

    def predicted_cost_s(self, flops: int, measure_budget_s: float) -> float:
        """Predicted seconds of one new measurement of a problem of ``flops``."""
        return state_cost_s(flops, max(self.reference_gflops, 1e-3) / 2, measure_budget_s, self.longest_compile_s)

    def refuses(self, flops: int, measure_budget_s: float) -> bool:
        """Whether a new measurement is predicted to end after the deadline (counted)."""
        if self.deadline is None or self.reference_gflops <= 0:
            return False
        if time.perf_counter() + self.predicted_cost_s(flops, measure_budget_s) <= self.deadline:
            return False
        self.refused += 1
        return True

    def refuses_again(self, flops: int, gflops: float, measure_budget_s: float) -> bool:
        """Whether timing again a schedule known to run at ``gflops`` would end after the
        deadline (counted)."""
        if self.deadline is None or time.perf_counter() + state_cost_s(flops, gflops, measure_budget_s, 0.0) <= self.deadline:
            return False
        self.refused += 1
        return True

    def record(self, measurement) -> None:
        """Learn from a measurement: its speed and compile time, and its wait for the timing
        lock (which moves the deadline)."""
        if not measurement.ok:
            return
        waited = getattr(measurement, "waited_s", 0.0)
        if waited > WAIT_NOTICED_S:
            self.waited_s += waited
            if self.deadline is not None:
                self.deadline += waited
        if measurement.gflops > 0:
            self.reference_gflops = measurement.gflops
        self.longest_compile_s = max(self.longest_compile_s, measurement.compile_s)
