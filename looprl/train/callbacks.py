"""RLlib callbacks: per-episode tuning metrics, and Ape-X's per-runner exploration."""

from __future__ import annotations

import math

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils.schedules.scheduler import Scheduler

from looprl.train import metric_names as metrics
from looprl.train.exploration import apex_epsilon


class LoopNestCallbacks(RLlibCallback):
    """Logs, per episode: the speed-up over the untuned nest, the final GFLOPS, the share of
    measurements served by the cache and the share of invalid actions."""

    apex = False

    def on_episode_start(self, *, episode, env_runner=None, metrics_logger=None, **kwargs) -> None:
        if self.apex and env_runner is not None:
            _set_apex_epsilon(env_runner)

    def on_episode_end(self, *, episode, env_runner=None, metrics_logger=None, **kwargs) -> None:
        if metrics_logger is None:
            return
        infos = episode.get_infos()
        if not infos:
            return
        first, last = infos[0], infos[-1]
        if first.get("gflops", 0) > 0 and "gflops" in last:
            ratio = last["gflops"] / first["gflops"]
            metrics_logger.log_value(metrics.SPEEDUP, ratio, reduce="mean", window=100)
            if ratio > 0:
                metrics_logger.log_value(metrics.LOG_SPEEDUP, math.log(ratio), reduce="mean", window=100)
            metrics_logger.log_value(metrics.FINAL_GFLOPS, last["gflops"], reduce="mean", window=100)
        measured = [info["from_cache"] for info in infos[1:] if info.get("from_cache") is not None]
        if measured:
            metrics_logger.log_value(metrics.CACHE_HIT_RATE, sum(measured) / len(measured), reduce="mean", window=100)
        steps = infos[1:]
        if steps:
            metrics_logger.log_value(metrics.INVALID_RATE, sum(not i.get("valid", True) for i in steps) / len(steps), reduce="mean", window=100)
        epsilon = getattr(getattr(env_runner, "module", None), "epsilon_schedule", None)
        if epsilon is not None:
            value = epsilon.get_current_value()
            if isinstance(value, float) and math.isfinite(value):
                metrics_logger.log_value(metrics.EPSILON, value, reduce="mean", window=100)


class ApexCallbacks(LoopNestCallbacks):
    """Also gives env runner i of N the fixed exploration 0.4 ** (1 + 7 i / (N - 1))."""

    apex = True


def _set_apex_epsilon(env_runner) -> None:
    module = getattr(env_runner, "module", None)
    if module is None or getattr(module, "_looprl_apex", False):
        return
    count = env_runner.config.num_env_runners
    index = env_runner.worker_index - 1  # remote runners are numbered from 1
    value = apex_epsilon(index, count) if count >= 1 and index >= 0 else apex_epsilon(0, 1)
    module.epsilon_schedule = Scheduler(fixed_value_or_schedule=value)
    module._looprl_apex = True
