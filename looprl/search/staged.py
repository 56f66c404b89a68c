"""The one driver of every staged search: ``looprl.search.run``'s stages (loops, layout
starts, layout actions), ``looprl.tune``'s (the policy's rollout, register tiles, the guided
search, parallel proposals) and the thread choice.

A :class:`Stage` is a name, a function of a :class:`~looprl.search.context.SearchContext`
that proposes schedules through the context (which measures them, within the context's
budget) and returns the :class:`~looprl.measurement.schedule_record.ScheduleRecord` s it found
(its best at least), and its share of the search's budget; a stage with a :class:`Scope` (its
actions, evaluation cap and :class:`Start`: a nest and the action path to it) runs in a context
of its own, in a plain list of them (:meth:`StagedSearch.run_stages`, ``looprl.search.run``'s
stages). :class:`StagedSearch` owns
what the stages share: the search's budget and deadline, which it gives each stage's context
(and, to a stage that refines the best so far, that best's speed to predict its costs from), the memo of measured schedules (a stage's context starts with every
value an earlier stage measured), the count of new measurements and failures, the best-so-far
curve and the search graph, and the candidates; a stage that runs out of budget or is
interrupted ends with what its context found. :func:`confirm_winner` is the one rule that
decides a winner among candidates measured once each: the contenders (those within a
fraction of the fastest) are timed again in interleaved rounds and ranked by their timings
over each round's fastest (:func:`~looprl.measurement.duels.paired_scores`), so neither a first
timing that caught the machine's slow phase nor one lucky sample decides.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import networkx as nx

from looprl.actions import ActionSet
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem
from looprl.measurement.duels import paired_scores, timed_in_rounds
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.budget import scaled_budget, state_cost_s
from looprl.search.context import BudgetExhausted, SearchContext

INTERRUPTED = "interrupted"
# Tune's thresholds for confirm_winner (its contenders) are its winner rule's: looprl.tune.winner.


@dataclass(frozen=True)
class Stage:
    """One stage of a staged search. ``share``: the part of the search's budget it may spend,
    counted from its context's start (None: until the search's deadline, or later where an earlier
    stage in the same context moved it; ``math.inf``: whatever it takes, as tune's rollout). ``refinements``: new measurements it may start however long
    the stages before it took (the deadline moves for them). ``from_best``: it refines the best
    schedule so far, whose speed predicts what its measurements cost (not the last schedule
    measured, which may be a slow one)."""

    name: str
    propose: Callable[[SearchContext], Iterable[ScheduleRecord]]
    share: float | None = None
    refinements: int = 0
    from_best: bool = False
    scope: Scope | None = None  # its own context, for run_stages (None: the one given to run)


@dataclass(frozen=True)
class Start:
    """Where a stage's own context starts: ``nest`` (None: the untuned nest) with the cursor on
    loop 0, and ``path``, the action names that lead there from the untuned nest with the cursor
    on loop 0 (None: none does, as for a re-laid layout start)."""

    nest: LoopNest | None = None
    path: tuple[str, ...] | None = ()

    def followed(self, actions: ActionSet, taken) -> tuple[str, ...] | None:
        """The path on from here by the action indices ``taken`` of ``actions`` (None: no path)."""
        return None if self.path is None else self.path + actions.named(taken)


BEST_SO_FAR = "best so far"  # a Scope's start: the best schedule an earlier stage found, by its path


@dataclass(frozen=True)
class Scope:
    """A stage's own context (:meth:`StagedSearch.run_stages`): the ``actions`` it searches
    with, its ``start`` (a :class:`Start`, or :data:`BEST_SO_FAR`) and its cap on distinct
    schedules, the earlier stages' included (None: no cap)."""

    actions: ActionSet
    start: Start | str = Start()
    max_evaluations: int | None = None


