"""``looprl.tune``: schedule a contraction with a trained policy and compile it, in well
under a second, without Ray or torch.

Two modes:

* measured (``measure=True``, the default): a policy-guided search
  (:func:`measured_search`, also the expert of training's demonstrations). The policy's greedy
  rollout (:func:`~looprl.policy.rollout.greedy_rollout`, the env's transition rules) comes
  first; then, until ``budget_s`` is spent (by default scaled to the problem:
  :mod:`looprl.search.budget`), the register tile the policy built is refined
  (:mod:`looprl.search.tiles`: canonical order, cache blocks, packed right operand) and
  :func:`~looprl.policy.guided.guided_search` measures the policy's few best actions and
  tiles from a small beam of states, so a policy
  trained on another machine is corrected by this machine's measurements. Tiles may split by
  the target's register-tile rows (e.g. ``split_6`` on AVX2) even when the policy has no such
  action, so ``actions`` may name splits outside the policy's action set. The fastest schedule measured
  is returned: never slower than the greedy rollout's best or the untuned nest. The answer is
  remembered in the measurement cache per host, target and problem, so tuning the same problem
  again (with no larger budget) is a lookup.
* pure policy (``measure=False``, the fast path of ``tune_module``, the ``torch.compile``
  backend and ``looprl-tune --no-measure``): the policy's greedy actions are followed without
  measuring; the state it ends in is compiled and timed once for the report (the untuned nest
  is not timed: ``speedup`` is NaN). A linear layer of
  few rows (:data:`~looprl.search.dots.IN_PLACE_ROWS`) gets a second episode on the weight as
  it is stored, also timed once, and the faster of the two is kept (:func:`_policy_tune`;
  an answer there that re-lays the weight is a copy, as the twin's, and pays what the twin pays).

The environment has no stop action: a trained policy that is content with a schedule picks an
action that cannot apply (a no-op there) and, being greedy, would pick it again and again.
The rollout sees that cycle (as any other) and stops.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from looprl import checks, defaults
from looprl.backend.kernel import Kernel, ReshapedKernel, compile
from looprl.target import Target
from looprl.backend.threads import available_cores, check_threads
from looprl.actions import ActionSet, State, replay
from looprl.actions.action_set import LAYOUT_ACTIONS
from looprl.ir.plans import Plan
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem, as_problem, matmul
from looprl.ir.rewrites import RewriteChain, plan_rewrites, relaid_twin
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.policy.guided import guided_search
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.search.parallel import parallel_proposals, split_once
from looprl.policy.retarget import retargeted
from looprl.policy.rollout import greedy_rollout, policy_actions
from looprl.ir.register_tiles import tile_of
from looprl.backend.pairs import pairs_a_weight
from looprl.search.tiles import measure_tiles, packed_path
from looprl.search.budget import MIN_BUDGET_S, REFINEMENTS
from looprl.search.context import BudgetExhausted
from looprl.search.staged import CONTENDER_ROUNDS, CONTENDER_WITHIN, TEAM_WITHIN, Stage, StagedSearch, confirm_winner
from looprl.search.dots import in_place_rows, in_place_search
from looprl.backend.host import cache_sizes
from looprl.measurement.roofline import memory_bandwidth

# Search time of measured tune by default: None scales it with the problem
# (:func:`~looprl.search.budget.scaled_budget`: 0.4 s up to ~256^3, where a new state costs
# ~15-25 ms to compile and time, up to 1.5 s for the largest real-model GEMMs).
TUNE_BUDGET_S = None
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
_warned_mismatch: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Answer:
    """A schedule of the problem searched, as a record (its actions replay on the rewrite
    ``record.replays_on`` names, if any), and what finding it cost."""

    record: ScheduleRecord
    mode: str  # "measured", "remembered" (a lookup of an earlier measured tune) or "policy"
    initial_gflops: float
    greedy_gflops: float | None = None  # the best state of the policy's greedy rollout (measured mode)
    measured: int = 0  # schedules timed
    waited_s: float = 0.0  # spent waiting for another process's timing (the machine-wide lock)
    serial_gflops: float | None = None  # the best serial schedule's, when parallel proposals were measured

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
    """A tuned schedule and its compiled kernel: the :class:`Answer` (its record carried back
    to ``problem``), the kernel, and the call's own facts. A right operand stored across the
    output's columns (a linear layer's W) is tuned as its twin (looprl.ir.rewrites), a problem
    with dimensions that always go together (a 1x1 convolution's h and w) as its fused view
    (looprl.ir.rewrites.fused_view): ``actions`` then replay on ``tuned_as``, not ``problem``;
    for a fused view, ``nest`` (and ``initial_gflops``) are the view's, and ``kernel`` takes
    ``problem``'s arrays.

    Built from an answer (``answer=``) or, as before there were answers, from the fields it
    exposes (``nest``, ``actions``, ``gflops``, ``target``, ``threads`` and the answer's)."""

    problem: Problem
    answer: Answer
    kernel: Kernel | ReshapedKernel  # callable: kernel(a, b) -> output array (kernel(a, b, bias, residual) with an epilogue)
    seconds: float  # wall clock of the whole call, compile of the returned kernel included
    tuned_as: Problem | None = None

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

    @property
    def action_set(self) -> ActionSet:
        """The actions that replay ``actions`` from the untuned nest (the env's, plus any
        ``split_<rows>`` a tile used, plus ``pack`` and ``pad`` if the path has them)."""
        return ActionSet.covering(self.actions, target=self.target)

    @property
    def speedup(self) -> float:
        return self.gflops / self.initial_gflops if self.initial_gflops > 0 else float("nan")

    def __call__(self, a: np.ndarray, b: np.ndarray, *epilogue: np.ndarray) -> np.ndarray:
        return self.kernel(a, b, *epilogue)


def as_tunable_problem(problem: Any) -> Problem:
    """A Problem from a Problem, a string, an (m, n, k) tuple or a pair of 2-D arrays (A, B)."""
    if isinstance(problem, (Problem, str)):
        return as_problem(problem)
    if isinstance(problem, (tuple, list)) and len(problem) == 2 and all(isinstance(x, np.ndarray) for x in problem):
        a, b = problem
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"arrays of shapes {a.shape} and {b.shape} do not form a matmul A[m,k] @ B[k,n]")
        return matmul(m=a.shape[0], n=b.shape[1], k=a.shape[1])
    if isinstance(problem, (tuple, list)) and len(problem) == 3 and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in problem):
        m, n, k = (int(x) for x in problem)
        return matmul(m=m, n=n, k=k)
    raise ValueError(f"cannot tune {problem!r}: expected a Problem, 'MxNxK', an (m, n, k) tuple or arrays (A, B)")


