"""``run(problem, algo, ...)`` -> :class:`SearchResult`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import numpy as np

from looprl import checks, defaults
from looprl.backend.layout_plan import conversions
from looprl.target import Target
from looprl.backend.threads import check_threads
from looprl.actions import ActionSet
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem, as_problem
from looprl.ir.schedules import layout_starts, target_split_factors
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.schedule_record import BestOf, ScheduleRecord
from looprl.search.algorithms import check_options, parse_algorithm
from looprl.search.context import SearchContext
from looprl.search.staged import BEST_SO_FAR, INTERRUPTED, Scope, Stage, StagedSearch, Start, confirm_winner

DEFAULT_BUDGET_S = 60.0
DEFAULT_DEPTH = 10
LAYOUT_REFINE_SHARE = 0.25  # layouts=True: the budget share of the layout actions from the best loop schedule


@dataclass(frozen=True)
class SearchResult(BestOf):
    """What one search found and what it cost."""

    problem: Problem
    algorithm: str
    best: ScheduleRecord  # its actions from the initial nest (cursor on loop 0); None: no path (a re-laid start)
    initial_gflops: float
    evaluations: int  # distinct schedules evaluated (cached or measured)
    new_measurements: int  # of which compiled and timed by this search
    failures: int
    elapsed_s: float
    stopped: str  # "done", "time budget", "evaluation budget" or "interrupted"
    verified_gflops: float | None  # the best schedule re-measured with a longer budget
    curve: tuple[tuple[float, int, float], ...]  # (seconds, evaluations, best GFLOPS so far)
    settings: dict[str, Any]
    graph: nx.DiGraph = field(repr=False, compare=False)

    @property
    def actions(self) -> tuple[str, ...]:
        """The best schedule's action names from the initial nest (empty when no path leads there)."""
        return self.best.actions or ()

    @property
    def speedup(self) -> float:
        """Best over initial GFLOPS."""
        return self.best_gflops / self.initial_gflops if self.initial_gflops > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "problem": self.problem.name,
            "sizes": dict(self.problem.sizes),
            "algorithm": self.algorithm,
            "best_gflops": self.best_gflops,
            "initial_gflops": self.initial_gflops,
            "speedup": self.speedup,
            "best_schedule": self.best_nest.key,
            "layout_conversions": conversions(self.best_nest),  # which are in the timed figures
            "best_nest": self.best_nest.to_text(),
            "actions": list(self.actions),
            "evaluations": self.evaluations,
            "new_measurements": self.new_measurements,
            "failures": self.failures,
            "elapsed_s": self.elapsed_s,
            "stopped": self.stopped,
            "verified_gflops": self.verified_gflops,
            "curve": [list(point) for point in self.curve],
            "settings": {key: "inf" if isinstance(value, float) and math.isinf(value) else value for key, value in self.settings.items()},
            "graph_nodes": self.graph.number_of_nodes(),
            "graph_edges": self.graph.number_of_edges(),
        }

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return path

    def save_graph(self, path: str | Path) -> Path:
        """Write the search graph: GraphML for ``.graphml``, else node-link JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".graphml":
            nx.write_graphml(self.graph, path)
        else:
            data = nx.node_link_data(self.graph, edges="edges")
            path.write_text(json.dumps(data) + "\n", encoding="utf-8")
        return path


def _layout_stages(name: str, searched, starts: list[LoopNest], loop_actions: ActionSet, layout_actions: ActionSet,
                   layout_stage: float | None, max_evaluations: int | None) -> list[Stage]:
    """``layouts=True``'s stages: loops from each layout start (an equal share each; only the
    first, the untuned nest, has an action path), then the layout actions from the best
    schedule (LAYOUT_REFINE_SHARE); with ``layout_stage``, ALT's order: the layout actions from
    each start first, then loops only from the best. The evaluation cap grows with the stages."""
    first, share, then = ((loop_actions, 1 - LAYOUT_REFINE_SHARE, layout_actions) if layout_stage is None
                          else (layout_actions, layout_stage, loop_actions))
    stages = [
        Stage(name, searched, share=share / len(starts), scope=Scope(
            first, Start(start, () if i == 0 else None),
            None if max_evaluations is None else max(1, int(max_evaluations * share * (i + 1) / len(starts)))))
        for i, start in enumerate(starts)
    ]
    return stages + [Stage(name, searched, share=1 - share, scope=Scope(then, BEST_SO_FAR, max_evaluations))]


def run(
    problem: Problem | str,
    algo: str = "greedy1",
    *,
    budget_s: float | None = DEFAULT_BUDGET_S,
    max_evaluations: int | None = None,
    depth: int = DEFAULT_DEPTH,
    split_factors=defaults.SPLIT_FACTORS,
    max_loops: int = defaults.MAX_LOOPS,
    cache=None,
    evaluator: Evaluator | None = None,
    measure_budget_s: float = defaults.STATE_BUDGET_S,
    seed: int = 0,
    progress: Callable[[SearchContext], None] | None = None,
    verify_s: float | None = 0.1,
    target=None,
    layouts: bool = False,
    layout_stage: float | None = None,
    threads: int | None = None,
    **options: Any,
) -> SearchResult:
    """Search ``problem``'s schedules with ``algo`` (``greedy1``, ``greedy2``, ``beam2dfs``,
    ``beam4bfs``, ``random``, ...) over the environment's actions, at most ``depth`` actions
    from the untiled nest, until the algorithm finishes or ``budget_s`` seconds (None: scaled
    to the problem, as tune's, :func:`~looprl.search.budget.scaled_budget`; ``math.inf``: no
    time limit) or ``max_evaluations`` distinct schedules (None: no cap) are spent. Measurements go
    through ``evaluator`` (or a new one on ``cache``). Ctrl-C ends the search early and
    returns what was found, with ``stopped="interrupted"``.

    Code is generated for ``target`` (a :class:`~looprl.Target`, a name or None for the
    host; ignored when ``evaluator`` is given, which has its own). ``split_factors="target"``
    offers the splits that form the target's register tiles besides 4, 8 and 16
    (:func:`~looprl.ir.schedules.target_split_factors`).

    The best of many short, noisy measurements is biased upwards, so the winner is measured
    again (at least three fresh timings, about ``verify_s`` seconds, outside the search
    budget; None skips it) and the best fresh timing is reported as ``verified_gflops``; the
    new timings are added to the winner's samples in the cache.

    ``layouts=True`` searches loops and data layouts jointly, in stages that share the budget
    and ``max_evaluations``. Layouts come from two places: the *layout starts*
    (:func:`~looprl.ir.schedules.layout_starts`: the untuned nest, then, when an input holds
    the output's last dimension but not innermost, the untuned nest with that input re-laid
    so: ALT's layout candidates) and the ``pack`` and ``pad`` actions (:mod:`looprl.actions`).
    A loop search runs from each start (an equal share of ``1 - LAYOUT_REFINE_SHARE``), then
    the search with ``pack`` and ``pad`` continues from the best schedule found with the rest.
    ``layout_stage`` (a fraction in (0, 1), with ``layouts=True`` and a finite ``budget_s``) is
    ALT's two-stage order instead: the search with ``pack`` and ``pad`` from each start gets
    that share, then a loops-only search continues from the best schedule (layouts kept).
    Converting an input to its layout is part of the measured kernel unless the problem
    declares it constant. The best of all stages is returned; a schedule reached from a
    re-laid start has no action path from the untuned nest: its ``actions`` are empty and
    ``best_nest`` holds it (``settings["layout_starts"]`` lists the starts); otherwise
    ``actions`` lists the stages' actions (``up`` moves return the cursor to loop 0 between
    them).

    ``threads`` (None: the ``evaluator``'s, else 1) > 1 adds the env's ``parallel`` action
    (mark the cursor loop parallel) and measures parallel schedules on that many threads (an
    ``evaluator`` given must measure on as many).

    Further keyword ``options`` go to the algorithm (``autotvm`` takes ``transfer=True``,
    ``batch_size`` and more: see :func:`looprl.search.autotvm.autotvm`); the others take none."""
    if problem is None:
        raise ValueError("problem is None; expected a Problem or a problem string like '128x64x256'")
    problem = as_problem(problem)
    function, defaults_ = parse_algorithm(algo)
    options = {**defaults_, **check_options(function, algo, options)}
    budget_s = checks.seconds(budget_s, "budget_s", allow_none=True, allow_inf=True)
    verify_s = checks.seconds(verify_s, "verify_s", allow_none=True)
    measure_budget_s = checks.seconds(measure_budget_s, "measure_budget_s")
    max_evaluations = None if max_evaluations is None else checks.positive_int(max_evaluations, "max_evaluations")
    depth = checks.positive_int(depth, "depth")
    seed = None if seed is None else checks.count(seed, "seed")
    if evaluator is not None and not callable(evaluator):
        raise ValueError(f"evaluator must be an Evaluator (callable on a LoopNest) or None, got {type(evaluator).__name__}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be a callable or None, got {type(progress).__name__}")
    layouts = checks.flag(layouts, "layouts")
    if layout_stage is not None:
        if not layouts or budget_s == math.inf:
            raise ValueError("layout_stage needs layouts=True and a budget_s to divide")
        layout_stage = checks.fraction(layout_stage, "layout_stage", allow_zero=False, allow_one=False)
    # The evaluator's target (a stand-in evaluator may have none: then ``target``'s).
    search_target = (getattr(evaluator, "target", None) if evaluator is not None else None) or Target.resolve(target)
    if isinstance(split_factors, str):
        if split_factors != "target":
            raise ValueError(f"split_factors must be a sequence of integers or 'target', got {split_factors!r}")
        split_factors = target_split_factors(search_target)
    given_threads = getattr(evaluator, "threads", 1) if evaluator is not None else 1
    threads = given_threads if threads is None else check_threads(threads)
    if evaluator is not None and threads != given_threads:
        raise ValueError(f"threads={threads} but the evaluator given measures on {given_threads} thread(s)")
    parallel = threads > 1
    actions = ActionSet(split_factors, max_loops, parallel=parallel)
    actions.check_fits(problem)
    evaluator = evaluator if evaluator is not None else Evaluator(cache, measure_budget_s, target=target, threads=threads)
    name = algo.strip().lower()

    def searched(context: SearchContext) -> None:
        return function(context, depth, np.random.default_rng(seed), **options)

    if layouts:
        loop_actions, actions = actions, ActionSet.for_target(search_target, split_factors, max_loops, layouts=True, parallel=parallel)
        starts = layout_starts(problem)
        stages = _layout_stages(name, searched, starts, loop_actions, actions, layout_stage, max_evaluations)
    else:
        stages = [Stage(name, searched, share=1.0, scope=Scope(actions, Start(), max_evaluations))]
    search = StagedSearch(problem, evaluator, target=search_target, progress=progress, return_on_interrupt=True, budget_s=budget_s)
    overall = search.run_stages(stages)  # the best of any stage, with its action names (None: no path)
    stopped, context, root_value = search.stopped, search.latest_context, search.initial_gflops
    elapsed = search.elapsed_s
    curve = search.curve + [(elapsed, search.evaluations, overall.gflops)]
    new_measurements = search.new_measurements  # the search's own: verification's timings are outside its budget
    verified = None
    if verify_s is not None and stopped != INTERRUPTED:
        confirmed = confirm_winner(context, [overall], within=1.0, rounds=max(3, round(verify_s / context.measure_budget_s))
                                   if context.measure_budget_s > 0 else 3, alone=True)
        verified = confirmed.winner_retimed_gflops
    return SearchResult(
        problem=problem,
        algorithm=name,
        best=overall,
        initial_gflops=root_value,
        evaluations=search.evaluations,
        new_measurements=new_measurements,
        failures=search.failures,
        elapsed_s=elapsed,
        stopped=stopped,
        verified_gflops=verified,
        curve=tuple(curve),
        settings={
            "budget_s": search.budget_s,  # a budget of None scaled to the problem
            "max_evaluations": max_evaluations,
            "depth": depth,
            "split_factors": list(actions.split_factors),
            "max_loops": actions.max_loops,
            "measure_budget_s": getattr(evaluator, "budget_s", None),
            "target": getattr(getattr(evaluator, "target", None), "isa", None),
            "seed": seed,
            "verify_s": verify_s,
            **({"layouts": True, "layout_stage": layout_stage, "layout_starts": [n.key for n in starts]} if layouts else {}),
            **({"threads": threads} if threads > 1 else {}),
            **({"options": options} if function.__name__ == "autotvm" else {}),
        },
        graph=search.graph,
    )
