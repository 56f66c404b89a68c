"""Tune's fast path (``measure=False``): the same pipeline as measured tune with the policy
proposer alone and a cap on timings. The policy's greedy actions are followed without
measuring; its proposals (:meth:`~looprl.tune.proposers.PolicyProposer.alone`: the state its
episode ends in, and for a paired bfloat16 weight up to three more) are timed, at most
:data:`POLICY_TIMINGS` an episode, and the fastest kept; the untuned nest is not timed (it can
take seconds a call on a large problem): ``speedup`` is NaN.

A linear layer of few rows (:data:`~looprl.tune.winner.IN_PLACE_ROWS`) gets a second episode on
the weight as it is stored; the winner rule keeps one of the two (an in-place answer that
re-lays the weight is a copy, as the re-laid start's, and pays what a copy pays). On more than one
thread, a policy whose actions mark loops parallel decides the thread split itself (timed on
that many threads); any other policy's serial answer is offered measured tune's teams, each
timed once (:func:`~looprl.tune.teams.split`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from looprl.ir.problem import Problem
from looprl.ir.rewrites import Relaid
from looprl.measurement.evaluator import Evaluator
from looprl.tune.measurer import Measurer
from looprl.tune.proposers import PolicyProposer
from looprl.tune.results import Answer, from_relaid_start
from looprl.tune.teams import split
from looprl.tune.winner import fastest, in_place_rows, preferred, relaying_actions

# Timings of the policy alone's proposals per episode: the state its greedy episode ends in,
# and for a bfloat16 weight its kernels pair, that state packed, the episode without
# dot-product tiles and that one packed. Four: the most it proposes (the cap never cuts today).
POLICY_TIMINGS = 4


def policy_tune(proposer: PolicyProposer, problem: Problem, start: Relaid | None, measurer: Measurer, weights_change: bool,
                timings: int = POLICY_TIMINGS) -> tuple[Answer, Evaluator]:
    """The fast path's answer for ``problem``, and the evaluator that timed its episodes: the
    policy's episode from the re-laid start of a constant weight (``start``, run in its
    coordinates) or else from the untuned nest and, for a linear layer of few rows, also on the
    weight as stored (never re-laying it where ``weights_change``: a copy would be compared on
    every call), each timing at most ``timings`` proposals; the winner rule picks."""
    evaluator = measurer.team if proposer.actions.parallel else measurer.evaluator

    def episode(problem: Problem, excluded: frozenset[str] = frozenset()) -> Answer:
        found = policy_answer(proposer, problem, measurer, evaluator, excluded, timings)
        return found if proposer.actions.parallel or measurer.threads == 1 else split(found, measurer)

    if start is None or not start.exact:
        return episode(problem), evaluator
    answer = from_relaid_start(episode(start.coordinates), start)
    in_place, compare_s = None, 0.0
    if in_place_rows(problem) and proposer.actions.fits(problem):
        compare_s = measurer.comparison_seconds(problem.constant_bytes) if weights_change else 0.0
        in_place = episode(problem, relaying_actions(proposer.actions) if weights_change else frozenset())
    return preferred([answer, in_place], compare_s), evaluator


def policy_answer(proposer: PolicyProposer, problem: Problem, measurer: Measurer, evaluator: Evaluator, excluded: frozenset[str],
                  timings: int) -> Answer:
    """The policy alone's answer for ``problem``: its proposals (never taking one of
    ``excluded``) timed in order through ``evaluator``, at most ``timings`` of them, a
    proposal that is the fastest so far not timed again; the fastest kept."""
    before = evaluator.compiled
    best, timed = None, 0
    for proposal in proposer.alone(problem, excluded):
        if timed < timings and (best is None or proposal.nest != best.nest):
            found, timed = measurer.timed(proposal, evaluator), timed + 1
            best = found if best is None else fastest([best, found])
    record = replace(best, found_by="policy", target=evaluator.target, threads=evaluator.threads)
    return Answer(record, "policy", math.nan, measured=evaluator.compiled - before)
