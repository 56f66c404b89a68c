"""Tune's measured searches: the proposers' schedules measured in one staged search
(:class:`~looprl.search.staged.StagedSearch`) within a budget, its stage winners confirmed by
the winner rule, then the teams on more than one thread (:func:`~looprl.tune.teams.with_teams`).

* :func:`measured_search`: the policy's rollout, then (until the budget is spent) the register
  tiles refined and the policy-guided search. Also the expert of training's demonstrations.
* :func:`relaid_answer`: that search from a problem's re-laid start
  (:class:`~looprl.ir.rewrites.Relaid`), as an answer for the problem.
* :func:`measured_answer`: that search of the problem searched (a
  :class:`~looprl.tune.searched.Searched`): from the re-laid start of a constant weight; for a
  right operand that changes per call and is stored across the output's columns, from its
  re-laid start too.
* :func:`in_place_answer`: the dot-product tiles of a problem as given (its weight in place).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from looprl.ir.problem import Problem
from looprl.ir.rewrites import Relaid
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.search.budget import REFINEMENTS
from looprl.search.dots import dot_proposals, in_place_actions
from looprl.search.staged import Stage, StagedSearch
from looprl.tune.measurer import Measurer
from looprl.tune.proposers import PolicyProposer, tiles_stage
from looprl.tune.results import Answer, from_relaid_start
from looprl.tune.searched import Searched
from looprl.tune.store import TUNER
from looprl.tune.teams import with_teams
from looprl.tune.winner import CONTENDER_WITHIN, TILE_CONTENDERS, confirmed, preferred


def measured_search(policy: Policy, problem: Problem, evaluator: Evaluator, episode_length: int | None, budget_s: float | None, threads: int,
                    started: float, max_evaluations: int | None = None) -> Answer:
    """Measured tune: stages of one staged search. The untuned nest; the policy's greedy
    rollout, always measured whole (a dozen actions at most: a bounded cost, and tune is never
    below the rollout in the winner rule's rounds); then, until the deadline (a measurement
    predicted to end after it is not started), the rollout's register tile and the target's own
    register tiles refined and the policy-guided search; the stage winners confirmed (:func:`~looprl.tune.winner.confirmed`);
    with threads, the teams. ``budget_s`` counts from ``started`` (tune's call; None: scaled to
    the problem, :mod:`looprl.search.budget`; 0: the rollout alone); ``max_evaluations`` caps
    the distinct schedules of the serial search."""
    proposer = PolicyProposer.of(policy, evaluator.target, episode_length)
    search = StagedSearch(problem, evaluator, budget_s=budget_s, started=started)
    context = search.context(proposer.actions, max_evaluations=max_evaluations)
    untuned = context.root()
    search.scale(untuned.gflops)  # a budget of None: scaled to the problem
    rollouts = []
    search.run(context, proposer.rollout_stage(untuned, rollouts))
    rollout = rollouts[0]
    # Fastest first; among equals the measured rollout's best (the shorter path to it).
    ranked = sorted(reversed(search.candidates), key=lambda candidate: -candidate.gflops)
    if search.budget_s > 0:
        # However long the rollout took, its tile gets a few refinements (budget.REFINEMENTS).
        search.run(context, tiles_stage(proposer.actions, rollout.best_nest, REFINEMENTS if search.scaled else 0,
                                        within=CONTENDER_WITHIN, most=TILE_CONTENDERS))
        search.run(context, proposer.guided_stage(search))
        ranked = confirmed(search, context)
    best, serial_gflops = with_teams(search, proposer.actions, ranked, threads)
    record = replace(best, actions=tuple(best.actions or ()), target=evaluator.target, threads=threads, budget_s=search.budget_s,
                     tuner=TUNER)
    return Answer(record, "measured", rollout.initial_gflops, rollout.best_gflops, search.new_measurements, search.waited_s, serial_gflops)


def relaid_answer(policy: Policy, start: Relaid, evaluator: Evaluator, episode_length: int | None, budget_s: float | None,
                  threads: int, started: float, max_evaluations: int | None = None) -> Answer:
    """The measured search of ``start``'s problem from its re-laid start (run in its
    coordinates, :mod:`looprl.ir.rewrites`), as an answer for the problem. Where the operand
    changes per call its kernel re-lays it inside every call: the answer is timed again on the
    threads with that conversion included (one more measurement)."""
    answer = from_relaid_start(measured_search(policy, start.coordinates, evaluator, episode_length, budget_s, threads, started,
                                               max_evaluations), start)
    if start.exact:
        return answer
    timed = evaluator.with_threads(threads) if threads > 1 else evaluator
    record = replace(answer.record, gflops=timed(answer.nest).gflops)  # the conversion inside the timed call
    return replace(answer, record=record, measured=answer.measured + 1)


def measured_answer(proposer: PolicyProposer, searched: Searched, measurer: Measurer, budget_s: float | None, started: float,
                    max_evaluations: int | None = None) -> Answer:
    """The measured search of the problem searched, on the measurer's one-thread evaluator and
    threads. A constant weight with a re-laid start is searched from it (:func:`relaid_answer`).
    A right operand that changes per call and is stored across the output's columns
    (``bmk,bnk->bmn``) is searched two ways, each a whole measured search with the budget: from
    its re-laid start (the operand re-laid inside every call, timed so) and as given (its tiles
    read the operand in place or pack it per tile); the winner rule keeps the faster (neither
    keeps a copy). Which wins depends on the shape and the target: with one row the conversion
    costs as much as the product; on 128x960x960 (Zen 4) the re-laid kernel ran at 98 GFLOPS for
    AVX-512 against 113 as given, and at 101 against 84 for AVX2. Any other problem: its
    measured search."""
    policy, length, evaluator, threads = proposer.policy, proposer.episode_length, measurer.evaluator, measurer.threads
    start = searched.start
    if start is not None and start.exact:
        return relaid_answer(policy, start, evaluator, length, budget_s, threads, started, max_evaluations)
    direct = measured_search(policy, searched.problem, evaluator, length, budget_s, threads, started, max_evaluations)
    if start is None:
        return direct
    through = relaid_answer(policy, start, evaluator, length, budget_s, threads, time.perf_counter(), max_evaluations)
    through = replace(through, record=replace(through.record, budget_s=direct.record.budget_s), initial_gflops=direct.initial_gflops,
                      greedy_gflops=direct.greedy_gflops)  # the report's untuned nest and rollout: the problem's as given
    return preferred([through, direct])


def in_place_answer(problem: Problem, evaluator: Evaluator, threads: int) -> Answer | None:
    """The in-place search of ``problem`` (as given, its weight where it lies): every
    dot-product tile measured (a handful, whatever the budget: :func:`~looprl.search.dots.
    dot_proposals`), the winner confirmed among the close ones, then on more than one thread
    the teams. None where no dot-product tile compiled."""
    actions = in_place_actions(evaluator.target, parallel=threads > 1)
    search = StagedSearch(problem, evaluator, budget_s=math.inf)
    context = search.context(actions)
    root = context.root()
    search.run(context, Stage("in place", lambda context: dot_proposals(context, actions), share=math.inf))
    ranked = confirmed(search, context)
    if not ranked:
        return None
    best, serial_gflops = with_teams(search, actions, ranked, threads)
    record = replace(best, threads=threads, tuner=TUNER)
    return Answer(record, "measured", root.gflops, None, search.new_measurements, search.waited_s, serial_gflops)
