"""Tile demonstrations and the policy cloned from them (training's optional pretrain stage)."""

import numpy as np
import pytest

import looprl
from looprl.actions import ActionSet, State
from looprl.measurement.evaluator import Evaluator
from looprl.policy.rollout import greedy_rollout
from looprl.train.config import load_agent
from looprl.train.demonstrations import candidate_tiles, demonstrate, demonstration_pairs, pretrain_policy

FACTORS = (4, 8, 16, 6, 9, 14, 32, 48, 64)


@pytest.mark.target_dependent
def test_a_demonstration_is_the_fastest_tile_that_fits_an_episode_and_ends_with_a_no_op():
    problem = looprl.matmul(96, 160, 128)
    actions = ActionSet(FACTORS)
    # each timing the best of its runs in 5 ms: at 1 ms, one preempted run let the untuned nest win under load
    evaluator = Evaluator(":memory:", 0.005, samples=1)
    demo = demonstrate(problem, actions, evaluator, episode_length=12)
    assert 0 < len(demo.actions) < 12 and demo.gflops > demo.initial_gflops
    state = State(looprl.initial_nest(problem), 0)
    for action in demo.actions:
        state = actions.apply(state, action)
    assert evaluator(state.nest).gflops == pytest.approx(demo.gflops)
    observations, labels = demonstration_pairs(demo, actions, normalized=True)
    assert len(labels) == len(demo.actions) + 1 and observations.shape == (len(labels), 10, 20)
    assert actions.apply(state, int(labels[-1])) is None  # the last label stays: it cannot apply
    target = looprl.Target.default()
    tiles = candidate_tiles(problem, actions, target)
    lanes = target.vector_width
    assert tiles and all(target.fits(rows, cols // lanes) for rows, cols in tiles if cols % lanes == 0 and rows > 1)


def test_training_can_start_from_a_policy_cloned_from_demonstrations(tmp_path):
    cache = str(tmp_path / "c.sqlite")
    agent = load_agent("apex-dqn", None)
    agent["env"].update(problems=["64x96x80", "48x128x64", "96x64x112"], split_factors=list(FACTORS), episode_length=12,
                        measure_budget_s=0.001, cache=cache)
    agent["pretrain"] = {"problems_per_dataset": 3, "epochs": 300, "lr": 0.003}
    policy = pretrain_policy(agent, seed=0, log=lambda line: None)
    assert policy.metadata["pretrained"]["problems"] == 3 and policy.action_names[-1] == "split_64"
    evaluator = Evaluator(cache, 0.001, samples=1)  # the demonstrations' measurements, cached
    actions = ActionSet(FACTORS)
    for name in agent["env"]["problems"]:
        problem = looprl.ir.problem.as_problem(name)
        demo = demonstrate(problem, actions, evaluator, episode_length=12)
        rollout = greedy_rollout(policy, problem, evaluator)
        assert rollout.actions[: len(demo.actions)] == tuple(actions.names[a] for a in demo.actions)  # it does as shown
        assert rollout.best_gflops >= demo.gflops
    with pytest.raises(ValueError, match="unknown settings"):
        pretrain_policy(dict(agent, pretrain={"epoch": 3}))


def test_the_clone_s_advantages_are_on_the_scale_of_rewards():
    agent = load_agent("apex-dqn", None)
    agent["env"].update(problems=["64x96x80"], split_factors=list(FACTORS), episode_length=12, measure_budget_s=0.001, cache=":memory:")
    agent["pretrain"] = {"problems_per_dataset": 1, "epochs": 100, "margin": 0.05}
    policy = pretrain_policy(agent, log=lambda line: None)
    scores = policy.scores(np.zeros((1, 10, 20), np.float32))
    assert np.abs(scores).max() < 5.0  # not the tens a cross-entropy fit leaves
