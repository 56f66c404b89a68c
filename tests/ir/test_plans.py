"""Plan actions (looprl.ir.plans): whole tiled schedules as one action each, correct on any
size, in bounds, and replayable like any other action."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.actions import Action, ActionSet, State, replay
from looprl.ir.plans import Plan, plan_catalogue, plan_nest, why_not_plan
from looprl.ir.register_tiles import tile_of, tile_shapes
from looprl.target import Target
from tests.conftest import examples
from tests.guarded import GuardedArray
from tests.backend.test_codegen_correctness import assert_matches, random_inputs, reference

pytestmark = pytest.mark.target_dependent  # the plans are the target's register tiles

AVX2, AVX512 = Target.named("avx2"), Target.named("avx512")


def problems():
    """Matmuls, batched products (A @ B and A @ B.T) and few-row products of sizes no tile divides."""
    sizes = st.integers(1, 70)
    plain = st.builds(looprl.matmul, sizes, sizes, st.integers(1, 700))
    batched = st.builds(lambda b, m, n, k, spec: looprl.contraction(spec, b=b, m=m, n=n, k=k), st.integers(1, 3), sizes, sizes,
                        st.integers(1, 90), st.sampled_from(["bmk,bkn->bmn", "bmk,bnk->bmn"]))
    decode = st.builds(lambda m, n, k: looprl.matmul(m, n, k), st.integers(1, 8), st.integers(17, 300), st.integers(9, 600))
    return st.one_of(plain, batched, decode)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), target=st.sampled_from([AVX2, AVX512]), named_for=st.sampled_from([AVX2, AVX512]),
       choice=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_every_plan_of_any_problem_computes_what_numpy_computes(problem, target, named_for, choice, seed):
    """Plans of either target's catalogue (a policy made for AVX-512 may tune for AVX2: its
    14-row tiles then outgrow AVX2's registers), compiled for either target."""
    if target.missing_on_host():
        target = Target.host()
    plans = [plan for plan in plan_catalogue(named_for) if why_not_plan(problem, target, plan) is None]
    if not plans:
        return
    plan = plans[choice % len(plans)]
    nest = plan_nest(problem, target, plan)
    a, b = random_inputs(problem, seed)
    assert_matches(problem, looprl.compile(nest, target=target), a, b)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), choice=st.integers(0, 10**6), side=st.sampled_from(["start", "end"]))
def test_plan_kernels_stay_in_bounds(problem, choice, side):
    target = Target.default()  # what compile generates for when given none
    plans = [plan for plan in plan_catalogue(target) if why_not_plan(problem, target, plan) is None]
    if not plans:
        return
    kernel = looprl.compile(plan_nest(problem, target, plans[choice % len(plans)]))
    guards = [GuardedArray(shape, side) for shape in (*problem.input_shapes, problem.output_shape)]
    try:
        a, b, out = (g.array for g in guards)
        a[...], b[...] = random_inputs(problem, 1)
        kernel.run(a, b, out, reps=2)
        np.testing.assert_allclose(out, reference(problem, a, b), atol=1e-3)
    finally:
        for g in guards:
            g.release()


def test_the_catalogue_names_the_target_s_tiles_blocks_packing_and_streams():
    names = [plan.name for plan in plan_catalogue(AVX2)]
    rows_vectors = AVX2.register_tiles()
    assert names[:6] == [f"plan_{r}x{v}{k}{p}" for r, v in rows_vectors[:1] for k in ("", "_k256", "_k512") for p in ("", "_pack")]
    assert len(names) == 6 * len(rows_vectors) + 3 + 5 and len(set(names)) == len(names)
    assert names[-8:-5] == ["plan_stream_8x16", "plan_stream_8x64", "plan_stream_4x64"]
    # AVX2's 16 registers: 8 columns of partial sums for one row, 5 for two rows, 3 for four
    assert names[-5:] == ["plan_dot_1x8", "plan_dot_1x4", "plan_dot_2x5", "plan_dot_2x4", "plan_dot_4x3"]
    assert all(Plan.parse(name).name == name for name in names)
    for bad in ("plan_6x2_k300", "plan_0x2", "plan_6x2_pack_k256", "plan_stream_8x64_pack", "plan_", "split_4", 7, "plan_dot_0x4", "plan_dot_1x4_pack"):
        assert Plan.parse(bad) is None


