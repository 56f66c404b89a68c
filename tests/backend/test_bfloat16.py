"""bfloat16 problems: the dtype in the problem's name, the conversions, and every reachable
schedule's kernel against the exact contraction of the bfloat16 inputs, within the bound that
float32 accumulation and one rounding of the output imply (looprl.ir.dtypes.error_bound)."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.pairs import pairing
from looprl.ir.dtypes import BFLOAT16, FLOAT32, error_bound, from_bfloat16, to_bfloat16
from looprl.ir.nest import LoopNest
from looprl.measurement.pair_steps import with_pairs
from looprl.measurement.timing import time_kernel
from looprl.target import Target
from tests.guarded import GuardedArray
from tests.schedules import action_steps, pack_every_tiled_loop, walk

BF16 = "bfloat16"
PROBLEMS = [
    looprl.matmul(67, 100, 250, dtype=BF16),  # no split divides these
    looprl.matmul(67, 100, 251, constant="b", dtype=BF16),  # a weight: kernels take its reduction in pairs (an odd one: a half pair)
    looprl.contraction("mk,nk->mn", m=33, n=72, k=95, constant="in1", dtype=BF16),  # a linear layer (pairs when packed)
    looprl.matmul(64, 48, 32, dtype=BF16),
    looprl.matmul(1, 33, 7, dtype=BF16),
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19, dtype=BF16),  # a linear layer's x @ W.T
    looprl.contraction("mk,nk->mn", m=3, n=40, k=77, constant="in1", dtype=BF16),  # few rows, dot products
    looprl.contraction("bmk,bkn->bmn", b=3, m=17, k=9, n=35, dtype=BF16),
    looprl.contraction("mk,k->m", m=37, k=50, dtype=BF16),
    looprl.contraction("kn,mk->nm", k=13, m=17, n=40, dtype=BF16),
    looprl.contraction("abcd,cde->abe", a=3, b=4, c=5, d=6, e=17, dtype=BF16),
]
LAYOUT_KINDS = ("split", "split", "swap_down", "swap_up", "pack", "pad", "parallel")


def bf16_inputs(problem, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [to_bfloat16(rng.uniform(-scale, scale, size=shape)) for shape in problem.input_shapes]


def paired_walk(problem, steps, target):
    """The schedule a random walk reaches, as the producers of schedules hand it to the code
    generator: a bfloat16 weight paired where the kernel for ``target`` can take pairs."""
    return with_pairs(walk(problem, steps), target)


def reductions(problem) -> int:
    return int(np.prod([problem.size(d) for d in problem.reduction_dims]))


def assert_within_bound(problem, out_bits, a_bits, b_bits):
    a, b = from_bfloat16(a_bits), from_bfloat16(b_bits)
    exact = np.einsum(problem.spec, a.astype(np.float64), b.astype(np.float64))
    bound = error_bound(problem.spec, a, b, reductions(problem), problem.dtype)
    error = np.abs(from_bfloat16(out_bits).astype(np.float64) - exact)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert (error <= bound).all(), f"error {error[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


# -- the dtype in problems ---------------------------------------------------------------------
def test_the_dtype_is_part_of_the_name_and_parses_back():
    problem = looprl.contraction("mk,nk->mn", m=4, n=8, k=16, constant="in1", dtype=BF16).with_cold()
    assert problem.name.endswith(";cold;dtype=bfloat16")
    assert looprl.parse_problem(problem.name) == problem
    assert looprl.matmul(4, 8, 16).name == "mk,kn->mn:m=4,k=16,n=8"  # float32 names unchanged
    assert problem.with_epilogue(bias=True).dtype == BF16 and problem.with_cold(False).dtype == BF16
    assert problem.with_dtype("float32") == looprl.contraction("mk,nk->mn", m=4, n=8, k=16, constant="in1").with_cold()
    assert looprl.matmul(4, 8, 16, dtype=torch.bfloat16).dtype == BF16  # a torch dtype names it too
    assert problem.constant_bytes == 2 * 8 * 16 and problem.with_dtype("float32").constant_bytes == 4 * 8 * 16


@pytest.mark.parametrize("bad", ["float16", "bf16", "int8", None, 3])
def test_an_unknown_dtype_is_a_value_error_naming_the_choices(bad):
    with pytest.raises(ValueError, match="float32, bfloat16"):
        looprl.matmul(4, 8, 16, dtype=bad)
    with pytest.raises(ValueError, match="float32, bfloat16"):
        looprl.parse_problem(f"8x8x8;dtype={bad}" if bad is not None else "8x8x8;dtype=")


def test_rounding_to_bfloat16_is_torchs_to_nearest_ties_to_even():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                             np.float32([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.00390625, 1.01171875])])
    ours = to_bfloat16(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    assert np.isnan(from_bfloat16(to_bfloat16(np.float32([np.nan])))).all()
    assert np.array_equal(from_bfloat16(ours[:100]), torch.from_numpy(theirs[:100].view(np.int16)).view(torch.bfloat16).float().numpy())


# -- kernels -------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(kinds=LAYOUT_KINDS), seed=st.integers(0, 2**16))
def test_random_bfloat16_schedules_stay_within_the_derived_bound(problem, steps, seed):
    nest = paired_walk(problem, steps, Target.default())
    a, b = bf16_inputs(problem, seed)
    kernel = looprl.compile(nest, threads=2)
    assert_within_bound(problem, kernel(a, b), a, b)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), seed=st.integers(0, 2**8))
def test_every_tiled_loop_packed_in_bfloat16_stays_within_the_bound(problem, steps, seed):
    nest = with_pairs(pack_every_tiled_loop(walk(problem, steps), seed), Target.default())
    a, b = bf16_inputs(problem, seed)
    assert_within_bound(problem, looprl.compile(nest)(a, b), a, b)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps())
def test_bfloat16_on_avx2_widens_and_stays_within_the_bound(problem, steps):
    """AVX2 code (no bfloat16 instructions) widens bfloat16 to float32: the same answers' bound."""
    a, b = bf16_inputs(problem, 1)
    target = Target.named("avx2")
    assert_within_bound(problem, looprl.compile(paired_walk(problem, steps, target), target=target)(a, b), a, b)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(kinds=LAYOUT_KINDS), side=st.sampled_from(["start", "end"]),
       target=st.sampled_from(["host", "avx2"]))
