"""Sibling linear calls (one input, weights promised constant by Inductor's freezing) merged by the
``torch.compile`` backend into one call over their weights concatenated (looprl.torch.siblings):
attention's q, k and v, a gated MLP's gate and up."""

import gc

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402

from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=5).save(tmp_path_factory.mktemp("policy") / "policy")
    # every call looprl's (not routed to torch by timing), the policy's answers alone (remembered for the module's cache
    # file: a graph compiled again tunes nothing); the rest of the graph Inductor's, whose freezing folds the concatenated
    # weights into constants (the backend merges only for it)
    cache = tmp_path_factory.mktemp("cache") / "siblings.sqlite"
    return {"policy": str(folder), "cache": str(cache), "compare_torch": False, "measure": False}


class Projections(nn.Module):
    """q, k and v (with biases) and gate and up (without) on one input, as a decoder layer has
    them, and a down projection of the gated product; q's columns viewed as heads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16)
        self.gate, self.up = nn.Linear(32, 48, bias=False), nn.Linear(32, 48, bias=False)
        self.down = nn.Linear(48, 32)

    def forward(self, x):
        heads = self.q(x).view(*x.shape[:-1], 4, 8).transpose(-2, -3)  # a view of the merged call's columns holds
        mixed = heads.transpose(-2, -3).reshape(*x.shape[:-1], 32) * torch.cat([self.k(x), self.v(x)], -1)
        return mixed + self.down(functional.silu(self.gate(x)) * self.up(x))


def compiled_layers(module, x, options, freezing: bool):
    """``module`` compiled by the backend (freezing on or off): its output on ``x`` and how many
    linear operators its graph holds."""
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


@pytest.mark.parametrize("shape", [(1, 1, 32), (5, 32)])
def test_siblings_become_one_call_under_freezing_and_give_the_unmerged_outputs(options, shape):
    """Merged on either input's rank; ``merge=False`` compiled once, on the 2-D input (its six
    calls are the backend's ordinary path, for inputs of any rank in tests/torch/test_dynamo.py)."""
    module, x = Projections().eval(), torch.randn(*shape)
    with torch.no_grad():
        expected = module(x)
    merged, merged_layers = compiled_layers(module, x, options, freezing=True)
    assert merged_layers == 3  # q+k+v, gate+up, down
    torch.testing.assert_close(merged, expected)
    if len(shape) == 2:
        apart, apart_layers = compiled_layers(module, x, dict(options, merge=False), freezing=True)
        assert apart_layers == 6  # against all six
        torch.testing.assert_close(merged, apart)  # the same values, up to float32 rounding


@pytest.mark.parametrize("freezing, rest", [(False, "inductor"), (True, "eager")])
def test_without_freezing_or_inductor_nothing_is_merged(options, freezing, rest):
    """Without the promise the weights are the graph's inputs (a concatenation would go stale);
    without Inductor nothing folds the concatenations (each call would concatenate again)."""
    module, x = Projections().eval(), torch.randn(3, 32)
    with torch.no_grad():
        expected = module(x)
    out, layers = compiled_layers(module, x, dict(options, rest=rest), freezing=freezing)
    assert layers == 6
    torch.testing.assert_close(out, expected)


def test_a_bad_merge_option_is_refused_by_name(options):
    compiled = torch.compile(Projections().eval(), backend="looprl", options=dict(options, merge="yes"))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="ValueError: option merge"):
        with torch.no_grad():
            compiled(torch.randn(2, 32))


def test_transformers_compile_recipe_merges_q_k_v_and_gate_up_and_gives_eagers_tokens(options):
    """transformers' compile recipe (a static cache, ``model.forward`` compiled whole, Inductor's
    freezing) with ``backend="looprl"``: each decoder layer's seven projections are four calls
    (q+k+v, o, gate+up, down), and greedy generation gives eager's tokens in float32.

    On a Qwen2-style model: transformers writes its decoder layer as Llama's (Qwen2's attention
    and MLP subclass Llama's) with biases on q, k and v, so one model merges both kinds of
    siblings, with biases (q+k+v) and without (gate+up); a Llama-style model's graph is the same
    graph without those three biases. GPT-2's recipe: tests/torch/test_transposed.py."""
    arch = "qwen2"
    pytest.importorskip("transformers")
    import copy

    import torch._inductor.config as inductor_config

    from looprl import dynamo
    from tests.torch.test_hf_models import build, generate, prompt

    model, ids = build(arch, layers=1), prompt()  # one decoder layer: what is asserted is per layer
    expected = generate(model, ids)
    torch._dynamo.reset()
    gc.collect()
    alive = len(dynamo._layers)
    compiled = copy.deepcopy(model)
    compiled.generation_config.cache_implementation = "static"
    compiled.forward = torch.compile(compiled.forward, backend="looprl", fullgraph=True, options=options)
    with inductor_config.patch(freezing=True):
        assert generate(compiled, ids) == expected
    layers = model.config.num_hidden_layers
    assert len(dynamo._layers) - alive == 2 * (4 * layers + 1)  # the prefill's graph and the decode step's: 4 calls a layer, the LM head
    del compiled
    torch._dynamo.reset()