def test_a_plan_is_the_tile_tune_measures_clipped_to_few_rows():
    problem = looprl.matmul(300, 600, 700)
    rows, vectors = AVX2.register_tiles()[0]
    nest = plan_nest(problem, AVX2, Plan(rows, vectors))
    assert tile_of(nest) == tile_shapes(problem, AVX2)[0] == (rows, vectors * 8)
    few = looprl.matmul(3, 600, 700)  # 3 rows: the tile keeps them all and widens
    assert tile_of(plan_nest(few, AVX2, Plan(rows, vectors))) == (3, AVX2.most_vectors(3) * 8)
    packed = plan_nest(problem, AVX2, Plan(rows, vectors, packed=True))
    assert packed.layouts and packed.compute == nest.compute
    blocked = plan_nest(problem, AVX2, Plan(rows, vectors, k_block=256))
    assert len(blocked.compute) == len(nest.compute) + 2 and any(loop.step == 256 for loop in blocked.compute)


def test_plans_that_do_not_fit_the_problem_say_why():
    small = looprl.matmul(64, 64, 64)
    assert "too small" in why_not_plan(small, AVX2, Plan(6, 2, k_block=256))
    assert "at most 8 output rows" in why_not_plan(small, AVX2, Plan(8, 64, stream=True))
    assert "two output dimensions" in why_not_plan(looprl.contraction("mk,k->m", m=9, k=9), AVX2, Plan(6, 2))
    with pytest.raises(ValueError, match="too small"):
        plan_nest(small, AVX2, Plan(6, 2, k_block=512))
    for bad in ({"rows": 0, "vectors": 2}, {"rows": 6, "vectors": 2, "k_block": 100}, {"rows": 8, "vectors": 64, "stream": True, "packed": True}):
        with pytest.raises(ValueError):
            Plan(**bad)


def test_plan_actions_apply_from_any_state_replay_and_refuse_a_no_op():
    problem = looprl.matmul(130, 600, 600)
    actions = ActionSet.for_target(AVX2, plans=True)
    assert actions.names[-len(actions.plans):] == actions.plans and actions.plans == tuple(p.name for p in plan_catalogue(AVX2))
    tiled = actions.index("plan_6x2_k256_pack")
    root = State(looprl.initial_nest(problem), 0)
    moved = actions.apply(actions.apply(root, actions.index("down")), actions.index("split_4"))
    for start in (root, moved):  # built from the untiled nest whatever the state
        after = actions.apply(start, tiled)
        assert after.nest == plan_nest(problem, AVX2, Plan(6, 2, 256, True)) and after.cursor == 0
    assert "already" in actions.why_not(after, tiled) and actions.apply(after, tiled) is None
    assert "too small" in actions.why_not(State(looprl.initial_nest(looprl.matmul(64, 64, 64)), 0), tiled)
    transitions = replay(ActionSet.covering(["down", "plan_6x2_k256_pack"], target=AVX2), root, float("nan"), ["down", "plan_6x2_k256_pack"])
    assert transitions[-1].state.nest == after.nest
    assert Action.parse("plan_4x3").name == "plan_4x3" and Action.parse("plan_9x9x9") is None


def test_plans_need_a_target_and_known_names():
    with pytest.raises(ValueError, match="need the target"):
        ActionSet(plans=("plan_6x2",))
    with pytest.raises(ValueError, match="unknown plan"):
        ActionSet.for_target(AVX2, plans=("plan_6x2_k7",))
    with pytest.raises(ValueError, match="distinct"):
        ActionSet.for_target(AVX2, plans=("plan_6x2", "plan_6x2"))
    with pytest.raises(ValueError, match="plans"):
        ActionSet.for_target(AVX2, plans="plan_6x2")


