"""Data layouts as schedule values: the primitives, keys, the env's layout actions and the
joint search."""

import itertools
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import looprl
import looprl.search
from looprl.actions import ActionSet, State
from looprl.env.observation import nest_graph, observation
from looprl.ir.layout import Layout
from looprl.ir.nest import LoopNest
from looprl.measurement.cache import MeasurementCache
from looprl.ir.schedules import layout_starts
from tests.schedules import action_steps, layout_steps, pack_every_tiled_loop, walk, with_layouts
from tests.backend.test_codegen_correctness import assert_matches
from tests.backend.test_layout_codegen import PROBLEMS


def assert_is_a_layout(layout: Layout):
    """Every element has its own place inside the layout's elements."""
    places = set()
    ranges = [range(n) for n in layout.sizes]
    for index in itertools.product(*ranges):
        offset = sum(layout.offset(v, x) for v, x in zip(layout.index, index))
        assert 0 <= offset < layout.elements
        places.add(offset)
    assert len(places) == int(np.prod(layout.sizes))


def test_primitives():
    row = Layout.row_major("kn", (5, 35))
    assert row.key == "k1.n1" and row.is_row_major and row.breakpoints("n") == ()
    packed = row.split(1, 16).reorder((1, 0, 2))
    assert packed.key == "n16.k1.n1%16" and packed.elements == 3 * 5 * 16
    assert [packed.offset("n", x) for x in (0, 1, 15, 16, 34)] == [0, 1, 15, 80, 162]
    assert packed.breakpoints("n") == (16,) and packed == row.pack("n", 16)
    padded = packed.pad(1, 8)
    assert padded.key == "n16.k1p8.n1%16" and padded.offset("n", 16) == 128
    fused = packed.fuse(1)
    assert fused.key == "n16.k1*n1%16" and fused.offset("n", 16) == packed.offset("n", 16)
    nested = packed.split(2, 4)
    assert nested.key == "n16.k1.n4%4.n1%4" and nested.breakpoints("n") == (4, 16)
    for layout in (row, packed, padded, fused, nested, row.reorder((1, 0)), packed.pack("n", 32)):
        assert_is_a_layout(layout)
        assert Layout.from_key("kn", (5, 35), layout.key) == layout


def test_primitives_refuse_what_they_cannot_do():
    packed = Layout.row_major("kn", (5, 35)).pack("n", 16)
    with pytest.raises(ValueError, match="fused"):
        packed.fuse(0).split(0, 2)
    with pytest.raises(ValueError, match="does not divide"):
        packed.split(2, 3)
    with pytest.raises(ValueError, match="need 2 <= factor"):
        packed.split(1, 5)
    with pytest.raises(ValueError, match="not a permutation"):
        packed.reorder((0, 0, 1))
    with pytest.raises(ValueError, match="last one"):
        packed.fuse(2)
    with pytest.raises(ValueError, match="already has a multiple"):
        packed.pad(2, 8)
    with pytest.raises(ValueError, match="out of range|has 3 dimensions"):
        packed.pad(3, 8)
    with pytest.raises(ValueError, match="padded"):
        packed.pad(1, 8).split(1, 2)
    nest = looprl.initial_nest(looprl.matmul(8, 8, 8))
    with pytest.raises(ValueError, match="MAX_BUFFER_BYTES"):
        nest.layout_pad("in1", 1, 2**40)
    for bad in ("k1.n1.n1", "k1.x1", "k2.n1", "k1.n16", "k1.n1%16", "k1.n16.n1%8", "k1.n1p2", "k1,n1"):
        with pytest.raises(ValueError):
            Layout.from_key("kn", (5, 35), bad)


