"""The AutoTVM search: budgets, the untuned nest as a floor, reproducibility, transfer."""

import hashlib
import math
from collections import Counter

import numpy as np
import pytest

import looprl
from looprl import search
from looprl.ir.nest import LoopNest, initial_nest
from looprl.measurement.cache import MeasurementCache
from looprl.measurement.evaluator import Evaluator, Measurement
from looprl.search.autotvm import ScheduleSpace, components, diverse_pick

SMALL = looprl.matmul(32, 48, 40)
FAST = {"batch_size": 8, "chains": 16, "max_steps": 20, "early_stop": 5}


class FakeEvaluator:
    """Deterministic GFLOPS per schedule, higher for a vectorised innermost loop (so that a
    model has something to learn); counts how often each schedule is asked for."""

    budget_s = 0.001

    def __init__(self, boost=None, cache=None):
        self.calls = Counter()
        self.boost = boost or {}
        if cache is not None:
            self.cache = cache

    def value(self, nest) -> float:
        if nest.key in self.boost:
            return self.boost[nest.key]
        digest = int(hashlib.sha256(nest.key.encode()).hexdigest()[:6], 16)
        loops = nest.compute
        vectorised = loops[-1].var == nest.problem.output[-1]
        tiled = len(loops) > 1 and loops[-2].var == "m" and loops[-2].size <= 8 and loops[-2].step == 1
        return 5.0 + 30.0 * vectorised + 40.0 * (vectorised and tiled) + digest % 1000 / 1000.0

    def __call__(self, nest):
        self.calls[nest.key] += 1
        return Measurement(self.value(nest), from_cache=False)


def run(evaluator, **options):
    settings = {"max_evaluations": 40, "budget_s": math.inf, "verify_s": None, "seed": 3, **FAST, **options}
    return search.run(SMALL, algo=settings.pop("algo", "autotvm"), evaluator=evaluator, **settings)


def test_autotvm_respects_the_evaluation_budget_and_measures_each_schedule_once():
    evaluator = FakeEvaluator()
    result = run(evaluator)
    assert result.evaluations == 40 and result.stopped == "evaluation budget"
    assert len(evaluator.calls) == 40 and max(evaluator.calls.values()) == 1
    assert result.best_gflops == max(evaluator.value(LoopNest.from_key(SMALL, k)) for k in evaluator.calls)
    assert result.best_gflops >= result.initial_gflops
    assert result.actions == () and result.settings["options"]["objective"] == "rank"
    assert result.graph.number_of_nodes() == 40


def test_autotvm_never_returns_worse_than_the_untuned_nest():
    root = looprl.initial_nest(SMALL)
    result = run(FakeEvaluator(boost={root.key: 1e6}), algo="autotvm-regression", max_evaluations=20)
    assert result.best_nest == root and result.best_gflops == 1e6 == result.initial_gflops


def test_autotvm_reproduces_with_a_seed_and_differs_with_another():
    first, second, other = FakeEvaluator(), FakeEvaluator(), FakeEvaluator()
    a, b = run(first), run(second)
    run(other, seed=4, max_evaluations=9)  # the untuned nest and the first batch, the seed's walks: where another seed shows first
    assert list(first.calls) == list(second.calls)  # the same schedules, in the same order
    assert a.best_nest == b.best_nest and a.best_gflops == b.best_gflops
    assert list(other.calls) != list(first.calls)[:9]


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_autotvm_finds_better_than_random_picks_on_a_learnable_evaluator(isa):
    """Averaged over two seeds, for each target's action set (the evaluator is fake, so the
    host must not decide which space is searched): one seed alone can be unlucky (AVX2's space
    with seed 3 and any factor stays at the random batch's level, seed 4 gains 33)."""
    for options, margin in (({"any_factor": True}, 10), ({}, 5)):  # the annealing's splits: any of 2..64, or mixed with the action set's
        gains = []
        for seed in (3, 4):
            evaluator = FakeEvaluator()
            evaluator.target = looprl.Target.named(isa)
            run(evaluator, max_evaluations=48, walks=False, seed=seed, **options)  # random picks from the whole 2..64 space
            values = [evaluator.value(LoopNest.from_key(SMALL, k)) for k in evaluator.calls]
            gains.append(np.mean(values[-16:]) - np.mean(values[1:9]))  # model-picked ones vs the random batch
        assert np.mean(gains) > margin, gains


def test_autotvm_draws_its_random_batch_from_env_action_walks_by_default():
    for walks in (True, False):
        evaluator = FakeEvaluator()
        options = {} if walks else {"walks": False}  # walks by default
        run(evaluator, max_evaluations=9, **options)  # the untuned nest and the first batch of 8
        steps = {lp.step for key in list(evaluator.calls)[1:9] for lp in LoopNest.from_key(SMALL, key).loops}
        powers_of_two = all(step & (step - 1) == 0 for step in steps)  # products of splits by 4, 8, 16
        assert powers_of_two == walks, (walks, steps)


def test_autotvm_with_a_real_evaluator_and_time_budget():
    result = search.run(SMALL, algo="autotvm", max_evaluations=10, budget_s=30, cache=":memory:", verify_s=None, seed=0, **FAST)
    assert result.evaluations == 10 and result.failures == 0
    assert result.best_gflops >= result.initial_gflops > 0


