"""Measured tune as a policy-guided search; policies that know their target and observation kind."""

import json
import warnings

import numpy as np
import pytest

import looprl
from looprl.actions import ActionSet, reach
from looprl.search.context import SearchContext
from looprl.env.observation import observation
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator
from looprl.policy import loading
from looprl.policy.guided import guided_search
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout
from looprl.tune.winner import CONTENDER_WITHIN
from looprl.ir.nest import initial_nest
from tests.policies import random_policy

PROBLEM = looprl.matmul(96, 80, 112)


def test_guided_tune_is_never_slower_than_the_greedy_rollout_or_the_untuned_nest():
    for seed in range(3):
        cache = MeasurementCache(":memory:")
        policy = random_policy(seed=seed)
        result = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.3, measure_budget_s=0.001, remember=False)
        evaluator = Evaluator(cache, 0.001, samples=1)
        rollout = greedy_rollout(policy, PROBLEM, evaluator)  # on the same cache: the same values
        assert result.greedy_gflops is not None and result.greedy_gflops >= result.initial_gflops
        # Below the rollout's best figure only where that one was a contender and lost the paired rounds.
        assert result.gflops >= CONTENDER_WITHIN * result.greedy_gflops
        assert result.gflops >= CONTENDER_WITHIN * rollout.best_gflops * 0.999  # cached values only grow with samples
        assert result.gflops == pytest.approx(cache.get(result.nest, budget_s=0.001, threads=result.threads))


def test_guided_search_measures_more_than_the_rollout_and_respects_its_deadline():
    import time

    policy = random_policy(seed=1)
    evaluator = Evaluator(":memory:", 0.001, samples=1)
    rollout = greedy_rollout(policy, PROBLEM, evaluator)
    context = SearchContext(PROBLEM, ActionSet(), evaluator, budget_s=10)
    guided = guided_search(policy, context, depth=3, start=(rollout.best_actions, rollout.best_gflops))
    assert guided.best_gflops >= rollout.best_gflops and guided.measured > 0 and guided.stopped in ("depth", "exhausted")
    late = guided_search(policy, SearchContext(PROBLEM, ActionSet(), Evaluator(":memory:", 0.001, samples=1), budget_s=0))  # already past
    assert late.stopped == "deadline" and late.measured == 1  # only the untuned nest


def test_a_tuned_problem_is_remembered_per_target_and_budget(tmp_path):
    cache = str(tmp_path / "c.sqlite")
    policy = random_policy(seed=2)
    first = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001)
    again = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001)
    assert first.mode == "measured" and again.mode == "remembered"
    assert again.nest == first.nest and again.gflops == first.gflops and again.measured == 0
    assert looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.4, measure_budget_s=0.001).mode == "measured"  # more budget
    other = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001, target="sse4")
    assert other.mode == "measured" and other.target.isa == "sse4" and other.kernel.target.isa == "sse4"
    assert looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001, remember=False).mode == "measured"


def test_an_answer_remembered_by_another_version_of_tune_is_not_returned(tmp_path, monkeypatch):
    import importlib

    tune_module = importlib.import_module("looprl.tune.store")  # the module, not the function it exports

    cache = str(tmp_path / "c.sqlite")
    policy = random_policy(seed=2)
    monkeypatch.setattr(tune_module, "TUNER", "tune-v1")  # an older looprl stored this answer
    assert looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001).mode == "measured"
    assert looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001).mode == "remembered"
    monkeypatch.setattr(tune_module, "TUNER", "tune-v2")  # the upgrade tunes again
    assert looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.2, measure_budget_s=0.001).mode == "measured"


def test_budget_zero_is_the_rollout_alone():
    policy = random_policy(seed=4)
    cache = MeasurementCache(":memory:")
    result = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0, measure_budget_s=0.001, remember=False, threads=1)
    rollout = greedy_rollout(policy, PROBLEM, Evaluator(cache, 0.001, samples=1))
    assert result.nest == rollout.best_nest and result.actions == rollout.best_actions


@pytest.mark.parametrize("budget", [-1, float("nan"), float("inf"), "1", True])
def test_bad_budgets_are_value_errors(budget):
    with pytest.raises(ValueError, match="budget_s"):
        looprl.tune(PROBLEM, random_policy(), cache=":memory:", budget_s=budget)