def test_bfloat16_kernels_stay_in_bounds(problem, steps, side, target):
    """bfloat16 inputs and output flush against inaccessible pages: a stray (or too wide) access
    faults. (It found LLVM 22 storing a masked single lane of <16 x i16> as 4 bytes.)"""
    target = Target.resolve(target)
    kernel = looprl.compile(paired_walk(problem, steps, target), target=target)
    guards = [GuardedArray(shape, side, np.uint16) for shape in (*problem.input_shapes, problem.output_shape)]
    try:
        a, b, out = (g.array for g in guards)
        a[...], b[...] = bf16_inputs(problem, 2)
        kernel.run(a, b, out, reps=2)
        assert_within_bound(problem, out, a, b)
    finally:
        for g in guards:
            g.release()


def test_runtime_rows_bound_weights_and_cold_timing_in_bfloat16():
    problem = looprl.contraction("mk,nk->mn", m=16, n=72, k=100, constant="in1", dtype=BF16)
    nest = looprl.initial_nest(problem).split(2, 16).swap(1)
    assert nest.why_not_layout_pack("in1", "n", 16) is None
    packed = nest.layout_pack("in1", "n", 16)
    a, b = bf16_inputs(problem, 3)
    for schedule in (nest, packed):
        kernel = looprl.compile(schedule, runtime_rows=True)
        bound = kernel.bind(b=b)
        for rows in (1, 5, 16):
            out = bound(a[:rows])
            assert out.dtype == np.uint16 and out.shape == (rows, 72)
            assert_within_bound(problem.with_epilogue(None), out, a[:rows], b)
    cold = looprl.compile(packed.on_problem(problem.with_cold()))  # timed on rotating copies of the packed bfloat16 weight
    assert time_kernel(cold, budget_s=0.01).seconds > 0


def test_epilogues_run_in_float32_and_round_once():
    problem = looprl.contraction("mk,nk->mn", m=9, n=40, k=64, constant="in1", dtype=BF16).with_epilogue(bias=True, activation="gelu",
                                                                                                         residual=True)
    a, b = bf16_inputs(problem, 4)
    bias, residual = to_bfloat16(np.linspace(-1, 1, 40)), to_bfloat16(np.linspace(-2, 2, 9 * 40).reshape(9, 40))
    out = looprl.compile(looprl.initial_nest(problem).split(2, 16))(a, b, bias, residual)
    x = torch.from_numpy(from_bfloat16(a)).double() @ torch.from_numpy(from_bfloat16(b)).double().T + torch.from_numpy(from_bfloat16(bias)).double()
    expected = torch.nn.functional.gelu(x) + torch.from_numpy(from_bfloat16(residual)).double()
    # the contraction's bound (through gelu, whose slope is at most 1.13), the epilogue's float32
    # steps, then one rounding of the result to bfloat16
    contraction = error_bound(problem.spec, from_bfloat16(a), from_bfloat16(b), 64, "float32")
    bound = 1.13 * contraction + 2e-6 * (np.abs(x.numpy()) + 2) + 2.0 ** -8 * np.abs(expected.numpy())
    assert (np.abs(from_bfloat16(out) - expected.numpy()) <= bound).all()


