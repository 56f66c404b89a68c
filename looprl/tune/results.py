"""What ``looprl.tune`` returns: an :class:`Answer` (a schedule of the problem searched, as a
record, and what finding it cost) and a :class:`TuneResult` (the answer for the problem asked,
its compiled kernel and the call's own facts). :func:`from_relaid_start` turns an answer found
in a re-laid start's coordinates into one of its problem."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from looprl.actions import ActionSet, State
from looprl.actions.transition import follow
from looprl.backend.kernel import Kernel, ReshapedKernel
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem
from looprl.ir.rewrites import RELAID, Relaid, relaid, replays_on
from looprl.measurement.load import LoadReading
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.target import Target


@dataclass(frozen=True)
class Answer:
    """A schedule of the problem searched, as a record (its actions replay from the untuned
    nest, or from the re-laid start where ``record.replays_on`` says so), and what finding it
    cost."""

    record: ScheduleRecord
    mode: str  # "measured", "remembered" (a lookup of an earlier measured tune) or "policy"
    initial_gflops: float
    greedy_gflops: float | None = None  # the best state of the policy's greedy rollout (measured mode)
    measured: int = 0  # schedules timed
    waited_s: float = 0.0  # spent waiting for another process's timing (the machine-wide lock)
    serial_gflops: float | None = None  # the best serial schedule's, when parallel proposals were measured
    load: LoadReading | None = None  # the machine's load during a measured search that was remembered (None: not read)

    @property
    def nest(self) -> LoopNest:
        return self.record.nest

    @property
    def gflops(self) -> float:
        return self.record.gflops

    @property
    def actions(self) -> tuple[str, ...]:
        return self.record.actions or ()


@dataclass(frozen=True, init=False)
class TuneResult:
    """A tuned schedule and its compiled kernel: the :class:`Answer` (its record a schedule of
    ``problem``, or of its fused view), the kernel, and the call's own facts. A problem with dimensions that always
    go together (a 1x1 convolution's h and w) is tuned as its fused view
    (looprl.ir.rewrites.fused_view): ``tuned_as`` is then the view, ``nest``, ``actions`` (and
    ``initial_gflops``) are the view's, and ``kernel`` takes ``problem``'s arrays; otherwise
    ``tuned_as`` is None. A right operand stored across the output's columns (a linear layer's
    W) is not another problem: its re-laid kernels are schedules of ``problem`` with that
    operand in another layout, whose ``actions`` replay from the re-laid start
    (``record.replays_on``, :meth:`replayed`).

    Built from an answer (``answer=``) or, as before there were answers, from the fields it
    exposes (``nest``, ``actions``, ``gflops``, ``target``, ``threads`` and the answer's)."""

    problem: Problem
    answer: Answer
    kernel: Kernel | ReshapedKernel  # callable: kernel(a, b) -> output array (kernel(a, b, bias, residual) with an epilogue)
    seconds: float  # wall clock of the whole call, compile of the returned kernel included
    tuned_as: Problem | None = None  # the fused view tuned in place of ``problem``, if any

    def __init__(self, problem: Problem, nest: LoopNest | None = None, kernel=None, actions=(), gflops: float = 0.0,
                 initial_gflops: float = math.nan, seconds: float = 0.0, mode: str = "measured", target: Target | None = None,
                 greedy_gflops: float | None = None, measured: int = 0, waited_s: float = 0.0, tuned_as: Problem | None = None,
                 threads: int = 1, serial_gflops: float | None = None, *, answer: Answer | None = None):
        if answer is None:
            answer = Answer(ScheduleRecord(nest, gflops, tuple(actions), mode, target, threads), mode, initial_gflops, greedy_gflops,
                            measured, waited_s, serial_gflops)
        for name, value in (("problem", problem), ("answer", answer), ("kernel", kernel), ("seconds", seconds), ("tuned_as", tuned_as)):
            object.__setattr__(self, name, value)

    @property
    def record(self) -> ScheduleRecord:
        return self.answer.record

    nest = property(lambda self: self.record.nest)
    gflops = property(lambda self: self.record.gflops)
    actions = property(lambda self: self.record.actions or ())
    target = property(lambda self: self.record.target)
    threads = property(lambda self: self.record.threads, doc="threads offered: the kernel's parallel loops (if any) run on as many")
    mode = property(lambda self: self.answer.mode)
    initial_gflops = property(lambda self: self.answer.initial_gflops)
    greedy_gflops = property(lambda self: self.answer.greedy_gflops)
    measured = property(lambda self: self.answer.measured, doc="schedules timed by this call")
    waited_s = property(lambda self: self.answer.waited_s)
    serial_gflops = property(lambda self: self.answer.serial_gflops)
    load = property(lambda self: self.answer.load, doc="the machine's load while a remembered measured search ran (None: not read); "
                    "a busy one's answer was stored as provisional")

    @property
    def action_set(self) -> ActionSet:
        """The actions that replay ``actions`` from the untuned nest (the env's, plus any
        ``split_<rows>`` a tile used, plus ``pack`` and ``pad`` if the path has them)."""
        return ActionSet.covering(self.actions, target=self.target)

    def replayed(self) -> LoopNest | None:
        """The schedule :attr:`actions` reach with :attr:`action_set` from where they start
        (:func:`replayed`): the untuned nest of the problem tuned (``tuned_as`` or ``problem``),
        or its re-laid start where ``record.replays_on`` says so. An answer found without an
        action path (a split-k team or a team whose split no action names: ``actions`` empty)
        replays by its record's steps instead (``initial_nest(problem).apply(record.steps)``);
        None where neither replays."""
        record = self.record
        if not self.actions and record.steps is not None and record.replays_on is None:
            return initial_nest(record.nest.problem).apply(record.steps)
        return replayed(self.tuned_as or self.problem, self.actions, self.action_set, record.replays_on)

    @property
    def speedup(self) -> float:
        return self.gflops / self.initial_gflops if self.initial_gflops > 0 else float("nan")

    def __call__(self, a: np.ndarray, b: np.ndarray, *epilogue: np.ndarray) -> np.ndarray:
        return self.kernel(a, b, *epilogue)


def from_relaid_start(answer: Answer, relaid: Relaid) -> Answer:
    """``answer``, a schedule of ``relaid``'s coordinates problem, as the answer for its
    problem: the same loops with the right operand re-laid, its actions replaying from the
    re-laid start (``replays_on`` = :data:`~looprl.ir.rewrites.RELAID`)."""
    return replace(answer, record=replace(answer.record, nest=relaid.schedule(answer.nest), replays_on=RELAID))


def replayed(problem: Problem, names, actions: ActionSet, replays: str | None = None) -> LoopNest | None:
    """The schedule of ``problem`` the action ``names`` reach with ``actions`` from its untuned
    nest or, where ``replays`` (a record's ``replays_on``, a former name too) says so, from its
    re-laid start (followed in its coordinates, :mod:`looprl.ir.rewrites`); None where one of
    them cannot apply. The schedule is the one compiled for the actions' target: its bfloat16
    weight paired where the kernel can take pairs, as a record of it is."""
    if replays_on(replays) == RELAID:
        start = relaid(problem)
        if start is None:
            raise ValueError(f"{problem.name} has no re-laid start for actions to replay from")
        state = follow(actions, State(initial_nest(start.coordinates), 0), names)
        nest = None if state is None else start.schedule(state.nest)
    else:
        state = follow(actions, State(initial_nest(problem), 0), names)
        nest = None if state is None else state.nest
    return None if nest is None else with_pairs(nest, actions.target)