def test_a_policy_records_its_target_and_a_bad_one_is_refused(tmp_path):
    avx2 = looprl.Target.named("avx2")
    folder = random_policy(target=avx2).save(tmp_path / "p")
    assert Policy.load(folder).target == avx2
    assert random_policy().target is None  # an older file: unknown
    meta = json.loads((folder / "policy.json").read_text())
    meta["target"]["vector_width"] = "wide"
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="target.*vector_width"):
        Policy.load(folder)


def test_the_default_policy_is_the_one_made_for_the_target(tmp_path, monkeypatch):
    for isa in ("avx512", "avx2"):
        random_policy(target=looprl.Target.named(isa)).save(tmp_path / isa)
    (tmp_path / "default_policies.json").write_text(json.dumps({"avx512": "avx512", "avx2": "avx2"}))
    monkeypatch.setattr(loading, "DEFAULT_POLICIES", tmp_path / "default_policies.json")
    assert loading.load_policy("default", "avx2").target.isa == "avx2"
    assert loading.load_policy("default", "avx512").target.isa == "avx512"
    with pytest.warns(RuntimeWarning, match="no policy for sse4; using the avx2 policy"):
        assert loading.load_policy("default", "sse4").target.isa == "avx2"  # the closest
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loading.load_policy("default", "sse4")  # said once


def test_tuning_for_another_target_than_the_policy_s_warns():
    policy = random_policy(target=looprl.Target.named("avx512"))
    with pytest.warns(RuntimeWarning, match="trained for avx512, tuning for sse4"):
        looprl.tune((32, 32, 32), policy, cache=":memory:", target="sse4", budget_s=0)


def test_a_policy_refuses_observations_of_the_other_kind():
    nest = looprl.initial_nest(PROBLEM).split(0, 8)
    raw, normalized = observation(nest, 1, 10, False), observation(nest, 1, 10, True)
    normalized_policy, raw_policy = random_policy(), random_policy(observation="raw")
    with pytest.raises(ValueError, match="takes normalized observations but was given raw"):
        normalized_policy.act(raw)
    with pytest.raises(ValueError, match="takes raw observations but was given normalized"):
        raw_policy.act(normalized)
    with pytest.raises(ValueError, match="normalized"):
        normalized_policy.scores(np.stack([raw, raw]))
    assert isinstance(normalized_policy.act(normalized), int) and isinstance(raw_policy.act(raw), int)


def test_guided_proposals_change_the_schedule_and_reach_every_part_of_the_nest():
    from looprl.actions import ActionSet, State
    from looprl.policy.guided import _proposals

    actions = ActionSet()
    state = State(looprl.initial_nest(PROBLEM), 0)
    policy = random_policy(bias=[0, 0, 0, 0, 0, 0, 9])  # always split_16, wherever the cursor is
    proposals = _proposals(policy, actions, state, top_k=1)  # its own choice: split_16 at the cursor
    reached = [following for _, _, following in proposals if following is not None]
    assert reached and all(following.nest != state.nest for following in reached)
    for _, path, following in proposals:  # each path replays to the state it claims
        assert following is None or reach(actions, state, path) == following
    split_loops = {following.cursor for following in reached}
    assert len(split_loops) >= 2  # not only where the cursor was


def test_guided_proposals_include_tiles_a_policy_would_not_reach_one_action_at_a_time():
    from looprl.actions import ActionSet, State
    from looprl.policy.guided import _proposals

    actions = ActionSet()
    root = State(looprl.initial_nest(PROBLEM), 0)  # m, k, n
    policy = random_policy(bias=[0, 0, -9, -9, 9, 0, 0])  # splits by 4, never swaps
    proposals = _proposals(policy, actions, root, top_k=3)
    reached = {following.nest for _, _, following in proposals if following is not None}
    tile = root.nest.split(0, 4).swap(1)  # m/4, k, m4, n: four output rows in registers
    assert tile in reached
    for _, path, following in proposals:
        assert following is None or reach(actions, root, path) == following


