"""``looprl.tune``: schedule a contraction with a trained policy and compile it, in well
under a second, without Ray or torch.

Two modes:

* measured (``measure=True``, the default): a policy-guided search
  (:func:`measured_search`, also the expert of training's demonstrations). The policy's greedy
  rollout (:func:`~looprl.policy.rollout.greedy_rollout`, the env's transition rules) comes
  first; then, until ``budget_s`` is spent (by default scaled to the problem:
  :mod:`looprl.search.budget`), the register tile the policy built is refined
  (:mod:`looprl.policy.tiles`: canonical order, cache blocks, packed right operand) and
  :func:`~looprl.policy.guided.guided_search` measures the policy's few best actions and
  tiles from a small beam of states, so a policy
  trained on another machine is corrected by this machine's measurements. Tiles may split by
  the target's register-tile rows (e.g. ``split_6`` on AVX2) even when the policy has no such
  action, so ``actions`` may name splits outside the policy's action set. The fastest schedule measured
  is returned: never slower than the greedy rollout's best or the untuned nest. The answer is
  remembered in the measurement cache per host, target and problem, so tuning the same problem
  again (with no larger budget) is a lookup.
* pure policy (``measure=False``): the policy's greedy actions are followed without measuring;
  the state it ends in is compiled and timed once for the report.

The environment has no stop action: a trained policy that is content with a schedule picks an
action that cannot apply (a no-op there) and, being greedy, would pick it again and again.
The rollout sees that cycle (as any other) and stops.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from looprl import defaults
from looprl.backend.kernel import Kernel, ReshapedKernel, compile
from looprl.target import Target
from looprl.backend.threads import available_cores, check_threads
from looprl.actions import ActionSet
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem, as_problem, fused_view, matmul
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.records import stored_nest
from looprl.measurement.timing import check_budget
from looprl.policy.guided import guided_search
from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy
from looprl.policy.parallel import parallel_proposals
from looprl.policy.rollout import greedy_rollout, policy_actions
from looprl.policy.tiles import measure_tiles, tile_of
from looprl.policy.twin import carried_back, transposed_twin
from looprl.search.budget import MIN_BUDGET_S, REFINEMENTS, Budget, scaled_budget, state_cost_s
from looprl.search.context import SearchContext

# Search time of measured tune by default: None scales it with the problem
# (:func:`~looprl.search.budget.scaled_budget`: 0.4 s up to ~256^3, where a new state costs
# ~15-25 ms to compile and time, up to 1.5 s for the largest real-model GEMMs).
TUNE_BUDGET_S = None
# Remembered answers are keyed by this: bump it when what tune finds changes (an upgrade must not
# return an older version's weaker answer). 2: register tiles at the output-row loop.
# 3: two-dimensional register tiles, cache blocks and packing; budgets scaled to the problem.
# 4: the target's own register tiles measured after the policy's (decode GEMMs, q.k^T).
# 5: streaming tiles for problems of few output rows (decode GEMMs whose weights outgrow L2).
TUNER = "tune-v5"
_warned_mismatch: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class TuneResult:
    """A tuned schedule and its compiled kernel."""

    problem: Problem
    nest: LoopNest
    kernel: Kernel | ReshapedKernel  # callable: kernel(a, b) -> output array (kernel(a, b, bias, residual) with an epilogue)
    actions: tuple[str, ...]
    gflops: float
    initial_gflops: float
    seconds: float  # wall clock of the whole call, compile of the returned kernel included
    mode: str  # "measured", "remembered" (a lookup of an earlier measured tune) or "policy"
    target: Target | None = None
    greedy_gflops: float | None = None  # the best state of the policy's greedy rollout (measured mode)
    measured: int = 0  # schedules timed by this call
    waited_s: float = 0.0  # of ``seconds``, spent waiting for another process's timing (the machine-wide lock)
    # A right operand stored across the output's columns (a linear layer's W) is tuned as its
    # twin (looprl.policy.twin), a problem with dimensions that always go together (a 1x1
    # convolution's h and w) as its fused view (looprl.ir.problem.fused_view): ``actions`` then
    # replay on this problem, not ``problem``; for a fused view, ``nest`` (and ``initial_gflops``)
    # are the view's, and ``kernel`` takes ``problem``'s arrays.
    tuned_as: Problem | None = None
    threads: int = 1  # threads offered: the kernel's parallel loops (if any) run on as many
    serial_gflops: float | None = None  # the best serial schedule's, when parallel proposals were measured

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
    steps: int | None = None,
    measure: bool = True,
    *,
    cache=None,
    budget_s: float | None = TUNE_BUDGET_S,
    measure_budget_s: float = defaults.STATE_BUDGET_S,
    target: Target | str | None = None,
    remember: bool = True,
    threads: int | None = None,
) -> TuneResult:
    """Schedule ``problem`` with ``policy`` and compile it for ``target`` (None: this machine).

    ``problem``: a :class:`Problem` (e.g. :func:`looprl.linear`, epilogue included),
    ``"MxNxK"``, an ``(m, n, k)`` tuple or arrays ``(A, B)``.
    ``policy``: ``"default"`` (the shipped policy made for the target's ISA, else the closest,
    with a warning), a policy folder or a :class:`Policy`. ``steps``: actions of the greedy
    rollout (None: the policy's training episode length). ``budget_s``: seconds the measured search may take, counted from the call
    (None: scaled to the problem, see :mod:`looprl.search.budget`; 0: the rollout only, every
    state of it measured whatever it costs);
    ``measure_budget_s``: timing budget per new schedule. ``cache``: the measurement cache (a
    path, ``":memory:"`` or None for the per-user one). ``remember``: reuse and store the
    answer for this host, target and problem (and thread count).

    ``threads``: how many threads the kernel may use (None: the cores this process may use,
    as numpy does; 1: a serial kernel). In measured mode with more than one, the best serial
    schedules found are proposed again with their outermost eligible loops parallel
    (:mod:`looprl.policy.parallel`) and measured on that many threads, after the serial
    search (which keeps its whole budget: the proposals get a quarter of it more); the faster
    of the serial best and the parallel proposals is returned, so a problem too small for
    threads to pay gets a serial kernel. Pure policy mode stays serial."""
    started = time.perf_counter()
    problem = as_tunable_problem(problem)
    if steps is not None and (isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)) or steps < 0):
        raise ValueError(f"steps must be a non-negative integer or None, got {steps!r}")
    steps = None if steps is None else int(steps)
    budget_s = None if budget_s is None else _check_search_budget(budget_s)
    measure_budget_s = check_budget(measure_budget_s, "measure_budget_s")
    if not isinstance(policy, (Policy, str, os.PathLike)):
        raise ValueError(f"policy must be a Policy, 'default' or a path to a policy folder, got {type(policy).__name__}")
    threads = available_cores() if threads is None else check_threads(threads)
    target = Target.resolve(target)
    target.check_runs_on_host()
    view = fused_view(problem)
    if view is not None:  # the same contraction over fewer dimensions: tuned as that, called through reshapes
        result = tune(view, policy, steps, measure, cache=cache, budget_s=budget_s, measure_budget_s=measure_budget_s,
                      target=target, remember=remember, threads=threads)
        return replace(result, problem=problem, kernel=ReshapedKernel(result.kernel, problem), seconds=time.perf_counter() - started,
                       tuned_as=result.tuned_as or view)
    twin = transposed_twin(problem)
    if twin is not None:  # tuned with the weight re-laid once, as the kernel binds it (see looprl.policy.twin)
        result = tune(twin, policy, steps, measure, cache=cache, budget_s=budget_s, measure_budget_s=measure_budget_s,
                      target=target, remember=remember, threads=threads)
        nest = carried_back(result.nest, problem)  # parallel marks included
        return replace(result, problem=problem, nest=nest, kernel=compile(nest, target=target, threads=threads),
                       seconds=time.perf_counter() - started, tuned_as=twin)
    loaded = load_policy(policy, target)
    _warn_if_made_for_another_target(loaded, target)
    policy_actions(loaded, target).check_fits(problem)  # before anything is measured
    evaluator = Evaluator(cache, measure_budget_s, target=target)
    if not measure:
        return _follow_policy(loaded, problem, evaluator, steps, started)
    if remember:
        known = _remembered(evaluator, problem, MIN_BUDGET_S if budget_s is None else budget_s, threads)
        if known is not None:
            return _remembered_result(problem, known, evaluator, threads, started)
    relaid_twin = transposed_twin(problem, constant_only=False)
    if relaid_twin is not None:  # a right operand that changes per call, stored across the output's columns
        return _tune_relaid(loaded, policy, problem, relaid_twin, evaluator, steps, budget_s, threads, started, remember)
    found = measured_search(loaded, problem, evaluator, steps, budget_s, threads, started)
    if remember:
        evaluator.cache.put_tuned(found.nest, found.gflops, found.budget_s, target, measure_budget_s, tuner=TUNER, threads=threads)
    kernel = compile(found.nest, target=target, threads=threads)
    return TuneResult(problem, found.nest, kernel, found.actions, found.gflops, found.initial_gflops, time.perf_counter() - started,
                      "measured", target, greedy_gflops=found.greedy_gflops, measured=found.measured, waited_s=found.waited_s,
                      threads=threads, serial_gflops=found.serial_gflops)


def _tune_relaid(loaded: Policy, policy, problem: Problem, twin: Problem, evaluator: Evaluator, steps: int | None,
                 budget_s: float | None, threads: int, started: float, remember: bool) -> TuneResult:
    """Measured tune of a problem whose right operand changes per call and is stored across
    the output's columns (``bmk,bnk->bmn``), two ways, each a whole measured tune with the
    budget: its twin, whose schedule is carried back with the operand re-laid inside every
    call (and that kernel timed, conversion included), and the problem as given (no
    conversion: its tiles read the operand in place or pack it per tile). The faster is
    returned and remembered. Which wins depends on the shape and the target: with one row the
    conversion costs as much as the product; on 128x960x960 (Zen 4) the re-laid kernel ran at
    98 GFLOPS for AVX-512 against 113 as given, and at 101 against 84 for AVX2."""
    target = evaluator.target
    relaid_result = tune(twin, policy, steps, cache=evaluator.cache, budget_s=budget_s, measure_budget_s=evaluator.budget_s,
                         target=target, remember=remember, threads=threads)
    relaid = carried_back(relaid_result.nest, problem)  # parallel marks included
    timed = evaluator.with_threads(threads) if threads > 1 else evaluator
    relaid_gflops = timed(relaid).gflops  # the conversion inside the timed call
    direct = measured_search(loaded, problem, evaluator, steps, budget_s, threads, time.perf_counter())
    if relaid_gflops >= direct.gflops:
        nest, gflops, actions, tuned_as = relaid, relaid_gflops, relaid_result.actions, twin
    else:
        nest, gflops, actions, tuned_as = direct.nest, direct.gflops, direct.actions, None
    if remember:
        evaluator.cache.put_tuned(nest, gflops, direct.budget_s, target, evaluator.budget_s, tuner=TUNER, threads=threads)
    kernel = compile(nest, target=target, threads=threads)
    return TuneResult(problem, nest, kernel, actions, gflops, direct.initial_gflops, time.perf_counter() - started, "measured", target,
                      greedy_gflops=direct.greedy_gflops, measured=direct.measured + relaid_result.measured + 1,
                      waited_s=direct.waited_s + relaid_result.waited_s, tuned_as=tuned_as, threads=threads,
                      serial_gflops=direct.serial_gflops if tuned_as is None else relaid_result.serial_gflops)


def _follow_policy(policy: Policy, problem: Problem, evaluator: Evaluator, steps: int | None, started: float) -> TuneResult:
    """Pure policy mode: the greedy actions, unmeasured; the state they end in is timed once."""
    rollout = greedy_rollout(policy, problem, None, length=steps)
    nest = rollout.final_nest
    initial = evaluator(initial_nest(problem)).gflops
    gflops = evaluator(nest).gflops
    kernel = compile(nest, target=evaluator.target)
    return TuneResult(problem, nest, kernel, tuple(rollout.final_actions), gflops, initial, time.perf_counter() - started, "policy",
                      evaluator.target, measured=evaluator.compiled)


def _remembered_result(problem: Problem, known: tuple[LoopNest, float], evaluator: Evaluator, threads: int, started: float) -> TuneResult:
    """The answer an earlier measured tune remembered, compiled."""
    nest, gflops = known
    root = initial_nest(problem)
    initial = evaluator.cache.get(root, evaluator.target, evaluator.budget_s) or evaluator(root).gflops
    kernel = compile(nest, target=evaluator.target, threads=threads)
    return TuneResult(problem, nest, kernel, (), gflops, initial, time.perf_counter() - started, "remembered", evaluator.target,
                      measured=evaluator.compiled, threads=threads)


@dataclass(frozen=True)
class Found:
    """What the measured search found."""

    nest: LoopNest
    gflops: float
    actions: tuple[str, ...]
    initial_gflops: float
    greedy_gflops: float
    budget_s: float  # the search budget it had (scaled, when none was given)
    measured: int
    waited_s: float
    serial_gflops: float | None


def measured_search(policy: Policy, problem: Problem, evaluator: Evaluator, steps: int | None, budget_s: float | None, threads: int,
                    started: float) -> Found:
    """Measured tune: stages over one search context. The untuned nest; the policy's greedy
    rollout, always measured whole (a dozen actions at most: a bounded cost, and tune is never
    below the rollout); then, until the deadline (a measurement predicted to end after it is
    not started), the rollout's register tile and the target's own register tiles refined
    (:func:`~looprl.policy.tiles.measure_tiles`) and the policy-guided search; with
    threads, the best serial schedules made parallel, in a quarter of the budget more. The
    budget counts from ``started`` (tune's call)."""
    action_set = policy_actions(policy, evaluator.target)
    context = SearchContext(problem, action_set, evaluator)
    untuned = context.root()
    scaled = budget_s is None
    if scaled:
        budget_s = scaled_budget(problem.flops, untuned.gflops, evaluator.budget_s)
    rollout = greedy_rollout(policy, problem, context, length=steps)
    context.budget.reference_gflops = max(rollout.best_gflops, context.budget.reference_gflops)  # refinements start from its best
    context.deadline = started + budget_s if budget_s > 0 else None
    if scaled and context.deadline is not None:
        # However long the rollout took, its tile gets a few refinements (budget.REFINEMENTS).
        context.deadline = max(context.deadline, time.perf_counter() + REFINEMENTS * context.predicted_cost_s())
    best = (rollout.best_nest, rollout.best_gflops, rollout.best_actions)
    candidates = [best]  # the best of each stage
    if budget_s > 0:
        # The policy's tile, then the target's own register tiles (a rollout may build none,
        # or a one-row tile on a decode GEMM), refined: canonical order, cache blocks, packed.
        tiles = measure_tiles(context, action_set, lead=tile_of(rollout.best_nest))
        candidates.append((tiles.nest, tiles.gflops, tiles.actions))
        if tiles.gflops > best[1]:
            best = (tiles.nest, tiles.gflops, tiles.actions)
        rows = tuple(rows for rows, _ in evaluator.target.register_tiles())  # e.g. 6 on AVX2: the policy may lack split_6
        guided = guided_search(policy, context, start=(best[2], best[1]), tile_rows=rows)
        candidates.append((guided.best_nest, guided.best_gflops, guided.best_actions))
        candidates = settle(context, candidates, budget_s)
        best = candidates[0]
    serial_gflops, waited_s = None, 0.0
    if threads > 1:  # the best serial schedules with their outermost loops parallel, measured on the threads
        context.evaluator = evaluator.with_threads(threads)  # the same buffers, already paged in
        waited_s += context.budget.waited_s
        context.budget = Budget(time.perf_counter() + budget_s / 4 if budget_s > 0 else None)  # a team's costs are its own
        chosen = parallel_proposals(candidates, context, threads)
        serial_gflops = best[1]
        if chosen is not None:  # the team against the serial best, re-timed together when close
            best = settle(context, [best, (chosen.nest, chosen.gflops, chosen.actions)], budget_s, within=TEAM_WITHIN)[0]
            serial_gflops = context.values.get(candidates[0][0].key, serial_gflops)
    nest, gflops, actions = best
    return Found(nest, gflops, tuple(actions), rollout.initial_gflops, rollout.best_gflops, budget_s, context.new_measurements,
                  waited_s + context.budget.waited_s, serial_gflops)


# Stage winners this close to the best are timed again together before one is returned: a
# first timing that caught the machine's slow phase must not decide (two tune calls on one
# problem should return kernels of the same speed).
CONTENDER_WITHIN = 0.9
CONTENDER_ROUNDS = 2
# A team and the serial best it was made from are re-timed together unless one is more than
# twice the other: a team is slowed by anything on any of its cores, and one disturbed timing
# (timed again once by parallel_proposals) must not send a problem that threads speed up 1.8x
# back to one thread.
TEAM_WITHIN = 0.5


def settle(context: SearchContext, candidates: list[tuple], budget_s: float, within: float = CONTENDER_WITHIN) -> list[tuple]:
    """``candidates`` ((nest, gflops, actions), each measured in ``context``) without repeats,
    fastest first, after those within ``within`` of the fastest were re-timed in
    :data:`CONTENDER_ROUNDS` interleaved rounds (each keeps the best of its samples). The rounds
    run after the search's deadline, but only when predicted to cost at most a quarter of
    ``budget_s``; else the first timings decide."""
    unique: dict[str, tuple] = {}
    for nest, gflops, actions in candidates:
        if nest is not None and gflops > 0 and (nest.key not in unique or gflops > unique[nest.key][1]):
            unique[nest.key] = (nest, gflops, tuple(actions))
    ranked = sorted(unique.values(), key=lambda c: -c[1])
    if len(ranked) < 2:
        return ranked or candidates[:1]
    close = [c for c in ranked if c[1] >= within * ranked[0][1]]
    cost = CONTENDER_ROUNDS * sum(state_cost_s(context.problem.flops, g, context.measure_budget_s, 0.0) for _, g, _ in close)
    if len(close) < 2 or cost > budget_s / 4:
        return ranked
    for _ in range(CONTENDER_ROUNDS):
        for nest, _, _ in close:
            context.remeasure(nest, force=True)
    settled = [(nest, context.values.get(nest.key, gflops), actions) for nest, gflops, actions in ranked]
    return sorted(settled, key=lambda c: -c[1])


def _check_search_budget(budget_s) -> float:
    """The search budget: 0 (the rollout alone) or what :func:`check_budget` accepts."""
    is_number = isinstance(budget_s, (int, float, np.integer, np.floating)) and not isinstance(budget_s, (bool, np.bool_))
    return 0.0 if is_number and budget_s == 0 else check_budget(budget_s, "budget_s")


def _remembered(evaluator: Evaluator, problem: Problem, budget_s: float, threads: int = 1) -> tuple[LoopNest, float] | None:
    """The remembered answer for ``problem`` on ``threads`` threads if it was found with at
    least ``budget_s``."""
    known = evaluator.cache.get_tuned(problem.name, evaluator.target, evaluator.budget_s, tuner=TUNER, threads=threads)
    if known is None:
        return None
    schedule, gflops, spent = known
    if spent < budget_s:
        return None
    nest = stored_nest(problem.name, schedule, {problem.name: problem})
    return (nest, gflops) if isinstance(nest, LoopNest) else None  # else another IR version wrote it: tune again


def _warn_if_made_for_another_target(policy: Policy, target: Target) -> None:
    made_for = policy.target
    if made_for is None or made_for.isa == target.isa:
        return
    pair = (made_for.isa, target.isa)
    if pair not in _warned_mismatch:
        _warned_mismatch.add(pair)
        warnings.warn(
            f"the policy was trained for {made_for.isa}, tuning for {target.isa}: its proposals are refined by measurement",
            RuntimeWarning,
            stacklevel=3,
        )
