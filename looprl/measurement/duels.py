"""Timing two things against each other: interleaved rounds until a sign test tells them apart
(:func:`duel_rounds`, a :class:`Duel` per pair), and the rule that says one is shown faster
(:func:`shown_faster`). Two schedules are compared so by :func:`schedule_duel`. Several timed in
the same interleaved rounds (:func:`timed_in_rounds`) are scored by :func:`paired_scores`, and the
best of the close ones among timed candidates is chosen so by :func:`chosen_in_rounds`.

Why rounds, not two best times. Each round times the challenger and then the incumbent, one
right after the other, so a slow phase of the machine hits both alike; the challenger wins the
round where the incumbent took at least ``1 + margin`` times as long. Rounds go on until a
sign test is ``confidence`` sure that the challenger wins most rounds (:func:`faster`: five of
five at 0.95), or until it could no longer be within ``max_rounds``. A best time alone can be
one lucky timing: a two-thread team on a machine whose second core is taken most of the time
has a best sample at twice the serial kernel's speed and a typical one at its speed or below
(32x1000x1280 on a busy 2-vCPU Zen 4: best 207 GFLOPS, median 105, the serial kernel's 113),
and a rule that compares best samples (of unequal numbers of timings, too) returns the team.

The routes of :mod:`looprl.torch.routes` (looprl's call against torch's, per row count) and
``looprl.tune``'s teams against the serial best (:func:`looprl.tune.winner.team_or_serial`)
are judged by it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from looprl import checks
from looprl.backend.kernel import compile
from looprl.errors import CompileError
from looprl.ir.nest import LoopNest
from looprl.measurement.keys import schedule_threads

DUEL_CONFIDENCE = 0.95  # the challenger wins once the sign test is this confident that it wins most rounds
DUEL_MAX_ROUNDS = 15  # the cap: rounds timed at most per pair; undecided by then, the incumbent's


@dataclass(frozen=True)
class Duel:
    """What interleaved rounds gave a pair (:func:`duel_rounds`): each one's best seconds over
    the rounds, the rounds timed and those the challenger won by the margin."""

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


def faster(wins: int, rounds: int, max_rounds: int = DUEL_MAX_ROUNDS, confidence: float = DUEL_CONFIDENCE) -> bool | None:
    """After ``rounds`` rounds of which the challenger won ``wins`` by the margin: True when the
    sign test is ``confidence`` sure that it wins more rounds than not, False when it could no
    longer be within ``max_rounds`` rounds (winning every one left; at the cap, whatever is not
    True), None while it still could: time another round."""
    alpha = 1.0 - confidence
    if binomial_tail(wins, rounds) <= alpha:
        return True
    if rounds >= max_rounds or binomial_tail(wins + max_rounds - rounds, max_rounds) > alpha:
        return False
    return None


def shown_faster(challenger_s: float, incumbent_s: float, wins: int | None, rounds: int | None, margin: float) -> bool:
    """The verdict on a closed duel: the challenger is faster by ``margin`` at best
    (``incumbent_s`` at least ``1 + margin`` times ``challenger_s``, each side's best time; a
    NaN is not) and in the rounds (``wins`` of ``rounds``, by :func:`faster` at their end).
    ``rounds`` None: two times given alone, judged by them."""
    at_best = incumbent_s >= (1.0 + margin) * challenger_s
    return at_best and (rounds is None or bool(faster(wins, rounds, rounds)))


def duel_rounds(pairs: list[tuple], seconds: Callable, margin: float, max_rounds: int = DUEL_MAX_ROUNDS,
                confidence: float = DUEL_CONFIDENCE) -> list[Duel]:
    """Each pair ``(challenger, incumbent)`` of ``pairs`` timed in rounds: in a round, every pair
    still open has its challenger timed and then its incumbent (``seconds(side)``: the seconds
    of one call), and the challenger wins the round where the incumbent took at least ``1 +
    margin`` times as long (a NaN is no win); a pair is closed once :func:`faster` decides it
    (``max_rounds``, ``confidence``), and the rounds go on while any is open (each pair gets at
    least one)."""
    margin = checks.finite_float(margin, "margin", minimum=0.0)
    max_rounds = checks.positive_int(max_rounds, "rounds")
    confidence = checks.fraction(confidence, "confidence", allow_zero=False, allow_one=False)
    best = [[math.inf, math.inf] for _ in pairs]
    wins, rounds = [0] * len(pairs), [0] * len(pairs)
    open_pairs = list(range(len(pairs)))
    while open_pairs:
        for index in open_pairs:
            challenger, incumbent = pairs[index]
            challenger_s = seconds(challenger)
            incumbent_s = seconds(incumbent)
            best[index] = [min(best[index][0], challenger_s), min(best[index][1], incumbent_s)]
            wins[index] += incumbent_s >= (1.0 + margin) * challenger_s
            rounds[index] += 1
        open_pairs = [index for index in open_pairs if faster(wins[index], rounds[index], max_rounds, confidence) is None]
    return [Duel(challenger_s, incumbent_s, won, timed) for (challenger_s, incumbent_s), won, timed in zip(best, wins, rounds)]


def schedule_duel(evaluator, challenger: LoopNest, incumbent: LoopNest, margin: float, max_rounds: int = DUEL_MAX_ROUNDS,
                  confidence: float = DUEL_CONFIDENCE, settle_s: float = 0.0) -> Duel:
    """Two schedules of one problem in interleaved rounds (:func:`duel_rounds`), each timed by
    ``evaluator`` (an :class:`~looprl.measurement.evaluator.Evaluator`: its budget per timing,
    its lock and buffers; a parallel schedule on its threads, a serial one on one), each
    compiled once; every timing is added to the measurement cache's samples. A timing that
    fails counts as NaN seconds (no win for the challenger; no loss for the incumbent).
    ``settle_s``: the challenger is first run (timed, its figures dropped) for that many seconds,
    so that a team's threads have spread over the cores before its rounds."""
    if not isinstance(challenger, LoopNest) or not isinstance(incumbent, LoopNest):
        raise ValueError(f"schedule_duel() takes two LoopNests, got {type(challenger).__name__} and {type(incumbent).__name__}")
    if challenger.problem != incumbent.problem:
        raise ValueError(f"a duel needs two schedules of one problem, got {challenger.problem.name} and {incumbent.problem.name}")
    kernels = {nest.key: _compiled(evaluator, nest) for nest in (challenger, incumbent)}
    flops = challenger.problem.flops

    def seconds(nest: LoopNest) -> float:
        measured = evaluator.remeasure(nest, kernels[nest.key])
        return flops / (measured.sample_gflops * 1e9) if measured.ok and measured.sample_gflops else math.nan

    settled = time.perf_counter() + settle_s
    while time.perf_counter() < settled and not math.isnan(seconds(challenger)):
        pass
    duel, = duel_rounds([(challenger, incumbent)], seconds, margin, max_rounds, confidence)
    return duel


