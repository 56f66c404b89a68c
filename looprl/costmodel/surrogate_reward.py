"""The AutoTVM cost model as a surrogate reward for ``LoopNest-v0`` (``reward="model"``).

:func:`reward_model` builds a :class:`SurrogateReward`, the env's reward model
(:class:`looprl.env.reward_model.RewardModel`): ``predict(nests)`` gives GFLOPS, ``observe(nest,
gflops)`` takes the env's measurements and refits every ``refit_every`` of them.

**Models.** A *base* model stays fixed: a saved :class:`~looprl.costmodel.model.CostModel`
(``model="path.json"``), a fitted CostModel object, or, with ``model=None``, one fitted on the
measurement cache's records for the env's target and timing budget (at most
:data:`MAX_RECORDS`, a seeded sample) when it holds at least ``refit_every`` of them. The
env's own measurements refit a local model on top of the base one's scores
(:class:`~looprl.costmodel.model.TransferModel`: f = f_base + f_local, AutoTVM section 4);
without a base model, a plain CostModel is fitted on them (plus the few cache records) once
there are ``refit_every`` rows, and until then nothing is predicted (the env measures). Fits
and calibration use the newest :data:`MAX_ROWS` measurements (bounded memory and refit time
in a long training run).

**Calibration: scores to GFLOPS.** The rank objective's scores have no unit, and the
regression objective predicts GFLOPS relative to a problem's best; a reward needs GFLOPS. With
s the model's output (either objective), after every fit:

* a problem with at least :data:`PROBLEM_ROWS` measured schedules gets a *monotone fit*:
  isotonic regression (pool-adjacent-violators) of its measured GFLOPS on their scores; a
  schedule's prediction interpolates it linearly, flat beyond the lowest and highest score
  measured (no extrapolation of an improvement the measurements have not shown);
* any other problem a *linear fit anchored at its untuned nest*, which the env measures at
  every reset: ``GFLOPS = GFLOPS(untuned) * max(0, 1 + b * (s - s(untuned)))``, with one slope
  b for all problems: the least-squares fit through the origin of ``g / g_untuned - 1`` on
  ``s - s_untuned`` over every measured schedule of every anchored problem, clamped at 0 (a
  model that orders schedules the wrong way then predicts the untuned value: reward 0 rather
  than rewards of the wrong sign).

Both maps are monotone in the score (they keep the model's ranking). On 3-4 matmuls with
100-120 random-walk measurements each, the monotone fit's mean absolute error was 15% of the
mean GFLOPS (a log-linear anchored fit: 48%), and the anchored linear fit's on a problem never
seen but for its untuned nest 22-26% (log-linear: 31-44%). Predictions are at most 64 times
the anchor; the env clips them to ``[0, peak]``.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Sequence

import numpy as np

from looprl import defaults
from looprl.costmodel.schedule_features import features_batch
from looprl.costmodel.model import CostModel, TransferModel, import_xgboost
from looprl.ir.nest import LoopNest, initial_nest
from looprl.measurement.records import measured_nests
from looprl.target import Target

logger = logging.getLogger("looprl.costmodel")

MAX_RECORDS = 4000  # cache records a base model is fitted on (a seeded sample beyond that)
MAX_ROWS = 3000  # measured schedules kept (the newest; a reset re-measures its anchor) for fits and calibration
PROBLEM_ROWS = 8  # measured schedules of a problem for its own (monotone) calibration
MAX_RATIO = 64.0


class SurrogateReward:
    """Predicted GFLOPS of schedules from a cost model refitted on the env's measurements
    (module docstring). ``records`` are ``(nest, gflops)`` measured earlier (the cache's)."""

    def __init__(
        self,
        base: CostModel | None = None,
        *,
        objective: str = "rank",
        isa: str,
        refit_every: int = 32,
        seed: int = 0,
        records: Sequence[tuple[LoopNest, float]] = (),
    ):
        self.base = base
        self.objective = base.objective if base is not None else objective
        self.layout = dict(base.layout) if base is not None else {"max_levels": defaults.MAX_LOOPS, "isa": isa}
        self.refit_every = int(refit_every)
        self.seed = 0 if seed is None else int(seed)
        self.model = TransferModel(base) if base is not None else CostModel(self.objective, seed=self.seed, **self.layout)
        self.target = Target.named(self.layout["isa"])  # what the features describe
        self.measured: dict[tuple[str, str], tuple[LoopNest, float]] = {}  # (problem, key) -> (nest, GFLOPS)
        self.observed: set[tuple[str, str]] = set()  # of which the env's own measurements
        self._rows: dict[tuple[str, str], np.ndarray] = {}  # feature rows, memoised
        for nest, gflops in records:
            self._remember(nest, gflops)
        self.since_fit = 0
        self.fits = 0
        self.slope = 0.0  # the anchored linear map's
        self.monotone: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # problem -> (scores, GFLOPS) of its monotone fit
        self._anchor_scores: dict[str, float] = {}  # problem -> its untuned nest's score (this fit)
        if self.ready:
            self._calibrate()

    @property
    def ready(self) -> bool:
        """Whether predictions can be made (some model is fitted)."""
        return self.base is not None or self.model.fitted

    # -- the env's protocol ------------------------------------------------------------
    def observe(self, nest: LoopNest, gflops: float) -> None:
        """A measurement by the env; refit after every ``refit_every`` new ones."""
        if not (isinstance(gflops, (int, float)) and math.isfinite(gflops) and gflops > 0):
            return
        key = (nest.problem.name, nest.key)
        new = key not in self.measured
        self._remember(nest, gflops)
        self.observed.add(key)
        self.since_fit += new
        if self.since_fit >= self.refit_every:
            self.refit()

    def predict(self, nests: Sequence[LoopNest]) -> np.ndarray:
        """Predicted GFLOPS of each nest; NaN before the first fit or for a problem whose
        untuned nest has not been measured."""
        nests = list(nests)
        result = np.full(len(nests), math.nan)
        if not nests or not self.ready:
            return result
        scores = self._scores(nests)
        anchors = self._anchor_scores
        for i, nest in enumerate(nests):
            name = nest.problem.name
            fit = self.monotone.get(name)
            if fit is not None:
                result[i] = float(np.interp(scores[i], fit[0], fit[1]))
                continue
            known = self.measured.get((name, initial_nest(nest.problem).key))
            if known is None:
                continue  # nothing to anchor on: NaN
            if name not in anchors:
                anchors[name] = float(self._scores([known[0]])[0])
            ratio = 1.0 + self.slope * (scores[i] - anchors[name])
            result[i] = known[1] * min(max(ratio, 0.0), MAX_RATIO)
        return result

    # -- fitting ---------------------------------------------------------------------------
    def refit(self) -> None:
        """Fit on the measurements (with a base model: the env's own, on top of the base
        model's scores; without: all of them), then the calibration."""
        keys = sorted(self.observed) if self.base is not None else list(self.measured)
        values = [self.measured[k][1] for k in keys]
        self.since_fit = 0
        if len(keys) < 2 or len(set(values)) < 2:
            return
        x = self._features(keys)
        self.model.fit(x, values, [k[0] for k in keys])
        self.fits += 1
        self._calibrate()
        logger.debug("surrogate reward: fit %d on %d measurements, slope %.3f", self.fits, len(keys), self.slope)

    def _calibrate(self) -> None:
        """The monotone fits of problems with enough measurements and the anchored linear
        map's slope (module docstring), for the current model."""
        self.monotone, self._anchor_scores, self.slope = {}, {}, 0.0
        keys = list(self.measured)
        if not keys:
            return
        scores = dict(zip(keys, self._scores_of(keys)))
        by_problem: dict[str, list] = {}
        for key in keys:
            by_problem.setdefault(key[0], []).append(key)
        ds, dr = [], []
        for name, group in by_problem.items():
            if len(group) >= PROBLEM_ROWS:
                x = np.array([scores[k] for k in group])
                order = np.argsort(x, kind="stable")
                self.monotone[name] = (x[order], _isotonic(np.array([self.measured[k][1] for k in group])[order]))
            root = (name, initial_nest(self.measured[group[0]][0].problem).key)
            if root not in scores:
                continue
            for key in group:
                if key != root:
                    ds.append(scores[key] - scores[root])
                    dr.append(self.measured[key][1] / self.measured[root][1] - 1.0)
        self.slope = _slope(np.array(ds), np.array(dr))

    # -- helpers ---------------------------------------------------------------------------
    def _remember(self, nest: LoopNest, gflops: float) -> None:
        key = (nest.problem.name, nest.key)
        self.measured.pop(key, None)  # newest last
        self.measured[key] = (nest, float(gflops))
        while len(self.measured) > MAX_ROWS:  # bounded memory and refit time in long runs
            oldest = next(iter(self.measured))
            del self.measured[oldest]
            self.observed.discard(oldest)
            self._rows.pop(oldest, None)

    def _features(self, keys) -> np.ndarray:
        missing = [k for k in keys if k not in self._rows]
        if missing:
            rows = features_batch([self.measured[k][0] for k in missing], self.layout["max_levels"], target=self.target)
            self._rows.update(zip(missing, rows))
        return np.stack([self._rows[k] for k in keys])

    def _scores(self, nests: list[LoopNest]) -> np.ndarray:
        return self.model.predict(features_batch(nests, self.layout["max_levels"], target=self.target))

    def _scores_of(self, keys) -> np.ndarray:
        return self.model.predict(self._features(keys))


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` on ``x`` through the origin, at least 0."""
    denominator = float(np.dot(x, x)) if len(x) else 0.0
    if denominator <= 1e-12:
        return 0.0
    return max(0.0, float(np.dot(x, y)) / denominator)


def _isotonic(y: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``y`` in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in y.tolist():
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count), blocks[-1][1] + count]
    return np.concatenate([np.full(int(count), mean) for mean, count in blocks]) if blocks else np.zeros(0)


def reward_model(model, *, evaluator, refit_every: int = 32, seed: int | None = 0, objective: str = "rank") -> SurrogateReward:
    """The env's reward model (:func:`looprl.env.reward_model.make_reward_model`) from ``model``: a path
    to a saved CostModel, a fitted CostModel, or None (fit one on the cache's records for
    ``evaluator``'s target and budget, if there are ``refit_every`` of them). A bad path or
    file, an unfitted model, or one whose features describe another ISA is a ValueError."""
    import_xgboost()  # fail at once, with the install hint, rather than at the first fit
    isa = evaluator.target.isa
    base = None
    records: list[tuple[LoopNest, float]] = []
    if isinstance(model, (str, os.PathLike)):
        base = CostModel.load(model)
    elif isinstance(model, CostModel):
        if not model.fitted:
            raise ValueError("model: the CostModel is not fitted; fit or load it first")
        base = model
    elif model is not None:
        raise ValueError(f"model must be a cost-model file path, a CostModel or None, got {type(model).__name__}")
    if base is not None and base.layout.get("isa") != isa:
        raise ValueError(f"model: its features describe {base.layout.get('isa')} code, this env generates {isa} code")
    if base is None:
        records = cache_records(evaluator, seed)
        if len(records) >= refit_every:
            base = CostModel(objective, seed=0 if seed is None else int(seed), target=evaluator.target.key, isa=isa)
            base.fit(
                features_batch([n for n, _ in records], base.layout["max_levels"], target=evaluator.target),
                [g for _, g in records],
                [n.problem.name for n, _ in records],
            )
            logger.info("surrogate reward: base model fitted on %d cached measurements", len(records))
    return SurrogateReward(base, objective=objective, isa=isa, refit_every=refit_every, seed=seed, records=records)


def cache_records(evaluator, seed: int | None) -> list[tuple[LoopNest, float]]:
    """``(nest, GFLOPS)`` of the evaluator's cache for its target and budget (a seeded
    sample of :data:`MAX_RECORDS` when there are more); records that no longer parse are
    skipped."""
    cache = getattr(evaluator, "cache", None)
    if cache is None or not callable(getattr(cache, "records", None)):
        return []
    rows = cache.records(evaluator.target, evaluator.budget_s)
    if len(rows) > MAX_RECORDS:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), MAX_RECORDS, replace=False))
        rows = [rows[i] for i in keep]
    return measured_nests(rows)