def test_guided_proposals_try_the_target_s_register_tiles_over_output_rows():
    from looprl.actions import ActionSet, State
    from looprl.policy.guided import _proposals

    actions = ActionSet((4, 8, 16, 6, 14))  # the policy's splits keep their indices; the target's rows follow
    root = State(looprl.initial_nest(PROBLEM), 1)  # on k: the policy splits where it stands
    policy = random_policy(bias=[0, 0, -9, -9, 0, 0, 9])  # likes split_16 best, has never seen 6 or 14
    proposals = _proposals(policy, actions, root, top_k=3, tile_rows=(14, 6, 4))
    reached = [following.nest for _, _, following in proposals if following is not None]
    for rows in (14, 6, 4):  # m is the only loop over output rows with a loop below it
        assert root.nest.split(0, rows).swap(1) in reached
    assert root.nest.split(1, 6).swap(2) not in reached  # k is a reduction: no register tile there
    register = [path for _, path, _ in proposals if len(path) >= 3 and actions.names[path[-3]] in ("split_6", "split_14")]
    assert len(register) == 2 and all(len(path) == 4 for path in register)  # up, split, down, swap_down
    first = [i for i, (_, path, _) in enumerate(proposals) if len(path) >= 3 and actions.names[path[-1]] == "swap_down"]
    assert first and first[0] <= 3  # register tiles come right after the policy's top 3


def test_replay_takes_the_tile_rows_tune_may_name():
    from looprl.measurement.evaluator import Evaluator
    from looprl.policy.rollout import measured_path

    values = measured_path(looprl.matmul(12, 16, 8), ["split_6", "down", "swap_down"], Evaluator(":memory:", 0.001))
    assert len(values) == 4 and all(v > 0 for v in values)


def test_the_action_set_covering_a_tune_path_keeps_the_env_s_indices():
    from looprl.actions import ActionSet

    covering = ActionSet.covering(["split_4", "down", "split_9", "swap_down", "split_9", "split_6"])
    assert covering.names[: len(ActionSet())] == ActionSet().names
    assert covering.split_factors == (4, 8, 16, 9, 6)
    assert ActionSet.covering(["up", "split_16"]).names == ActionSet().names


def test_a_layout_policy_pads_for_the_target_and_keeps_its_scores_by_name_when_tile_rows_are_added():
    from looprl.actions import State
    from looprl.policy.guided import _scores
    from looprl.policy.rollout import policy_actions

    policy = random_policy(bias=[0, 0, 0, 0, 1, 2, 3, 9, -9], layouts=True)  # pack first, pad last
    assert policy_actions(policy, looprl.Target.named("avx2")).pad_multiple == 8
    assert policy_actions(policy, looprl.Target.named("avx512")).pad_multiple == 16
    actions = policy_actions(policy, looprl.Target.named("avx2")).with_splits((6,))
    assert actions.names[-3:] == ("split_6", "pack", "pad")  # the new split moved pack and pad
    scores = _scores(policy, actions, [State(looprl.initial_nest(PROBLEM), 0)])[0]
    assert int(np.argmax(scores)) == actions.index("pack") and int(np.argmin(scores)) == actions.index("split_6")
    assert scores[actions.index("pad")] == pytest.approx(-9) and scores[actions.index("split_16")] == pytest.approx(3)