def _compiled(evaluator, nest: LoopNest):
    """``nest`` compiled for ``evaluator``'s target on the threads it would time it on, or None
    where it does not compile (the evaluator's timing then reports the error)."""
    try:
        return compile(nest, target=evaluator.target, threads=schedule_threads(nest, evaluator.threads))
    except CompileError:
        return None


def timed_in_rounds(remeasure: Callable, nests: list[LoopNest], rounds: int) -> tuple[list[dict[str, float]], set[str]]:
    """``nests`` timed again by ``remeasure`` (a nest to its measurement) in ``rounds``
    interleaved rounds: per round, each nest's new sample in GFLOPS (the measurement's
    ``sample_gflops``, else its figure), and the keys of those that failed (not timed again)."""
    samples: list[dict[str, float]] = []
    failed: set[str] = set()
    for _ in range(rounds):
        this_round: dict[str, float] = {}
        for nest in nests:
            if nest.key in failed:
                continue
            measurement = remeasure(nest)
            if not measurement.ok:
                failed.add(nest.key)
                continue
            this_round[nest.key] = getattr(measurement, "sample_gflops", None) or measurement.gflops
        samples.append(this_round)
    return samples, failed


def paired_scores(samples: list[dict[str, float]], keys: list[str]) -> dict[str, float]:
    """Each of ``keys``' timings in interleaved rounds (``samples``: one dict of GFLOPS per
    round) over the fastest of its round, averaged over the rounds in which it was timed: 1.0
    for a schedule that was the fastest in every round. Keys never timed are left out."""
    totals: dict[str, list[float]] = {key: [] for key in keys}
    for this_round in samples:
        fastest = max((this_round[key] for key in keys if key in this_round), default=0.0)
        if fastest <= 0:
            continue
        for key in keys:
            if key in this_round:
                totals[key].append(this_round[key] / fastest)
    return {key: sum(values) / len(values) for key, values in totals.items() if values}


def chosen_in_rounds(candidates: list, figure: Callable, nest_of: Callable, remeasure: Callable, within: float, most: int,
                     rounds: int) -> tuple[object, bool]:
    """Of ``candidates`` (each timed once: ``figure(c)`` its GFLOPS, ``nest_of(c)`` its
    schedule), the fastest, or, where others came within ``within`` of it, the best by
    :func:`paired_scores` over ``rounds`` interleaved rounds (:func:`timed_in_rounds` through
    ``remeasure``) of the ``most`` fastest; the earliest among equals. Returned with whether
    rounds ran (then the chosen one was timed again); ``(None, False)`` where there are none.
    Whatever ``remeasure`` raises (a search's deadline) reaches the caller."""
    if not candidates:
        return None, False
    ranked = sorted(candidates, key=lambda c: -figure(c))  # stable: the earliest among equals first
    close = [c for c in ranked if figure(c) >= within * figure(ranked[0])][:most]
    if len(close) < 2:
        return ranked[0], False
    samples, _ = timed_in_rounds(remeasure, [nest_of(c) for c in close], rounds)
    scores = paired_scores(samples, [nest_of(c).key for c in close])
    return max(close, key=lambda c: (scores.get(nest_of(c).key, 0.0), figure(c))), True