def test_the_env_offers_plan_actions_and_a_plan_step_measures_the_whole_schedule(tmp_path):
    from looprl.env import LoopNestEnv

    env = LoopNestEnv(problems=["mk,kn->mn:m=64,k=64,n=64"], target="avx2", plans=True, cache=str(tmp_path / "c.sqlite"),
                             measure_budget_s=0.002)
    _, before = env.reset(seed=0)
    index = env.actions.index("plan_6x2")
    _, reward, _, _, info = env.step(index)
    # The whole tiled schedule measured in one step: the reward is its GFLOPS against the
    # untuned nest's (its sign is the machine's to decide; a loaded host can time either slow).
    assert tile_of(env.state.nest) == (6, 16) and info["valid"] and info["gflops"] > 0
    assert reward == pytest.approx((info["gflops"] - before["gflops"]) / info["peak"])
    _, reward, _, _, info = env.step(index)  # the same plan again: nothing changes
    assert reward == 0 and not info["valid"]


class _Timings:
    """An evaluator whose GFLOPS are given per schedule (the plan that built it), for the demonstration rule."""

    def __init__(self, problem, target, by_plan, untuned=1.0):
        self.target = target
        self.by_key = {plan_nest(problem, target, Plan.parse(name)).key: value for name, value in by_plan.items()}
        self.untuned_key = looprl.initial_nest(problem).key
        self.untuned = untuned

    def __call__(self, nest):
        from types import SimpleNamespace

        gflops = self.untuned if nest.key == self.untuned_key else self.by_key.get(nest.key, 0.5)
        return SimpleNamespace(ok=True, gflops=gflops)


def test_a_plan_demonstration_is_the_first_plan_within_three_percent_of_the_fastest():
    from looprl.train.demonstrations import demonstrate, demonstration_pairs

    problem = looprl.matmul(130, 600, 600)
    actions = ActionSet.for_target(AVX2, plans=True)
    timings = _Timings(problem, AVX2, {"plan_4x3": 50.0, "plan_6x2_k256": 60.0, "plan_6x2_k512_pack": 61.0, "plan_2x4": 61.5})
    demo = demonstrate(problem, actions, timings, episode_length=6)
    assert [actions.names[a] for a in demo.actions] == ["plan_6x2_k256"] and demo.gflops == 60.0  # 60 >= 0.97 * 61.5, first in order
    observations, labels = demonstration_pairs(demo, actions, normalized=True)
    assert len(labels) == 2 and actions.names[labels[0]] == "plan_6x2_k256"
    assert not actions.can_apply(actions.apply(State(looprl.initial_nest(problem), 0), labels[0]), labels[1])  # then stay
    slower = _Timings(problem, AVX2, {}, untuned=100.0)  # no plan beats the untuned nest: stay there
    assert demonstrate(problem, actions, slower, episode_length=6).actions == ()


def test_a_policy_cloned_on_plans_tunes_through_them_and_its_answer_replays(tmp_path):
    from looprl.policy.rollout import policy_actions
    from looprl.train.demonstrations import pretrain_policy

    # 48x256x256, not 48x64x64: there the untuned nest ran at 0.58x the tuned answer on a Zen 3 (AVX2), close enough
    # that on a busy machine the planner once kept it and the clone learnt to stay; here 0.39x.
    target = Target.default()
    agent = {"algorithm": "dqn", "env": {"problems": ["mk,kn->mn:m=48,k=256,n=256", "mk,kn->mn:m=4,k=600,n=600"], "plans": True,
                                         "episode_length": 4, "measure_budget_s": 0.002, "cache": str(tmp_path / "c.sqlite"),
                                         "observation": "normalized", "target": target.isa},
             "model": {"fcnet_hiddens": [32]}, "pretrain": {"epochs": 150}}
    policy = pretrain_policy(agent, 0, lambda *_: None, tmp_path)
    assert policy.metadata["plans"] == [plan.name for plan in plan_catalogue(target)]
    assert policy_actions(policy, target).names == policy.action_names
    folder = policy.save(tmp_path / "policy")
    for name in agent["env"]["problems"]:
        alone = looprl.tune(name, folder, measure=False, cache=str(tmp_path / "c.sqlite"))
        assert alone.actions and alone.actions[0].startswith("plan_")  # the clone's first decision is a plan
        measured = looprl.tune(name, folder, budget_s=0.3, cache=str(tmp_path / "c.sqlite"), remember=False, threads=1)
        transitions = replay(measured.action_set, State(looprl.initial_nest(measured.tuned_as or measured.problem), 0), float("nan"),
                             measured.actions)
        assert (transitions[-1].state.nest if transitions else looprl.initial_nest(measured.problem)) == measured.nest
        a, b = random_inputs(measured.problem, 3)
        assert_matches(measured.problem, measured.kernel, a, b)


