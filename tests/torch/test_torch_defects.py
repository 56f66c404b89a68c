"""Issue 60, item 4: five ways a tuned model or its records once differed from the model given.

Each test compares what the tuned module returns (values and dtype) with what the original
returns, or, for the records file, that a bad version is refused. Every layer is scheduled by
the shipped policy alone (``measure=False``) and no route is timed (``compare_torch=False``):
the subject is which calls the kernels may compute, not how fast they are.
"""

import json
import types

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402

from looprl.measurement.tuned_records import read_tuned_records  # noqa: E402
from looprl.torch import TunedLinear, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch.routes import AUTOCAST, TRANSFORMED  # noqa: E402

# The process's measurement cache (tests/conftest.py: a private folder), where the policy alone's
# answers are remembered: a layer shape and row count another test tuned is not tuned again.
FAST = {"measure": False, "compare_torch": False, "progress": False}
BF16 = torch.bfloat16


def same(tuned_out, reference, rtol=1e-5, atol=1e-5):
    """The tuned module's output is the original's: the same dtype and shape, values close."""
    assert tuned_out.dtype == reference.dtype and tuned_out.shape == reference.shape
    torch.testing.assert_close(tuned_out, reference, rtol=rtol, atol=atol)


def doubled(self, x):
    """A forward that is not nn.Linear's: twice the layer."""
    return 2 * functional.linear(x, self.weight, self.bias)


def test_a_linear_whose_forward_is_replaced_on_the_instance_is_left_to_torch():
    """Defect 1: the override was ignored (the tuned layer computed the plain linear layer)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.Linear(32, 16)).eval()
    model[0].forward = types.MethodType(doubled, model[0])
    x = torch.randn(5, 24)
    tuned = tune_module(model, x, **FAST)
    assert set(dict(tuned_layers(tuned))) == {"1"}  # the other layer is still tuned
    assert "forward is replaced on the instance" in stats(tuned)["left_to_torch"]["0"]
    with torch.no_grad():
        same(tuned(x), model(x))  # the second layer's kernels round as they do; the first doubles, as its forward says


def test_a_subclass_and_a_replaced_forward_are_refused_by_one_rule():
    """The same rule for both: a layer is tuned only as an nn.Linear itself running its own call."""

    class Scaled(nn.Linear):
        def forward(self, x):
            return 3 * super().forward(x)

    torch.manual_seed(1)
    model = nn.Sequential(Scaled(24, 16), nn.Linear(16, 8)).eval()
    x = torch.randn(3, 24)
    tuned = tune_module(model, x, **FAST)
    assert "Scaled, not an nn.Linear itself" in stats(tuned)["left_to_torch"]["0"]
    with torch.no_grad():
        same(tuned(x), model(x))


def test_an_activation_whose_forward_is_replaced_on_the_instance_is_not_fused():
    """Defect 2: the sequence fused it as the plain activation (ReLU computed where tanh was asked)."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 8)).eval()
    model[1].forward = types.MethodType(lambda self, x: torch.tanh(x), model[1])
    x = torch.randn(6, 24)
    tuned = tune_module(model, x, **FAST)
    layers = dict(tuned_layers(tuned))
    assert layers["0"].activation is None  # tuned as a linear layer alone
    with torch.no_grad():
        same(tuned(x), model(x))


def test_an_activation_replaced_after_tuning_unfuses_the_pair():
    """The sequence checks on every call that the next module is still the fused activation."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(24, 16), nn.SiLU(), nn.Linear(16, 8)).eval()
    x = torch.randn(4, 24)
    tuned = tune_module(model, x, **FAST)
    assert dict(tuned_layers(tuned))["0"].activation is not None  # fused
    for module in (tuned, model):
        module[1].forward = types.MethodType(lambda self, x: torch.sigmoid(x), module[1])
    with torch.no_grad():
        same(tuned(x), model(x))


def mlp(dtype=torch.float32):
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 16)).to(dtype).eval()


def test_under_autocast_to_bfloat16_a_float32_model_returns_bfloat16_as_the_original_does():
    """Defect 3: the kernels returned float32 where autocast made the original's layers bfloat16.
    A float32 layer has no bfloat16 kernel: under autocast, its calls are torch's."""
    model = mlp()
    x = torch.randn(2, 5, 24)
    tuned = tune_module(model, x, **FAST)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=BF16):
            out, reference = tuned(x), model(x)
            alone = tuned[2](torch.randn(3, 40))  # a layer called by itself, not by its sequence
        assert alone.dtype == BF16
        same(out, reference, rtol=1.6e-2, atol=1.6e-2)  # torch's own calls: within bfloat16's rounding
        assert stats(tuned)["fallbacks"] == {AUTOCAST: 3}
        same(tuned(x), model(x))  # autocast over: the kernels again
    assert stats(tuned)["looprl_calls"] == 2


