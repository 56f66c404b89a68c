"""bfloat16 models: tune_module and the torch.compile backend give bfloat16 linear layers
bfloat16 kernels, within the derived bound of the exact layer on the bfloat16 values."""

import numpy as np
import pytest
import torch
from torch import nn

import looprl.dynamo
import looprl.torch as lt
from looprl.ir.dtypes import error_bound
from looprl.torch.module import NOT_FLOAT32, _left_to_torch

BF16 = torch.bfloat16


def model(seed=0, activation=True):
    torch.manual_seed(seed)
    layers = [nn.Linear(96, 200)] + ([nn.GELU()] if activation else []) + [nn.Linear(200, 72, bias=False)]
    return nn.Sequential(*layers).to(BF16).eval()


def assert_layer_within_bound(x, linear: nn.Linear, out):
    """``out`` against the exact ``x @ W.T + b`` of the bfloat16 values: the contraction's bound,
    the bias's one float32 addition, one rounding to bfloat16."""
    xs, w = x.detach().float().reshape(-1, linear.in_features).numpy(), linear.weight.detach().float().numpy()
    exact = xs.astype(np.float64) @ w.T.astype(np.float64)
    bound = error_bound("mk,nk->mn", xs, w, linear.in_features, "bfloat16")
    if linear.bias is not None:
        exact = exact + linear.bias.detach().float().numpy()
        bound = bound + 2.0**-24 * np.abs(exact) + 2.0**-8 * np.abs(exact)
    assert (np.abs(out.detach().float().reshape(exact.shape).numpy() - exact) <= bound).all()


@pytest.mark.parametrize("frozen", [False, True])
def test_tune_module_gives_bfloat16_layers_bfloat16_kernels(frozen):
    m = model(activation=False)
    # kernels for 1, 2, 4 and 6 rows (every power of two up to the most rows an example gave, and those rows): a call of 5
    # rows is planned from them, one of 13 beyond them; 6, not 24, rows: four row counts tuned a layer, not six
    examples = [torch.randn(1, 96).to(BF16), torch.randn(6, 96).to(BF16)]
    tuned = lt.tune_module(m, examples, measure=False, compare_torch=False, progress=False, frozen=frozen)
    first, second = tuned[0], tuned[1]
    assert isinstance(first, lt.TunedLinear) and first.kernels.dtype == "bfloat16"
    assert all(result.problem.dtype == "bfloat16" for result in first.results.values())
    with torch.no_grad():
        for rows in (1, 5, 6, 13):  # tuned, between, and beyond the tuned rows
            x = torch.randn(rows, 96).to(BF16)
            hidden = first(x)
            assert hidden.dtype == BF16 and hidden.shape == (rows, 200)
            assert_layer_within_bound(x, m[0], hidden)
            assert_layer_within_bound(hidden, m[1], second(hidden))
            assert torch.equal(tuned(x), second(hidden))
    assert lt.stats(tuned)["fallback_calls"] == 0


def test_a_fused_activation_in_a_bfloat16_model():
    m = model()
    tuned = lt.tune_module(m, torch.randn(8, 96).to(BF16), measure=False, compare_torch=False, progress=False)
    with torch.no_grad():
        x = torch.randn(8, 96).to(BF16)
        out, reference = tuned(x), m(x)
    assert out.dtype == BF16 and lt.stats(tuned)["looprl_calls"] == 2 and lt.stats(tuned)["fallback_calls"] == 0
    # the hidden values may differ from torch's by a bfloat16 rounding, which the second layer carries on
    assert (out.float() - reference.float()).abs().max() <= 0.02 * reference.float().abs().max()


def test_a_layer_of_mixed_dtypes_is_left_to_torch_and_a_float32_call_of_a_bfloat16_layer_falls_back():
    mixed = nn.Linear(16, 32).to(BF16)
    mixed.bias.data = mixed.bias.data.float()  # weight bfloat16, bias float32
    assert _left_to_torch(mixed) == NOT_FLOAT32
    assert _left_to_torch(nn.Linear(16, 32).to(torch.float16)) == NOT_FLOAT32
    layer = lt.tune_module(nn.Linear(32, 8).to(BF16), torch.randn(4, 32).to(BF16), measure=False, compare_torch=False, progress=False)
    with torch.no_grad():
        assert layer.kernels.why_not(torch.randn(4, 32), layer.weight, layer.bias) == "input not a bfloat16 CPU tensor"


def test_the_backend_replaces_bfloat16_linear_calls():
    m = model(1)
    x = torch.randn(6, 96).to(BF16)
    before = looprl.dynamo.stats()  # process-wide totals: an earlier test's fallbacks stay counted
    with torch.no_grad():
        compiled = torch.compile(m, backend="looprl", options={"measure": False, "compare_torch": False, "rest": "eager"})
        out = compiled(x)
        assert out.dtype == BF16
        hidden = nn.functional.gelu(m[0](x).float()).to(BF16)
        reference = m(x).float()
    calls = looprl.dynamo.stats()
    assert calls["looprl_calls"] - before["looprl_calls"] >= 2 and calls["fallback_calls"] == before["fallback_calls"]
    # the output within the second layer's bound around the exact layer on torch's hidden values
    # (the first layer's output may differ by a rounding, which the second layer carries on)
    assert (out.float() - reference).abs().max() <= 0.05 * reference.abs().max()
    assert_layer_within_bound(hidden, m[2], m[2](hidden))
    torch._dynamo.reset()
