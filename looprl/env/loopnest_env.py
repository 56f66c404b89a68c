"""``LoopNest-v0``: LoopTune's loop-nest tuning environment (DESIGN.md section 1).

An episode starts from a problem's untiled nest with the cursor on the outermost loop. Each
step applies one discrete action (see :mod:`looprl.actions`; the transition is
:func:`looprl.actions.step`, the rule every search and rollout follows): ``up``, ``down``, ``swap_up``,
``swap_down`` and ``split_<f>`` for each split factor (4, 8 and 16 by default, as in the paper).

* **Observation**: ``Box(max_loops, 20)`` float32, one row per loop in depth-first order
  (compute nest then write-back nest), zero rows after the last loop: cursor flag, trip count,
  tail (elements), the compute flag (0 for a write-back loop; for a compute loop 1 for a
  float32 problem, 0.5 for a bfloat16 one: its element size in float32 words), and the 16-bin
  stride histogram (:mod:`looprl.env.observation`). ``observation="normalized"`` replaces trip
  count and tail by ``log2(1 + x) / 8`` for learning.
* **dtype** (beyond the paper): ``dtype="bfloat16"`` makes every problem bfloat16 (inputs and
  output; float32 sums: :mod:`looprl.ir.dtypes`); None (the default) keeps each problem's own,
  so a list of problems may mix them.
* **Reward**: ``(GFLOPS_t - GFLOPS_{t-1}) / peak``, the peak of the episode's problem's dtype
  (bfloat16: twice the float32 one where ``vdpbf16ps`` runs). Cursor moves and invalid actions give 0
  and measure nothing; new schedules are compiled and timed once per host (persistent cache).
  ``reward="model"`` (beyond the paper) takes the GFLOPS of most new schedules from a cost
  model instead: a schedule not in the cache is measured with probability
  ``measure_fraction``, else predicted; every episode's untuned nest is measured (it anchors
  the predictions of its problem); the model refits on the measurements every
  ``refit_every`` of them (:mod:`looprl.env.reward_model`, :mod:`looprl.costmodel.surrogate_reward`).
* **Threads** (beyond the paper): ``threads=N`` > 1 adds a ``parallel`` action (mark the
  cursor loop parallel), measures parallel schedules on N threads and normalises rewards by
  the measured N-thread peak.
* **Episode**: ``episode_length`` actions (10), then ``truncated``; never ``terminated``.
* **Invalid action**: a no-op with reward 0 and ``info["valid"] = False``.
* **Failure**: a schedule that fails to compile or run leaves the state unchanged, gives
  reward 0, logs a warning and reports ``info["error"]``; ``step`` does not raise.

``info`` holds ``gflops`` (current state), ``peak``, ``threads``, ``problem``, ``nest`` (pseudo-code),
``schedule`` (cache key), ``layout_conversions`` (which data-layout conversions the measured
figure includes: :func:`looprl.backend.codegen.conversions`), ``cursor``, ``action`` (name),
``valid``, ``from_cache`` (whether the measurement came from the cache; None when nothing was
measured), ``predicted`` (whether the step's GFLOPS came from the reward model), ``error`` and
``action_mask``.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import gymnasium as gym
import networkx as nx
import numpy as np
from gymnasium import spaces

from looprl import checks, defaults
from looprl.backend.layout_plan import conversions
from looprl.target import Target
from looprl.backend.threads import check_threads
from looprl.actions import ActionSet, State, step
from looprl.workloads.datasets import dataset_groups, env_problems
from looprl.env.observation import (
    FEATURES_PER_LOOP,
    HISTOGRAM_BINS,
    LOG_SCALE,
    nest_graph,
    observation,
)
from looprl.env.reward_model import DEFAULT_MEASURE_FRACTION, DEFAULT_REFIT_EVERY, check_reward, make_reward_model
from looprl.ir.dtypes import as_dtype
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem, as_problem
from looprl.measurement.evaluator import Evaluator, Measurement
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.peak import peak_gflops

logger = logging.getLogger("looprl.env")

OBSERVATION_KINDS = ("raw", "normalized")
ORDERS = ("cycle", "random")


class LoopNestEnv(gym.Env):
    """Tune the loop nest of a tensor contraction by moving a cursor, swapping and splitting loops.

    Args:
        dataset: benchmark set to draw problems from (``"mm64-256"``), or a list of sets (with
            ``order="random"`` each reset first draws a set, so a small set is seen as often as
            a large one), unless ``problems`` is given.
        split: ``"train"``, ``"test"`` or ``"all"`` of the dataset.
        problems: explicit problems (``Problem`` objects or strings such as ``"128x64x256"``).
        order: ``"cycle"`` through the problems in order (a seeded reset starts at position
            ``seed % len(problems)``) or ``"random"`` (sampled with the env's seeded generator).
        split_factors: the ``split_<f>`` actions, integers in 2..512.
        max_loops: bound on the number of loops (compute + write-back); observation rows.
        episode_length: actions per episode before truncation.
        observation: ``"raw"`` or ``"normalized"``.
        measure_budget_s: timing budget per new schedule (compile time excluded); 4 ms by
            default (tune and the searches use 8 ms and three timings: see docs/measurement.md).
        measure_samples: a state revisited with fewer timings than this is timed again and
            keeps the best (timing on a shared machine is bimodal). 1 (the default) makes the
            first timing final: a revisit is a cache lookup, which training needs; 3 is what
            tune and the searches use.
        cache: a :class:`~looprl.MeasurementCache`, a path (``":memory:"`` for a private one) or
            None for the per-user persistent cache.
        peak: GFLOPS used to normalise rewards; None measures the target's peak on this host
            (cached per host and target).
        target: what code is generated for: a :class:`~looprl.Target`, a name (``"avx512"``,
            ``"avx2"``, ``"sse4"``, ``"host"``) or None for the host. A narrower target than
            the host's is compiled and measured here (an AVX-512 CPU runs AVX2 code), so an
            agent can learn for an AVX2 machine on an AVX-512 one.
        render_mode: None or ``"ansi"``.
        reward: ``"measured"`` (every new schedule is measured: the paper) or ``"model"``
            (most are predicted by a cost model; beyond the paper).
        model: with ``reward="model"``: a path to a saved :class:`~looprl.costmodel.model.CostModel`
            (JSON: what an env config for Ray workers should hold), a fitted CostModel, any
            object with ``predict(nests)`` and ``observe(nest, gflops)``
            (:class:`~looprl.env.reward_model.RewardModel`), or None: a model fitted on the
            cache's measurements for the target, or from scratch on the env's first
            ``refit_every`` measurements. Needs XGBoost (``pip install 'looprl[autotvm]'``).
        measure_fraction: with ``reward="model"``, the probability that a new schedule (not in
            the cache) is measured rather than predicted.
        refit_every: with ``reward="model"``, new measurements between refits of the model.
        layouts: add the data-layout actions ``pack`` and ``pad`` after the splits (see
            :mod:`looprl.actions`; pad rounds to the target's vector width). Off by
            default: the paper's action space. The observation keeps its shape; its stride
            histograms show the strides of the layouts the kernel uses. A packed input's
            conversion is measured as part of the kernel unless the problem declares it
            constant.
        threads: threads the kernels' parallel loops run on (1 to the cores this process may
            use). With more than one the actions end with ``parallel`` (mark the cursor loop
            parallel: a loop over an output dimension, one per nest; invalid otherwise), new
            parallel schedules are measured on that many threads (the count is part of their
            cache key) and rewards are normalised by the measured peak of that many threads.
            The observation does not show the mark (its shape is the one policies know); the
            state graph, the printed nest and ``info["schedule"]`` do.
        dtype: ``"float32"`` or ``"bfloat16"`` (or its DType): every problem (the dataset's, or ``problems``) in
            that dtype; None keeps each problem's own.
        plans: add one action per plan of the target (True: all of
            :func:`~looprl.ir.plans.plan_catalogue`; or a list of plan names), after the
            others: each replaces the schedule by a whole register-tiled one
            (:mod:`looprl.ir.plans`: a register tile, a cache block, packing, or a
            streaming tile), the decisions tune's tile stage measures, in one action.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}  # fps: for video recorders only

    def __init__(
        self,
        dataset: str = defaults.DATASET,
        split: str = "train",
        problems: Sequence[Problem | str] | None = None,
        order: str = "cycle",
        split_factors: Sequence[int] = defaults.SPLIT_FACTORS,
        max_loops: int = defaults.MAX_LOOPS,
        episode_length: int = defaults.EPISODE_LENGTH,
        observation: str = defaults.ENV_OBSERVATION,
        measure_budget_s: float = defaults.ENV_STATE_BUDGET_S,
        cache=None,
        peak: float | None = None,
        render_mode: str | None = None,
        target: "Target | str | None" = None,
        measure_samples: int = defaults.ENV_MEASUREMENT_SAMPLES,
        reward: str = "measured",
        model=None,
        measure_fraction: float = DEFAULT_MEASURE_FRACTION,
        refit_every: int = DEFAULT_REFIT_EVERY,
        layouts: bool = False,
        threads: int = 1,
        plans=False,
        dtype=None,
    ):
        self._groups = dataset_groups(dataset, split) if problems is None else ()  # drawn from by set when several
        self.problems = tuple(p for group in self._groups for p in group) if problems is None else env_problems(problems=problems)
        self.dtype = None if dtype is None else as_dtype(dtype)
        if self.dtype is not None:
            self._groups = tuple(tuple(p.with_dtype(self.dtype) for p in group) for group in self._groups)
            self.problems = tuple(p.with_dtype(self.dtype) for p in self.problems)
        self.reward, self.measure_fraction, refit_every = check_reward(reward, model, measure_fraction, refit_every)
        self.order = checks.one_of(order, "order", ORDERS)
        self.normalized = checks.one_of(observation, "observation", OBSERVATION_KINDS) == "normalized"
        self.episode_length = checks.positive_int(episode_length, "episode_length")
        self.render_mode = checks.one_of(render_mode, "render_mode", self.metadata["render_modes"], allow_none=True)
        layouts = checks.flag(layouts, "layouts")
        self.threads = check_threads(threads)
        if self.threads > 1 and self.reward != "measured":
            raise ValueError("reward='model' needs threads=1: the cost model's features do not see parallel loops")
        self.actions = ActionSet(split_factors, max_loops)  # validates the arguments first
        self.max_loops = self.actions.max_loops
        for problem in self.problems:
            self.actions.check_fits(problem)
        measure_budget_s = checks.seconds(measure_budget_s, "measure_budget_s")
        peak = checks.positive_float(peak, "peak", unit="GFLOPS", allow_none=True)
        self.evaluator = Evaluator(cache, measure_budget_s, target=target, samples=measure_samples, threads=self.threads)
        self.target = self.evaluator.target
        if layouts or self.threads > 1 or plans:
            self.actions = ActionSet.for_target(self.target, split_factors, max_loops, layouts=layouts, parallel=self.threads > 1,
                                                plans=plans)
        # one peak per dtype of the problems (keyed by the DType, which also answers to its name): each
        # episode's rewards are normalised by its problem's
        self.peaks = {kind: peak if peak is not None else peak_gflops(target=self.target, cache=self.evaluator.cache, threads=self.threads,
                                                                       dtype=kind)
                      for kind in sorted({p.dtype for p in self.problems}, key=lambda dtype: dtype.name)}
        # reward="model": predicts most new states' GFLOPS; its own generator draws which to measure.
        self.surrogate = None if self.reward == "measured" else make_reward_model(model, self.evaluator, refit_every=refit_every, seed=None)
        self._draws = np.random.default_rng()

        self.max_extent = max(max(p.size(d) for d in p.dims) for p in self.problems)
        self.action_space = spaces.Discrete(len(self.actions))
        self.observation_space = self._observation_space()

        self._position = 0  # next problem in "cycle" order
        self._state: State | None = None
        self._gflops = 0.0
        self._steps = 0
        self._predicted = False  # whether the last step's GFLOPS came from the reward model

    # -- spaces ----------------------------------------------------------------
    def _observation_space(self) -> spaces.Box:
        low = np.zeros((self.max_loops, FEATURES_PER_LOOP), dtype=np.float32)
        high = np.ones((self.max_loops, FEATURES_PER_LOOP), dtype=np.float32)
        extent = float(self.max_extent)
        if self.normalized:
            extent = math.log2(1.0 + extent) / LOG_SCALE
        high[:, 1:3] = extent
        assert high.shape[1] == 4 + HISTOGRAM_BINS
        return spaces.Box(low, high, dtype=np.float32)

    # -- properties --------------------------------------------------------------
    @property
    def peak(self) -> float:
        """GFLOPS that normalise the rewards: the peak of the current problem's dtype (before
        the first reset, of the first problem's)."""
        problem = self._state.nest.problem if self._state is not None else self.problems[0]
        found = self.peaks.get(problem.dtype)
        if found is None:  # a problem given to reset(options=) in a dtype none of the env's has
            found = self.peaks[problem.dtype] = peak_gflops(target=self.target, cache=self.evaluator.cache, threads=self.threads,
                                                             dtype=problem.dtype)
        return found

    @property
    def action_names(self) -> tuple[str, ...]:
        return self.actions.names

    @property
    def state(self) -> State:
        self._require_reset()
        return self._state

    @property
    def nest(self) -> LoopNest:
        return self.state.nest

    @property
    def cursor(self) -> int:
        return self.state.cursor

    @property
    def problem(self) -> Problem:
        return self.state.nest.problem

    @property
    def gflops(self) -> float:
        """GFLOPS of the current schedule: measured (``reward="model"``: or predicted)."""
        self._require_reset()
        return self._gflops

    def action_mask(self) -> np.ndarray:
        """int8 array over the actions: 1 where the action applies in the current state."""
        return self.actions.mask(self.state)

    def graph(self) -> nx.DiGraph:
        """The LoopTune state graph of the current state (see :mod:`looprl.features`)."""
        return nest_graph(self.nest, self.cursor)

    # -- gymnasium API -------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            seed = checks.count(seed, "seed")
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        unknown = set(options) - {"problem"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown, key=repr)}; supported: 'problem'")
        problem = None
        if options.get("problem") is not None:  # None: the next problem, as without the option
            try:
                problem = as_problem(options["problem"])
            except ValueError as error:
                raise ValueError(f"options['problem']: {error}") from None
            if self.dtype is not None:
                problem = problem.with_dtype(self.dtype)
            self.actions.check_fits(problem)
            dim = max(problem.dims, key=problem.size)
            if problem.size(dim) > self.max_extent:
                raise ValueError(
                    f"problem {problem.name}: dimension {dim}={problem.size(dim)} is larger than {self.max_extent}, "
                    "the largest extent this env's observation space was declared for; "
                    "create the env with this problem among its problems"
                )
        super().reset(seed=seed)
        if seed is not None:
            self._position = seed % len(self.problems)
            self._draws = np.random.default_rng((seed, 1))
        if problem is None and self.order == "random" and len(self._groups) > 1:
            group = self._groups[int(self.np_random.integers(len(self._groups)))]
            problem = group[int(self.np_random.integers(len(group)))]
        elif problem is None and self.order == "random":
            problem = self.problems[int(self.np_random.integers(len(self.problems)))]
        elif problem is None:
            problem = self.problems[self._position]
            self._position = (self._position + 1) % len(self.problems)
        self._state = State(initial_nest(problem), 0)
        self._steps = 0
        measurement = self._measure(with_pairs(self._state.nest, self.target))
        if self.surrogate is not None and measurement.ok:
            self.surrogate.observe(self._state.nest, measurement.gflops)
        self._gflops = measurement.gflops
        return self._observe(), self._info(None, True, measurement)

    def step(self, action):
        self._require_reset()
        if self._steps >= self.episode_length:
            logger.warning("step() called after the episode was truncated; call reset()")
        action = self.actions.validate(action)
        self._steps += 1
        self._predicted = False
        transition = step(self.actions, self._state, self._gflops, action, self._value)
        reward = (transition.gflops - self._gflops) / self.peak if transition.changed else 0.0
        self._state, self._gflops = transition.state, transition.gflops
        truncated = self._steps >= self.episode_length
        measurement = None if self._predicted else transition.measurement
        return self._observe(), float(reward), False, truncated, self._info(action, transition.valid, measurement, self._predicted)

    def render(self):
        if self.render_mode != "ansi":
            return None
        self._require_reset()
        return (
            self.nest.to_text(self.cursor)
            + f"\n# {self._gflops:.1f} GFLOPS ({self._gflops / self.peak:.0%} of peak {self.peak:.1f})"
            + f", step {self._steps}/{self.episode_length}\n"
        )

    # -- helpers ---------------------------------------------------------------------
    def _value(self, nest: LoopNest) -> Measurement:
        """The GFLOPS of a new state, as :func:`looprl.actions.step` asks for them. With
        ``reward="model"`` a cached state costs a lookup (no resampling), and one not in the
        cache is predicted (``self._predicted``) unless drawn for measurement (or the model
        cannot predict yet). What is measured is the state's schedule as compiled, its bfloat16
        weight paired where the kernel can take pairs; the model sees the state."""
        schedule = with_pairs(nest, self.target)
        if self.surrogate is not None:
            known = self.evaluator.cache.lookup(schedule, self.target, self.evaluator.budget_s, self.threads)
            if known is not None:
                self.surrogate.observe(nest, known.gflops)
                return Measurement(known.gflops, from_cache=True, samples=known.samples)
            if self._draws.random() >= self.measure_fraction:
                predicted = float(self.surrogate.predict([nest])[0])
                if math.isfinite(predicted):
                    self._predicted = True
                    return Measurement(min(max(predicted, 0.0), self.peak), from_cache=False)
        measurement = self._measure(schedule)
        if measurement.ok and self.surrogate is not None:
            self.surrogate.observe(nest, measurement.gflops)
        return measurement

    def _measure(self, nest: LoopNest) -> Measurement:
        measurement = self.evaluator(nest)
        if not measurement.ok:
            logger.warning("schedule %s of %s failed: %s", nest.key, nest.problem.name, measurement.error)
        return measurement

    def _observe(self) -> np.ndarray:
        return observation(self._state.nest, self._state.cursor, self.max_loops, self.normalized)

    def _info(self, action: int | None, valid: bool, measurement: Measurement | None, predicted: bool = False) -> dict[str, Any]:
        nest = self._state.nest
        return {
            "gflops": self._gflops,
            "peak": self.peak,
            "target": self.target.isa,
            "threads": self.threads,
            "problem": nest.problem.name,
            "nest": nest.to_text(self._state.cursor),
            "schedule": nest.key,
            "layout_conversions": conversions(nest),  # inputs converted inside the timed kernel, or once
            "cursor": self._state.cursor,
            "action": None if action is None else self.actions.names[action],
            "valid": valid,
            "from_cache": None if measurement is None else measurement.from_cache,
            "predicted": predicted,
            "error": None if measurement is None else measurement.error,
            "action_mask": self.actions.mask(self._state),
        }

    def _require_reset(self) -> None:
        if self._state is None:
            raise gym.error.ResetNeeded("call reset() before using the environment")