def test_under_autocast_to_bfloat16_a_bfloat16_model_keeps_its_kernels():
    """Autocast in the layers' own dtype changes nothing: the bfloat16 kernels compute, in bfloat16."""
    model = mlp(BF16)
    x = torch.randn(7, 24).to(BF16)
    tuned = tune_module(model, x, **FAST)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
        out, reference = tuned(x), model(x)
        from_float32 = tuned(x.float())  # autocast casts a float32 input for torch's call: the original's answer
        reference_from_float32 = model(x.float())
    same(out, reference, rtol=2e-2, atol=2e-2)  # two roundings of the hidden layer may differ by one bfloat16 step
    same(from_float32, reference_from_float32, rtol=2e-2, atol=2e-2)
    assert stats(tuned)["looprl_calls"] >= 2


def test_under_autocast_to_float16_a_bfloat16_model_is_torch_s():
    model = mlp(BF16)
    x = torch.randn(3, 24).to(BF16)
    tuned = tune_module(model, x, **FAST)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        same(tuned(x), model(x), rtol=0, atol=0)
    assert stats(tuned)["looprl_calls"] == 0


@pytest.mark.parametrize("version", [True, False, 0, 4, "2", None, 1.0, 2.0, [2]], ids=repr)
def test_a_records_file_of_a_version_that_is_not_an_integer_1_to_3_is_refused(tmp_path, version):
    """Defect 4: ``"version": true`` was read as version 1 (JSON's true is Python's True, == 1)."""
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": version, "cpu": "x", "records": []}))
    with pytest.raises(ValueError, match="version"):
        read_tuned_records(path)
    with pytest.raises(ValueError, match="version"):
        tune_module(mlp(), torch.randn(2, 24), records=path, progress=False, cache=":memory:")


@pytest.mark.parametrize("version", [1, 2, 3])
def test_records_files_of_versions_1_to_3_are_read(tmp_path, version):
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"format": "looprl-tuned-records", "version": version, "cpu": "x", "records": []}))
    assert read_tuned_records(path) == []


def test_vmap_of_a_tuned_model_gives_the_original_s_answer():
    """Defect 5: torch.func.vmap(tuned)(x) raised "Cannot access data pointer of Tensor that
    doesn't have storage" (a batched tensor has none); under a transform the calls are torch's."""
    model = mlp()
    x = torch.randn(3, 4, 24)
    tuned = tune_module(model, x[0], **FAST)
    with torch.no_grad():
        same(torch.func.vmap(tuned)(x), torch.func.vmap(model)(x), rtol=0, atol=0)
    assert stats(tuned)["fallbacks"] == {TRANSFORMED: 2} and stats(tuned)["looprl_calls"] == 0


def test_other_torch_func_transforms_of_a_tuned_layer_give_the_original_s_answers():
    torch.manual_seed(5)
    layer = nn.Linear(24, 16).eval()
    x = torch.randn(4, 24)
    tuned = tune_module(layer, x, **FAST)
    assert isinstance(tuned, TunedLinear)
    tangent = torch.randn(4, 24)

    def total(module):
        return lambda inputs: module(inputs).sum()

    same(torch.func.grad(total(tuned))(x), torch.func.grad(total(layer))(x))
    same(torch.func.jacrev(tuned)(x), torch.func.jacrev(layer)(x))
    with torch.no_grad():  # grad mode off: no "autograd" reason to fall back for; jvp raised, functionalize crashed the process
        same(torch.func.jvp(tuned, (x,), (tangent,))[1], torch.func.jvp(layer, (x,), (tangent,))[1])
        same(torch.func.functionalize(tuned)(x), layer(x))
        same(tuned(x), layer(x))  # outside the transforms: the kernels
    assert stats(tuned)["looprl_calls"] == 1
