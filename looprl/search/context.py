"""The one search engine's bookkeeping: every search (greedy, beam, random walks, AutoTVM,
the policy-guided search and tune's stages) evaluates schedules through a
:class:`SearchContext`, which owns the memo of what this search has measured, the budget
(:class:`~looprl.search.budget.Budget`: deadline, evaluation count, predicted cost, lock
waits), the best state so far, the best-so-far curve and the search graph. Strategies
propose states and are told their values; moving between states follows the one transition
rule (:func:`looprl.actions.step`): an invalid action or a schedule that fails to compile or
run gives no new node."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from looprl.actions import ActionSet, State, step
from looprl.interrupts import check_interrupt
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Measurement
from looprl.measurement.pair_steps import with_pairs
from looprl.search.budget import Budget

logger = logging.getLogger("looprl.search")


class BudgetExhausted(Exception):
    """Raised inside a strategy when the time or evaluation budget is spent."""


@dataclass(frozen=True)
class Node:
    """A state reached by a search, with the action path from the initial state."""

    state: State
    path: tuple[int, ...]
    gflops: float


def node_id(state: State) -> str:
    return f"{state.nest.key}@{state.cursor}"


class SearchContext:
    """Evaluates states for a strategy and records everything a search result needs.

    :meth:`measure` is the only place a search learns a schedule's value: it takes a state's
    nest as the schedule compiled for the context's target (its bfloat16 weight paired where
    the kernel can take pairs: :func:`~looprl.measurement.pair_steps.with_pairs`, the search's
    one call of it; the states themselves stay as the actions made them), looks the schedule up
    in this search's memo, then asks the evaluator (persistent cache, else compile
    and time), and raises :class:`BudgetExhausted` instead of starting a new measurement once
    the deadline or the evaluation count is reached, or when the measurement is predicted to
    end after the deadline. A failed schedule is remembered as failed (never measured twice,
    never a node)."""

    def __init__(
        self,
        problem: Problem,
        actions: ActionSet,
        evaluator,
        budget_s: float | None = None,
        max_evaluations: int | None = None,
        progress: Callable[["SearchContext"], None] | None = None,
        progress_every_s: float = 5.0,
        start: LoopNest | None = None,
        target=None,
    ):
        self.problem = problem
        # What code is generated for: the evaluator's (a stand-in evaluator may have none: give it).
        self.target = target if target is not None else getattr(evaluator, "target", None)
        self.start = start if start is not None else initial_nest(problem)  # the root's schedule
        self.actions = actions
        self.evaluator = evaluator
        self.started = time.perf_counter()
        self.budget = Budget(None if budget_s is None else self.started + budget_s, max_evaluations)
        self.values: dict[str, float] = {}  # schedule key -> GFLOPS, this search
        self.failed: dict[str, str] = {}  # schedule key -> why it could not be built or run
        self.new_measurements = 0  # schedules timed (not final in the cache): what a cap on measurements counts
        self.retimed = 0  # timings again of schedules already timed (a winner's confirmation)
        self.failures = 0
        self.graph = nx.DiGraph(problem=problem.name)
        self.curve: list[tuple[float, int, float]] = []  # (seconds, evaluations, best GFLOPS)
        self.best: Node | None = None
        self._root: Node | None = None
        self._progress = progress
        self._progress_every_s = progress_every_s
        self._last_progress = self.started

    # -- budget ----------------------------------------------------------------------
    @property
    def deadline(self) -> float | None:
        return self.budget.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.budget.deadline = value

    @property
    def max_evaluations(self) -> int | None:
        return self.budget.max_evaluations

    @property
    def evaluations(self) -> int:
        """Distinct schedules this search has evaluated (from the cache or measured)."""
        return len(self.values) + len(self.failed)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @property
    def threads(self) -> int:
        """The threads the evaluator measures on."""
        return getattr(self.evaluator, "threads", 1)

    @property
    def measure_budget_s(self) -> float:
        """The evaluator's timing budget per schedule (what a measurement costs at least)."""
        return getattr(self.evaluator, "budget_s", 0.0)

    def exhausted(self) -> str | None:
        """Why the search must stop now, or None (a lost stop signal raises KeyboardInterrupt)."""
        check_interrupt()
        return self.budget.why_stop(self.evaluations)

    def predicted_cost_s(self) -> float:
        """Predicted seconds of one new measurement of this problem."""
        return self.budget.predicted_cost_s(self.problem.flops, self.measure_budget_s)

    # -- evaluation ------------------------------------------------------------------
    def measure(self, nest: LoopNest, force: bool = False) -> Measurement:
        """The value of ``nest``: this search's memo, else the evaluator's (``force``: whatever
        the budget). A failed schedule gives a failed :class:`Measurement`."""
        nest = self.schedule(nest)
        key = nest.key
        if key in self.values:
            return Measurement(self.values[key], from_cache=True)
        if key in self.failed:
            return Measurement(0.0, from_cache=True, error=self.failed[key])
        if not force:
            reason = self.exhausted()
            if reason is None and not self._is_final(nest) and self.budget.refuses(nest.problem.flops, self.measure_budget_s):
                reason = "time budget"
            if reason is not None:
                raise BudgetExhausted(reason)
        measurement = self.evaluator(nest)
        self.budget.record(measurement)
        if not measurement.from_cache:
            self.new_measurements += 1
        if measurement.ok:
            self.values[key] = measurement.gflops
        else:
            self.failures += 1
            self.failed[key] = measurement.error
            logger.warning("schedule %s of %s failed: %s", key, self.problem.name, measurement.error)
        self._report_progress()
        return measurement

    def remeasure(self, nest: LoopNest, force: bool = False) -> Measurement:
        """Time ``nest`` (measured before) again, unless predicted to end after the deadline
        (:class:`BudgetExhausted`; ``force``: whatever the budget); its samples keep the best,
        and this search takes the new figure."""
        nest = self.schedule(nest)
        known = self.values.get(nest.key)
        if not force and known is not None and self.budget.refuses_again(nest.problem.flops, known, self.measure_budget_s):
            raise BudgetExhausted("time budget")
        remeasure = getattr(self.evaluator, "remeasure", None)
        if remeasure is None:  # a stand-in evaluator that cannot time again: the figure stays
            return self.measure(nest, force=True)
        measurement = remeasure(nest)
        if not measurement.from_cache:
            self.retimed += 1
        if measurement.ok:
            self.values[nest.key] = measurement.gflops
        return measurement

    def schedule(self, nest: LoopNest) -> LoopNest:
        """The schedule this search compiles and measures for a state's ``nest``: its bfloat16
        weight paired where the kernel for the context's target can take pairs."""
        return with_pairs(nest, self.target)

    def _is_final(self, nest: LoopNest) -> bool:
        """Whether the evaluator would answer ``nest`` from its cache without timing it."""
        is_final = getattr(self.evaluator, "is_final", None)
        return bool(is_final(nest)) if is_final is not None else False

    # -- nodes -----------------------------------------------------------------------
    def root(self) -> Node:
        """The initial state, evaluated whatever the budget (once: later calls return it);
        0 GFLOPS if even the untuned nest fails."""
        if self._root is not None:
            return self._root
        state = State(self.start, 0)
        node = Node(state, (), self.measure(state.nest, force=True).gflops)
        self._add(node)
        self._root = node
        return node

    def child(self, parent: Node, action: int) -> Node | None:
        """The node after ``action`` (evaluated), or None when the action cannot apply or its
        schedule fails (:func:`looprl.actions.step`)."""
        transition = step(self.actions, parent.state, parent.gflops, action, self.measure)
        if not transition.valid or transition.outcome == "failed":
            return None
        node = Node(transition.state, parent.path + (action,), transition.gflops)
        self._add(node)
        self.graph.add_edge(node_id(parent.state), node_id(node.state), action=self.actions.names[action])
        return node

    def children(self, parent: Node) -> list[Node]:
        """All children of ``parent`` that apply and do not fail, evaluated, in action order."""
        found = []
        for action in range(len(self.actions)):
            node = self.child(parent, action)
            if node is not None:
                found.append(node)
        return found

    def node_after(self, parent: Node, path) -> Node:
        """The node ``path`` (action indices or names) leads to from ``parent``, under the
        transition rule: an action that cannot apply or whose schedule fails leaves the node."""
        node = parent
        for action in path:
            node = self.child(node, self.actions.as_index(action)) or node
        return node

    def visit(self, nest: LoopNest) -> Node | None:
        """The node of a schedule reached otherwise than by the actions (e.g. a model-guided
        search), evaluated: cursor 0, no action path, no edge in the graph; None if it fails."""
        if not isinstance(nest, LoopNest) or nest.problem != self.problem:
            raise ValueError(f"expected a LoopNest of {self.problem.name}, got {nest!r:.200}")
        measurement = self.measure(nest)
        if not measurement.ok:
            return None
        node = Node(State(nest, 0), (), measurement.gflops)
        self._add(node)
        return node

    def _add(self, node: Node) -> None:
        """Put ``node`` in the graph and keep it if it beats the best so far (ties keep the
        shorter, earlier path)."""
        target = node_id(node.state)
        if target not in self.graph:
            state = node.state
            self.graph.add_node(target, gflops=node.gflops, schedule=state.nest.key, cursor=state.cursor, depth=len(node.path))
        if self.best is None or node.gflops > self.best.gflops:
            self.best = node
            self.curve.append((self.elapsed_s, self.evaluations, node.gflops))

    def _report_progress(self) -> None:
        if self._progress is None:
            return
        now = time.perf_counter()
        if now - self._last_progress >= self._progress_every_s:
            self._last_progress = now
            self._progress(self)