@pytest.mark.target_dependent
@pytest.mark.parametrize("target", ["host", "avx2"])
@pytest.mark.parametrize("k", [768, 77])
def test_a_packed_weight_is_paired_and_its_tile_uses_vdpbf16ps_where_the_host_has_it(target, k):
    """The linear layer's register tile of the shipped plans (a packed panel of 48 columns, 9
    rows): its weight stored with pairs of the reduction innermost; ``vdpbf16ps`` where the
    target has AVX512_BF16, else each pair split into two FMAs; an odd reduction ends in a half
    pair (its empty partner place holds garbage that must not reach the sum)."""
    target = Target.named(target)
    if target.missing_on_host():
        pytest.skip(f"this host cannot run {target.isa} code")
    problem = looprl.contraction("mk,nk->mn", m=40, n=100, k=k, constant="in1", dtype=BF16)
    nest = with_pairs(LoopNest.from_key(problem, f"n2s48t4,m4s9t4,k{k}s1,m9s1,n48s1|m40s1,n100s1|in1=n48.k1.n1%48"), target)
    paired = pairing(nest, target)
    assert paired is not None and paired.layout.key == "n48.k2.n1%48.k1%2" and paired.var == "k"
    assert paired.dot == target.bfloat16_dot
    kernel = looprl.compile(nest, target=target)
    assert ("vdpbf16ps" in kernel.assembly()) == paired.dot
    a, b = bf16_inputs(problem, 5)
    bound = kernel.bind(b=b)
    bound._buffers["in1"][...] = np.uint16(0x7FC0)  # every place NaN, then the weight packed over it
    kernel._packers["looprl_pack_in1"](b.ctypes.data, bound._buffers["in1"].ctypes.data)
    assert_within_bound(problem, bound(a), a, b)
    assert pairing(nest.on_problem(problem.with_dtype("float32")), target) is None
    weights_change = looprl.contraction("mk,nk->mn", m=40, n=100, k=k, dtype=BF16)  # a weight converted per call would cost as much as the product
    assert pairing(nest.on_problem(weights_change), target) is None


@pytest.mark.target_dependent
@pytest.mark.parametrize("k", [4096, 77, 33])
def test_few_row_dot_products_read_pairs_on_a_bfloat16_host(k):
    """A decode layer's weight read as stored (``[n, k]``, the reduction innermost in both
    inputs): partial sums of vdpbf16ps over 32 values a vector where the host has AVX512_BF16
    (the last vector masked: its missing values read as zeros in both inputs); widened
    elsewhere."""
    problem = looprl.contraction("mk,nk->mn", m=3, n=40, k=k, constant="in1", dtype=BF16)
    nest = looprl.initial_nest(problem).swap(1)  # m, n, k: k innermost
    a, b = bf16_inputs(problem, 6)
    for target in (Target.host(), Target.named("avx2")):
        if target.missing_on_host():
            continue
        kernel = looprl.compile(nest, target=target)
        assert kernel.plan.dot_pairs == ("vdpbf16ps" in kernel.assembly()) == target.bfloat16_dot
        assert_within_bound(problem, kernel(a, b), a, b)


@pytest.mark.target_dependent
def test_a_bfloat16_dot_tile_takes_twice_the_width_of_the_reduction_per_vector_where_pairs_run():
    """The dot-product plans (a decode layer's weight read as stored) split the reduction by the
    elements one vector of partial sums takes: 32 bfloat16 values on vdpbf16ps (a 16-wide split
    would leave every pair vector half masked), the width elsewhere."""
    from looprl.ir.schedules import dot_steps

    layer = looprl.linear(1, 768, 96, bias=False, dtype=BF16)
    for target in (Target.host(), Target.named("avx2")):
        nest = looprl.initial_nest(layer).apply(dot_steps(layer, target, 1, 4))
        inner = [lp for lp in nest.compute if lp.var == "k"][-1]
        assert inner.step == 1 and inner.size == (2 if target.bfloat16_dot else 1) * target.vector_width
        assert inner.size == BFLOAT16.reduction_lanes(target) and FLOAT32.reduction_lanes(target) == target.vector_width
        if not target.missing_on_host():
            a, b = bf16_inputs(layer, 8)
            assert_within_bound(layer, looprl.compile(nest, target=target)(a, b), a, b)


