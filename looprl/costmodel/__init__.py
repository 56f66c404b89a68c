"""AutoTVM's learned cost model: loop-context and relation features of a schedule
(:mod:`~looprl.costmodel.schedule_features`) and gradient-boosted trees that rank schedules
(:mod:`~looprl.costmodel.model`, XGBoost: ``pip install looprl[autotvm]``)."""

from looprl.costmodel.schedule_features import FEATURE_KEY, FEATURE_VERSION, feature_length, feature_names, features, features_batch

__all__ = ["FEATURE_KEY", "FEATURE_VERSION", "feature_length", "feature_names", "features", "features_batch"]