def test_autotvm_transfer_uses_other_problems_measurements(caplog):
    caplog.set_level("INFO", logger="looprl.search")
    cache = MeasurementCache(":memory:")
    other = looprl.matmul(24, 40, 16)
    teacher = FakeEvaluator()
    for nest in ScheduleSpace(initial_nest(other), 10).random_many(np.random.default_rng(0), 10, 40):
        cache.put(nest, teacher.value(nest), budget_s=teacher.budget_s)
    evaluator = FakeEvaluator(cache=cache)
    evaluator.target = None
    result = run(evaluator, transfer=True, max_evaluations=16)
    assert result.evaluations == 16 and result.settings["options"]["transfer"] is True
    assert "global model fitted on 40 measurements of 1 problems" in caplog.text
    values = [evaluator.value(LoopNest.from_key(SMALL, k)) for k in list(evaluator.calls)[1:9]]
    assert np.mean(values) > 30  # the first batch already follows the global model
    run(FakeEvaluator(), transfer=True, max_evaluations=10)  # no cache: no global model, no error


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown option.*nosuch"):
        run(FakeEvaluator(), nosuch=1)
    with pytest.raises(ValueError, match="takes none"):
        search.run(SMALL, algo="greedy1", evaluator=FakeEvaluator(), transfer=True, verify_s=None)
    for bad in ({"batch_size": 0}, {"epsilon": 1.5}, {"transfer": "yes"}, {"objective": "nosuch"}, {"restart": 1.5}):
        with pytest.raises(ValueError):
            run(FakeEvaluator(), **bad)
    with pytest.raises(ValueError, match="autotvm"):
        search.parse_algorithm("autotvm-nosuch")


def test_space_moves_stay_valid_and_merges_undo_splits():
    space = ScheduleSpace(initial_nest(SMALL), 10)
    rng = np.random.default_rng(0)
    nest = initial_nest(SMALL)
    for _ in range(300):
        nest = space.neighbour(nest, rng)
        assert len(nest) <= 10 and LoopNest.from_key(SMALL, nest.key) == nest

    def merges(nest):  # the neighbours with one loop fewer, over many draws
        found = (space.neighbour(nest, np.random.default_rng(seed)) for seed in range(200))
        return {other for other in found if len(other) == len(nest) - 1}

    split = initial_nest(SMALL).split(0, 8).split(0, 2)  # m2s16, m2s8, m8s1, k, n
    # loops 0+1 and 1+2 merge back into one split; m8s1 and k (or any other pair) never merge
    assert merges(split) == {initial_nest(SMALL).split(0, 8), initial_nest(SMALL).split(0, 16)}
    assert merges(initial_nest(SMALL).split(0, 16)) == {initial_nest(SMALL)}


def test_diverse_pick_prefers_uncovered_components():
    a = initial_nest(SMALL).split(0, 4)
    b = initial_nest(SMALL).split(0, 4).swap(2)  # a with k and n swapped: the same m tiling
    c = initial_nest(SMALL).split(2, 8)
    assert components(a) != components(c)
    candidates = [(3.0, a.key, a), (2.9, b.key, b), (1.0, c.key, c)]
    assert diverse_pick(candidates, 2, alpha=0.0) == [a, b]
    assert diverse_pick(candidates, 2, alpha=5.0)[1] == c


def test_context_visit_refuses_another_problems_nest():
    from looprl.actions import ActionSet
    from looprl.search.context import SearchContext

    context = SearchContext(SMALL, ActionSet(), FakeEvaluator(), None, None)
    with pytest.raises(ValueError, match="LoopNest of"):
        context.visit(looprl.initial_nest(looprl.matmul(8, 8, 8)))
    assert context.visit(initial_nest(SMALL).split(0, 4)).path == ()


def test_a_real_evaluator_cache_feeds_records():
    evaluator = Evaluator(":memory:")
    evaluator(looprl.initial_nest(looprl.matmul(8, 8, 8)))
    result = search.run(SMALL, algo="autotvm", max_evaluations=4, budget_s=math.inf, evaluator=evaluator, verify_s=None, transfer=True, **FAST)
    assert result.evaluations == 4


def test_a_policy_prior_gives_the_first_batch_the_schedules_its_greedy_episode_passes_through():
    from looprl.actions import State
    from looprl.policy.rollout import PolicyPrior, greedy_schedules, policy_actions
    from tests.policies import random_policy

    policy = random_policy(bias=[0, 0, 0, 0, 1, 0, 0])  # always split_4: m 32 -> 8 x 4 -> 2 x 4 x 4, then a no-op
    actions = policy_actions(policy)
    root = State(initial_nest(SMALL), 0)
    once = actions.apply(root, actions.index("split_4"))
    twice = actions.apply(once, actions.index("split_4"))
    assert [n.key for n in greedy_schedules(policy, SMALL)] == [twice.nest.key, once.nest.key]  # the end first
    passed = {once.nest.key, twice.nest.key}
    evaluator = FakeEvaluator()
    result = run(evaluator, max_evaluations=1 + 8, prior=PolicyPrior(policy))
    measured = list(evaluator.calls)
    assert passed <= set(measured[1:])  # the first batch, after the untuned nest
    without = FakeEvaluator()
    run(without, max_evaluations=1 + 8)
    assert not passed <= set(without.calls)  # a random first batch does not hold them both
    assert result.best_gflops >= max(evaluator.value(LoopNest.from_key(SMALL, k)) for k in passed)


def test_a_prior_must_be_callable():
    with pytest.raises(ValueError, match="prior must be a callable"):
        run(FakeEvaluator(), prior="default")
