"""The parallel action in the environment and the searches."""

import math

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import looprl
from looprl import search
from looprl.backend.threads import available_cores
from looprl.actions import ActionSet, State
from looprl.ir.step import Step

needs_two = pytest.mark.skipif(available_cores() < 2, reason="needs two cores")


def test_the_parallel_action_comes_last_and_follows_the_ir_rules():
    actions = ActionSet((4, 8), parallel=True, layouts=True)
    assert actions.names[-3:] == ("pack", "pad", "parallel")
    assert ActionSet((4, 8)).names == ("up", "down", "swap_up", "swap_down", "split_4", "split_8")
    parallel = actions.index("parallel")
    state = State(looprl.initial_nest(looprl.matmul(16, 16, 16)), 0)
    assert actions.is_structural(parallel)
    marked = actions.apply(state, parallel)
    assert marked.nest == state.nest.parallel(0) and marked.cursor == 0
    assert actions.apply(marked, parallel) is None  # already parallel
    assert actions.apply(State(state.nest, 1), parallel) is None  # k: a reduction loop
    assert actions.apply(State(marked.nest, 2), parallel) is None  # nested
    assert actions.apply(State(marked.nest, 3), parallel) is not None  # the write-back nest's own
    assert actions.mask(marked)[parallel] == 0
    # splits added for tiles keep the action, and paths replay it
    assert actions.with_splits([6]).names[-1] == "parallel"
    assert ActionSet((4,)).extended(["split_6", "parallel"]).parallel
    assert ActionSet.covering(["split_4", "parallel"]).names[-1] == "parallel"
    path, reached = actions.path(state, [Step("split", 0, 4), Step("parallel", 0)])
    assert reached.nest == state.nest.split(0, 4).parallel(0)
    assert [actions.names[a] for a in path] == ["split_4", "parallel"]


def test_one_thread_envs_keep_the_paper_actions():
    env = gymnasium.make("LoopNest-v0", problems=["16x16x16"], cache=":memory:", peak=100.0)
    assert "parallel" not in env.unwrapped.action_names and env.unwrapped.threads == 1


@needs_two
def test_an_env_on_two_threads_offers_parallel_and_measures_on_two_threads(cache_path):
    env = gymnasium.make("LoopNest-v0", problems=["64x32x48"], cache=cache_path, threads=2, measure_budget_s=0.002)
    unwrapped = env.unwrapped
    assert unwrapped.peak == looprl.peak_gflops(cache=cache_path, threads=2)  # the two-thread peak, measured
    obs, info = env.reset(seed=0)
    assert info["threads"] == 2 and obs.shape == unwrapped.observation_space.shape
    parallel = unwrapped.action_names.index("parallel")
    obs, reward, _, _, info = env.step(parallel)
    assert info["valid"] and info["schedule"].startswith("m64s1p,")
    assert info["gflops"] > 0 and np.isfinite(reward)
    assert looprl.MeasurementCache(cache_path).get(unwrapped.nest, budget_s=0.002, threads=2) is not None
    assert unwrapped.graph().nodes[("loop", 0)]["parallel"]
    _, reward, _, _, info = env.step(parallel)  # invalid: already parallel
    assert not info["valid"] and reward == 0.0
    check_env(unwrapped, skip_render_check=True)


def test_env_threads_are_checked():
    for bad in (0, available_cores() + 1, True, 1.5):
        with pytest.raises(ValueError, match="threads"):
            gymnasium.make("LoopNest-v0", problems=["16x16x16"], cache=":memory:", peak=100.0, threads=bad)


@needs_two
def test_the_surrogate_reward_is_for_one_thread():
    with pytest.raises(ValueError, match="threads=1"):
        gymnasium.make("LoopNest-v0", problems=["16x16x16"], cache=":memory:", peak=100.0, threads=2, reward="model")


@needs_two
def test_searches_take_threads(cache_path):
    result = search.run("64x32x48", "greedy1", budget_s=math.inf, max_evaluations=30, cache=cache_path, threads=2,
                        measure_budget_s=0.002, verify_s=None)
    assert result.settings["threads"] == 2
    assert "threads" not in search.run("16x16x16", "greedy1", max_evaluations=3, cache=":memory:", verify_s=None).settings
    evaluator = looprl.Evaluator(":memory:", 0.002, threads=2)
    with pytest.raises(ValueError, match="evaluator given measures on 2"):
        search.run("16x16x16", "greedy1", evaluator=evaluator, threads=1)
    with pytest.raises(ValueError, match="threads"):
        search.run("16x16x16", "greedy1", threads=0)
