"""looprl.torch: tuned kernels inside PyTorch modules, and every way a call falls back."""

import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from looprl.torch import TunedLinear, tune_module, tuned_layers  # noqa: E402
from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    return {"policy": folder, "budget_s": 0.1, "cache": str(tmp_path_factory.mktemp("cache") / "m.sqlite")}


def block(activation=None):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), activation or nn.GELU(), nn.Linear(40, 24), nn.LayerNorm(24)).eval()


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU()], ids=repr)
def test_a_tuned_block_computes_what_the_block_computes(options, activation):
    module = block(activation)
    x = torch.randn(2, 7, 24)  # (batch, seq, features): 14 rows
    tuned = tune_module(module, x, **options)
    layers = dict(tuned_layers(tuned))
    assert set(layers) == {"0", "2"} and isinstance(tuned[1], nn.Identity)  # the activation fused into layer 0
    assert sorted(layers["0"].results) == [14] and layers["0"].activation is not None
    assert isinstance(tuned[3], nn.LayerNorm) and isinstance(module[0], nn.Linear)  # the original is untouched
    assert tuned.state_dict().keys() == module.state_dict().keys()  # the original's parameters, under their names
    with torch.no_grad():
        close(tuned(x), module(x))
        close(tuned(x.transpose(0, 1).contiguous().transpose(0, 1)), module(x))  # non-contiguous
        close(tuned(x[:1]), module(x[:1]))  # 7 rows, not tuned: the original layers
    with torch.inference_mode():
        close(tuned(x), module(x))


def test_every_other_call_falls_back_to_the_original_layer(options):
    module = block()
    x = torch.randn(5, 24)
    tuned = tune_module(module, [x, torch.randn(3, 24)], **options)  # two shapes
    assert sorted(dict(tuned_layers(tuned))["0"].results) == [3, 5]
    with pytest.raises(RuntimeError):  # float64 input: the original layer's own error
        tuned(x.double())
    with pytest.raises(RuntimeError):
        tuned(torch.randn(5, 23))
    # autograd: the kernels have no backward, the original layers do
    grad_input = x.clone().requires_grad_()
    tuned(grad_input).sum().backward()
    reference = x.clone().requires_grad_()
    module(reference).sum().backward()
    close(grad_input.grad, reference.grad)
    # new weights are bound on the next call
    with torch.no_grad():
        for layer in (tuned[0], module[0]):
            layer.weight.mul_(2.0)
        close(tuned(x), module(x))
    tuned[2].weight = nn.Parameter(module[2].weight.detach() * 0.5)
    module[2].weight = nn.Parameter(module[2].weight.detach() * 0.5)
    with torch.no_grad():
        close(tuned(x), module(x))


def test_other_layers_dtypes_and_shared_layers_are_left_alone(options):
    shared = nn.Linear(16, 16)
    module = nn.Sequential(shared, nn.ReLU(), shared).eval()
    tuned = tune_module(module, torch.randn(4, 16), **options)
    assert isinstance(tuned[1], nn.ReLU) and isinstance(tuned[0], TunedLinear)  # used twice: not fused
    assert tuned[0] is tuned[2] and tuned[0].activation is None
    y = torch.randn(4, 16)
    with torch.no_grad():
        close(tuned(y), module(y))
    no_bias = nn.Sequential(nn.Linear(16, 8, bias=False), nn.SiLU()).eval()
    tuned_no_bias = tune_module(no_bias, y, **options)
    assert isinstance(tuned_no_bias[1], nn.Identity) and tuned_no_bias.state_dict().keys() == {"0.weight"}
    with torch.no_grad():
        close(tuned_no_bias(y), no_bias(y))
    double = nn.Sequential(nn.Linear(16, 16).double(), nn.ReLU()).eval()
    assert tuned_layers(tune_module(double, torch.randn(4, 16, dtype=torch.float64), **options)) == []
    mixed = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()  # float32 weights, never called with float32
    assert tuned_layers(tune_module(mixed, [(torch.randn(4, 16),), (torch.randn(0, 16),)], **options)) != []


def test_concurrent_calls(options):
    module = block()
    x = torch.randn(6, 24)
    tuned = tune_module(module, x, **options)
    with torch.no_grad():
        expected = module(x)
    failures = []

    def work():
        with torch.no_grad():
            for _ in range(50):
                if not torch.allclose(tuned(x), expected, rtol=1e-5, atol=1e-5):
                    failures.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_bad_arguments_are_value_errors(options):
    with pytest.raises(ValueError, match="torch.nn.Module"):
        tune_module(lambda x: x, torch.randn(2, 2), **options)
    with pytest.raises(ValueError, match="example_inputs"):
        tune_module(block(), [], **options)
    with pytest.raises(ValueError, match="example_inputs"):
        tune_module(block(), "x", **options)
    assert isinstance(TunedLinear, type)


def test_importing_looprl_does_not_import_torch():
    code = "import sys, looprl; looprl.linear(2, 3, 4); assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_stats_count_looprl_calls_and_fallbacks_by_reason(options):
    from looprl.torch import stats

    module = block()
    x = torch.randn(5, 24)
    tuned = tune_module(module, x, **options)
    assert stats(tuned)["looprl_calls"] == 0 and stats(tuned)["fallback_calls"] == 0
    with torch.no_grad():
        tuned(x)  # both linear layers: looprl
        tuned(torch.randn(7, 24))  # a row count not tuned: both fall back
    tuned(x.clone().requires_grad_())  # autograd: both fall back
    counted = stats(tuned)
    layers = len(tuned_layers(tuned))
    assert layers == 2
    assert counted["looprl_calls"] == layers and counted["fallback_calls"] == 2 * layers
    assert counted["fallbacks"] == {"row count not tuned": layers, "autograd": layers}
    assert set(counted["layers"]) == {name for name, _ in tuned_layers(tuned)}
    assert all(entry["looprl_calls"] == 1 and entry["fallback_calls"] == 2 for entry in counted["layers"].values())
    assert stats(nn.Linear(3, 4)) == {"looprl_calls": 0, "fallback_calls": 0, "fallbacks": {}, "layers": {}}
