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
STATE_BUDGET_S = 0.008  # timing budget per new schedule in the env, searches and tune