def test_kernels_of_bfloat16_problems_refuse_float32_arrays_by_name():
    problem = looprl.matmul(4, 8, 16, dtype=BF16)
    kernel = looprl.compile(looprl.initial_nest(problem))
    a, b = bf16_inputs(problem, 0)
    with pytest.raises(ValueError, match="first input must have dtype uint16 .*bfloat16"):
        kernel(from_bfloat16(a), b)
    with pytest.raises(ValueError, match="output must have dtype uint16"):
        kernel.run(a, b, np.zeros((4, 8), np.float32))
    f32 = looprl.compile(looprl.initial_nest(problem.with_dtype("float32")))
    with pytest.raises(ValueError, match="second input must have dtype float32"):
        f32(from_bfloat16(a), b)


# -- the environment -------------------------------------------------------------------------
def test_the_env_takes_bfloat16_problems_and_says_so_in_the_observation():
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make("LoopNest-v0", problems=["64x48x96"], dtype=BF16, cache=":memory:", peak=100.0, measure_budget_s=0.001).unwrapped
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert env.problem.dtype == BF16 and info["problem"].endswith(";dtype=bfloat16")
    compute = [lp.nest == "compute" for lp in env.nest.loops]
    assert list(obs[: len(compute), 3]) == [0.5 if c else 0.0 for c in compute]
    _, _, _, _, info = env.step(env.action_names.index("split_16"))
    assert info["valid"] and info["gflops"] > 0  # a bfloat16 kernel compiled and measured
    assert env.reset(options={"problem": "32x32x32"})[1]["problem"].endswith(";dtype=bfloat16")  # the env's dtype
    mixed = gymnasium.make("LoopNest-v0", problems=["64x48x96", "mk,kn->mn:m=32,k=64,n=48;dtype=bfloat16"], cache=":memory:",
                           measure_budget_s=0.001).unwrapped
    assert set(mixed.peaks) == {"float32", BF16}
    first = mixed.reset(seed=0)[0]
    assert mixed.problem.dtype == "float32" and first[0, 3] == 1.0 and mixed.peak == mixed.peaks["float32"]
    mixed.reset()
    assert mixed.problem.dtype == BF16 and mixed.peak == mixed.peaks[BF16]
    with pytest.raises(ValueError, match="dtype"):
        gymnasium.make("LoopNest-v0", problems=["64x48x96"], dtype="float16", cache=":memory:", peak=1.0)


@pytest.mark.target_dependent
def test_the_bfloat16_peak_counts_two_products_per_lane_where_vdpbf16ps_runs():
    from looprl.backend.peak_kernel import flops_per_step, peak_ir
    from looprl.measurement.peak import peak_gflops

    for target in (Target.host(), Target.named("avx512"), Target.named("avx2")):
        dot = target.bfloat16_dot
        assert flops_per_step(target, BF16) == (2 if dot else 1) * flops_per_step(target) == (4 if dot else 2) * target.vector_width
        assert ("dpbf16ps" in peak_ir(target, 8, dtype=BF16)) == dot and "dpbf16ps" not in peak_ir(target, 8)
    cache = looprl.MeasurementCache(":memory:")
    cache.put_peak(123.0)
    assert peak_gflops(target="avx2", cache=cache, dtype=BF16) == peak_gflops(target="avx2", cache=cache)  # no vdpbf16ps: the float32 peak
    if Target.default().bfloat16_dot:  # peak_gflops's target when none is given
        cache.put_peak(456.0, dtype=BF16)
        assert (peak_gflops(cache=cache), peak_gflops(cache=cache, dtype=BF16)) == (123.0, 456.0)  # cached apart


def test_amx_is_refused_with_a_reason_on_any_host():
    with pytest.raises(ValueError, match="AMX tiles .* no AMX host was at hand .* amx-bf16"):
        Target.named("amx")
    with pytest.raises(ValueError, match="AMX"):
        looprl.compile(looprl.initial_nest(looprl.matmul(4, 4, 4, dtype=BF16)), target="amx")


