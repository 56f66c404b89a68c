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

The answers are remembered in the process (:func:`remembered_policy_tune`): a recompiled graph
or a second model with the same layer shapes asks the same question again, and gets the answer
without its episodes and timings (only the finishing compile).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from looprl.ir.problem import Problem
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.target import Target
from looprl.tune.measurer import Measurer
from looprl.tune.proposers import PolicyProposer
from looprl.tune.results import Answer, from_relaid_start
from looprl.tune.searched import Searched
from looprl.tune.teams import split
from looprl.tune.winner import fastest, preferred, relaying_actions

# Timings of the policy alone's proposals per episode: the state its greedy episode ends in,
# and for a bfloat16 weight its kernels pair, that state packed, the episode without
# dot-product tiles and that one packed. Four: the most it proposes (the cap never cuts today).
POLICY_TIMINGS = 4
# Policy-alone answers the process remembers, the least recently asked forgotten first: a
# model's layer shapes times its row counts (a 7B decoder: ~7 shapes, ~10 row counts) many times
# over; an answer is a schedule record, a few kilobytes.
REMEMBERED_ANSWERS = 1024


@dataclass(frozen=True)
class Question:
    """Everything the policy alone's answer depends on, besides this host: the problem searched
    (``pairs``: its bfloat16 weight may be paired), the target, the policy (its
    :func:`fingerprint`, as made ready for the target) and its episode length, the threads, the
    timing budget per schedule, whether the weights change, the cap on timings and the
    measurement cache's file (its timings are what the answer was picked by)."""

    problem: Problem
    pairs: bool
    target: Target
    policy: str
    episode_length: int | None
    threads: int
    budget_s: float
    weights_change: bool
    timings: int
    cache: str


_answers: OrderedDict[Question, Answer] = OrderedDict()
_answers_lock = threading.Lock()


def remembered_policy_tune(proposer: PolicyProposer, searched: Searched, measurer: Measurer, weights_change: bool,
                           remember: bool = True, timings: int = POLICY_TIMINGS) -> tuple[Answer, Evaluator]:
    """:func:`policy_tune`'s answer, remembered in this process for the same :class:`Question`
    (at most :data:`REMEMBERED_ANSWERS`): asked again, the answer comes back with nothing timed
    (``measured`` 0). Without ``remember`` (tune's), or with a private measurement cache
    (``":memory:"``: it starts from nothing, and so does its tune), nothing is remembered or recalled."""
    if not remember or measurer.cache.path == ":memory:":
        return policy_tune(proposer, searched, measurer, weights_change, timings)
    question = Question(searched.problem, searched.pairs, measurer.target, fingerprint(proposer.policy), proposer.episode_length,
                        measurer.threads, measurer.budget_s, weights_change, timings, os.path.realpath(measurer.cache.path))
    with _answers_lock:
        known = _answers.get(question)
        if known is not None:
            _answers.move_to_end(question)
    if known is not None:
        return replace(known, measured=0, waited_s=0.0), measurer.policy_evaluator(proposer.actions.parallel)
    answer, evaluator = policy_tune(proposer, searched, measurer, weights_change, timings)
    with _answers_lock:
        _answers[question] = answer
        while len(_answers) > REMEMBERED_ANSWERS:
            _answers.popitem(last=False)
    return answer, evaluator


def forget_policy_answers() -> None:
    """Forget every answer :func:`remembered_policy_tune` remembers."""
    with _answers_lock:
        _answers.clear()


def fingerprint(policy: Policy) -> str:
    """A digest of what ``policy`` is: its metadata and every layer's activation, shape and
    weights, so a policy loaded again from the same files has the same one and a policy whose
    weights or actions differ has another."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps(policy.metadata, sort_keys=True, default=repr).encode())
    for name, layers in [("trunk", policy.trunk), *sorted(policy.heads.items())]:
        digest.update(name.encode())
        for layer in layers:
            digest.update(layer.activation.encode())
            for array in (layer.weight, layer.bias):
                array = np.ascontiguousarray(array)
                digest.update(f"{array.dtype}{array.shape}".encode())
                digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def policy_tune(proposer: PolicyProposer, searched: Searched, measurer: Measurer, weights_change: bool,
                timings: int = POLICY_TIMINGS) -> tuple[Answer, Evaluator]:
    """The fast path's answer for the problem searched, and the evaluator that timed its
    episodes (:meth:`~looprl.tune.measurer.Measurer.policy_evaluator`): the policy's episode from
    the re-laid start of a constant weight (run in its coordinates) or else from the untuned nest
    and, for a linear layer of few rows, also on the weight as stored (never re-laying it where
    ``weights_change``: a copy would be compared on every call), each timing at most ``timings``
    proposals; the winner rule picks."""
    evaluator = measurer.policy_evaluator(proposer.actions.parallel)
    start = searched.exact_start
    if start is None:
        return policy_answer(proposer, searched.problem, searched.pairs, measurer, evaluator, frozenset(), timings), evaluator
    in_place = searched.few_rows and proposer.actions.fits(searched.problem)
    problem = searched.problem
    compare_s = measurer.comparison_seconds(problem.constant_bytes, problem.between) if in_place and weights_change else 0.0
    relaid = policy_answer(proposer, start.coordinates, searched.pairs, measurer, evaluator, frozenset(), timings)
    answers = [from_relaid_start(relaid, start)]
    if in_place:
        excluded = relaying_actions(proposer.actions) if weights_change else frozenset()
        answers.append(policy_answer(proposer, searched.problem, searched.pairs, measurer, evaluator, excluded, timings))
    return preferred(answers, compare_s), evaluator


def policy_answer(proposer: PolicyProposer, problem: Problem, pairs: bool, measurer: Measurer, evaluator: Evaluator,
                  excluded: frozenset[str], timings: int) -> Answer:
    """The policy alone's answer for ``problem`` (``pairs``: its bfloat16 weight may be paired,
    :attr:`~looprl.tune.searched.Searched.pairs`): its proposals (never taking one of
    ``excluded``) timed in order through ``evaluator``, at most ``timings`` of them, a proposal
    that is the fastest so far not timed again; the fastest kept. On more than one thread, a
    policy whose actions mark no loop parallel has its answer offered the teams
    (:func:`~looprl.tune.teams.split`)."""
    before = evaluator.compiled
    best, timed = None, 0
    for proposal in proposer.alone(problem, pairs, excluded):
        if timed < timings and (best is None or proposal.nest != best.nest):
            found, timed = measurer.timed(proposal, evaluator), timed + 1
            best = found if best is None else fastest([best, found])
    record = replace(best, found_by="policy", target=evaluator.target, threads=evaluator.threads)
    answer = Answer(record, "policy", math.nan, measured=evaluator.compiled - before)
    return answer if measurer.threads == 1 or proposer.actions.parallel else split(answer, measurer)
