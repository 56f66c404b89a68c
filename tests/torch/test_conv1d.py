"""transformers' Conv1D made an nn.Linear for ``tune_module(..., frozen=True)``
(looprl/torch/conv1d.py): what it computes, and the layers it must leave as they are.
GPT-2 end to end: tests/torch/test_hf_models.py."""

import importlib.util
import types

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="could not import 'transformers'")

from looprl.torch import TunedLinear, stats, tune_module  # noqa: E402
from looprl.torch.conv1d import NOT_FROZEN, as_linear, is_conv1d, linear_conv1d  # noqa: E402
from tests.policies import random_policy  # noqa: E402

FAST = {"compare_torch": False, "progress": False, "measure": False}


def conv1d(inputs=48, outputs=80):
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    layer = Conv1D(outputs, inputs)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    return layer.eval()


def test_as_linear_computes_what_the_conv1d_computes_for_any_leading_dimensions():
    layer = conv1d()
    linear = as_linear(layer)
    assert is_conv1d(layer) and not is_conv1d(linear) and linear.weight.is_contiguous()
    assert linear.bias is layer.bias and linear.weight.data_ptr() != layer.weight.data_ptr()  # a copy: the weight's transpose
    for shape in [(5, 48), (2, 3, 48), (1, 1, 1, 48)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(linear(x), layer(x), rtol=1e-5, atol=1e-4)


def test_tune_module_on_a_conv1d_itself_frozen_returns_a_tuned_layer_that_computes_it(tmp_path):
    layer, x = conv1d(), torch.randn(3, 5, 48)
    policy = random_policy(seed=3).save(tmp_path / "policy")
    tuned = tune_module(layer, (x,), frozen=True, policy=policy, cache=str(tmp_path / "m.sqlite"), **FAST)
    assert isinstance(tuned, TunedLinear)
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), layer(x), rtol=1e-5, atol=1e-4)
    assert stats(tuned)["looprl_calls"] >= 1 and is_conv1d(layer)


def test_a_conv1d_whose_call_may_compute_something_else_is_left_with_its_reason():
    replaced, hooked, plain = conv1d(), conv1d(), conv1d()
    replaced.forward = types.MethodType(lambda self, x: x, replaced)
    hooked.register_forward_hook(lambda module, args, output: output * 2)
    root = torch.nn.ModuleDict({"replaced": replaced, "hooked": hooked, "plain": plain, "again": plain})
    new_root, left = linear_conv1d(root, frozen=True)
    assert new_root is root and set(left) == {"replaced", "hooked"}
    assert "replaced on the instance" in left["replaced"] and "hooks" in left["hooked"]
    assert root["replaced"] is replaced and root["hooked"] is hooked
    assert type(root["plain"]) is torch.nn.Linear and root["again"] is root["plain"]  # a shared layer: one replacement
    _, left = linear_conv1d(torch.nn.ModuleDict({"plain": conv1d()}), frozen=False)
    assert left == {"plain": NOT_FROZEN}
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:  # a global hook sees every module's call: it would see an nn.Linear in the Conv1D's place
        _, left = linear_conv1d(torch.nn.ModuleDict({"plain": conv1d()}), frozen=True)
    finally:
        handle.remove()
    assert "global module hooks" in left["plain"]
