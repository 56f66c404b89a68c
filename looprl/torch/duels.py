"""Timing two torch calls against each other: the rounds and the sign test of
:mod:`looprl.measurement.duels` (where the rule and its defaults live, shared with
``looprl.tune``'s teams), each call timed under ``torch.no_grad()`` by looprl's timing rule
(:func:`interleaved_duels`). The routes of :mod:`looprl.torch.routes` (looprl's plan against
torch's call, per row count) and ``tune_module``'s whole-model check are judged by it; why the
routes use it as they do, and what its defaults cost, is :mod:`looprl.torch.routes`' docstring."""

from __future__ import annotations

import math
from typing import Callable

import torch

from looprl.measurement.duels import DUEL_CONFIDENCE, DUEL_MAX_ROUNDS, Duel, binomial_tail, duel_rounds, faster, shown_faster  # noqa: F401
from looprl.measurement.timing import best_time

ROUTE_CONFIDENCE = DUEL_CONFIDENCE  # looprl keeps a row count once the sign test is this confident that it wins most rounds
ROUTE_MAX_ROUNDS = DUEL_MAX_ROUNDS  # the cap: rounds timed at most per row count; undecided by then, torch's


def best_seconds(function: Callable, args: tuple, budget_s: float) -> float:
    """Best seconds of one ``function(*args)`` by looprl's timing rule
    (:func:`~looprl.measurement.timing.best_time`, ``budget_s``)."""

    def repeat(reps: int, function=function, args=args) -> None:
        for _ in range(reps):
            function(*args)

    return best_time(repeat, budget_s).seconds


def interleaved_duels(pairs: list[tuple], budget_s: float, margin: float, max_rounds: int = ROUTE_MAX_ROUNDS,
                      confidence: float = ROUTE_CONFIDENCE, seconds: Callable = best_seconds) -> list[Duel]:
    """Each pair ``((challenger, args), (incumbent, args))`` of ``pairs`` timed in interleaved
    rounds under ``torch.no_grad()`` (:func:`~looprl.measurement.duels.duel_rounds`), a side
    timed by ``seconds(function, args, budget_s)`` (by default :func:`best_seconds`)."""
    with torch.no_grad():
        return duel_rounds(pairs, lambda call: seconds(call[0], call[1], budget_s), margin, max_rounds, confidence)


def interleaved_best_seconds(calls: list[tuple], budget_s: float, rounds: int) -> list[float]:
    """Best seconds of one ``function(*args)`` for each ``(function, args)`` of ``calls``, under
    ``torch.no_grad()``, by looprl's timing rule (``budget_s`` each), in ``rounds`` rounds that
    time them in turn (a slow phase of the machine hits every call alike)."""
    best = [math.inf] * len(calls)
    with torch.no_grad():
        for _ in range(rounds):
            for index, (function, args) in enumerate(calls):
                best[index] = min(best[index], best_seconds(function, args, budget_s))
    return best