@pytest.mark.target_dependent
def test_tune_measures_a_bfloat16_weights_tiles_packed_and_the_policy_alone_offers_its_packed_answer(monkeypatch):
    """A bfloat16 weight is re-laid once into pairs whatever the schedule: its tiles are measured
    with it packed into panels (contiguous pairs), and the policy alone times its answer packed
    too (the shipped policies learnt on float32, where a weight re-laid whole streams as well)."""
    from looprl.measurement.evaluator import Evaluator
    from looprl.search.context import SearchContext
    from looprl.actions import ActionSet
    from looprl.ir.rewrites import relaid
    from looprl.measurement.evaluator import Measurement
    from looprl.backend.pairs import pairs_a_weight
    from looprl.search.tiles import measure_tiles

    layer = looprl.linear(16, 512, 384, bias=False, dtype=BF16)
    assert pairs_a_weight(layer) and not pairs_a_weight(layer.with_dtype("float32"))
    assert not pairs_a_weight(looprl.matmul(16, 384, 512, dtype=BF16))  # the second input changes per call
    timed = []
    original = Evaluator.__call__
    monkeypatch.setattr(Evaluator, "__call__", lambda self, nest: timed.append(nest) or original(self, nest))
    result = looprl.tune(layer, threads=1, cache=":memory:", measure=False)
    panels = ["%" in (dict(nest.layouts).get("in1").key if dict(nest.layouts).get("in1") else "") for nest in timed]
    assert len(timed) >= 2 and panels[-1]  # the answer packed was timed too (from the re-laid start tune searches); the faster kept
    a, b = bf16_inputs(layer, 7)
    assert_within_bound(layer, result.kernel(a, b), a, b)
    measured = []
    monkeypatch.setattr(SearchContext, "measure", lambda self, nest, force=False: measured.append(nest) or Measurement(1.0 + len(measured), from_cache=False))
    target = Target.default()  # what tune compiles for (LOOPRL_TARGET, else the host)
    actions = ActionSet.for_target(target, layouts=True)
    coordinates = relaid(layer).coordinates  # the re-laid start as tune searches it: [k, n]
    for problem in (layer, coordinates, coordinates.with_cold()):
        measured.clear()
        measure_tiles(SearchContext(problem, actions, Evaluator(":memory:", target=target)), actions)
        schedules = [with_pairs(nest, target) for nest in measured]  # what the context compiles for each (SearchContext.schedule)
        assert schedules and all(pairing(nest, target) is not None and "%" in dict(nest.layouts)["in1"].key for nest in schedules)


@pytest.mark.target_dependent
def test_the_policy_alone_times_its_best_register_tile_where_its_answer_is_a_bfloat16_dot_tile(monkeypatch):
    """Where the greedy answer for a paired bfloat16 weight is a dot-product tile, the policy's
    greedy episode without dot tiles is timed too, and packed (a paired register tile computes
    at twice the float32 rate, which a float32-trained policy does not know)."""
    import dataclasses

    from looprl.ir.plans import Plan, planned
    from looprl.measurement.evaluator import Evaluator
    from looprl.policy import rollout as rollout_module
    from looprl.tune import proposers as tuner_module

    target = Target.default()  # what tune compiles for (LOOPRL_TARGET, else the host)
    if not target.bfloat16_dot:
        pytest.skip(f"needs vdpbf16ps (AVX512_BF16) on the default target; it is {target.isa}, "
                    "whose shipped policy has no dot-product tiles")
    layer = looprl.linear(16, 256, 96, bias=False, dtype=BF16)
    real = rollout_module.greedy_rollout
    dot = next(name for name in tuner_module.policy_actions(tuner_module.load_policy("default", target, weights=True),
                                                            target).names if (p := Plan.parse(name)) is not None and p.dot)
    episodes = []

    def dot_first(policy, problem, observe, episode_length=None, excluded=frozenset()):
        found = real(policy, problem, observe, episode_length=episode_length, excluded=excluded)
        episodes.append(excluded)
        if dot in excluded:
            return found
        forced = planned(problem, target, Plan.parse(dot))  # on the weight as stored (re-laid [k, n] it has no dot tile)
        if isinstance(forced, str):
            return found
        return dataclasses.replace(found, final=dataclasses.replace(found.final, nest=forced, actions=(dot,)))

    timed = []
    original = Evaluator.__call__
    monkeypatch.setattr(Evaluator, "__call__", lambda self, nest: timed.append(nest) or original(self, nest))
    monkeypatch.setattr(tuner_module, "greedy_rollout", dot_first)
    result = looprl.tune(layer, threads=1, cache=":memory:", measure=False)
    assert any(dot in excluded for excluded in episodes)  # the episode without dot tiles ran
    assert any(pairing(nest, target) is not None for nest in timed)  # a paired register tile was timed
    a, b = bf16_inputs(layer, 9)
    assert_within_bound(layer, result.kernel(a, b), a, b)
