"""A tuned module copies and saves (issue 51 #6): deepcopy, pickle and torch.save keep its
schedules, not their compiled code, and compile them again on load (nothing measured); on a
CPU that cannot run them every call is torch's."""

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402

from looprl import torch as looprl_torch  # noqa: E402
from looprl.target import Target  # noqa: E402
from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=4).save(tmp_path_factory.mktemp("policy") / "policy")
    # looprl's kernels on every call (not routed to torch by timing), each layer scheduled by the
    # policy alone (measure=False): the copies' schedules are under test, not how they were found
    return {"policy": str(folder), "cache": ":memory:", "compare_torch": False, "progress": False, "measure": False}


@pytest.fixture(scope="module")
def tuned(options):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8)).eval()
    return looprl_torch.tune_module(module, torch.randn(4, 16), **options)


def saved_and_loaded(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda module: pickle.loads(pickle.dumps(module)), "torch.save": saved_and_loaded}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_tuned_module_copies_and_saves_and_computes_as_it_did(tuned, how, capfd):
    copied = COPIES[how](tuned)
    layers = [layer for _, layer in looprl_torch.tuned_layers(copied)]
    assert len(layers) == 2 and all(layer.kernels is not original.kernels for layer, (_, original) in
                                    zip(layers, looprl_torch.tuned_layers(tuned)))
    before = looprl_torch.stats(copied)["looprl_calls"]
    with torch.no_grad():
        for rows in (1, 4, 7):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(copied(x), tuned(x), rtol=0, atol=0)  # the same schedules, the same code
    counted = looprl_torch.stats(copied)
    assert counted["looprl_calls"] - before == 6 and counted["fallback_calls"] == 0  # the copy's own kernels computed them
    # the copy's weights are its own: an edit of the copy's is computed with, the original's untouched
    with torch.no_grad():
        layers[0].weight.mul_(-1)
        x = torch.randn(3, 16)
        hidden = functional.relu(functional.linear(x, layers[0].weight, layers[0].bias))
        torch.testing.assert_close(copied(x), functional.linear(hidden, layers[1].weight, layers[1].bias), rtol=1e-5, atol=1e-5)
        assert not torch.equal(copied(x), tuned(x))
    assert [layer.results.keys() for layer in layers] == [layer.results.keys() for _, layer in looprl_torch.tuned_layers(tuned)]
    del copied, layers
    import gc

    gc.collect()
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err


def test_a_frozen_layer_stays_frozen_and_its_state_dict_round_trips(tuned, options):
    layer = looprl_torch.tune_module(nn.Linear(16, 8), torch.randn(2, 16), frozen=True, **options)
    loaded = pickle.loads(pickle.dumps(layer))
    assert loaded.kernels.frozen and copy.deepcopy(layer).kernels.frozen
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), layer(x), rtol=0, atol=0)
    state = tuned.state_dict()
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # the original's keys
    other = pickle.loads(pickle.dumps(tuned))
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.mul_(3)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), state.values()))
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(other(x), tuned(x), rtol=0, atol=0)


def test_on_a_cpu_that_cannot_run_the_schedules_every_call_is_torch_s(tuned, monkeypatch):
    saved = pickle.dumps(tuned)
    monkeypatch.setattr(Target, "missing_on_host", lambda self: ("avx512f",))
    loaded = pickle.loads(saved)  # nothing compiled: the code would not run here
    monkeypatch.undo()
    before = looprl_torch.stats(loaded)  # the calls counted so far come with the copy
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), tuned(x), rtol=1e-5, atol=1e-5)
    counted = looprl_torch.stats(loaded)
    assert counted["looprl_calls"] == before["looprl_calls"] and counted["fallback_calls"] == before["fallback_calls"] + 2
    (reason,) = set(counted["fallbacks"]) - set(before["fallbacks"])
    assert reason == "tuned for a CPU with avx512f, which this one lacks" and counted["fallbacks"][reason] == 2
