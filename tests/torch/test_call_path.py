"""A tuned layer's call made cheaper (issue 63: a routed or tuned call at most 5 us more than
torch's own) computes what it did: a routed row count is torch's answer bit for bit, whatever the
input's shape; a call the checks must refuse is still refused after many accepted calls (another
dtype, autograd, a weight replaced, a parametrization or pruning added after tuning)."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrize, prune  # noqa: E402

import looprl  # noqa: E402
from looprl.torch import TORCH_FASTER, Route, TunedLinear  # noqa: E402

IN, OUT = 24, 16


def results(counts=(1, 8)):
    """Tune results of the untuned nest (compiled, nothing tuned) for each row count."""
    answer = {}
    for rows in counts:
        nest = looprl.initial_nest(looprl.linear(rows, IN, OUT, bias=True))
        answer[rows] = looprl.TuneResult(problem=nest.problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0,
                                         initial_gflops=1.0, seconds=0.0, mode="policy")
    return answer


@pytest.fixture(scope="module")
def compiled():
    return results()


def layer_pair(compiled, frozen=False, routes=None):
    torch.manual_seed(0)
    layer = nn.Linear(IN, OUT).eval()
    return layer, TunedLinear(layer, None, compiled, routes=routes, frozen=frozen)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_routed_row_count_is_torchs_answer_bit_for_bit_in_any_shape(compiled):
    # one row judged torch's, eight looprl's: 1-row calls (2-D, 3-D, 4-D inputs) are torch's own call
    layer, tuned = layer_pair(compiled, routes={1: Route(1, 2e-6, 1e-6), 8: Route(8, 1e-6, 2e-6)})
    with torch.no_grad():
        for x in (torch.randn(1, IN), torch.randn(1, 1, IN), torch.randn(1, 1, 1, IN), torch.randn(IN, 3)[:, 0].unsqueeze(0)):
            assert torch.equal(tuned(x), functional.linear(x, layer.weight, layer.bias))
        for shape in ((8, IN), (2, 4, IN)):  # looprl's rows, flattened from any leading dimensions
            x = torch.randn(*shape)
            close(tuned(x), layer(x))
    assert tuned.counted() == {TORCH_FASTER: 4, "looprl": 2}


def test_after_many_accepted_calls_a_call_the_checks_refuse_still_falls_back(compiled):
    layer, tuned = layer_pair(compiled)
    x = torch.randn(8, IN)
    with torch.no_grad():
        for _ in range(3):
            close(tuned(x), layer(x))
        with pytest.raises(RuntimeError):  # another dtype: torch's call, torch's error
            tuned(x.double())
        assert tuned(torch.randn(0, IN)).shape == (0, OUT)
    grad_x = x.clone().requires_grad_()
    out = tuned(grad_x)  # grad mode: torch's call, which records the graph
    assert out.grad_fn is not None
    out.sum().backward()
    assert grad_x.grad is not None
    assert tuned.counted() == {"looprl": 3, "input not a float32 CPU tensor": 1, "empty input": 1, "autograd": 1}


@pytest.mark.parametrize("frozen", [False, True])
def test_a_weight_replaced_or_viewed_otherwise_is_bound_again(compiled, frozen):
    layer, tuned = layer_pair(compiled, frozen=frozen)
    x = torch.randn(8, IN)
    with torch.no_grad():
        close(tuned(x), layer(x))
        tuned.weight.data = torch.randn(OUT, IN)  # a new tensor: bound again, frozen or not
        close(tuned(x), functional.linear(x, tuned.weight, tuned.bias))
        tuned.weight.data = torch.randn(IN, OUT).t()  # the same shape, other strides
        close(tuned(x), functional.linear(x, tuned.weight, tuned.bias))
        tuned.weight.data = tuned.weight.data.double()  # another dtype: torch's call (its error)
        with pytest.raises(RuntimeError):
            tuned(x)
    assert tuned.counted() == {"looprl": 3, "parameters not float32 on the CPU": 1}


def test_a_parametrization_or_pruning_added_after_tuning_is_the_weight_used(compiled):
    class Doubled(nn.Module):
        def forward(self, weight):
            return 2 * weight

    layer, tuned = layer_pair(compiled)
    x = torch.randn(8, IN)
    parametrize.register_parametrization(tuned, "weight", Doubled())
    with torch.no_grad():
        close(tuned(x), functional.linear(x, 2 * layer.weight, layer.bias))
    layer, tuned = layer_pair(compiled)
    prune.l1_unstructured(tuned, "weight", amount=0.5)
    with torch.no_grad():
        close(tuned(x), functional.linear(x, tuned.weight_orig * tuned.weight_mask, layer.bias))
        assert not torch.equal(tuned.weight, layer.weight)