@settings(max_examples=150, deadline=None)
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), layouts=layout_steps(), seed=st.integers(0, 100))
def test_layout_schedules_round_trip_through_their_keys(problem, steps, layouts, seed):
    nest = with_layouts(walk(problem, steps), layouts, seed)
    assert LoopNest.from_key(problem, nest.key) == nest
    if not nest.layouts:
        assert nest.key.count("|") == 1  # row-major schedules keep their old keys
    for tensor, layout in nest.layouts:
        if np.prod(layout.sizes) <= 4096:
            assert_is_a_layout(layout)


def test_default_keys_are_unchanged_and_layouts_change_keys_and_cache_entries(tmp_path):
    problem = looprl.matmul(32, 48, 16)
    nest = looprl.initial_nest(problem).split(2, 16)
    assert nest.key == "m32s1,k16s1,n3s16,n16s1|m32s1,n48s1"
    packed = nest.layout_pack("in1", "n", 16)
    assert packed.key == nest.key + "|in1=n16.k1.n1%16" and packed != nest and hash(packed) != hash(nest)
    assert packed.layout_reorder("in1", (1, 0, 2)).layout_reorder("in1", (1, 0, 2)) == packed
    assert packed.with_layout("in1", nest.layout("in1")) == nest  # back to row-major: no layout left
    cache = MeasurementCache(str(tmp_path / "m.sqlite"))
    cache.put(nest, 50.0)
    assert cache.get(nest) == 50.0 and cache.get(packed) is None  # its own cache entry
    cache.put(packed, 60.0)
    assert cache.get(LoopNest.from_key(problem, packed.key)) == 60.0 and cache.get(nest) == 50.0
    constant = LoopNest(looprl.matmul(32, 48, 16, constant="b"), packed.compute, packed.write_back, packed.layouts)
    assert cache.get(constant) is None  # a weight's schedule is timed without its conversion: another entry


def test_from_key_refuses_bad_layout_parts():
    problem = looprl.matmul(32, 48, 16)
    base = "m32s1,k16s1,n48s1|m32s1,n48s1"
    for bad in (
        base + "|in2=k1.n1",
        base + "|in1=k1.n1",  # row-major listed
        base + "|in1=n16.k1.n1%16;in1=n16.k1.n1%16",
        base + "|out=n16.k1.n1%16",  # k is not an index of the output
        base + "|in1=n16.k1.n1%16|x",
        base + "|in1",
        base + "|in1=n16.k1.n1%16;in0=k4.m1.k1%4",  # not canonical (in0 first)
    ):
        with pytest.raises(ValueError):
            LoopNest.from_key(problem, bad)


# -- env ---------------------------------------------------------------------------------------


def make_env(**kwargs):
    kwargs.setdefault("problems", ["48x32x40", "64x16x24"])
    return gymnasium.make("LoopNest-v0", cache=":memory:", peak=100.0, measure_budget_s=0.001, layouts=True, **kwargs).unwrapped


