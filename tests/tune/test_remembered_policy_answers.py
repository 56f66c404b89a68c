"""The fast path's answers remembered in the process (looprl.tune.policy_alone.remembered_policy_tune):
the same question asked again is answered without a tune; any part of the question changed is a new tune."""

import numpy as np
import pytest

import looprl
from looprl.backend.threads import available_cores
from looprl.policy.numpy_policy import Policy
from looprl.target import Target
from looprl.tune import policy_alone
from tests.policies import random_policy

LAYER = looprl.linear(2, 16, 24)  # few rows: two episodes, on the re-laid start and in place


@pytest.fixture
def tunes(monkeypatch):
    """The fast path's tunes made from here on (each ``policy_tune`` call, remembered or not), none
    remembered before."""
    policy_alone.forget_policy_answers()
    made = []
    original = policy_alone.policy_tune

    def counted(*args, **kwargs):
        made.append(args[1].problem)
        return original(*args, **kwargs)

    monkeypatch.setattr(policy_alone, "policy_tune", counted)
    yield made
    policy_alone.forget_policy_answers()


def fast(policy, cache, **kwargs):
    return looprl.tune(LAYER, policy, measure=False, cache=str(cache), threads=1, **kwargs)


def test_the_same_question_gets_the_same_answer_with_nothing_timed(tmp_path, tunes):
    folder = random_policy(seed=3).save(tmp_path / "p")
    first = fast(folder, tmp_path / "c.sqlite")
    again = fast(random_policy(seed=3).save(tmp_path / "copy"), tmp_path / "c.sqlite")  # the same policy, saved elsewhere
    assert len(tunes) == 1 and first.measured > 0 and again.measured == 0 and again.mode == first.mode == "policy"
    assert (again.nest, again.actions, again.gflops, again.problem) == (first.nest, first.actions, first.gflops, first.problem)
    assert again.kernel is not first.kernel  # compiled for this call
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 16), (24, 16), (24,)))
    np.testing.assert_allclose(again.kernel(x, w, b), x @ w.T + b, rtol=1e-4, atol=1e-4)


def test_another_target_threads_policy_cache_or_weights_promise_is_another_question(tmp_path, tunes):
    folder = random_policy(seed=3).save(tmp_path / "p")
    cache = tmp_path / "c.sqlite"
    fast(folder, cache)
    other = "sse4" if Target.resolve(None).isa != "sse4" else "avx2"
    fast(folder, cache, target=other)
    fast(folder, tmp_path / "other.sqlite")
    fast(random_policy(seed=4).save(tmp_path / "q"), cache)
    fast(folder, cache, weights_change=True)
    fast(folder, cache, episode_length=3)
    assert len(tunes) == 6
    fast(folder, cache, target=other)  # each of them remembered in turn
    assert len(tunes) == 6
    if available_cores() > 1:
        looprl.tune(LAYER, folder, measure=False, cache=str(cache), threads=2)
        assert len(tunes) == 7


def test_a_private_cache_or_remember_false_tunes_every_time(tmp_path, tunes):
    folder = random_policy(seed=3).save(tmp_path / "p")
    for _ in range(2):
        looprl.tune(LAYER, folder, measure=False, cache=":memory:", threads=1)
    assert len(tunes) == 2
    first = fast(folder, tmp_path / "c.sqlite")
    again = fast(folder, tmp_path / "c.sqlite", remember=False)
    assert len(tunes) == 4 and first.measured > 0 and again.measured > 0


def test_a_policy_changed_in_place_is_another_question(tmp_path, tunes):
    policy = random_policy(seed=3)
    fast(policy, tmp_path / "c.sqlite")
    policy.trunk[0].weight[:] *= -1
    fast(policy, tmp_path / "c.sqlite")
    assert len(tunes) == 2


def test_the_least_recently_asked_answer_is_forgotten_first(tmp_path, tunes, monkeypatch):
    monkeypatch.setattr(policy_alone, "REMEMBERED_ANSWERS", 2)
    folder = random_policy(seed=3).save(tmp_path / "p")
    cache = tmp_path / "c.sqlite"
    for episode_length in (1, 2, 1, 3, 1, 2):  # 1 asked again before 3 comes: 2 is forgotten, 1 kept
        fast(folder, cache, episode_length=episode_length)
    assert len(tunes) == 4


def test_the_fingerprint_is_the_policy_s_content():
    policy = random_policy(seed=3)
    assert policy_alone.fingerprint(policy) == policy_alone.fingerprint(random_policy(seed=3))
    metadata = dict(policy.metadata, episode_length=11)
    assert policy_alone.fingerprint(Policy(metadata, policy.trunk, policy.heads)) != policy_alone.fingerprint(policy)
    assert policy_alone.fingerprint(random_policy(seed=3, hidden=9)) != policy_alone.fingerprint(policy)
