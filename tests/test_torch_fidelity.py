"""A tuned model computes what the given model computes, and tuning leaves the given model (and
torch's random generator) as they were (issue 51): fused activations, hooks, parametrizations,
pruning, weight norm, negative views, BatchNorm and Dropout; then a seeded property test over
random small models and random edits."""

import copy
import hashlib
import random

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrize, prune  # noqa: E402

import looprl  # noqa: E402
from looprl.torch import TunedLinear, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch.routes import NEGATIVE_VIEW  # noqa: E402
from tests.policies import random_policy  # noqa: E402

# float32 GEMMs summing in another order: relative error of a few ulp times the reduction's
# length, on values of order one (the layers here reduce over at most 32 terms)
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    # looprl's kernels on every call (none routed to torch by timing), unless a test asks for the checks
    return {"policy": str(folder), "budget_s": 0.05, "cache": str(tmp_path_factory.mktemp("cache") / "f.sqlite"),
            "compare_torch": False, "progress": False}


def close(a, b):
    torch.testing.assert_close(a, b, **TOLERANCE)


def test_a_negative_view_input_is_computed_with_its_values_and_a_negative_weight_by_torch(options):
    """Issue 51 #14: torch._neg_view keeps the values unnegated in memory, with a bit that says so."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 16).eval()
    x = torch.randn(4, 8)
    tuned = tune_module(layer, x, **options)
    with torch.no_grad():
        close(tuned(torch._neg_view(x)), layer(torch._neg_view(x)))
        close(tuned(torch._neg_view(x.t()).t()), layer(-x))  # a strided negative view too
        assert stats(tuned)["looprl_calls"] == 2  # resolved, then looprl's kernels
        weight = torch.randn(16, 8)
        layer.weight.data = torch._neg_view(weight.clone())
        tuned.weight.data = torch._neg_view(weight.clone())
        assert tuned.weight.is_neg()
        close(tuned(x), layer(x))
        close(tuned(x), functional.linear(x, -weight, layer.bias))
    assert stats(tuned)["fallbacks"] == {NEGATIVE_VIEW: 2}
