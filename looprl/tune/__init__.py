"""``looprl.tune`` as parts: proposers that only propose schedules for a problem
(:mod:`~looprl.tune.proposers`: the policy's rollout, its guided search, the register tiles,
the policy alone; the in-place dot-product tiles, :mod:`looprl.search.dots`; the teams,
:mod:`~looprl.tune.teams`), one measurer that times them (:mod:`~looprl.tune.measurer`), one
store that remembers answers (:mod:`~looprl.tune.store`) and one winner rule that decides
between candidates (:mod:`~looprl.tune.winner`). :func:`~looprl.tune.api.tune` wires them: the
measured searches (:mod:`~looprl.tune.measured`) or the fast path, the same pipeline with the
policy proposer alone and a cap on timings (:mod:`~looprl.tune.policy_alone`).

``looprl.tune`` is the function (``looprl/__init__.py`` binds it after importing this package);
the parts are imported by their full names, e.g. ``from looprl.tune import winner``.
"""

from looprl.tune.api import TUNE_BUDGET_S, as_tunable_problem, tune
from looprl.tune.measured import measured_search
from looprl.tune.results import Answer, TuneResult
from looprl.tune.store import TUNER

__all__ = ["TUNER", "TUNE_BUDGET_S", "Answer", "TuneResult", "as_tunable_problem", "measured_search", "tune"]
