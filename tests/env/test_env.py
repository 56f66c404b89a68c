import logging
import math
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import looprl
from looprl.actions import ActionSet, State
from looprl.env.observation import nest_graph, observation, stride_bin
from looprl.env.loopnest_env import LoopNestEnv
from looprl.errors import CompileError
from looprl.measurement import evaluator as evaluator_module
from looprl.measurement.cache import MeasurementCache

PEAK = 100.0
SMALL = "mk,kn->mn:m=64,k=20,n=32"  # loops m64, k20, n32 | m64, n32


def make_env(**kwargs):
    kwargs.setdefault("problems", [SMALL])
    kwargs.setdefault("cache", ":memory:")
    kwargs.setdefault("peak", PEAK)
    kwargs.setdefault("measure_budget_s", 0.001)
    return LoopNestEnv(**kwargs)


def action(env, name):
    return env.action_names.index(name)


# -- spaces, registration, checker ------------------------------------------------------


def test_registered_and_check_env_is_clean():
    env = gymnasium.make("LoopNest-v0", problems=["48x32x40", "64x16x24"], cache=":memory:", peak=PEAK, render_mode="ansi")
    assert env.unwrapped.spec.nondeterministic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_spaces_are_declared_up_front():
    env = make_env(split_factors=(2, 4, 8, 16, 32, 64), max_loops=12)
    assert env.action_space == gymnasium.spaces.Discrete(10)
    assert env.action_names == ("up", "down", "swap_up", "swap_down", "split_2", "split_4", "split_8", "split_16", "split_32", "split_64")
    assert env.observation_space.shape == (12, 20) and env.observation_space.dtype == np.float32
    assert env.observation_space.high[0, 1] == 64  # the largest extent among the problems
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space
    normalized = make_env(observation="normalized")
    obs, _ = normalized.reset(seed=0)
    assert obs in normalized.observation_space
    assert normalized.observation_space.high.max() <= 1.0


def test_default_env_uses_the_dataset_training_split():
    env = make_env(problems=None)
    assert len(env.problems) == 1757
    assert env.action_names == ("up", "down", "swap_up", "swap_down", "split_4", "split_8", "split_16")
    assert env.observation_space.shape == (10, 20)
    assert env.observation_space.high[0, 1] == 256


