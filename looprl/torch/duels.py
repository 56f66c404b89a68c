"""Timing two calls against each other: interleaved rounds until a sign test tells them apart
(:func:`interleaved_duels`, a :class:`Duel` per pair), and the rule that says one is shown
faster (:func:`shown_faster`). The routes of :mod:`looprl.torch.routes` (looprl's plan against
torch's call, per row count) and ``tune_module``'s whole-model check are judged by it; why the
rule is what it is, and what its defaults cost, is :mod:`looprl.torch.routes`' docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from looprl import checks
from looprl.measurement.timing import best_time

ROUTE_CONFIDENCE = 0.95  # looprl keeps a row count once the sign test is this confident that it wins most rounds
ROUTE_MAX_ROUNDS = 15  # the cap: rounds timed at most per row count; undecided by then, torch's


@dataclass(frozen=True)
class Duel:
    """What interleaved rounds gave a pair of calls (:func:`interleaved_duels`): each one's best
    seconds over the rounds, the rounds timed and those the challenger won by the margin."""

    challenger_s: float
    incumbent_s: float
    wins: int
    rounds: int

    def shown_faster(self, margin: float) -> bool:
        """Whether the challenger is shown faster by ``margin`` (:func:`shown_faster`)."""
        return shown_faster(self.challenger_s, self.incumbent_s, self.wins, self.rounds, margin)


def binomial_tail(wins: int, rounds: int) -> float:
    """``P(Binomial(rounds, 1/2) >= wins)``: how likely ``wins`` or more wins of ``rounds`` are
    for a side that wins each round with probability one half."""
    return sum(math.comb(rounds, k) for k in range(max(wins, 0), rounds + 1)) / 2**rounds


def faster(wins: int, rounds: int, max_rounds: int = ROUTE_MAX_ROUNDS, confidence: float = ROUTE_CONFIDENCE) -> bool | None:
    """The rule of a route (see the module's docstring): after ``rounds`` rounds of which the
    challenger (looprl's call) won ``wins`` by the margin, True when the sign test is
    ``confidence`` sure that it wins more rounds than not, False when it could no longer be
    within ``max_rounds`` rounds (winning every one left; at the cap, whatever is not True),
    None while it still could: time another round."""
    alpha = 1.0 - confidence
    if binomial_tail(wins, rounds) <= alpha:
        return True
    if rounds >= max_rounds or binomial_tail(wins + max_rounds - rounds, max_rounds) > alpha:
        return False
    return None


def shown_faster(challenger_s: float, incumbent_s: float, wins: int | None, rounds: int | None, margin: float) -> bool:
    """The verdict on a closed duel (the module's docstring): the challenger (looprl's call) is
    faster by ``margin`` at best (``incumbent_s`` at least ``1 + margin`` times ``challenger_s``,
    each side's best time; a NaN is not) and in the rounds (``wins`` of ``rounds``, by
    :func:`faster` at their end). ``rounds`` None: two times given alone, judged by them."""
    at_best = incumbent_s >= (1.0 + margin) * challenger_s
    return at_best and (rounds is None or bool(faster(wins, rounds, rounds)))


def best_seconds(function: Callable, args: tuple, budget_s: float) -> float:
    """Best seconds of one ``function(*args)`` by looprl's timing rule
    (:func:`~looprl.measurement.timing.best_time`, ``budget_s``)."""

    def repeat(reps: int, function=function, args=args) -> None:
        for _ in range(reps):
            function(*args)

    return best_time(repeat, budget_s).seconds


def interleaved_duels(pairs: list[tuple], budget_s: float, margin: float, max_rounds: int = ROUTE_MAX_ROUNDS,
                      confidence: float = ROUTE_CONFIDENCE, seconds: Callable = best_seconds) -> list[Duel]:
    """Each pair ``((challenger, args), (incumbent, args))`` of ``pairs`` timed in rounds under
    ``torch.no_grad()``: in a round, every pair still open has its challenger timed and then its
    incumbent (``seconds(function, args, budget_s)``, by default :func:`best_seconds`), and the
    challenger wins the round where the incumbent took at least ``1 + margin`` times as long (a
    NaN is no win); a pair is closed once :func:`faster` decides it (``max_rounds``,
    ``confidence``), and the rounds go on while any is open (each pair gets at least one)."""
    margin = checks.finite_float(margin, "margin", minimum=0.0)
    max_rounds = checks.positive_int(max_rounds, "rounds")
    confidence = checks.fraction(confidence, "confidence", allow_zero=False, allow_one=False)
    best = [[math.inf, math.inf] for _ in pairs]
    wins, rounds = [0] * len(pairs), [0] * len(pairs)
    open_pairs = list(range(len(pairs)))
    with torch.no_grad():
        while open_pairs:
            for index in open_pairs:
                (challenger, challenger_args), (incumbent, incumbent_args) = pairs[index]
                challenger_s = seconds(challenger, challenger_args, budget_s)
                incumbent_s = seconds(incumbent, incumbent_args, budget_s)
                best[index] = [min(best[index][0], challenger_s), min(best[index][1], incumbent_s)]
                wins[index] += incumbent_s >= (1.0 + margin) * challenger_s
                rounds[index] += 1
            open_pairs = [index for index in open_pairs if faster(wins[index], rounds[index], max_rounds, confidence) is None]
    return [Duel(challenger_s, incumbent_s, won, timed) for (challenger_s, incumbent_s), won, timed in zip(best, wins, rounds)]


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
