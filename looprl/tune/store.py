"""Tune's store: answers remembered in the measurement cache per host, target, problem,
threads offered and version of tune (:data:`TUNER`), so tuning the same problem again (with
no larger budget) is a lookup.

:func:`remember` and :func:`recall` are the only ways in and out. They are where the
busy-machine rule belongs (``looprl.measurement``'s detection of a busy host): an answer found
on a busy machine is not remembered as final, and one recalled on a quiet machine is timed
again; neither is decided here yet.
"""

from __future__ import annotations

from dataclasses import replace

from looprl.ir.nest import initial_nest
from looprl.ir.problem import Problem
from looprl.ir.rewrites import relaid_twin
from looprl.tune.measurer import Measurer
from looprl.tune.results import Answer

# Remembered answers are keyed by this: bump it when what tune finds changes (an upgrade must not
# return an older version's weaker answer). 2: register tiles at the output-row loop.
# 3: two-dimensional register tiles, cache blocks and packing; budgets scaled to the problem.
# 4: the target's own register tiles measured after the policy's (decode GEMMs, q.k^T).
# 5: streaming tiles for problems of few output rows (decode GEMMs whose weights outgrow L2).
# 6: panel schedules for cold problems; a team slower than its serial schedule timed again (answers
# remembered by v5 at two threads included serial ones a noisy moment had chosen).
# 7: the policy's own answer (its unmeasured greedy episode's last state) measured first.
# 8: the default policies act with plan actions (checkpoints/clone-plans*): their answers differ.
# 9: few-row problems whose inputs both store the reduction last are also searched in place
# (dot-product tiles, looprl.search.dots), and kept unless the re-laid twin is IN_PLACE_MARGIN faster.
TUNER = "tune-v9"


def remember(answer: Answer, measurer: Measurer) -> None:
    """Store ``answer`` (a measured one) as tune's for its problem, target and threads offered,
    timed with the measurer's budget per schedule."""
    measurer.cache.put_tuned(replace(answer.record, tuner=TUNER), measurer.budget_s)


def recall(measurer: Measurer, problem: Problem, least_budget_s: float) -> Answer | None:
    """The answer an earlier measured tune of ``problem`` on the measurer's threads remembered,
    if it was found with at least ``least_budget_s`` and its action path is known (else None:
    tune again). The untuned nest's speed is looked up (or timed) for the report."""
    known = measurer.cache.get_tuned(problem, measurer.target, measurer.budget_s, tuner=TUNER, threads=measurer.threads)
    if known is None or known.budget_s < least_budget_s or known.actions is None:
        return None  # (also when another IR version wrote it) tune again
    if known.replays_on is not None:
        relaid = relaid_twin(problem)
        if relaid is None or relaid.kind != known.replays_on:
            return None  # written for another rewrite of this problem: tune again
    root = initial_nest(problem)
    initial = measurer.cache.get(root, measurer.target, measurer.budget_s) or measurer.evaluator(root).gflops
    return Answer(known, "remembered", initial, measured=measurer.compiled)