def tune(
    problem: Any,
    policy: Policy | str | Path = "default",
    episode_length: int | None = None,
    measure: bool = True,
    *,
    cache=None,
    budget_s: float | None = TUNE_BUDGET_S,
    measure_budget_s: float = defaults.STATE_BUDGET_S,
    target: Target | str | None = None,
    remember: bool = True,
    threads: int | None = None,
    max_evaluations: int | None = None,
    weights_change: bool = False,
    **deprecated: Any,
) -> TuneResult:
    """Schedule ``problem`` with ``policy`` and compile it for ``target`` (None: this machine).

    ``problem``: a :class:`Problem` (e.g. :func:`looprl.linear`, epilogue included),
    ``"MxNxK"``, an ``(m, n, k)`` tuple or arrays ``(A, B)``.
    ``policy``: ``"default"`` (the shipped policy made for the target's ISA, else the closest,
    with a warning), a policy folder or a :class:`Policy`; a plan policy made for another ISA
    acts with this target's plans, each mapped from its counterpart
    (:func:`looprl.policy.retarget.retargeted`). ``episode_length``: actions of the greedy
    rollout (None: the policy's training episode length; the env, the agent YAML and the
    policy's metadata use the same name; the former ``steps`` is accepted with a
    DeprecationWarning). ``budget_s``: seconds the measured search may take, counted from the call
    (None: scaled to the problem, see :mod:`looprl.search.budget`; 0: the rollout only, every
    state of it measured whatever it costs);
    ``measure_budget_s``: timing budget per new schedule. ``cache``: the measurement cache (a
    path, ``":memory:"`` or None for the per-user one). ``remember``: reuse and store the
    answer for this host, target and problem (and thread count).

    ``threads``: how many threads the kernel may use (None: the cores this process may use,
    as numpy does; 1: a serial kernel). In measured mode with more than one, the best serial
    schedules found are proposed again with their outermost eligible loops parallel
    (:mod:`looprl.search.parallel`) and measured on that many threads, after the serial
    search (which keeps its whole budget: the proposals get a quarter of it more); the faster
    of the serial best and the parallel proposals is returned, so a problem too small for
    threads to pay gets a serial kernel. Pure policy mode: a policy whose actions mark loops
    parallel (trained on several threads) decides the split in its episode; any other
    policy's serial answer is offered measured mode's parallel variants, each timed once.

    ``max_evaluations``: at most this many distinct schedules in the serial search, the untuned
    nest and the rollout's included (the name ``looprl.search.run`` gives the same cap; the
    former ``max_measurements`` is accepted with a DeprecationWarning); a capped answer is not
    remembered, and a capped tune (or one of budget 0) does not search a linear layer in place
    (below).

    ``weights_change``: the problem's constant inputs may change between calls (a model whose
    weights are followed: ``tune_module``'s default path), so a schedule that reads a re-laid
    copy of them pays, on every call, for comparing that copy with them (two reads of the
    weights at this host's measured bandwidth, :func:`~looprl.measurement.roofline.
    memory_bandwidth`); its in-place rival (below) is then kept unless the twin is faster
    with that cost counted, and searched at more rows too where that cost is
    :data:`COMPARISON_SHARE` of the twin's call or more. Default False: constant means constant
    (bound once, as ``frozen=True`` and Inductor's freezing promise).

    One pass: the exact rewrites of the problem (:func:`looprl.ir.rewrites.plan_rewrites`:
    its fused view, its transposed twin) give the problem searched; the answer for it comes
    from the policy alone, from the cache, or from one measured search (two for a right
    operand re-laid per call, :func:`_measured_answer`); :func:`_finish` carries it back,
    compiles it once, remembers it and builds the result."""
    started = time.perf_counter()
    unknown = set(deprecated) - {"max_measurements", "steps"}
    if unknown:
        raise TypeError(f"tune() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    episode_length, name = _former_name(deprecated, "steps", "episode_length", episode_length)
    episode_length = None if episode_length is None else checks.count(episode_length, name)
    measure, remember = checks.flag(measure, "measure"), checks.flag(remember, "remember")
    budget_s = checks.seconds(budget_s, "budget_s", allow_zero=True, allow_none=True)
    measure_budget_s = checks.seconds(measure_budget_s, "measure_budget_s")
    if not isinstance(policy, (Policy, str, os.PathLike)):
        raise ValueError(f"policy must be a Policy, 'default' or a path to a policy folder, got {type(policy).__name__}")
    threads = available_cores() if threads is None else check_threads(threads)
    max_evaluations, name = _former_name(deprecated, "max_measurements", "max_evaluations", max_evaluations)
    max_evaluations = None if max_evaluations is None else checks.positive_int(max_evaluations, name)
    remember = remember and max_evaluations is None
    weights_change = checks.flag(weights_change, "weights_change")
    target = Target.resolve(target)
    target.check_runs_on_host()
    plan = plan_rewrites(as_tunable_problem(problem))
    searched = plan.searched
    loaded = load_policy(policy, target, weights="in1" in searched.constant)  # "default": the weights policy where the right operand is one
    _warn_if_made_for_another_target(loaded, target)
    loaded = retargeted(loaded, target)  # another ISA's plans would spill here: this target's, each from its counterpart
    policy_actions(loaded, target).check_fits(searched)  # before anything is measured
    evaluator = Evaluator(cache, measure_budget_s, target=target)
    given = plan.as_given()  # the problem with its twin undone: searched in place too, where it has few rows
    if not measure:
        return _policy_tune(loaded, plan, given, evaluator, episode_length, threads, weights_change, started)
    # ... unless the search is the rollout alone (budget 0) or capped in schedules (measurements outside the cap would
    # make a capped comparison unequal)
    searches_given = given is not None and in_place_rows(given.searched, None) and budget_s != 0 and max_evaluations is None
    given = given if searches_given else None
    compare_s = _comparison_seconds(plan.original, evaluator, threads) if weights_change and given is not None else 0.0
    answer = in_place = None
    if remember:
        least = MIN_BUDGET_S if budget_s is None else budget_s
        answer = _remembered(evaluator, searched, least, threads)
        if answer is not None and _searches_in_place(given, answer, compare_s):
            in_place = _remembered(evaluator, given.searched, least, threads)
    if answer is None:
        answer = _measured_answer(loaded, searched, evaluator, episode_length, budget_s, threads, started, max_evaluations)
        if remember:
            evaluator.cache.put_tuned(answer.record, measure_budget_s)
    if in_place is None and _searches_in_place(given, answer, compare_s):  # a remembered twin is not searched again
        in_place = _in_place_answer(given.searched, evaluator, threads)
        if in_place is not None:
            in_place = replace(in_place, record=replace(in_place.record, budget_s=answer.record.budget_s))
            if remember:
                evaluator.cache.put_tuned(in_place.record, measure_budget_s)
    return _finish(*_preferred(plan, answer, given, in_place, compare_s), evaluator, threads, started)


# Where the weights may change, a problem of more rows than looprl.search.dots.IN_PLACE_ROWS is
# searched in place too when comparing the twin's copy would cost at least this share of the
# twin's call: below it the in-place answer would have to win on speed alone, which dot-product
# tiles do not at many rows (two loads per multiply-add), and its search would cost measurements
# for nothing (at 512 rows of 640->1920 the comparison is 0.5% of the call; at 64 rows, 4%).
COMPARISON_SHARE = 0.02


def _searches_in_place(given: RewriteChain | None, answer: Answer, compare_s: float) -> bool:
    """Whether tune searches ``given`` (the problem as given, or None) in place, the twin's
    ``answer`` in hand: few rows always; more where the comparison ``compare_s`` of the
    twin's copy is :data:`COMPARISON_SHARE` of its call or more."""
    if given is None:
        return False
    if in_place_rows(given.searched):
        return True
    call_s = given.original.flops / (answer.gflops * 1e9) if answer.gflops > 0 else math.inf
    return compare_s >= COMPARISON_SHARE * call_s


def _comparison_seconds(problem: Problem, evaluator: Evaluator, threads: int) -> float:
    """What comparing a re-laid copy of ``problem``'s constant inputs with them costs a call:
    both read once, at the host's measured bandwidth from where they live (the last-level cache
    when both fit it, else memory)."""
    read = 2 * problem.constant_bytes
    bandwidth = memory_bandwidth(evaluator.target, evaluator.cache, threads=threads)
    return read / (1e9 * bandwidth["llc" if read <= cache_sizes()[1] else "dram"])


# A schedule that reads the weight in place is kept unless the one through the re-laid twin is
# at least this much faster: the twin's kernel reads a copy of the weight, which a model must
# keep in step with the weight (compared on every call unless frozen); a near-tie goes to the
# schedule that keeps nothing. 5%: what two timings of one kernel differ by (torch.routes).
IN_PLACE_MARGIN = 0.05


def _preferred(plan: RewriteChain, answer: Answer, given: RewriteChain | None, in_place: Answer | None,
               compare_s: float = 0.0) -> tuple[RewriteChain, Answer]:
    """The chain and answer tune returns: the in-place answer where there is one and the
    twin's is not :data:`IN_PLACE_MARGIN` faster (its call's time with ``compare_s``, the
    comparison of its copies, added), else the twin's."""
    if in_place is None:
        return plan, answer
    flops = plan.original.flops
    twin_gflops = flops / (flops / (answer.gflops * 1e9) + compare_s) / 1e9 if answer.gflops > 0 else 0.0
    measured, waited_s = in_place.measured + answer.measured, in_place.waited_s + answer.waited_s  # both searches counted
    if twin_gflops >= (1.0 + IN_PLACE_MARGIN) * in_place.gflops:
        return plan, replace(answer, measured=measured, waited_s=waited_s)
    return given, replace(in_place, measured=measured, waited_s=waited_s)


def _in_place_answer(problem: Problem, evaluator: Evaluator, threads: int) -> Answer | None:
    """The in-place search's answer (:func:`looprl.search.dots.in_place_search`), or None."""
    found = in_place_search(problem, evaluator, threads)
    if found.best is None:
        return None
    record = replace(found.best, threads=threads, tuner=TUNER)
    return Answer(record, "measured", found.initial_gflops, None, found.measured, found.waited_s, found.serial_gflops)


def _finish(plan: RewriteChain, answer: Answer, evaluator: Evaluator, threads: int, started: float) -> TuneResult:
    """The one finishing step: ``answer`` (a schedule of the plan's searched problem) carried
    back through the plan's rewrites, compiled once (a fused view's kernel called through
    reshapes), and the result built."""
    nest = plan.carry_back(answer.nest)
    kernel = compile(nest, target=evaluator.target, threads=threads)
    if plan.through_fused_view:
        kernel = ReshapedKernel(kernel, plan.original)
    if answer.record.replays_on is not None:
        tuned_as = relaid_twin(plan.searched).searched
    else:
        tuned_as = plan.searched if plan.chain else None
    record = replace(answer.record, nest=nest, target=evaluator.target, threads=threads)
    answer = replace(answer, record=record, measured=answer.measured or evaluator.compiled)
    return TuneResult(plan.original, kernel=kernel, seconds=time.perf_counter() - started, tuned_as=tuned_as, answer=answer)


def _policy_tune(policy: Policy, plan: RewriteChain, given: RewriteChain | None, evaluator: Evaluator, episode_length: int | None,
                 threads: int, weights_change: bool, started: float) -> TuneResult:
    """Pure policy mode: the policy's greedy episode on the problem searched, and, for a linear
    layer of few rows (the rows tune searches in place), on the problem as given too; each
    answer's last state is timed once and the faster kept by the rule of measured mode
    (:func:`_preferred`). On ``threads`` > 1, a policy whose actions mark loops parallel
    decides the thread split itself (timed on that many threads); any other policy's serial
    answer is split by measured tune's rule, each variant timed once
    (:func:`~looprl.search.parallel.split_once`)."""
    actions = policy_actions(policy, evaluator.target)
    team = Evaluator(evaluator.cache, evaluator.budget_s, target=evaluator.target, threads=threads) if threads > 1 else evaluator
    if actions.parallel:
        evaluator = team

    def episode(problem: Problem, excluded: frozenset[str] = frozenset()) -> Answer:
        found = _policy_answer(policy, problem, evaluator, episode_length, excluded)
        if actions.parallel or threads == 1:
            return found
        before = team.compiled
        split = split_once(found.record, team)
        return replace(found, record=split, measured=found.measured + team.compiled - before)

    answer = episode(plan.searched)
    in_place, compare_s = None, 0.0
    if given is not None and in_place_rows(given.searched) and actions.fits(given.searched):
        compare_s = _comparison_seconds(plan.original, evaluator, threads) if weights_change else 0.0
        # where the weights change, the episode on the weight as stored reads it in place (a copy would be compared per call)
        in_place = episode(given.searched, _relaying_actions(actions) if weights_change else frozenset())
        if dict(in_place.nest.layouts).get("in1") is not None:  # it re-lays the weight: a copy, as the twin's; the faster copy kept
            measured = answer.measured + in_place.measured
            plan, answer = (given, in_place) if in_place.gflops > answer.gflops else (plan, answer)
            answer, in_place = replace(answer, measured=measured), None
    return _finish(*_preferred(plan, answer, given, in_place, compare_s), evaluator, threads, started)


def _relaying_actions(actions: ActionSet) -> frozenset[str]:
    """The actions that re-lay an operand: the layout actions and the plans that pack."""
    plans = {name for name in actions.names if (plan := Plan.parse(name)) is not None and plan.packed}
    return frozenset(plans | {name for name in actions.names if name in LAYOUT_ACTIONS})


def _policy_answer(policy: Policy, problem: Problem, evaluator: Evaluator, episode_length: int | None,
                   excluded: frozenset[str] = frozenset()) -> Answer:
    """The greedy actions (never one of ``excluded``), unmeasured; the state they end in is
    timed once. The untuned nest is not timed (it can take seconds a call on a large
    problem): ``speedup`` is NaN.

    A bfloat16 problem whose weight its kernels pair (:func:`~looprl.backend.pairs.pairs_a_weight`),
    re-laying allowed, also has that state timed with the weight packed into panels of its tile,
    and, where the answer is a dot-product tile, the policy's greedy episode without dot-product
    tiles timed (packed too); the fastest is kept. The shipped policies learnt on float32, where
    a weight re-laid whole streams as fast as in panels and few-row dot products compete with
    register tiles; in bfloat16 a paired register tile computes at twice the rate."""
    rollout = greedy_rollout(policy, problem, None, episode_length=episode_length, excluded=excluded)
    before = evaluator.compiled
    best = (evaluator(rollout.final_nest).gflops, rollout.final_nest, tuple(rollout.final_actions))
    if pairs_a_weight(problem) and "pack" not in excluded:
        actions = policy_actions(policy, evaluator.target)
        paths = [best[2]]
        dots = frozenset(name for name in actions.names if (plan := Plan.parse(name)) is not None and plan.dot)
        if dots & set(best[2]):
            tiled = greedy_rollout(policy, problem, None, episode_length=episode_length, excluded=excluded | dots)
            if tiled.final_nest != best[1]:
                best = max(best, (evaluator(tiled.final_nest).gflops, tiled.final_nest, tuple(tiled.final_actions)), key=lambda b: b[0])
                paths.append(tuple(tiled.final_actions))
        for path in paths:
            packed = packed_path(problem, path, actions)
            if packed is not None and packed[1].nest != best[1]:
                best = max(best, (evaluator(packed[1].nest).gflops, packed[1].nest, packed[0]), key=lambda b: b[0])
    gflops, nest, actions = best
    record = ScheduleRecord(nest, gflops, tuple(actions), "policy", evaluator.target, threads=evaluator.threads)
    return Answer(record, "policy", math.nan, measured=evaluator.compiled - before)


def _measured_answer(policy: Policy, problem: Problem, evaluator: Evaluator, episode_length: int | None, budget_s: float | None,
                     threads: int, started: float, max_evaluations: int | None = None) -> Answer:
    """The measured search of ``problem``. A right operand that changes per call and is stored
    across the output's columns (``bmk,bnk->bmn``) is searched two ways, each a whole measured
    search with the budget: through its re-laid twin (:data:`looprl.ir.rewrites.RELAID_TWIN`),
    whose schedule is carried back and timed again on ``problem``, conversion inside the call
    included, and as given (its tiles read the operand in place or pack it per tile); the
    faster is kept. Which wins depends on the shape and the target: with one row the
    conversion costs as much as the product; on 128x960x960 (Zen 4) the re-laid kernel ran at
    98 GFLOPS for AVX-512 against 113 as given, and at 101 against 84 for AVX2."""
    direct = measured_search(policy, problem, evaluator, episode_length, budget_s, threads, started, max_evaluations)
    relaid = relaid_twin(problem)
    if relaid is None:
        return direct
    through = measured_search(policy, relaid.searched, evaluator, episode_length, budget_s, threads, time.perf_counter(), max_evaluations)
    carried = relaid.carry_back(through.nest)  # parallel marks included
    timed = evaluator.with_threads(threads) if threads > 1 else evaluator
    carried_gflops = timed(carried).gflops  # the conversion inside the timed call
    measured = direct.measured + through.measured + 1
    if carried_gflops < direct.gflops:
        return replace(direct, measured=measured, waited_s=direct.waited_s + through.waited_s)
    record = replace(through.record, nest=carried, gflops=carried_gflops, budget_s=direct.record.budget_s, replays_on=relaid.kind)
    return Answer(record, "measured", direct.initial_gflops, direct.greedy_gflops, measured, direct.waited_s + through.waited_s,
                  through.serial_gflops)


def _remembered(evaluator: Evaluator, problem: Problem, budget_s: float, threads: int) -> Answer | None:
    """The answer an earlier measured tune of ``problem`` on ``threads`` threads remembered, if
    it was found with at least ``budget_s`` and its action path is known (else: tune again)."""
    known = evaluator.cache.get_tuned(problem, evaluator.target, evaluator.budget_s, tuner=TUNER, threads=threads)
    if known is None or known.budget_s < budget_s or known.actions is None:
        return None  # (also when another IR version wrote it) tune again
    if known.replays_on is not None:
        relaid = relaid_twin(problem)
        if relaid is None or relaid.kind != known.replays_on:
            return None  # written for another rewrite of this problem: tune again
    root = initial_nest(problem)
    initial = evaluator.cache.get(root, evaluator.target, evaluator.budget_s) or evaluator(root).gflops
    return Answer(known, "remembered", initial, measured=evaluator.compiled)




def measured_search(policy: Policy, problem: Problem, evaluator: Evaluator, episode_length: int | None, budget_s: float | None, threads: int,
                    started: float, max_evaluations: int | None = None) -> Answer:
    """Measured tune: stages of one staged search (:class:`~looprl.search.staged.StagedSearch`).
    The untuned nest; the policy's greedy rollout, always measured whole (a dozen actions at
    most: a bounded cost, and tune is never below the rollout); then, until the deadline (a
    measurement predicted to end after it is not started), the rollout's register tile and the
    target's own register tiles refined (:func:`~looprl.search.tiles.measure_tiles`) and the
    policy-guided search; the stage winners confirmed (:func:`~looprl.search.staged.
    confirm_winner`); with threads, the best serial schedules made parallel, in a quarter of
    the budget more, and the winner confirmed among them and the serial best. The budget counts
    from ``started`` (tune's call)."""
    action_set = policy_actions(policy, evaluator.target)
    search = StagedSearch(problem, evaluator, budget_s=budget_s, started=started)
    context = search.context(action_set, max_evaluations=max_evaluations)
    untuned = context.root()
    search.scale(untuned.gflops)  # a budget of None: scaled to the problem
    scaled, budget_s = search.scaled, search.budget_s
    rollouts = []

    def rollout_stage(context):
        # The policy's own answer first: the state its greedy episode ends in, followed without
        # measuring and timed at once, so that a trained policy's answer is in hand after two
        # measurements whatever the cap (the measured rollout then finds it in the memo).
        ahead = greedy_rollout(policy, problem, None, episode_length=episode_length)
        found = []
        if ahead.final_nest.key != untuned.state.nest.key:
            try:
                node = context.visit(ahead.final_nest)
            except BudgetExhausted:
                node = None
            if node is not None:
                found.append(replace(ahead.final, gflops=node.gflops, actions=_applied(action_set, problem, ahead.final_actions)))
        rollout = greedy_rollout(policy, problem, context, episode_length=episode_length)
        rollouts.append(rollout)
        return found + [rollout.best]

    search.run(context, Stage("rollout", rollout_stage, share=math.inf))  # measured whole, whatever the budget
    rollout = rollouts[0]
    # Fastest first; among equals the measured rollout's best (the shorter path to it).
    ranked = sorted(reversed(search.candidates), key=lambda candidate: -candidate.gflops)
    if budget_s > 0:
        # The policy's tile, then the target's own register tiles (a rollout may build none,
        # or a one-row tile on a decode GEMM), refined: canonical order, cache blocks, packed.
        def tiles_stage(context):
            tiles, _ = measure_tiles(context, action_set, lead=tile_of(rollout.best_nest))
            return [tiles] if tiles is not None else []

        def guided_stage(context):
            best = search.best()
            rows = tuple(rows for rows, _ in evaluator.target.register_tiles())  # e.g. 6 on AVX2: the policy may lack split_6
            guided = guided_search(policy, context, start=(best.actions, best.gflops), tile_rows=rows)
            return [guided.best]

        # However long the rollout took, its tile gets a few refinements (budget.REFINEMENTS).
        search.run(context, Stage("tiles", tiles_stage, refinements=REFINEMENTS if scaled else 0, from_best=True))
        search.run(context, Stage("guided", guided_stage))
        ranked = search.confirm(context, within=CONTENDER_WITHIN, rounds=CONTENDER_ROUNDS, max_cost_s=budget_s / 4).ranked
    best = ranked[0]
    serial_gflops = None
    if threads > 1:  # the best serial schedules with their outermost loops parallel, measured on the threads
        team_context = search.context(action_set, evaluator=evaluator.with_threads(threads))
        # A team is predicted from the serial schedule it is made of (the best), not from the
        # last schedule the serial stages measured: that may be a slow one (8 GFLOPS after a
        # 219 GFLOPS best), predicting a 0.5 s measurement and refusing every team.
        proposals: list[ScheduleRecord] = []
        teams = Stage("parallel", lambda c: proposals.extend(parallel_proposals(ranked, c, threads)) or proposals, share=0.25,
                      from_best=True)
        search.run(team_context, teams)
        serial_gflops = best.gflops
        if proposals:  # the teams against the serial best, re-timed together when close
            best = confirm_winner(team_context, [best] + proposals, within=TEAM_WITHIN, rounds=CONTENDER_ROUNDS,
                                  max_cost_s=budget_s / 4).ranked[0]
            serial_gflops = team_context.values.get(ranked[0].nest.key, serial_gflops)
    record = replace(best, actions=tuple(best.actions or ()), target=evaluator.target, threads=threads, budget_s=budget_s, tuner=TUNER)
    return Answer(record, "measured", rollout.initial_gflops, rollout.best_gflops, search.new_measurements, search.waited_s, serial_gflops)


def _former_name(deprecated: dict, former: str, name: str, value):
    """The value of ``tune``'s argument ``name`` and the keyword it was given by: ``name``, or
    its former keyword ``former`` in ``deprecated`` (a DeprecationWarning; both given: a
    ValueError)."""
    if former not in deprecated:
        return value, name
    warnings.warn(f"tune({former}=...) is now {name}=... (the name the rest of looprl gives it)", DeprecationWarning, stacklevel=3)
    if value is not None:
        raise ValueError(f"give {name} only ({former} is its former name)")
    return deprecated[former], former


def _applied(actions: ActionSet, problem: Problem, names) -> tuple[str, ...]:
    """``names`` (a greedy episode's actions) without those that did nothing where they were taken."""
    transitions = replay(actions, State(initial_nest(problem), 0), math.nan, names)
    return tuple(name for name, transition in zip(names, transitions) if transition.valid)


def _warn_if_made_for_another_target(policy: Policy, target: Target) -> None:
    made_for = policy.target
    if made_for is None or made_for.isa == target.isa:
        return
    pair = (made_for.isa, target.isa)
    if pair not in _warned_mismatch:
        _warned_mismatch.add(pair)
        warnings.warn(
            f"the policy was trained for {made_for.isa}, tuning for {target.isa}: its plans (if any) are mapped to {target.isa}'s "
            f"and its proposals refined by measurement (looprl-train --adapt fits it to this target)",
            RuntimeWarning,
            stacklevel=3,
        )