class StagedSearch:
    """Runs stages over contexts that share one memo, and collects what they found.
    ``budget_s`` counts from ``started`` (default: now): None, scaled to the problem once the
    untuned nest's speed is known (:meth:`scale`; :mod:`looprl.search.budget`); ``math.inf``, no
    time limit; 0, no deadline either (tune's ``budget_s=0``: stages that run whole)."""

    def __init__(self, problem: Problem, evaluator, target=None, progress=None, return_on_interrupt: bool = False,
                 budget_s: float | None = math.inf, started: float | None = None):
        self.problem = problem
        self.return_on_interrupt = return_on_interrupt  # Ctrl-C ends the stage (search.run) rather than the call (tune)
        self.evaluator = evaluator
        self.target = target if target is not None else getattr(evaluator, "target", None)
        self.progress = progress
        self.candidates: list[ScheduleRecord] = []
        self._confirmed = False  # the candidates are confirm_winner's ranking, none added since
        self.stopped = "done"  # why the last stage ended
        self.elapsed_s = 0.0  # summed over the contexts, in the order they ran
        self.curve: list[tuple[float, int, float]] = []
        self._contexts: list[SearchContext] = []
        self.limit(budget_s, time.perf_counter() if started is None else started)

    def limit(self, budget_s: float | None, started: float) -> None:
        """The search's budget: ``budget_s`` seconds from ``started`` (a ``time.perf_counter()``
        value); no deadline for ``math.inf`` or 0, nor for None until :meth:`scale` sets it."""
        self.budget_s, self.started, self.scaled = budget_s, started, budget_s is None
        self.deadline = started + budget_s if budget_s and math.isfinite(budget_s) else None

    def scale(self, untuned_gflops: float) -> None:
        """Set a budget scaled to the problem (``budget_s`` None) from the untuned nest's speed
        (:func:`~looprl.search.budget.scaled_budget`); a budget given, or scaled already, stays."""
        if self.budget_s is None:
            self.budget_s = scaled_budget(self.problem.flops, untuned_gflops, getattr(self.evaluator, "budget_s", 0.0))
            self.deadline = self.started + self.budget_s

    # -- contexts --------------------------------------------------------------------
    def context(self, actions: ActionSet, budget_s: float | None = None, max_evaluations: int | None = None,
                start: LoopNest | None = None, evaluator=None) -> SearchContext:
        """A new context for the next stage, knowing every schedule measured so far."""
        context = SearchContext(self.problem, actions, evaluator if evaluator is not None else self.evaluator, budget_s,
                                max_evaluations, self.progress, start=start, target=self.target)
        for earlier in self._contexts:
            context.values.update(earlier.values)
            context.failed.update(earlier.failed)
        self._contexts.append(context)
        return context

    def run_stages(self, stages: Iterable[Stage]) -> ScheduleRecord:
        """Run ``stages`` in order, each in a context of its own made of its :attr:`Stage.scope`
        (whose root is evaluated first, whatever the budget; the first root, the untuned nest,
        scales a budget of None). Returns the best schedule they found
        (the earliest among equals; each stage's best joins :attr:`candidates`), its ``actions``
        the path from the untuned nest (None where none leads there); a stage from
        :data:`BEST_SO_FAR` starts from it, its path followed by the cursor moves back to loop 0
        (:meth:`~looprl.actions.ActionSet.moves`). An interrupted stage ends the run."""
        best: ScheduleRecord | None = None
        best_start = Start()
        for stage in stages:
            scope = stage.scope
            start = best_start if scope.start == BEST_SO_FAR else scope.start
            context = self.context(scope.actions, max_evaluations=scope.max_evaluations, start=start.nest)
            self.scale(context.root().gflops)
            stopped = self.run(context, stage)
            node = context.best
            found = ScheduleRecord(node.state.nest, node.gflops, start.followed(scope.actions, node.path), stage.name,
                                   self.target, context.threads, self.budget_s)
            self.add([found])
            if best is None or found.gflops > best.gflops:
                best = found
                best_start = Start(found.nest, start.followed(scope.actions, node.path + scope.actions.moves(node.state.cursor, 0)))
            if stopped == INTERRUPTED:
                break
        return best

    @property
    def latest_context(self) -> SearchContext:
        """The context of the stage that ran last."""
        return self._contexts[-1]

    @property
    def initial_gflops(self) -> float:
        """The first context's root speed (the untuned nest's, where the first stage starts there)."""
        return self._contexts[0].root().gflops

    def run(self, context: SearchContext, stage: Stage) -> str:
        """Run ``stage`` in ``context`` (one of :meth:`context`'s, whose deadline and reference
        speed the stage's budget sets: :meth:`_limit`); the records it returns join
        :attr:`candidates` (a stage that ran out of budget returns nothing: its context's best
        node is found by the caller, in ``context.best``). Returns why it ended: ``"done"``, the
        budget that ran out, or ``"interrupted"`` (Ctrl-C, with ``return_on_interrupt``: the caller
        stops there and returns what was found; without it, Ctrl-C propagates)."""
        self._limit(context, stage)
        started = context.elapsed_s
        found: list[ScheduleRecord] = []
        stopped = "done"
        try:
            found = list(stage.propose(context) or ())
        except BudgetExhausted as reason:
            stopped = str(reason)
        except KeyboardInterrupt:
            if not self.return_on_interrupt:
                raise
            stopped = INTERRUPTED
        self.add(found)
        offset = self.elapsed_s - started
        self.curve += [(offset + t, e, g) for t, e, g in context.curve if not self.curve or g > self.curve[-1][2]]
        self.elapsed_s = offset + context.elapsed_s
        self.stopped = stopped
        return stopped

    def _limit(self, context: SearchContext, stage: Stage) -> None:
        """Give ``context`` the stage's deadline and, for a refinement, the best speed so far."""
        if stage.share is None:  # a context's deadline moved later (lock waits, refinements) stays
            later = context.deadline is not None and self.deadline is not None and context.deadline > self.deadline
            context.deadline = context.deadline if later else self.deadline
        elif math.isinf(stage.share) or not self.budget_s or math.isinf(self.budget_s):
            context.deadline = None
        else:
            context.deadline = context.started + stage.share * self.budget_s
        best = self.best()
        if stage.from_best and best is not None:
            context.budget.reference_gflops = max(best.gflops, context.budget.reference_gflops)
        if stage.refinements and context.deadline is not None:
            context.deadline = max(context.deadline, time.perf_counter() + stage.refinements * context.predicted_cost_s())

    def confirm(self, context: SearchContext, **rule) -> "Confirmed":
        """:func:`confirm_winner` among the candidates so far, which become its ranking (its
        winner first: :meth:`best` until another candidate is added)."""
        confirmed = confirm_winner(context, self.candidates, **rule)
        self.candidates = list(confirmed.ranked)
        self._confirmed = True
        return confirmed

    def add(self, candidates: Iterable[ScheduleRecord]) -> None:
        """ScheduleRecords a caller made of a stage's context (e.g. its best node, with the action
        path that leads there)."""
        self.candidates += [c for c in candidates if c.nest is not None and c.gflops > 0]
        self._confirmed = False

    # -- totals ----------------------------------------------------------------------
    @property
    def values(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        for context in self._contexts:
            merged.update(context.values)
        return merged

    @property
    def evaluations(self) -> int:
        """Distinct schedules evaluated by any stage."""
        keys: set[str] = set()
        for context in self._contexts:
            keys.update(context.values)
            keys.update(context.failed)
        return len(keys)

    @property
    def new_measurements(self) -> int:
        return sum(c.new_measurements for c in _distinct(self._contexts))

    @property
    def failures(self) -> int:
        return sum(c.failures for c in _distinct(self._contexts))

    @property
    def waited_s(self) -> float:
        return sum(c.budget.waited_s for c in _distinct(self._contexts))

    @property
    def graph(self) -> nx.DiGraph:
        graphs = [c.graph for c in _distinct(self._contexts)]
        graph = graphs[0] if graphs else nx.DiGraph(problem=self.problem.name)
        for other in graphs[1:]:
            graph = nx.compose(graph, other)
        return graph

    def best(self) -> ScheduleRecord | None:
        """The confirmed winner where the candidates were confirmed (:meth:`confirm`) and none
        was added since, else the fastest candidate so far (the earliest among equals)."""
        if self._confirmed and self.candidates:
            return self.candidates[0]
        return max(self.candidates, key=lambda c: c.gflops, default=None)


def _distinct(contexts: list[SearchContext]) -> list[SearchContext]:
    seen, result = set(), []
    for context in contexts:
        if id(context) not in seen:
            seen.add(id(context))
            result.append(context)
    return result


@dataclass(frozen=True)
class Confirmed:
    """:func:`confirm_winner`'s answer: the candidates ranked (the re-timed contenders first, by
    their paired scores, each with its best figure; the others fastest first), and the winner's
    best fresh timing (None when it was not re-timed)."""

    ranked: list[ScheduleRecord]
    winner_retimed_gflops: float | None


def confirm_winner(context: SearchContext, candidates: Iterable[ScheduleRecord], *, within: float, rounds: int,
                   max_cost_s: float | None = None, alone: bool = False, most: int | None = None,
                   max_rounds: int | None = None) -> Confirmed:
    """The one rule that decides a search's winner. ``candidates`` (measured in ``context``)
    without repeats (the faster figure of a schedule kept); the contenders, those within
    ``within`` of the fastest (the ``most`` fastest of them; None: all), are timed again in
    interleaved rounds, then ranked by :func:`paired_scores`: each round's timing of a contender
    over the round's fastest, averaged over the rounds, so that a phase of the machine that
    slows one round slows every contender in it alike and no lucky first timing decides. The
    contenders come first in that order, each with its best figure (the context's memo); the
    others follow, fastest first. ``rounds`` rounds at least, ``max_rounds`` at most (None:
    ``rounds``), as many as ``max_cost_s`` pays for (None: no limit); where it pays for fewer
    than ``rounds``, the slowest contenders are left out until it does, and with fewer than two
    left no round is run: the first timings decide. A lone contender is re-timed only with
    ``alone`` (search's verification of its winner). A schedule that fails when timed again
    drops out."""
    unique: dict[str, ScheduleRecord] = {}
    for candidate in candidates:
        if candidate.nest is None or not candidate.gflops > 0:
            continue
        known = unique.get(candidate.nest.key)
        if known is None or candidate.gflops > known.gflops or (known.actions is None and candidate.actions is not None
                                                                  and candidate.gflops == known.gflops):
            unique[candidate.nest.key] = candidate
    ranked = sorted(unique.values(), key=lambda c: -c.gflops)
    if not ranked:
        return Confirmed([], None)
    contenders = [c for c in ranked if c.gflops >= within * ranked[0].gflops][:most]

    def round_cost(chosen: list[ScheduleRecord]) -> float:
        return sum(state_cost_s(context.problem.flops, c.gflops, context.measure_budget_s, 0.0) for c in chosen)

    while max_cost_s is not None and len(contenders) > 1 and rounds * round_cost(contenders) > max_cost_s:
        contenders = contenders[:-1]
    if len(contenders) < 2 and not alone:
        return Confirmed(ranked, None)
    if max_cost_s is not None and rounds * round_cost(contenders) > max_cost_s:
        return Confirmed(ranked, None)
    most_rounds = max(rounds, max_rounds or rounds)
    if max_cost_s is not None and math.isfinite(max_cost_s):
        most_rounds = max(rounds, min(most_rounds, int(max_cost_s / max(round_cost(contenders), 1e-9))))
    # Each contender runs the kernel of its last timing (the evaluator's recent kernels).
    samples, failed = timed_in_rounds(lambda nest: context.remeasure(nest, force=True), [c.nest for c in contenders], most_rounds)
    scores = paired_scores(samples, [c.nest.key for c in contenders if c.nest.key not in failed])
    settled = [c.with_gflops(context.values.get(c.nest.key, c.gflops)) for c in ranked if c.nest.key not in failed]
    first = sorted((c for c in settled if c.nest.key in scores), key=lambda c: (-scores[c.nest.key], -c.gflops))
    rest = sorted((c for c in settled if c.nest.key not in scores), key=lambda c: -c.gflops)
    settled = first + rest
    if not settled:
        return Confirmed([], None)
    fresh = [s[settled[0].nest.key] for s in samples if settled[0].nest.key in s]
    return Confirmed(settled, max(fresh) if fresh else None)
