"""``looprl.tune``: schedule a contraction with a trained policy and compile it, in well
under a second, without Ray or torch. :func:`tune` wires the package's parts: the proposers
(:mod:`looprl.tune.proposers`), the measurer (:mod:`looprl.tune.measurer`), the store
(:mod:`looprl.tune.store`) and the winner rule (:mod:`looprl.tune.winner`).

Two modes:

* measured (``measure=True``, the default): a policy-guided search
  (:func:`~looprl.tune.measured.measured_search`, also the expert of training's
  demonstrations). The policy's greedy rollout (:func:`~looprl.policy.rollout.greedy_rollout`,
  the env's transition rules) comes first; then, until ``budget_s`` is spent (by default scaled
  to the problem: :mod:`looprl.search.budget`), the register tile the policy built is refined
  (:mod:`looprl.search.tiles`: canonical order, cache blocks, packed right operand) and
  :func:`~looprl.policy.guided.guided_search` measures the policy's few best actions and tiles
  from a small beam of states, so a policy trained on another machine is corrected by this
  machine's measurements. Tiles may split by the target's register-tile rows (e.g. ``split_6``
  on AVX2) even when the policy has no such action, so ``actions`` may name splits outside the
  policy's action set. The fastest schedule measured is returned: never slower than the greedy
  rollout's best or the untuned nest. The answer is remembered in the measurement cache per
  host, target and problem, so tuning the same problem again (with no larger budget) is a lookup.
* pure policy (``measure=False``, the fast path of ``tune_module``, the ``torch.compile``
  backend and ``looprl-tune --no-measure``): the same pipeline with the policy proposer alone
  and a cap on timings (:mod:`looprl.tune.policy_alone`: by default at most
  :data:`~looprl.tune.policy_alone.POLICY_TIMINGS` schedules an episode, the state the policy's
  greedy episode ends in and, for a paired bfloat16 weight, its packed and dot-free variants);
  the untuned nest is not timed (``speedup`` is NaN). A linear layer of few rows
  (:data:`~looprl.tune.winner.IN_PLACE_ROWS`) gets a second episode on the weight as it is
  stored, and the winner rule keeps one (an answer there that re-lays the weight is a copy, as
  the re-laid start's, and pays what a copy pays). With ``remember``, the answer is remembered
  in the process for the same problem, target, policy, threads and cache file
  (:func:`~looprl.tune.policy_alone.remembered_policy_tune`), so a recompiled graph does not tune
  its layers again.

One pass: the problem asked is read once into a :class:`~looprl.tune.searched.Searched` (the
problem searched, the problem or its fused view, :func:`looprl.ir.rewrites.plan_rewrites`, and
its facts), which the parts read; a right operand stored across the output's columns is searched
from its re-laid start (:class:`looprl.ir.rewrites.Relaid`, a layout of the same problem's nest)
and, where the winner rule asks, as stored; the answers, all schedules of the one problem, come
from the policy alone, the store or the measured searches; the winner rule picks one, and
:func:`_finish` compiles it once (a fused view's kernel called through reshapes), or takes the
kernel that timed it where the evaluator's last timings compiled it
(:meth:`~looprl.measurement.evaluator.Evaluator.kernel_for`).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from looprl import checks, defaults
from looprl.backend.kernel import ReshapedKernel
from looprl.backend.threads import available_cores, check_threads
from looprl.ir.problem import Problem, as_problem, matmul
from looprl.measurement.evaluator import Evaluator
from looprl.policy.numpy_policy import Policy
from looprl.search.budget import MIN_BUDGET_S
from looprl.target import Target
from looprl.tune.measured import in_place_answer, measured_answer
from looprl.tune.measurer import Measurer
from looprl.tune.policy_alone import remembered_policy_tune
from looprl.tune.proposers import PolicyProposer
from looprl.tune.results import Answer, TuneResult
from looprl.tune import store
from looprl.tune.searched import Searched
from looprl.tune.winner import preferred, searches_in_place

# Search time of measured tune by default: None scales it with the problem
# (:func:`~looprl.search.budget.scaled_budget`: 0.4 s up to ~256^3, where a new state costs
# ~15-25 ms to compile and time, up to 1.5 s for the largest real-model GEMMs).
TUNE_BUDGET_S = None


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
    """Schedule ``problem`` with ``policy`` and compile it for ``target`` (None: this machine);
    the modes are :mod:`looprl.tune.api`'s.

    ``problem``: a :class:`Problem` (e.g. :func:`looprl.linear`, epilogue included), ``"MxNxK"``,
    an ``(m, n, k)`` tuple or arrays ``(A, B)``. ``policy``: ``"default"`` (the shipped policy
    made for the target's ISA, else the closest, with a warning), a policy folder or a
    :class:`Policy`; another ISA's plan policy acts with this target's plans, each mapped from its
    counterpart. ``episode_length``: actions of the greedy rollout (None: the policy's training
    episode length; the former ``steps`` is accepted with a DeprecationWarning). ``budget_s``:
    seconds the measured search may take, counted from the call (None: scaled to the problem; 0:
    the rollout only, every state of it measured). ``measure_budget_s``: timing budget per new
    schedule. ``cache``: the measurement cache (a path, ``":memory:"`` or None for the per-user
    one). ``remember``: reuse and store the answer for this host, target, problem and threads.
    ``threads``: threads the kernel may use (None: the cores this process may use; 1: serial).
    Measured mode proposes the best serial schedules again with their outermost eligible loops
    parallel, in a quarter of the budget more, and returns the faster of them and the serial
    best (:mod:`looprl.tune.teams`); pure policy mode lets a policy whose actions mark loops
    parallel decide, and offers any other's serial answer those teams, each timed once.

    ``max_evaluations``: at most this many distinct schedules in the serial search, the untuned
    nest and the rollout's included (the former ``max_measurements`` is accepted with a
    DeprecationWarning); a capped answer is not remembered, and a capped tune (or one of budget
    0) does not search a linear layer in place. ``weights_change``: the constant inputs may change
    between calls (``tune_module``'s default path), so a schedule reading a re-laid copy of them
    pays for comparing it on every call, and the in-place rival is searched at more rows
    (:mod:`looprl.tune.winner`); default False: constant means constant."""
    started = time.perf_counter()
    episode_length, max_evaluations = _renamed(deprecated, episode_length, max_evaluations)
    measure, remember = checks.flag(measure, "measure"), checks.flag(remember, "remember")
    budget_s = checks.seconds(budget_s, "budget_s", allow_zero=True, allow_none=True)
    measure_budget_s = checks.seconds(measure_budget_s, "measure_budget_s")
    if not isinstance(policy, (Policy, str, os.PathLike)):
        raise ValueError(f"policy must be a Policy, 'default' or a path to a policy folder, got {type(policy).__name__}")
    threads = available_cores() if threads is None else check_threads(threads)
    weights_change = checks.flag(weights_change, "weights_change")
    target = Target.resolve(target)
    target.check_runs_on_host()
    searched = Searched.read(as_tunable_problem(problem))
    proposer = PolicyProposer.prepared(policy, target, searched.problem, episode_length)
    measurer = Measurer.open(cache, measure_budget_s, target, threads)
    if not measure:
        return _finish(searched, *remembered_policy_tune(proposer, searched, measurer, weights_change, remember), threads, started)
    chosen = _measured(proposer, searched, measurer, budget_s, started, max_evaluations, remember and max_evaluations is None, weights_change)
    return _finish(searched, chosen, measurer.evaluator, threads, started)


def _measured(proposer: PolicyProposer, searched: Searched, measurer: Measurer, budget_s: float | None, started: float,
              max_evaluations: int | None, remembers: bool, weights_change: bool) -> Answer:
    """Measured mode's answer for the problem searched. A
    constant weight with a re-laid start (:attr:`Searched.exact_start`) is searched from it
    (recalled from the store, else measured and stored when ``remembers``) and, where the winner
    rule asks, as stored in place (recalled only along a recalled answer from the start); the
    winner rule picks. Any other problem gets the measured answer
    (:func:`~looprl.tune.measured.measured_answer`). The weight as stored is not searched where
    the search is the rollout alone (budget 0) or capped in schedules (measurements outside the
    cap would make a capped comparison unequal)."""
    exact = searched.exact_start
    given = searched.problem if exact is not None and searched.dots and budget_s != 0 and max_evaluations is None else None
    compare_s = (measurer.comparison_seconds(searched.problem.constant_bytes, searched.problem.between)
                 if weights_change and given is not None else 0.0)
    answer = in_place = None
    load = store.load_now(measurer) if remembers else None  # the machine's load: a busy moment is not remembered as final
    least = MIN_BUDGET_S if budget_s is None else budget_s
    if remembers:
        answer = store.recall(measurer, searched.problem, least, load, exact)
        if answer is not None and searches_in_place(given, answer, compare_s):
            in_place = store.recall(measurer, searched.problem, least, load)
    if answer is None:
        answer = measured_answer(proposer, searched, measurer, budget_s, started, max_evaluations)
        if remembers:
            answer = store.remember(answer, measurer, load, exact)
    if in_place is None and searches_in_place(given, answer, compare_s):  # a remembered answer is not searched again
        in_place = in_place_answer(searched.problem, measurer.evaluator, measurer.threads)
        if in_place is not None:
            in_place = replace(in_place, record=replace(in_place.record, budget_s=answer.record.budget_s))
            if remembers:
                in_place = store.remember(in_place, measurer, load)
    return preferred([answer, in_place], compare_s)


def _finish(searched: Searched, answer: Answer, evaluator: Evaluator, threads: int, started: float) -> TuneResult:
    """The one finishing step: ``answer`` (a schedule of the problem searched) compiled once (a
    fused view's kernel called through reshapes), or the kernel that has just timed it where
    ``evaluator`` (the one that timed the answer's search) keeps it, and the result built."""
    kernel = evaluator.kernel_for(answer.nest, threads)  # the kernel that timed it, where it was among the last timed
    if searched.fused:
        kernel = ReshapedKernel(kernel, searched.original)
    record = replace(answer.record, target=evaluator.target, threads=threads)
    answer = replace(answer, record=record, measured=answer.measured or evaluator.compiled)
    return TuneResult(searched.original, kernel=kernel, seconds=time.perf_counter() - started,
                      tuned_as=searched.problem if searched.fused else None, answer=answer)


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


def _renamed(deprecated: dict, episode_length: int | None, max_evaluations: int | None) -> tuple[int | None, int | None]:
    """``episode_length`` and ``max_evaluations`` checked, each given by its name or by its
    former keyword in ``deprecated`` (``steps``, ``max_measurements``: a DeprecationWarning;
    both a name and its former keyword: a ValueError); any other keyword is a TypeError."""
    unknown = set(deprecated) - {"max_measurements", "steps"}
    if unknown:
        raise TypeError(f"tune() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    episode_length, name = _former_name(deprecated, "steps", "episode_length", episode_length)
    episode_length = None if episode_length is None else checks.count(episode_length, name)
    max_evaluations, name = _former_name(deprecated, "max_measurements", "max_evaluations", max_evaluations)
    return episode_length, None if max_evaluations is None else checks.positive_int(max_evaluations, name)


def _former_name(deprecated: dict, former: str, name: str, value):
    """The value of ``tune``'s argument ``name`` and the keyword it was given by: ``name``, or
    its former keyword ``former`` in ``deprecated`` (a DeprecationWarning; both given: a
    ValueError)."""
    if former not in deprecated:
        return value, name
    warnings.warn(f"tune({former}=...) is now {name}=... (the name the rest of looprl gives it)", DeprecationWarning, stacklevel=4)
    if value is not None:
        raise ValueError(f"give {name} only ({former} is its former name)")
    return deprecated[former], former
