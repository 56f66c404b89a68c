"""Bookkeeping shared by every search: budgets, the per-search state memo, the best state so
far, the best-so-far curve and the search graph."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import networkx as nx

from looprl.env.actions import ActionSet, State
from looprl.interrupts import check_interrupt
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Evaluator

logger = logging.getLogger("looprl.search")


class BudgetExhausted(Exception):
    """Raised inside an algorithm when the time or evaluation budget is spent."""


@dataclass(frozen=True)
class Node:
    """A state reached by a search, with the action path from the initial state."""

    state: State
    path: tuple[int, ...]
    gflops: float


def node_id(state: State) -> str:
    return f"{state.nest.key}@{state.cursor}"


class SearchContext:
    """Evaluates states for an algorithm and records everything a :class:`SearchResult` needs.

    ``evaluate`` is the only place a search learns a state's value: it looks the schedule
    up in this search's memo, then in the evaluator (persistent cache, else compile and
    time), and raises :class:`BudgetExhausted` before starting a new evaluation once the
    wall-clock deadline or the evaluation count is reached."""

    def __init__(
        self,
        problem: Problem,
        actions: ActionSet,
        evaluator: Evaluator,
        budget_s: float | None,
        max_evaluations: int | None,
        progress: Callable[["SearchContext"], None] | None = None,
        progress_every_s: float = 5.0,
        start: LoopNest | None = None,
    ):
        self.problem = problem
        self.start = start if start is not None else initial_nest(problem)  # the root's schedule
        self.actions = actions
        self.evaluator = evaluator
        self.budget_s = budget_s
        self.max_evaluations = max_evaluations
        self.started = time.perf_counter()
        self.deadline = None if budget_s is None else self.started + budget_s
        self.values: dict[str, float] = {}  # schedule key -> GFLOPS, this search
        self.new_measurements = 0  # schedules compiled and timed (not found in the cache)
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
    def evaluations(self) -> int:
        """Distinct schedules this search has evaluated (from the cache or measured)."""
        return len(self.values)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def exhausted(self) -> str | None:
        """Why the search must stop now, or None (a lost stop signal raises KeyboardInterrupt)."""
        check_interrupt()
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return "time budget"
        if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
            return "evaluation budget"
        return None

    # -- evaluation ------------------------------------------------------------------
    def root(self) -> Node:
        """The initial state, evaluated whatever the budget (once: later calls return it)."""
        if self._root is not None:
            return self._root
        state = State(self.start, 0)
        node = Node(state, (), self._value(state, force=True))
        self.graph.add_node(node_id(state), gflops=node.gflops, schedule=state.nest.key, cursor=0, depth=0)
        self._offer(node)
        self._root = node
        return node

    def child(self, parent: Node, action: int) -> Node | None:
        """The node after ``action`` (evaluated), or None when the action cannot apply."""
        state = self.actions.apply(parent.state, action)
        if state is None:
            return None
        node = Node(state, parent.path + (action,), self._value(state))
        target = node_id(state)
        if target not in self.graph:
            self.graph.add_node(target, gflops=node.gflops, schedule=state.nest.key, cursor=state.cursor, depth=len(node.path))
        self.graph.add_edge(node_id(parent.state), target, action=self.actions.names[action])
        self._offer(node)
        return node

    def visit(self, nest: LoopNest) -> Node:
        """The node of a schedule reached otherwise than by the actions (e.g. a model-guided
        search), evaluated: cursor 0, no action path, no edge in the graph."""
        if not isinstance(nest, LoopNest) or nest.problem != self.problem:
            raise ValueError(f"expected a LoopNest of {self.problem.name}, got {nest!r:.200}")
        state = State(nest, 0)
        node = Node(state, (), self._value(state))
        if node_id(state) not in self.graph:
            self.graph.add_node(node_id(state), gflops=node.gflops, schedule=nest.key, cursor=0, depth=0)
        self._offer(node)
        return node

    def children(self, parent: Node) -> list[Node]:
        """All valid children of ``parent``, evaluated, in action order."""
        found = []
        for action in range(len(self.actions)):
            node = self.child(parent, action)
            if node is not None:
                found.append(node)
        return found

    def _value(self, state: State, force: bool = False) -> float:
        key = state.nest.key
        known = self.values.get(key)
        if known is not None:
            return known
        if not force:
            reason = self.exhausted()
            if reason is not None:
                raise BudgetExhausted(reason)
        measurement = self.evaluator(state.nest)
        if not measurement.from_cache:
            self.new_measurements += 1
        if not measurement.ok:
            self.failures += 1
            logger.warning("schedule %s of %s failed: %s", key, self.problem.name, measurement.error)
        self.values[key] = measurement.gflops
        self._report_progress()
        return measurement.gflops

    def _offer(self, node: Node) -> None:
        """Keep ``node`` if it beats the best so far (ties keep the shorter, earlier path)."""
        best = self.best
        if best is None or node.gflops > best.gflops:
            self.best = node
            self.curve.append((self.elapsed_s, self.evaluations, node.gflops))

    def _report_progress(self) -> None:
        if self._progress is None:
            return
        now = time.perf_counter()
        if now - self._last_progress >= self._progress_every_s:
            self._last_progress = now
            self._progress(self)