def test_a_layout_policy_s_proposals_include_its_layout_actions_and_tune_replays_them():
    from looprl.actions import State
    from looprl.policy.guided import _proposals
    from looprl.policy.rollout import measured_path, policy_actions

    problem = looprl.matmul(24, 40, 20)  # k = 20: pad makes it 24 on AVX2
    policy = random_policy(bias=[0, 0, -9, -9, 0, 0, 0, 0, 9], layouts=True)  # pads wherever it can
    actions = policy_actions(policy, looprl.Target.named("avx2"))
    proposals = _proposals(policy, actions, State(looprl.initial_nest(problem), 0), top_k=3)
    padded = [following for _, path, following in proposals if actions.names[path[-1]] == "pad"]
    assert padded and padded[0].nest.layouts  # pad at the k loop, reached by a move
    cache = MeasurementCache(":memory:")
    result = looprl.tune(problem, policy, cache=cache, budget_s=0.3, measure_budget_s=0.001, remember=False, target="avx2", threads=1)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((24, 20)).astype(np.float32), rng.standard_normal((20, 40)).astype(np.float32)
    np.testing.assert_allclose(result(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert result.action_set.layouts == any(name in ("pack", "pad") for name in result.actions)
    values = measured_path(problem, result.actions, Evaluator(cache, 0.001, samples=1, target="avx2"), result.action_set)
    assert values[-1] == pytest.approx(result.gflops)  # the same schedule, from the cache


class _ScriptedEvaluator:
    """Stand-in evaluator: each schedule's first value, then the values its re-timings give
    (the best of its samples is kept, as the real evaluator does)."""

    budget_s = 0.001

    def __init__(self, scripts):
        self.scripts = {key: list(values) for key, values in scripts.items()}
        self.best = {}
        self.retimed = []

    def __call__(self, nest):
        from looprl.measurement.evaluator import Measurement

        self.best[nest.key] = self.scripts[nest.key].pop(0)
        return Measurement(self.best[nest.key], from_cache=False, samples=1)

    def remeasure(self, nest):
        from looprl.measurement.evaluator import Measurement

        self.retimed.append(nest.key)
        sample = self.scripts[nest.key].pop(0)
        self.best[nest.key] = max(self.best[nest.key], sample)
        return Measurement(self.best[nest.key], from_cache=False, sample_gflops=sample)


def _two_schedules():
    first = looprl.initial_nest(PROBLEM)
    return first, first.split(0, 4)


def _settle(context, candidates, max_cost_s):
    from looprl.search import ScheduleRecord, confirm_winner

    return confirm_winner(context, [ScheduleRecord(n, g, ()) for n, g in candidates], within=0.9, rounds=2, max_cost_s=max_cost_s).ranked


def test_close_contenders_are_retimed_together_before_one_wins():
    a, b = _two_schedules()
    # b's first timing caught a slow phase (95 against a's 100); timed again it is the faster
    evaluator = _ScriptedEvaluator({a.key: [100.0, 99.0, 100.0], b.key: [95.0, 110.0, 108.0]})
    context = SearchContext(PROBLEM, ActionSet(), evaluator)
    candidates = [(n, context.measure(n).gflops) for n in (a, b)]
    settled = _settle(context, candidates + [candidates[0]], max_cost_s=2.5)
    assert [c.nest.key for c in settled] == [b.key, a.key] and settled[0].gflops == 110.0
    assert evaluator.retimed == [a.key, b.key] * 2  # interleaved rounds


def test_the_contender_faster_in_the_rounds_wins_over_one_lucky_first_timing():
    """Ranked by best samples, a's lucky first timing (120) would win though b was faster in
    every round: the paired scores (each round's timing over the round's fastest) rank b first,
    each keeping its best figure."""
    from looprl.search import ScheduleRecord, confirm_winner

    a, b = _two_schedules()
    evaluator = _ScriptedEvaluator({a.key: [120.0, 90.0, 92.0, 91.0], b.key: [100.0, 100.0, 101.0, 99.0]})
    context = SearchContext(PROBLEM, ActionSet(), evaluator)
    candidates = [ScheduleRecord(n, context.measure(n).gflops, ()) for n in (a, b)]
    confirmed = confirm_winner(context, candidates, within=0.75, rounds=3)
    assert [c.nest.key for c in confirmed.ranked] == [b.key, a.key]
    assert [c.gflops for c in confirmed.ranked] == [101.0, 120.0] and confirmed.winner_retimed_gflops == 101.0
    assert evaluator.retimed == [a.key, b.key] * 3


def test_the_rounds_fit_the_cost_cap_by_leaving_out_the_slowest_contenders_and_run_as_many_as_it_pays_for():
    from looprl.search import ScheduleRecord, confirm_winner

    a, b = _two_schedules()
    c = b.split(1, 2)
    evaluator = _ScriptedEvaluator({a.key: [100.0] * 8, b.key: [99.0] * 8, c.key: [80.0] * 8})
    context = SearchContext(PROBLEM, ActionSet(), evaluator)
    candidates = [ScheduleRecord(n, context.measure(n).gflops, ()) for n in (a, b, c)]
    one_timing = 0.001  # the context's timing budget per schedule: what a round costs each contender here
    confirm_winner(context, candidates, within=0.75, rounds=2, max_rounds=5, max_cost_s=2 * 2 * one_timing + 1e-9)
    assert evaluator.retimed == [a.key, b.key] * 2  # c left out: three contenders would cost more than two rounds allow
    evaluator.retimed.clear()
    confirm_winner(context, candidates[:2], within=0.75, rounds=2, max_rounds=3, max_cost_s=1.0)
    assert evaluator.retimed == [a.key, b.key] * 3  # a cap that pays for more: up to max_rounds


def test_far_apart_or_too_costly_contenders_are_not_retimed():
    a, b = _two_schedules()
    evaluator = _ScriptedEvaluator({a.key: [100.0], b.key: [50.0]})
    context = SearchContext(PROBLEM, ActionSet(), evaluator)
    settled = _settle(context, [(n, context.measure(n).gflops) for n in (a, b)], max_cost_s=2.5)
    assert [c.nest.key for c in settled] == [a.key, b.key] and evaluator.retimed == []  # 50 is not a contender
    evaluator = _ScriptedEvaluator({a.key: [100.0], b.key: [99.0]})
    context = SearchContext(PROBLEM, ActionSet(), evaluator)
    settled = _settle(context, [(n, context.measure(n).gflops) for n in (a, b)], max_cost_s=0.00025)  # the rounds cost more
    assert [c.nest.key for c in settled] == [a.key, b.key] and evaluator.retimed == []


@pytest.mark.target_dependent
def test_tune_measures_the_targets_own_tiles_when_the_rollout_builds_none():
    from looprl.ir.register_tiles import tile_shapes, tile_steps
    from looprl.ir.register_tiles import tile_of
    from looprl.target import Target

    stay = random_policy(bias=[10.0, 0, 0, 0, 0, 0, 0])  # always "up": invalid at the first loop, the rollout stays put
    cache = MeasurementCache(":memory:")
    result = looprl.tune(PROBLEM, stay, cache=cache, budget_s=0.5, measure_budget_s=0.001, remember=False, threads=1)
    assert result.greedy_gflops == pytest.approx(result.initial_gflops)  # the rollout built nothing
    rows, columns = tile_shapes(PROBLEM, Target.default())[0]  # tune's target
    tile = looprl.initial_nest(PROBLEM).apply(tile_steps(PROBLEM, rows, columns))
    assert tile_of(tile) == (rows, columns) and cache.get(tile, budget_s=0.001) is not None  # the target's first tile was measured
    assert result.gflops > result.initial_gflops


@pytest.mark.parametrize("cap", [1, 3, 9])
def test_a_measurement_cap_bounds_the_serial_search_and_its_answer_is_correct(cap):
    policy = random_policy(seed=2)
    cache = MeasurementCache(":memory:")
    result = looprl.tune(PROBLEM, policy, cache=cache, budget_s=5.0, measure_budget_s=0.001, threads=1, max_evaluations=cap)
    assert 1 <= result.measured <= cap
    assert result.gflops >= result.initial_gflops
    a, b = (np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in PROBLEM.input_shapes)
    np.testing.assert_allclose(result.kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    # A capped answer is not remembered: a later uncapped call searches again.
    again = looprl.tune(PROBLEM, policy, cache=cache, budget_s=0.5, measure_budget_s=0.001, threads=1)
    assert again.mode == "measured"


def test_the_rollout_ends_where_the_measurement_cap_runs_out():
    from looprl.policy.rollout import policy_actions

    policy = random_policy(seed=0)
    context = SearchContext(PROBLEM, policy_actions(policy), Evaluator(":memory:", 0.001, samples=1), max_evaluations=2)
    context.root()
    rollout = greedy_rollout(policy, PROBLEM, context, episode_length=40)
    assert context.evaluations <= 2
    assert rollout.stopped in ("budget", "cycle", "length")


@pytest.mark.parametrize("cap", [0, -1, 2.5, "3", True])
def test_bad_measurement_caps_are_value_errors(cap):
    with pytest.raises(ValueError, match="max_measurements"):
        looprl.tune(PROBLEM, random_policy(), cache=":memory:", max_measurements=cap)


def test_the_policys_own_answer_is_measured_first_so_two_measurements_return_it():
    policy = random_policy(bias=[0, 1, 0, 0, 0, 1.5, 0])  # split_8 where it can, then down, ...
    ahead = greedy_rollout(policy, PROBLEM, None)
    assert ahead.final_nest.key != initial_nest(PROBLEM).key
    cache = MeasurementCache(":memory:")
    result = looprl.tune(PROBLEM, policy, cache=cache, budget_s=5.0, measure_budget_s=0.001, threads=1, max_evaluations=2)
    schedules = {key for problem, key, _ in cache.records(budget_s=0.001) if problem == PROBLEM.name}
    assert schedules == {initial_nest(PROBLEM).key, ahead.final_nest.key}  # the policy's answer was the one measured
    assert result.nest.key in (ahead.final_nest.key, initial_nest(PROBLEM).key)
    values = {key: value for problem, key, value in cache.records(budget_s=0.001) if problem == PROBLEM.name}
    assert result.gflops == values[result.nest.key]  # its figure as the cache holds it
    # A contender of the two (the winner rule's paired rounds decide between close ones).
    assert values[result.nest.key] >= CONTENDER_WITHIN * max(values.values())