def test_a_plan_of_another_target_has_the_counterpart_of_the_same_role():
    """counterpart: the tile with as many vectors per row (the nearest count where none has
    as many), the same cache block and packing; streams and plans already there map to themselves."""
    from looprl.ir.plans import counterpart

    avx2, avx512 = plan_catalogue(AVX2), plan_catalogue(AVX512)
    assert counterpart(Plan.parse("plan_14x2_k256_pack"), avx2) == Plan.parse("plan_6x2_k256_pack")
    assert counterpart(Plan.parse("plan_9x3"), avx2) == Plan.parse("plan_4x3")
    assert counterpart(Plan.parse("plan_4x6_pack"), avx2) == Plan.parse("plan_2x4_pack")  # no 6-vector tile on AVX2: 4
    assert counterpart(Plan.parse("plan_2x4_k512"), avx512) == Plan.parse("plan_6x4_k512")
    assert counterpart(Plan.parse("plan_stream_8x64"), avx2) == Plan.parse("plan_stream_8x64")
    assert counterpart(Plan.parse("plan_6x2"), avx2) == Plan.parse("plan_6x2")
    with pytest.raises(ValueError, match="makes the decision"):
        counterpart(Plan.parse("plan_stream_8x16"), [p for p in avx2 if not p.stream])


@pytest.mark.parametrize("source, target", [(AVX512, AVX2), (AVX2, AVX512)])
def test_a_plan_policy_adapted_to_another_target_gets_that_target_s_plans(source, target):
    """``looprl-train --adapt`` to another ISA first gives the policy the target's plans: each
    new plan's score is the old counterpart's, the other actions' scores and the value head
    unchanged, and the adaptation agent and action set are the target's."""
    from looprl.ir.plans import counterpart
    from looprl.policy.loading import load_policy
    from looprl.policy.retarget import needs_retargeting, retargeted
    from looprl.policy.rollout import policy_actions
    from looprl.train.adapt import adaptation_agent
    from looprl.train.config import agent_actions

    policy = load_policy("default", source)
    moved = retargeted(policy, target)
    catalogue = [plan.name for plan in plan_catalogue(target) if not plan.dot]  # the shipped policies know no dot-product plan
    assert needs_retargeting(policy, target) and not needs_retargeting(moved, target)
    assert moved.metadata["plans"] == catalogue and moved.target.isa == target.isa
    assert moved.metadata["retargeted"]["from_target"] == source.isa
    assert policy_actions(moved, target).names == moved.action_names
    assert adaptation_agent(moved, target)["env"]["plans"] == catalogue
    assert agent_actions(adaptation_agent(moved, target), target).names == moved.action_names
    observations = np.random.default_rng(0).random((5, *policy.observation_shape), dtype=np.float32)
    old, new = policy.scores(observations), moved.scores(observations)
    for i, name in enumerate(moved.action_names):
        plan = Plan.parse(name)
        source_name = name if plan is None else counterpart(plan, [Plan.parse(n) for n in policy.metadata["plans"]]).name
        np.testing.assert_allclose(new[:, i], old[:, policy.action_names.index(source_name)], rtol=1e-5, atol=1e-6)  # BLAS may round apart
    for head in set(policy.heads) - {policy.metadata["network"]["greedy"]}:
        assert moved.heads[head] is policy.heads[head]
    assert retargeted(moved, target) is moved and retargeted(policy, source) is policy


