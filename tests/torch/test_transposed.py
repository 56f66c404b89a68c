"""``addmm`` over a constant weight stored ``[in, out]`` (transformers' ``Conv1D``: GPT-2's
projections) made a linear call by the ``torch.compile`` backend under Inductor's freezing
(looprl.torch.transposed), and left to torch where freezing does not promise the weight."""

import gc

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=5).save(tmp_path_factory.mktemp("policy") / "policy")
    return {"policy": str(folder), "cache": ":memory:", "compare_torch": False, "measure": False}


class Conv1D(nn.Module):
    """GPT-2's projection as transformers writes it: the weight ``[in, out]``, ``torch.addmm``."""

    def __init__(self, out_features: int, in_features: int):
        super().__init__()
        self.nf = out_features
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / in_features ** 0.5)
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class Block(nn.Module):
    """Two projections with a GELU between, as GPT-2's MLP; ``scaled`` an addmm with beta 2 (not a linear call)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c_fc, self.c_proj = Conv1D(48, 24), Conv1D(24, 48)
        self.extra, self.square = nn.Parameter(torch.randn(24)), nn.Parameter(torch.randn(24, 24))

    def forward(self, x):
        y = self.c_proj(torch.nn.functional.gelu(self.c_fc(x)))
        scaled = torch.addmm(self.extra, x.view(-1, 24), self.square, beta=2.0)
        return y + scaled.view_as(y)


def compiled_layers(module, x, options, freezing: bool):
    """``module`` compiled by the backend: its output on ``x`` and how many linear operators its graph holds."""
    import torch._inductor.config as inductor_config

    from looprl import dynamo

    torch._dynamo.reset()
    gc.collect()
    alive = len(dynamo._layers)
    compiled = torch.compile(module, backend="looprl", options=options)
    with inductor_config.patch(freezing=freezing), torch.no_grad():
        out = compiled(x)
    layers = len(dynamo._layers) - alive
    torch._dynamo.reset()
    return out, layers


@pytest.mark.parametrize("shape", [(1, 1, 24), (3, 5, 24)])
def test_conv1d_projections_become_looprl_linear_calls_under_freezing_and_give_torchs_values(options, shape):
    module, x = Block().eval(), torch.randn(*shape)
    with torch.no_grad():
        expected = module(x)
    out, layers = compiled_layers(module, x, options, freezing=True)
    assert layers == 2  # c_fc and c_proj; the addmm with beta 2 is not a linear call and stays torch's
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_without_freezing_an_addmm_stays_torchs(options):
    module, x = Block().eval(), torch.randn(2, 24)
    with torch.no_grad():
        expected = module(x)
    out, layers = compiled_layers(module, x, options, freezing=False)
    assert layers == 0
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_the_pass_rewrites_only_constant_weights_of_the_right_shape():
    from looprl.torch.transposed import addmm_as_linear

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.randn(8, 6))
            self.register_buffer("b", torch.randn(6))

        def forward(self, x, w_input):
            return torch.addmm(self.b, x, self.w), torch.addmm(self.b, x, w_input), torch.addmm(self.b, x, self.w, alpha=0.5)

    gm = torch.fx.symbolic_trace(Graph())
    x = torch.randn(3, 8)
    for node in gm.graph.nodes:  # the example values Dynamo would have recorded
        if node.op == "placeholder":
            node.meta["example_value"] = x if node.name == "x" else torch.randn(8, 6)
    expected = gm(x, torch.randn(8, 6))[0]
    assert addmm_as_linear(gm, (torch.float32,)) == 1  # the weight that is an input and the scaled product are left alone
    calls = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    assert calls.count(torch.addmm) == 2 and calls.count(torch.nn.functional.linear) == 1
    torch.testing.assert_close(gm(x, torch.randn(8, 6))[0], expected)


def test_transformers_gpt2_under_the_compile_recipe_has_every_projection_looprls_and_gives_eagers_tokens(options):
    """GPT-2 (its projections ``Conv1D``) in transformers' compile recipe (a static cache,
    ``model.forward`` compiled whole, Inductor's freezing) with ``backend="looprl"``: each
    decoder layer's four projections and the LM head are looprl's calls, and greedy generation
    gives eager's tokens in float32."""
    pytest.importorskip("transformers")
    import copy

    import torch._inductor.config as inductor_config

    from looprl import dynamo
    from tests.torch.test_hf_models import build, generate, prompt

    model, ids = build("gpt2", layers=1), prompt()
    expected = generate(model, ids)
    torch._dynamo.reset()
    gc.collect()
    alive = len(dynamo._layers)
    compiled = copy.deepcopy(model)
    compiled.generation_config.cache_implementation = "static"
    compiled.forward = torch.compile(compiled.forward, backend="looprl", fullgraph=True, options=options)
    with inductor_config.patch(freezing=True):
        assert generate(compiled, ids) == expected
    assert len(dynamo._layers) - alive == 2 * (4 * model.config.num_hidden_layers + 1)  # the prefill's graph and the decode step's
    del compiled
    torch._dynamo.reset()