def test_env_is_registered_in_a_fresh_process_by_module_prefix():
    code = (
        "import gymnasium; env = gymnasium.make('looprl:LoopNest-v0', problems=['16x16x16'], cache=':memory:', peak=1.0);"
        "print(env.reset(seed=0)[0].shape)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(10, 20)"


# -- actions ---------------------------------------------------------------------------


def test_each_action_on_a_known_nest():
    env = make_env()
    env.reset(seed=0)
    assert env.nest.key == "m64s1,k20s1,n32s1|m64s1,n32s1" and env.cursor == 0

    _, reward, _, _, info = env.step(action(env, "up"))
    assert not info["valid"] and reward == 0.0 and env.cursor == 0

    _, reward, _, _, info = env.step(action(env, "down"))
    assert info["valid"] and info["from_cache"] is None and reward == 0.0 and env.cursor == 1

    env.step(action(env, "swap_up"))  # k above m; the cursor follows k
    assert env.nest.key == "k20s1,m64s1,n32s1|m64s1,n32s1" and env.cursor == 0

    env.step(action(env, "swap_down"))  # back
    assert env.nest.key == "m64s1,k20s1,n32s1|m64s1,n32s1" and env.cursor == 1

    _, _, _, _, info = env.step(action(env, "split_8"))  # k20 -> k2 step 8 tail 4, k8
    assert info["valid"] and env.nest.key == "m64s1,k2s8t4,k8s1,n32s1|m64s1,n32s1" and env.cursor == 1

    _, _, _, _, info = env.step(action(env, "swap_down"))  # two k loops: refused
    assert not info["valid"] and env.cursor == 1

    _, _, _, _, info = env.step(action(env, "split_4"))  # k2 is smaller than 4
    assert not info["valid"]

    env.step(action(env, "down"))
    env.step(action(env, "down"))  # on n32, the innermost compute loop
    _, _, _, _, info = env.step(action(env, "swap_down"))  # would cross into the write-back nest
    assert not info["valid"] and env.cursor == 3
    assert list(info["action_mask"]) == [1, 1, 1, 0, 1, 1, 1]
    np.testing.assert_array_equal(info["action_mask"], env.action_mask())


def test_split_keeps_cursor_on_outer_loop_and_respects_max_loops():
    env = make_env(max_loops=6)
    env.reset(seed=0)
    env.step(action(env, "split_16"))
    assert env.nest.key == "m4s16,m16s1,k20s1,n32s1|m64s1,n32s1" and env.cursor == 0
    mask = env.action_mask()
    assert not any(mask[4:])  # six loops: no more splits
    _, reward, _, _, info = env.step(action(env, "split_4"))
    assert not info["valid"] and reward == 0.0 and len(env.nest) == 6


def test_cursor_moves_into_the_write_back_nest():
    env = make_env()
    env.reset(seed=0)
    for _ in range(4):
        env.step(action(env, "down"))
    assert env.cursor == 4 and env.nest.loops[4].is_write_back
    _, _, _, _, info = env.step(action(env, "down"))
    assert not info["valid"] and env.cursor == 4
    env.step(action(env, "swap_up"))  # m and n of the write-back nest
    assert env.nest.key == "m64s1,k20s1,n32s1|n32s1,m64s1" and env.cursor == 3


def test_action_set_rejects_bad_configuration():
    for factors in [(1,), (513,), ("4",), (4, 4), ()]:
        with pytest.raises(ValueError, match="split.factor"):
            ActionSet(factors)
    with pytest.raises(ValueError, match="max_loops"):
        ActionSet((4,), max_loops=0)
    actions = ActionSet()
    state = State(looprl.initial_nest(looprl.matmul(8, 8, 8)))
    for bad in (-1, 7, 1.5, True):
        with pytest.raises(ValueError, match="action"):
            actions.apply(state, bad)


def test_env_rejects_bad_arguments():
    cases = [
        (dict(observation="pixels"), "observation"),
        (dict(order="sorted"), "order"),
        (dict(problems=[]), "must not be empty"),
        (dict(problems=["12x"]), "cannot parse problem"),
        (dict(max_loops=4), "more than max_loops"),
        (dict(episode_length=0), "episode_length"),
        (dict(peak=-1.0), "peak"),
        (dict(problems=None, split="valid"), "unknown split"),
        (dict(problems=None, split="validation"), "mm64-256' has no validation split"),  # only models and models-called have one
        (dict(problems=None, dataset="mm1-2"), "unknown dataset"),
        (dict(render_mode="human"), "render_mode"),
        (dict(cache=3), "cache"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            make_env(**kwargs)
    env = make_env()
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step(0)
    env.reset()
    with pytest.raises(ValueError, match=r"action must be an integer in 0\.\.6, got 7"):
        env.step(7)
    with pytest.raises(ValueError, match="reset options"):
        env.reset(options={"problme": "8x8x8"})
    with pytest.raises(ValueError, match="larger than 64"):
        env.reset(options={"problem": "128x8x8"})


# -- observation ------------------------------------------------------------------------


def test_stride_bins():
    assert [stride_bin(s) for s in (1, 2, 3, 4, 5, 20, 32, 33, 256)] == [0, 1, 2, 2, 3, 5, 5, 6, 8]
    assert stride_bin(40000) == 15  # (2^15, 2^16) joins the last bin
    assert stride_bin(1 << 16) is None  # dropped
    with pytest.raises(ValueError):
        stride_bin(0)


def test_observation_of_a_known_nest_by_hand():
    # A[m,k] is 64x20 (m stride 20, k stride 1), B[k,n] is 20x32 (k stride 32, n stride 1),
    # acc/out[m,n] are 64x32 (m stride 32, n stride 1).
    env = make_env()
    obs, _ = env.reset(seed=0)
    expected = np.zeros((10, 20), dtype=np.float32)
    expected[0, :4] = [1, 64, 0, 1]
    expected[0, 4 + 5] = 1.0  # A: 20 -> bin 5, acc: 32 -> bin 5
    expected[1, :4] = [0, 20, 0, 1]
    expected[1, 4 + 0] = expected[1, 4 + 5] = 0.5  # A: 1 -> bin 0, B: 32 -> bin 5
    expected[2, :4] = [0, 32, 0, 1]
    expected[2, 4 + 0] = 1.0  # B and acc: stride 1
    expected[3, :4] = [0, 64, 0, 0]
    expected[3, 4 + 5] = 1.0  # acc and out: 32
    expected[4, :4] = [0, 32, 0, 0]
    expected[4, 4 + 0] = 1.0
    np.testing.assert_array_equal(obs, expected)

    env.step(action(env, "down"))
    obs, *_ = env.step(action(env, "split_8"))  # k2 step 8 tail 4, then k8
    expected[0, 0], expected[1, 0] = 0, 1
    expected[1, :4] = [1, 2, 4, 1]
    expected[1, 4:] = 0
    expected[1, 4 + 3] = expected[1, 4 + 8] = 0.5  # A: 1*8 -> bin 3, B: 32*8=256 -> bin 8
    expected[2:6] = expected[1:5].copy()
    expected[2, :4] = [0, 8, 0, 1]
    expected[2, 4:] = 0
    expected[2, 4 + 0] = expected[2, 4 + 5] = 0.5
    np.testing.assert_array_equal(obs, expected[:10])


def test_normalized_observation_log_scales_sizes():
    env = make_env(observation="normalized")
    obs, _ = env.reset(seed=0)
    assert obs[0, 1] == pytest.approx(math.log2(65) / 8)
    assert obs[1, 1] == pytest.approx(math.log2(21) / 8)
    raw = observation(env.nest, env.cursor, 10)
    np.testing.assert_array_equal(obs[:, 4:], raw[:, 4:])


def test_state_graph_has_nesting_data_and_stride_edges():
    env = make_env()
    env.reset(seed=0)
    env.step(action(env, "down"))
    env.step(action(env, "split_8"))
    graph = env.graph()
    loops = [n for n, d in graph.nodes(data=True) if d["kind"] == "loop"]
    assert len(loops) == 6 and graph.nodes[("loop", 1)]["cursor"]
    kinds = {d["kind"] for _, _, d in graph.edges(data=True)}
    assert kinds == {"nest", "data", "stride"}
    edge = graph.edges[("loop", 1), ("tensor", "in1")]
    assert edge["stride"] == 256 and edge["weight"] == 64 * 2
    edge = graph.edges[("loop", 2), ("tensor", "in0")]
    assert edge["stride"] == 1 and edge["weight"] == 64 * 2 * 8
    assert not graph.has_edge(("loop", 0), ("tensor", "in1"))  # B does not move with m
    assert graph.has_edge(("loop", 3), ("stmt", "compute"))
    assert graph.has_edge(("tensor", "in0"), ("stmt", "compute"))
    assert graph.has_edge(("stmt", "write_back"), ("tensor", "out"))
    assert nest_graph(env.nest).graph["schedule"] == env.nest.key


# -- reward, measurement, robustness -------------------------------------------------------


def test_reward_is_the_gflops_change_over_peak():
    cache = MeasurementCache(":memory:")
    problem = looprl.parse_problem(SMALL)
    start = looprl.initial_nest(problem)
    better = start.split(0, 4)
    cache.put(start, 20.0, budget_s=0.001, samples=3)  # final values: not timed again
    cache.put(better, 45.0, budget_s=0.001, samples=3)
    env = make_env(cache=cache)
    _, info = env.reset(seed=0)
    assert info["gflops"] == 20.0 and info["from_cache"] is True
    _, reward, terminated, truncated, info = env.step(action(env, "split_4"))
    assert reward == pytest.approx((45.0 - 20.0) / PEAK) and reward > 0
    assert info["gflops"] == 45.0 and info["from_cache"] is True and info["valid"]
    assert not terminated and not truncated
    assert info["schedule"] == better.key and "<-" in info["nest"]
    env.step(action(env, "down"))
    env.step(action(env, "down"))  # on k
    cache.put(better.swap(1), 5.0, budget_s=0.001, samples=3)
    _, reward, *_ = env.step(action(env, "swap_up"))
    assert reward == pytest.approx((5.0 - 45.0) / PEAK)


def test_new_states_are_measured_once():
    env = make_env()  # by default a revisit is a lookup: training's hot path never re-times
    _, info = env.reset(seed=0)
    assert info["from_cache"] is False and info["gflops"] > 0
    _, _, _, _, info = env.step(action(env, "split_4"))
    assert info["from_cache"] is False
    env.reset(seed=0)
    _, _, _, _, info = env.step(action(env, "split_4"))
    assert info["from_cache"] is True
    assert env.evaluator.compiled == 2


def test_revisited_states_are_timed_until_they_have_their_samples():
    env = make_env(measure_samples=2)
    env.reset(seed=0)
    _, _, _, _, first = env.step(action(env, "split_4"))
    env.reset(seed=0)
    _, _, _, _, second = env.step(action(env, "split_4"))
    env.reset(seed=0)
    _, _, _, _, third = env.step(action(env, "split_4"))
    assert [first["from_cache"], second["from_cache"], third["from_cache"]] == [False, False, True]
    assert second["gflops"] >= first["gflops"] and third["gflops"] == second["gflops"]  # the best of two
    assert env.evaluator.resampled == 2  # the initial nest and the split, once each


def test_failing_compile_is_a_logged_zero_reward_step(monkeypatch, caplog):
    monkeypatch.setenv("LOOPRL_STRICT", "0")
    env = make_env()
    env.reset(seed=0)
    before = (env.nest, env.gflops)

    def broken(nest, target=None, threads=1):
        raise CompileError("backend exploded")

    monkeypatch.setattr(evaluator_module, "compile", broken)
    # another test in this worker may have reconfigured logging (a dictConfig that disables the loggers
    # it does not name): the env's logger is this test's subject, enabled and propagating here
    monkeypatch.setattr(logging.getLogger("looprl.env"), "disabled", False)
    monkeypatch.setattr(logging.getLogger("looprl.env"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="looprl.env"):
        _, reward, terminated, truncated, info = env.step(action(env, "split_4"))
    assert reward == 0.0 and not terminated
    assert "backend exploded" in info["error"] and "backend exploded" in caplog.text
    assert (env.nest, env.gflops) == before
    assert len(env.evaluator.cache) == 1  # the failure was not cached


def test_an_unexpected_error_while_measuring_is_a_bug_and_propagates(monkeypatch):
    monkeypatch.setenv("LOOPRL_STRICT", "0")
    env = make_env()
    env.reset(seed=0)

    def broken(nest, target=None, threads=1):
        raise TypeError("a bug in the code generator")

    monkeypatch.setattr(evaluator_module, "compile", broken)
    with pytest.raises(TypeError, match="a bug"):
        env.step(action(env, "split_4"))


def test_strict_evaluation_raises_compile_failures(monkeypatch):
    env = make_env()  # the test suite runs with LOOPRL_STRICT=1
    env.reset(seed=0)

    def broken(nest, target=None, threads=1):
        raise CompileError("backend exploded")

    monkeypatch.setattr(evaluator_module, "compile", broken)
    with pytest.raises(CompileError):
        env.step(action(env, "split_4"))


def test_episodes_truncate_and_never_terminate():
    env = make_env(episode_length=3)
    env.reset(seed=0)
    flags = [env.step(action(env, "up"))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_long_random_run_stays_in_space():
    problems = ["24x20x36", "bmk,bkn->bmn:b=3,m=17,k=9,n=33", "mk,k->m:m=40,k=24"]
    env = make_env(problems=problems, split_factors=(2, 3, 4, 8, 16), episode_length=15)
    env.action_space.seed(1)
    obs, _ = env.reset(seed=1)
    for _ in range(150):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert obs in env.observation_space and np.isfinite(reward) and info["error"] is None
        if truncated:
            obs, _ = env.reset()
    assert env.evaluator.compiled > 10


# -- problems and seeding ---------------------------------------------------------------


def test_cycle_order_and_seeded_start():
    problems = ["16x16x16", "32x16x16", "48x16x16"]
    env = make_env(problems=problems)
    names = [env.reset()[1]["problem"] for _ in range(4)]
    assert names == [looprl.parse_problem(p).name for p in problems + problems[:1]]
    assert env.reset(seed=5)[1]["problem"] == looprl.parse_problem(problems[2]).name  # 5 % 3
    assert env.reset(options={"problem": "8x8x8"})[1]["problem"] == looprl.matmul(8, 8, 8).name


def test_seeded_random_episodes_are_reproducible():
    problems = [f"{m}x16x16" for m in range(16, 65, 8)]

    def run(seed):
        env = make_env(problems=problems, order="random")
        env.action_space.seed(seed)
        trace = []
        obs, info = env.reset(seed=seed)
        for _ in range(25):
            obs, _, _, truncated, info = env.step(env.action_space.sample())
            trace.append((info["problem"], info["schedule"], env.cursor, obs.tobytes()))
            if truncated:
                obs, info = env.reset()
        return trace

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_render_shows_cursor_and_gflops():
    env = make_env(render_mode="ansi")
    env.reset(seed=0)
    env.step(action(env, "down"))
    text = env.render()
    assert "for k in 20:  <-" in text and "GFLOPS" in text and "step 1/10" in text
    assert make_env().render() is None


def test_a_list_of_datasets_draws_each_dataset_equally_often():
    import collections

    env = looprl.env.LoopNestEnv(dataset=["mm64-256", "mm384-1024"], order="random", cache=":memory:", peak=100.0, measure_budget_s=0.001)
    sizes = looprl.dataset_problems("mm64-256", "train"), looprl.dataset_problems("mm384-1024", "train")
    assert len(env.unwrapped.problems) == len(sizes[0]) + len(sizes[1])
    counts = collections.Counter()
    env.reset(seed=3)
    for _ in range(60):
        counts["large" if env.unwrapped.problem in sizes[1] else "small"] += 1
        env.reset()
    assert 15 <= counts["large"] <= 45  # 1757 small problems against 172 large ones: drawn by set, not by problem
    with pytest.raises(ValueError, match="dataset"):
        looprl.env.LoopNestEnv(dataset=[], cache=":memory:", peak=100.0)