def test_a_plan_policy_s_prior_is_its_episode_then_its_other_plans_as_it_ranks_them():
    """AutoTVM's first batch from a plan policy (PolicyPrior): the greedy episode's schedules,
    then every other plan that applies, in the order of the policy's scores at the untuned nest."""
    from looprl.env.observation import observation
    from looprl.policy.loading import load_policy
    from looprl.policy.rollout import greedy_rollout, greedy_schedules, policy_actions

    policy = load_policy("default", AVX2)
    problem = looprl.matmul(130, 600, 600)
    actions = policy_actions(policy, AVX2)
    root = State(looprl.initial_nest(problem), 0)
    schedules = greedy_schedules(policy, problem, AVX2)
    applicable = {actions.apply(root, i).nest.key for i, a in enumerate(actions.actions) if a.kind == "plan" and actions.can_apply(root, i)}
    assert applicable <= {nest.key for nest in schedules} and len({n.key for n in schedules}) == len(schedules)
    scores = policy.scores(observation(root.nest, 0, actions.max_loops, True))
    plan_order = [i for i, a in enumerate(actions.actions) if a.kind == "plan" and actions.can_apply(root, i)]
    ranked = [actions.apply(root, i).nest.key for i in sorted(plan_order, key=lambda i: -scores[i])]
    episode = greedy_rollout(policy, problem, None)
    head = {t.state.nest.key for t in replay(actions, root, float("nan"), episode.final_actions) if t.valid} - {root.nest.key}
    rest = [key for key in dict.fromkeys(ranked) if key not in head]
    assert len(schedules) == len(head) + len(rest) and [nest.key for nest in schedules[len(head):]] == rest


def test_tune_with_a_plan_policy_made_for_another_isa_acts_with_this_isa_s_plans(tmp_path, monkeypatch):
    """looprl.tune(policy=<the AVX-512 default>, target=avx2): the policy's episode chooses among
    AVX2's plans (no AVX-512 tile spilling on 16 registers), with a warning that says so."""
    from looprl.tune import proposers as tuner
    from looprl.policy.loading import default_policy_dir

    monkeypatch.setattr(tuner, "_warned_mismatch", set())  # said once per process: whatever ran before

    problem = looprl.matmul(96, 200, 300)
    with pytest.warns(RuntimeWarning, match="mapped to avx2's"):
        alone = looprl.tune(problem, default_policy_dir(AVX512), measure=False, target=AVX2, cache=str(tmp_path / "c.sqlite"))
    plans = [name for name in alone.actions if name.startswith("plan_")]
    assert plans and set(plans) <= {plan.name for plan in plan_catalogue(AVX2)}
    assert set(alone.action_set.plans) <= {plan.name for plan in plan_catalogue(AVX2)}  # the set that replays the answer
    a, b = random_inputs(alone.problem, 1)
    assert_matches(alone.problem, alone.kernel, a, b)


def test_autotvm_s_prior_from_a_plan_policy_made_for_another_isa_ranks_this_isa_s_plans():
    from looprl.policy.loading import load_policy
    from looprl.policy.retarget import retargeted
    from looprl.policy.rollout import PolicyPrior, greedy_schedules

    policy = load_policy("default", AVX512)
    problem = looprl.matmul(100, 300, 200)
    schedules = PolicyPrior(policy, AVX2)(problem)
    assert [n.key for n in schedules] == [n.key for n in greedy_schedules(retargeted(policy, AVX2), problem, AVX2)]
    assert {n.key for n in schedules} >= {plan_nest(problem, AVX2, plan).key for plan in plan_catalogue(AVX2)[:2]}
