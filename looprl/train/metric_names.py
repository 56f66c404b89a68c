"""Names of the per-episode metrics the callbacks log (under ``result["env_runners"]``).

Kept apart from the callbacks so that reading them does not import Ray."""

SPEEDUP = "looprl_speedup"  # final / initial GFLOPS of the episode (arithmetic mean: skewed)
LOG_SPEEDUP = "looprl_log_speedup"  # its logarithm: exp(mean) is the geometric mean
FINAL_GFLOPS = "looprl_final_gflops"
CACHE_HIT_RATE = "looprl_cache_hit_rate"  # measured steps whose value came from the cache
INVALID_RATE = "looprl_invalid_rate"
EPSILON = "looprl_epsilon"
