"""Defaults shared by the environment, training, search, tune and the command lines.

One place for each value, so that a policy exported by training, the env it was trained on
and the rollout that replays it cannot disagree.
"""

DATASET = "mm64-256"  # LoopTune's benchmark set (envs/mm64-256.json)
SPLIT_FACTORS = (4, 8, 16)  # the paper's split actions
MAX_LOOPS = 10  # loops per nest (compute + write-back), rows of the observation
EPISODE_LENGTH = 10  # actions per episode
ENV_OBSERVATION = "raw"  # what LoopNest-v0 returns unless asked otherwise (the paper's numbers)
TRAINING_OBSERVATION = "normalized"  # what training feeds the networks, and policies expect
STATE_BUDGET_S = 0.008  # timing budget per new schedule in the searches and tune
# LoopNest-v0's timing budget per new schedule: training's hot path, where a new state costs
# its compile (~6-7 ms) plus this. One 4 ms timing falls short of a state's best by 0.26% at
# the median and ranks states like the best (rank correlation 0.986-0.994 against 0.987-0.999
# at 8 ms; experiments/timing_budget_noise.py, docs/measurement.md). Part of the cache key:
# the env's values live beside, not among, the searches' 8 ms ones.
ENV_STATE_BUDGET_S = 0.004
# Timings a measured value needs before it is final: a state met again with fewer is timed
# again and the cache keeps the best (on a shared machine timing is bimodal, and a first timing
# may have caught the slow mode). 3 where a decision is made (tune, search, looprl.measure);
# 1 in LoopNest-v0, whose revisits must be lookups for training to run at thousands of steps
# per second: there the first timing is the reward (docs/measurement.md: what that costs).
MEASUREMENT_SAMPLES = 3
ENV_MEASUREMENT_SAMPLES = 1
# Largest problem accepted, in bytes of its float32 buffers (two inputs, output, accumulator).
# Every measurement allocates and fills all four in this process, so a typo such as
# "100000x100000x100000" must fail at once with a message, not as an out-of-memory kill or a
# minutes-long allocation. 8 GiB is far above every benchmark shape (a 4096^3 matmul needs
# 256 MiB) and still fits, with the process around it, in a 16 GiB machine.
MAX_BUFFER_BYTES = 8 * 2**30

# Row counts up to this are tuned with the bytes the model's other layers read between two calls
# of a linear layer (looprl.ir.problem.Problem.between: the weight timed as cold as a decode step
# leaves it): the schedule that is fastest with the weight in the cache (GPT-2 small's 768->3072 on
# a Zen 4: 44 GFLOPS warm) is not the one that streams it fastest from memory (12 against 14.5
# GFLOPS for packed panels). More rows read the weight once for many flops: tuned warm. Used by
# looprl.torch (tune_module, the backend) and by the models-called dataset that trains for it.
COLD_ROWS = 16
