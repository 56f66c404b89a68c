"""AutoTVM's statistical cost model: gradient-boosted trees (XGBoost) on schedule features.

The model scores feature vectors (:mod:`looprl.costmodel.schedule_features`); a higher score means a
faster schedule. Two objectives, as in the paper (section 3.2):

* ``"rank"`` (default): XGBoost's ``rank:pairwise``: only the order of the schedules of one
  problem matters, so one model can learn from problems whose GFLOPS differ in scale;
* ``"regression"``: squared error on GFLOPS divided by the best GFLOPS of the same problem.

Training data come in groups (one per problem): ranks never compare schedules of two
problems. ``base_margin`` (per row) starts the trees from given scores instead of 0: how a
local model is fitted on top of a global one (:class:`TransferModel`, section 4).

XGBoost is an optional dependency (``pip install 'looprl[autotvm]'``), imported only when a
model is fitted or loaded. Saved models are one JSON file: the booster plus metadata (feature
and code-generator versions, feature layout, objective, target key); :meth:`CostModel.load` refuses a corrupt file or
one made for other features, objective or target with a ValueError naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from looprl import checks, defaults
from looprl.costmodel.schedule_features import DEFAULT_TARGET, FEATURE_KEY, feature_length
from looprl.target import Target

OBJECTIVES = {"rank": "rank:pairwise", "regression": "reg:squarederror"}
FILE_FORMAT = "looprl-costmodel"
FILE_FORMAT_VERSION = 1
# The trees' settings: small and shallow (AutoTVM's are depth 3), so that refitting after every
# batch of measurements costs milliseconds; one thread, so that fits are reproducible and do
# not disturb timing on the other vCPU.
DEFAULT_PARAMS = {
    "max_depth": 4,
    "eta": 0.3,
    "gamma": 1e-4,
    "min_child_weight": 1.0,
    "subsample": 1.0,
    "lambda": 1.0,
    "alpha": 0.0,
    "tree_method": "hist",
    "max_bin": 32,
    "nthread": 1,
}
DEFAULT_ROUNDS = 60


def import_xgboost():
    """The ``xgboost`` module, or an ImportError telling how to install it."""
    try:
        import xgboost
    except ImportError as error:
        raise ImportError(
            "the AutoTVM cost model needs XGBoost, which is not installed: pip install 'looprl[autotvm]' (or pip install xgboost-cpu)"
        ) from error
    return xgboost


class CostModel:
    """Gradient-boosted trees that score schedules' feature vectors (higher: faster).

    ``layout`` records how the features were made (``max_levels`` and ``isa``, the target
    whose register planning they describe), ``target`` the measurements' origin (e.g. the
    cache's host key); both are saved with the model and checked when it is loaded."""

    def __init__(
        self,
        objective: str = "rank",
        *,
        rounds: int = DEFAULT_ROUNDS,
        params: dict | None = None,
        seed: int = 0,
        target: str | None = None,
        max_levels: int = defaults.MAX_LOOPS,
        isa: str = DEFAULT_TARGET,
    ):
        self.objective = checks.one_of(objective, "cost-model objective", OBJECTIVES)
        self.rounds = checks.positive_int(rounds, "rounds")
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"params must be a dict of XGBoost parameters or None, got {type(params).__name__}")
        if target is not None and not isinstance(target, str):
            raise ValueError(f"target must be a string (a target or host key) or None, got {type(target).__name__}")
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.seed = checks.count(seed, "seed")
        self.target = target
        Target.named(isa)  # a known target name
        self.layout = {"max_levels": checks.positive_int(max_levels, "max_levels"), "isa": isa}
        self.length = feature_length(self.layout["max_levels"])
        self.booster = None
        self.trained_on = 0  # rows of the last fit

    @property
    def fitted(self) -> bool:
        return self.booster is not None

    # -- training and prediction ----------------------------------------------------
    def _matrix(self, x, what: str) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.length:
            raise ValueError(f"{what} must be a (rows, {self.length}) feature matrix, got shape {x.shape}")
        return x

    def fit(self, x, gflops, groups=None, base_margin=None) -> "CostModel":
        """Fit on feature rows ``x`` and their measured ``gflops`` (higher is better);
        ``groups`` labels each row's problem (default: all one problem). Rows with a
        non-finite or non-positive value (failed schedules) count as the slowest."""
        x = self._matrix(x, "x")
        self.booster = fit_booster(x, gflops, groups, self.objective, params=self.params, rounds=self.rounds, seed=self.seed,
                                   base_margin=base_margin)
        self.trained_on = int(x.shape[0])
        return self

    def predict(self, x, base_margin=None) -> np.ndarray:
        """Scores of feature rows ``x`` (float64; higher: predicted faster)."""
        if self.booster is None:
            raise ValueError("the cost model is not fitted yet: call fit() or load() first")
        x = self._matrix(x, "x")
        if x.shape[0] == 0:
            return np.zeros(0)
        return predict_booster(self.booster, x, base_margin)

    # -- files ------------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write the model and its metadata as one JSON file."""
        if self.booster is None:
            raise ValueError("cannot save a cost model that is not fitted")
        path = Path(path)
        data = {
            "format": FILE_FORMAT,
            "format_version": FILE_FORMAT_VERSION,
            "features": FEATURE_KEY,
            "feature_length": self.length,
            "layout": self.layout,
            "objective": self.objective,
            "target": self.target,
            "rounds": self.rounds,
            "params": self.params,
            "seed": self.seed,
            "trained_on": self.trained_on,
            "booster": json.loads(bytes(self.booster.save_raw(raw_format="json"))),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path, *, target: str | None = None, objective: str | None = None) -> "CostModel":
        """A model saved by :meth:`save`. A file that is not one, or was made for other
        features, or (when given) another ``target`` or ``objective``, is a ValueError naming it."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"cost model file {path} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"cost model file {path} is not readable JSON: {error}") from None
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            raise ValueError(f"{path} is not a looprl cost model file (no '\"format\": \"{FILE_FORMAT}\"')")

        def field(name, kind):
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
                raise ValueError(f"cost model file {path}: field {name!r} is missing or not a {getattr(kind, '__name__', kind)}")
            return value

        if field("format_version", int) != FILE_FORMAT_VERSION:
            raise ValueError(f"cost model file {path} has format version {data['format_version']}, this looprl reads {FILE_FORMAT_VERSION}")
        if field("features", str) != FEATURE_KEY:
            raise ValueError(
                f"cost model file {path} was trained on features {data['features']!r}, this looprl "
                f"computes {FEATURE_KEY!r} (feature and code-generator versions): train it again"
            )
        layout = field("layout", dict)
        saved_objective = field("objective", str)
        if saved_objective not in OBJECTIVES:
            raise ValueError(f"cost model file {path}: unknown objective {saved_objective!r}")
        if objective is not None and checks.one_of(objective, "cost-model objective", OBJECTIVES) != saved_objective:
            raise ValueError(f"cost model file {path} was trained with objective {saved_objective!r}, not {objective!r}")
        saved_target = data.get("target")
        if saved_target is not None and not isinstance(saved_target, str):
            raise ValueError(f"cost model file {path}: field 'target' is not a string")
        if target is not None and saved_target != target:
            raise ValueError(f"cost model file {path} was trained for target {saved_target!r}, not {target!r}")
        try:
            model = cls(
                saved_objective,
                rounds=field("rounds", int),
                params=field("params", dict),
                seed=field("seed", int),
                target=saved_target,
                max_levels=layout["max_levels"],
                isa=layout["isa"],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"cost model file {path}: bad metadata ({error})") from None
        if field("feature_length", int) != model.length:
            raise ValueError(f"cost model file {path}: {data['feature_length']} features, its layout gives {model.length}")
        xgb = import_xgboost()
        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(json.dumps(field("booster", dict)).encode()))
        except xgb.core.XGBoostError as error:
            raise ValueError(f"cost model file {path}: XGBoost cannot read its trees: {str(error).splitlines()[0]}") from None
        if booster.num_features() != model.length:
            raise ValueError(f"cost model file {path}: its trees take {booster.num_features()} features, expected {model.length}")
        model.booster = booster
        model.trained_on = int(data.get("trained_on") or 0)
        return model


class TransferModel:
    """``global + local`` (AutoTVM, eq. 4): a model fitted on other problems' measurements
    and one fitted on this problem's, starting from the global model's scores."""

    def __init__(self, global_model: CostModel, local_model: CostModel | None = None):
        if not global_model.fitted:
            raise ValueError("the global model must be fitted")
        self.global_model = global_model
        self.local_model = local_model

    @property
    def fitted(self) -> bool:
        return True

    def fit(self, x, gflops, groups=None) -> "TransferModel":
        x = np.asarray(x, dtype=np.float32)
        if self.local_model is None:
            g = self.global_model
            self.local_model = CostModel(g.objective, rounds=g.rounds, params=g.params, seed=g.seed, target=g.target, **g.layout)
        self.local_model.fit(x, gflops, groups, base_margin=self.global_model.predict(x))
        return self

    def predict(self, x) -> np.ndarray:
        prior = self.global_model.predict(x)
        if self.local_model is None or not self.local_model.fitted:
            return prior
        return self.local_model.predict(x, base_margin=prior)


def _dmatrix(x: np.ndarray, label=None, qid=None, base_margin=None):
    xgb = import_xgboost()
    margin = None if base_margin is None else np.asarray(base_margin, dtype=np.float64).reshape(-1)
    if margin is not None and margin.shape[0] != x.shape[0]:
        raise ValueError(f"base_margin has {margin.shape[0]} entries for {x.shape[0]} rows")
    return xgb.DMatrix(x, label=label, qid=qid, base_margin=margin, nthread=1)


def fit_booster(x: np.ndarray, gflops, groups=None, objective: str = "rank", *, params: dict | None = None,
                rounds: int = DEFAULT_ROUNDS, seed: int = 0, base_margin=None):
    """The cost model's XGBoost fit on any (rows, columns) matrix ``x``: labels are GFLOPS
    relative to each group's (problem's) best; ``rank`` compares pairs within a group.
    :class:`CostModel` fits AutoTVM's features with it; other representations can be
    compared on the same terms."""
    objective = checks.one_of(objective, "cost-model objective", OBJECTIVES)
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(gflops, dtype=np.float64).reshape(-1)
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"{y.shape[0]} GFLOPS values for {x.shape[0]} feature rows")
    if x.shape[0] == 0:
        raise ValueError("cannot fit a cost model on no data")
    y = np.where(np.isfinite(y) & (y > 0), y, 0.0)
    labels = np.zeros(len(y), dtype=np.int64) if groups is None else _group_ids(groups, len(y))
    order = np.argsort(labels, kind="stable")  # XGBoost wants each query's rows together
    x, y, labels = x[order], y[order], labels[order]
    margin = None if base_margin is None else np.asarray(base_margin, dtype=np.float64).reshape(-1)[order]
    best = np.zeros(labels.max() + 1)
    np.maximum.at(best, labels, y)
    relative = np.divide(y, best[labels], out=np.zeros_like(y), where=best[labels] > 0)
    params = dict(DEFAULT_PARAMS if params is None else params, seed=seed, objective=OBJECTIVES[objective])
    if objective == "rank":
        # Every pair of one problem's schedules ("mean" sampling, as rank:pairwise used to).
        params.setdefault("lambdarank_pair_method", "mean")
        params.setdefault("lambdarank_num_pair_per_sample", 32)
        data = _dmatrix(x, relative, labels, margin)
    else:
        data = _dmatrix(x, relative, None, margin)
    return import_xgboost().train(params, data, num_boost_round=rounds, verbose_eval=False)


def predict_booster(booster, x: np.ndarray, base_margin=None) -> np.ndarray:
    """Scores (float64; higher: predicted faster) of rows ``x`` by a :func:`fit_booster` booster."""
    return booster.predict(_dmatrix(np.asarray(x, dtype=np.float32), base_margin=base_margin), output_margin=True).astype(np.float64)


def _group_ids(groups, count: int) -> np.ndarray:
    """Dense integer ids (first-appearance order) of ``count`` group labels."""
    groups = list(groups)
    if len(groups) != count:
        raise ValueError(f"{len(groups)} group labels for {count} rows")
    ids: dict = {}
    return np.array([ids.setdefault(g, len(ids)) for g in groups], dtype=np.int64)


def spearman(a, b) -> float:
    """Spearman rank correlation of two score vectors (ties broken by position): a quick
    check of how well a model orders schedules."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.size < 2:
        return math.nan
    ra, rb = np.argsort(np.argsort(a, kind="stable")), np.argsort(np.argsort(b, kind="stable"))
    return float(np.corrcoef(ra, rb)[0, 1])
