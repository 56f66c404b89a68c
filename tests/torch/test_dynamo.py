"""torch.compile(model, backend="looprl"): linear calls become tuned kernels, everything else stays torch's."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=5).save(tmp_path_factory.mktemp("policy") / "policy")
    # looprl's kernels on every call (not routed to torch by timing): tests/torch/test_torch_routes.py tests routing.
    # A cache file of the module's: the policy alone's answers are remembered for it (a graph compiled again tunes nothing)
    cache = tmp_path_factory.mktemp("cache") / "dynamo.sqlite"
    return {"policy": str(folder), "budget_s": 0.05, "cache": str(cache), "compare_torch": False}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), nn.GELU(approximate="tanh"), nn.Linear(40, 24), nn.LayerNorm(24), nn.Linear(24, 8, bias=False),
                         nn.ReLU()).eval()


def test_a_compiled_model_computes_what_the_model_computes_at_any_row_count(options):
    from looprl import dynamo

    module = model()
    before = dynamo.stats()
    # the policy's answers alone (measure=False): this test is about what the compiled graph computes, not how it was tuned
    compiled = torch.compile(module, backend="looprl", dynamic=True, options=dict(options, rest="eager", max_rows=8, measure=False))
    with torch.no_grad():
        for rows in (4, 1, 7, 16, 37):  # and twice each: counts above max_rows too (14, 16, 32, 37, 74)
            x = torch.randn(rows, 24)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
            x = torch.randn(2, rows, 24)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
    after = dynamo.stats()
    assert after["looprl_calls"] - before["looprl_calls"] == 3 * 10  # three linear layers, ten calls, none fell back
    assert after["fallback_calls"] == before["fallback_calls"]
    # grad mode on: compiled again, the linear calls left to torch, gradients as torch computes them
    x = torch.randn(5, 24, requires_grad=True)
    compiled(x).sum().backward()
    reference = x.detach().clone().requires_grad_()
    module(reference).sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)
    assert dynamo.stats()["looprl_calls"] == after["looprl_calls"]


def test_the_rest_of_the_graph_goes_to_inductor(options):
    module = nn.Sequential(nn.Linear(16, 16), nn.SiLU()).eval()
    compiled = torch.compile(module, backend="looprl", options=dict(options, max_rows=4, measure=False))  # the policy's answer
    with torch.no_grad():
        x = torch.randn(4, 16)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)


def test_with_inductor_freezing_the_linear_layers_are_still_replaced(options):
    """With ``torch._inductor.config.freezing`` on, Dynamo hands the parameters to the backend
    as attributes of the graph (``get_attr``), not as inputs: they must be found there too."""
    import gc

    import torch._inductor.config as inductor_config

    from looprl import dynamo

    torch._dynamo.reset()
    gc.collect()  # the graphs reset dropped, freed now: stats() lists the operators alive
    module = model()
    before = dynamo.stats()
    compiled = torch.compile(module, backend="looprl", options=dict(options, rest="eager", measure=False))  # found, not searched
    with inductor_config.patch(freezing=True), torch.no_grad():
        x = torch.randn(6, 24)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
    after = dynamo.stats()
    assert len(after["layers"]) - len(before["layers"]) == 3 and after["looprl_calls"] - before["looprl_calls"] == 3
    torch._dynamo.reset()


def test_bad_options_are_refused_with_their_names(options):
    compiled = torch.compile(nn.Linear(4, 4).eval(), backend="looprl", options={"rows": 3})
    with pytest.raises(Exception, match="unknown looprl backend option"):
        with torch.no_grad():
            compiled(torch.randn(2, 4))


@pytest.mark.parametrize("max_rows", [-1, 0, 2.5, True, "8"])
@pytest.mark.parametrize("grad", [False, True])
def test_a_bad_max_rows_is_refused_by_name(options, max_rows, grad):
    compiled = torch.compile(nn.Linear(4, 4).eval(), backend="looprl", options=dict(options, rest="eager", max_rows=max_rows))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="ValueError: max_rows must be a positive integer"):
        with torch.set_grad_enabled(grad):  # refused also where grad mode leaves every linear call to torch
            compiled(torch.randn(3, 4))


def test_the_backend_is_found_by_name_without_importing_looprl():
    """In a fresh interpreter that has imported torch and not looprl (the first of the checks
    that share one: tests/fresh_interpreter.py)."""
    from tests.fresh_interpreter import fresh_interpreter_checks

    outcome = fresh_interpreter_checks()["backend by name"]
    assert outcome["error"] is None, outcome["error"]


class Attention(nn.Module):
    def forward(self, q, k, v):
        return torch.matmul((q @ k.transpose(-2, -1)).softmax(-1), v)


def test_attention_s_batched_products_become_tuned_kernels_of_their_shapes(options):
    from looprl import dynamo

    module = Attention()
    compiled = torch.compile(module, backend="looprl", options=dict(options, rest="eager", bmm="always"))
    q, k, v = (torch.randn(2, 3, 10, 8) for _ in range(3))
    before = dynamo.stats()
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), module(q, k, v), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(q, k, v.contiguous()), module(q, k, v), rtol=1e-5, atol=1e-5)
    after = dynamo.stats()
    assert after["looprl_calls"] - before["looprl_calls"] == 4 and after["fallback_calls"] == before["fallback_calls"]
    product = dynamo._products[sorted(dynamo._products.keys())[-2]]  # q @ k^T: the transposed right operand is read in place
    assert product.transposed and product.result.problem.spec == "bmk,bnk->bmn"
    with torch.no_grad():  # a layout other than the tuned one: torch's answer
        wide = torch.randn(2, 3, 8, 20)[..., :10]
        torch.testing.assert_close(product(q, wide), torch.matmul(q, wide))
    assert dynamo.stats()["fallbacks"].get("right operand's layout not as tuned", 0) >= 1
    never = torch.compile(Attention(), backend="looprl", options=dict(options, rest="eager", bmm="never"))
    newest = max(dynamo._products.keys())
    with torch.no_grad():
        torch.testing.assert_close(never(q, k, v), module(q, k, v), rtol=1e-5, atol=1e-5)
    assert max(dynamo._products.keys()) == newest  # no product registered


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_compiled_layers_are_freed_with_their_graphs(options, rest):
    """Issue 51 #12: every compilation registered its operators' kernels (and their copies of
    the weights) for the life of the process; now the compiled graph owns them (as long as
    Dynamo keeps it: they survive a collection), and ``torch._dynamo.reset()`` (dropping the
    graphs) frees them. The rest of the graph eager's: two compilations, the second not keeping
    the first's kernels; Inductor's (which compiles the rest, not the registration): one."""
    import gc
    import weakref

    from looprl import dynamo

    # model()'s three linear layers and fused activations without its LayerNorm: what Inductor compiles around the layers is
    # not the subject (the LayerNorm cost Inductor's C++ compiler seconds from a cold cache); the layers' problems are model()'s
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(24, 40), nn.GELU(approximate="tanh"), nn.Linear(40, 24), nn.Linear(24, 8, bias=False), nn.ReLU()).eval()
    x = torch.randn(4, 24)
    torch._dynamo.reset()
    gc.collect()
    alive = len(dynamo._layers)
    before = dynamo.stats()
    kept = []  # weak references to each compilation's kernels and to one of their weight copies
    compilations = 2 if rest == "eager" else 1
    for _ in range(compilations):  # each freed: the second is not the first's kernels kept
        compiled = torch.compile(module, backend="looprl", options=dict(options, rest=rest, measure=False))  # nothing searched
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
            gc.collect()  # the graph Dynamo keeps still owns its operators
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
        assert len(dynamo._layers) == alive + 3  # this compilation's three linear layers, no more
        newest = dynamo._layers[max(dynamo._layers.keys())]
        entry = newest._bound._entry  # the weight copy its kernels were bound from (none where they read it in place)
        copy = entry[0][0][1] if entry is not None else newest
        kept += [weakref.ref(newest), weakref.ref(copy)]
        del compiled, newest, copy, entry  # (entry holds the weight copy too)
        torch._dynamo.reset()
        gc.collect()
        assert len(dynamo._layers) == alive
    assert all(reference() is None for reference in kept)
    # the calls of freed layers still count in the totals: two calls of three layers each time
    assert dynamo.stats()["looprl_calls"] == before["looprl_calls"] + compilations * 2 * 3