def test_env_with_layouts_passes_check_env():
    env = make_env(render_mode="ansi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    assert env.action_names[-2:] == ("pack", "pad")
    default = gymnasium.make("LoopNest-v0", problems=["48x32x40", "64x16x24"], cache=":memory:", peak=100.0).unwrapped
    assert "pack" not in default.action_names and env.observation_space == default.observation_space


def test_pack_and_pad_actions_masks_and_rendering():
    env = make_env(problems=["40x67x24"], render_mode="ansi")
    names = env.action_names
    env.reset(seed=0)
    mask = env.action_mask()
    assert not mask[names.index("pack")]  # loop 0 walks m with step 1: nothing to tile
    assert not mask[names.index("pad")]  # m is the outermost dimension of A and C: padding it changes no stride
    width = env.target.vector_width
    for name in ("down", "down", "split_16"):
        obs_before, *_ = env.step(names.index(name))
    obs, reward, terminated, truncated, info = env.step(names.index("pack"))
    assert info["valid"] and "in1=n16.k1.n1%16" in info["schedule"]
    assert obs.shape == obs_before.shape and not np.array_equal(obs, obs_before)  # strides moved
    assert "layout in1" in env.render()
    obs, reward, terminated, truncated, info = env.step(names.index("pack"))
    assert not info["valid"] and reward == 0.0  # the same tile again changes nothing
    obs, reward, terminated, truncated, info = env.step(names.index("pad"))  # n = 67 in B (packed) and C
    padded = -(-67 // width) * width
    assert info["valid"] and info["schedule"].endswith(f"|in1=n16.k1.n1%16;out=m1.n1p{padded}"), info["schedule"]


def test_layout_actions_are_pure_and_can_apply_agrees_with_apply():
    problem = looprl.matmul(40, 67, 24)
    actions = ActionSet((4, 8, 16), 10, layouts=True, pad_multiple=8)
    rng = np.random.default_rng(0)
    state = State(looprl.initial_nest(problem), 0)
    for _ in range(200):
        action = int(rng.integers(len(actions)))
        following = actions.apply(state, action)
        assert (following is not None) == bool(actions.mask(state)[action])
        if following is not None:
            LoopNest.from_key(problem, following.nest.key)
            state = following
    with pytest.raises(ValueError):
        ActionSet(layouts="yes")
    with pytest.raises(ValueError):
        ActionSet(layouts=True, pad_multiple=1)


def test_stride_histograms_follow_the_layouts_the_kernel_uses():
    nest = looprl.initial_nest(looprl.matmul(32, 64, 48)).split(2, 16).swap(1)  # m, n/16, k, n16
    packed = nest.layout_pack("in1", "n", 16)

    def strides(n):
        graph = nest_graph(n)
        return {(src[1], dst[1]): e["stride"] for src, dst, e in graph.edges(data=True) if e["kind"] == "stride"}

    # the k loop (index 2) walks B with a row stride of 64 row-major, 16 packed
    assert strides(nest)[(2, "in1")] == 64 and strides(packed)[(2, "in1")] == 16
    assert strides(nest)[(1, "in1")] == 16 and strides(packed)[(1, "in1")] == 16 * 48
    assert observation(packed, 0, 10).shape == observation(nest, 0, 10).shape
    inert = looprl.initial_nest(looprl.matmul(32, 64, 48)).layout_pack("in1", "n", 16)
    assert strides(inert) == strides(looprl.initial_nest(looprl.matmul(32, 64, 48)))


# -- search ------------------------------------------------------------------------------------


def replay(problem, names, layouts=True, pad_multiple=16):
    actions = ActionSet((4, 8, 16), 10, layouts=layouts, pad_multiple=pad_multiple)
    state = State(looprl.initial_nest(problem), 0)
    for name in names:
        following = actions.apply(state, actions.index(name))
        assert following is not None, name
        state = following
    return state.nest


@pytest.mark.parametrize("stage", [None, 0.5])
def test_joint_search_finds_a_schedule_its_actions_rebuild(stage):
    result = looprl.search.run(
        "48x67x24", "beam2bfs", max_evaluations=30, budget_s=30, depth=4, layouts=True, layout_stage=stage,
        cache=":memory:", measure_budget_s=0.001, verify_s=None,
    )
    assert result.settings["layouts"] and result.settings["layout_stage"] == stage
    width = looprl.Target.default().vector_width  # the search's target
    assert replay(result.problem, result.actions, pad_multiple=width) == result.best_nest
    assert result.best_gflops >= result.initial_gflops and result.evaluations <= 31
    with pytest.raises(ValueError, match="layout_stage"):
        looprl.search.run("48x67x24", "greedy1", layout_stage=0.5, cache=":memory:")
    with pytest.raises(ValueError, match="layout_stage"):
        looprl.search.run("48x67x24", "greedy1", layouts=True, layout_stage=1.5, cache=":memory:")


def test_packed_template_schedules_round_trip():
    nest = pack_every_tiled_loop(looprl.initial_nest(looprl.matmul(64, 48, 32)).split(2, 16).split(3, 4).split(0, 8), 3)
    assert LoopNest.from_key(nest.problem, nest.key) == nest


def test_pack_on_a_step_one_loop_tiles_by_the_tile_it_walks():
    problem = looprl.contraction("mk,nk->mn", m=32, n=64, k=16)  # A @ B.T
    actions = ActionSet((4, 8, 16), 10, layouts=True)
    nest = looprl.initial_nest(problem).split(2, 16)  # m, k, n/16, n16
    pack = actions.index("pack")
    assert actions.apply(State(nest, 0), pack) is None  # m has step 1 and no tile
    inner = actions.apply(State(nest, 3), pack).nest  # n16 walks a tile of 16
    outer = actions.apply(State(nest, 2), pack).nest  # n/16 has step 16
    assert inner == outer and dict(inner.layouts)["in1"].key == "n16.k1.n1%16"
    assert looprl.compile(inner).packed_inputs == ("in1",)


@pytest.mark.parametrize("spec, sizes, relaid", [
    ("mk,nk->mn", {"m": 9, "k": 7, "n": 21}, {"in1": "k1.n1"}),
    ("bmk,bnk->bmn", {"b": 2, "m": 5, "k": 6, "n": 19}, {"in1": "b1.k1.n1"}),
    ("nhwc,oc->nhwo", {"n": 1, "h": 3, "w": 5, "c": 6, "o": 17}, {"in1": "c1.o1"}),
    ("nk,mk->mn", {"m": 5, "k": 6, "n": 18}, {"in0": "k1.n1"}),
    ("mk,kn->mn", {"m": 5, "k": 6, "n": 18}, None),  # B already has n innermost
    ("km,kn->mn", {"m": 5, "k": 6, "n": 18}, None),  # A read by broadcast: no relayout
    ("nchw,oc->nohw", {"n": 1, "c": 6, "h": 3, "w": 5, "o": 4}, None),
])
def test_layout_starts_re_lay_inputs_read_across_the_output_columns(spec, sizes, relaid):
    problem = looprl.contraction(spec, **sizes)
    starts = layout_starts(problem)
    assert starts[0] == looprl.initial_nest(problem)
    if relaid is None:
        assert len(starts) == 1
        return
    assert len(starts) == 2
    assert {t: layout.key for t, layout in starts[1].layouts} == relaid
    # Each start's kernel, after random loop transforms, computes what numpy computes.
    rng = np.random.default_rng(0)
    for start in starts:
        nest = start
        for _ in range(4):
            i = int(rng.integers(len(nest.compute)))
            nest = nest.split(i, 4) if rng.random() < 0.5 and nest.compute[i].size > 4 else (nest.swap(i) if nest.why_not_swap(i) is None else nest)
        a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in problem.input_shapes)
        assert_matches(problem, looprl.compile(nest), a, b)


def test_the_joint_search_starts_a_share_of_its_budget_from_each_layout_start():
    problem = looprl.contraction("mk,nk->mn", m=24, k=16, n=40)
    result = looprl.search.run(problem, "greedy1", max_evaluations=24, layouts=True, cache=":memory:", measure_budget_s=0.001,
                               verify_s=None)
    assert result.settings["layout_starts"] == [n.key for n in layout_starts(problem)]
    assert result.evaluations <= 24
    assert all(b[2] > a[2] for a, b in zip(result.curve, result.curve[1:-1]))  # the best so far only rises
    if result.best_nest.layouts and dict(result.best_nest.layouts).get("in1", None) is not None and \
            dict(result.best_nest.layouts)["in1"].key.startswith("k1.n1"):
        assert result.actions == ()  # reached from the re-laid start: no action path from the untuned nest
    else:
        width = looprl.Target.default().vector_width  # the search's target
        assert replay(problem, result.actions, pad_multiple=width) == result.best_nest
    loops_only = looprl.search.run(problem, "greedy1", max_evaluations=24, cache=":memory:", measure_budget_s=0.001, verify_s=None)
    assert "layout_starts" not in loops_only.settings
