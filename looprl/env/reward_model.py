"""The environment's side of ``reward="model"``: what a surrogate reward model must do, and
how the ``model`` argument becomes one.

With ``reward="model"``, :class:`~looprl.env.loopnest_env.LoopNestEnv` measures only some new
states and asks a *reward model* for the GFLOPS of the others. A reward model is any object
with two methods (:class:`RewardModel`):

* ``predict(nests) -> numpy array``: predicted GFLOPS of each nest, NaN where it cannot
  predict yet (no fitted model, or no measurement of the problem to anchor on); the env
  measures those states instead;
* ``observe(nest, gflops)``: a measurement the env made (the model may refit on it).

The env owns this protocol; the cost-model layer below it (:mod:`looprl.costmodel`, which
knows nothing of the env) implements it: :func:`looprl.costmodel.surrogate_reward.reward_model`,
imported only when a ``reward="model"`` env is created. So ``model`` can stay a JSON value (a
path, or None) in an env config shipped to Ray workers, and the default env never imports the
cost model or XGBoost.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from looprl import checks
from looprl.ir.nest import LoopNest

REWARDS = ("measured", "model")
DEFAULT_MEASURE_FRACTION = 0.1
DEFAULT_REFIT_EVERY = 32


@runtime_checkable
class RewardModel(Protocol):
    """What ``reward="model"`` needs of a model (module docstring)."""

    def predict(self, nests: Sequence[LoopNest]) -> np.ndarray: ...

    def observe(self, nest: LoopNest, gflops: float) -> None: ...


def check_reward(reward, model, measure_fraction, refit_every) -> tuple[str, float, int]:
    """Validated ``(reward, measure_fraction, refit_every)``; ValueError naming the bad one."""
    reward = checks.one_of(reward, "reward", REWARDS)
    if reward == "measured" and model is not None:
        raise ValueError("model is only used with reward='model'; pass reward='model' or drop model")
    measure_fraction = checks.fraction(measure_fraction, "measure_fraction")
    refit_every = checks.positive_int(refit_every, "refit_every")
    if not (model is None or isinstance(model, (str, os.PathLike)) or hasattr(model, "predict")):
        raise ValueError(f"model must be a cost-model file path, a CostModel, a reward model or None, got {type(model).__name__}")
    return reward, measure_fraction, refit_every


def make_reward_model(model: Any, evaluator, *, refit_every: int, seed: int | None) -> RewardModel:
    """``model`` itself if it already is a :class:`RewardModel`, else the cost-model layer's
    reward model built from it (a path to a saved CostModel, a CostModel, or None: start from
    the measurement cache's records for ``evaluator``'s target)."""
    if isinstance(model, RewardModel):
        return model
    from looprl.costmodel.surrogate_reward import reward_model  # deferred: the default env needs neither it nor XGBoost

    return reward_model(model, evaluator=evaluator, refit_every=refit_every, seed=seed)
