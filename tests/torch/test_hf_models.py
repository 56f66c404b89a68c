"""Hugging Face transformers' own decoders (Llama-, Qwen2- and GPT-2-style, tiny configs, random
weights, nothing downloaded) tuned by ``tune_module``: ``generate`` gives eager's tokens.

What ``tune_module`` promises, and so what is asserted: in float32 each tuned layer computes
the layer's function within float32 rounding (another summation order than torch's), so greedy
generation gives exactly eager's tokens (a tie between two logits broken the other way by a
rounding would show as a failure, and none is near one in these seeded models). In bfloat16 a
tuned layer is within the derived error bound of the exact layer on the bfloat16 values
(tests/torch/test_torch_bfloat16.py), not bit for bit torch's: the logits, fed eager's tokens,
are within a few bfloat16 roundings of eager's, and the tokens are eager's up to the first step
where eager's own top two logits are that close (none of these seeded models has one).

Most tests schedule every layer by a small policy alone (``measure=False``) and keep every
row count on looprl's kernels (``compare_torch=False``): the kernels are what runs inside the
model, not torch (the routes would give a model this small to torch). One test runs the
default path (measured tuning, the routes judged) on one tiny model.
"""

import importlib.util
import warnings

import pytest

torch = pytest.importorskip("torch")
# transformers imported by the tests that build a model (build()), not when collected: ~0.8 CPU s in
# each worker, which may never build one
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="could not import 'transformers'")

from looprl.torch import TunedLinear, stats, tune_module, tuned_layers  # noqa: E402
from tests.policies import random_policy  # noqa: E402

VOCAB = 256
NEW_TOKENS = 8
SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "vocab_size": VOCAB, "max_position_embeddings": 64, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def build(arch: str, dtype=torch.float32, layers: int = 2):
    """A transformers decoder of ``layers`` decoder layers, random weights (seed 0), in eval mode:
    ``llama`` (grouped-query attention, no biases), ``qwen2`` (grouped-query attention, biases on
    q, k and v; its LM head not tied) or ``gpt2`` (GPT-2's own attention and MLP, its LM head tied
    to the embedding)."""
    import transformers

    shape = dict(SHAPE, num_hidden_layers=layers)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    elif arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape, tie_word_embeddings=False))
    else:
        config = transformers.GPT2Config(n_embd=64, n_layer=layers, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=None,
                                         eos_token_id=None)
        model = transformers.GPT2LMHeadModel(config)
    torch.manual_seed(0)
    model.init_weights()  # drawn again from seed 0 (the constructor's draws follow torch's global state)
    return model.eval().to(dtype)


def prompt():
    return torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(1))


def generate(model, ids):
    """Greedy: the ``NEW_TOKENS`` new token ids after ``ids``."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def logits(model, ids):
    """The logits at every position of ``ids`` (one call, no cache), as float32."""
    with torch.no_grad():
        return model(ids, use_cache=False).logits[0].float()


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    return {"policy": folder, "cache": str(tmp_path_factory.mktemp("cache") / "m.sqlite"), "compare_torch": False, "progress": False,
            "measure": False}


def examples(ids):
    """What a generation calls: the prompt's prefill and a one-token decode step."""
    return [(ids,), (ids[:, :1],)]


# GPT-2's attention and MLP projections are transformers' Conv1D (x @ W + b with W [in, out]),
# not nn.Linear: without frozen=True tune_module tunes its LM head alone (with it, the Conv1D layers too: the last test).
TUNED = {"llama": 15, "qwen2": 15, "gpt2": 1}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_a_tuned_transformers_decoder_generates_eagers_tokens_in_float32(options, arch):
    model, ids = build(arch), prompt()
    expected = generate(model, ids)
    tuned = tune_module(model, examples(ids), **options)
    assert len(dict(tuned_layers(tuned))) == TUNED[arch] and type(tuned) is type(model)
    assert generate(tuned, ids) == expected
    counted = stats(tuned)
    assert counted["fallback_calls"] == 0 and counted["looprl_calls"] >= TUNED[arch] * NEW_TOKENS  # every call of every step looprl's
    assert generate(model, ids) == expected  # the given model is left as it was


# Qwen2-style, not also Llama-style: transformers writes Qwen2's decoder layer as Llama's (its attention and MLP subclass
# Llama's) with biases on q, k and v, so in bfloat16 its layers are Llama's problems (o, gate, up, down and the LM head,
# without biases) and the biased ones; Llama-style models are the float32 tests'.
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_a_tuned_transformers_decoder_in_bfloat16_stays_within_bfloat16_roundings_of_eager(options, arch):
    model, ids = build(arch, torch.bfloat16), prompt()
    expected = generate(model, ids)
    tuned = tune_module(model, examples(ids), **options)
    layers = dict(tuned_layers(tuned))
    assert len(layers) == TUNED[arch] and all(layer.kernels.dtype == "bfloat16" for layer in layers.values())
    got = generate(tuned, ids)
    assert stats(tuned)["fallback_calls"] == 0
    sequence = torch.cat([ids, torch.tensor([expected])], dim=1)  # eager's tokens fed to both
    reference, ours = logits(model, sequence), logits(tuned, sequence)
    tolerance = 2.0**-4 * reference.abs().max().item()  # a few bfloat16 roundings (8 bits) of the largest logit
    assert (ours - reference).abs().max().item() <= tolerance
    first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    if first is not None:  # a token may differ only where eager's own choice was that close a call
        row = reference[ids.shape[1] - 1 + first]
        assert (row[expected[first]] - row[got[first]]).item() <= 2 * tolerance


def test_the_default_path_and_frozen_on_a_transformers_decoder_give_eagers_tokens(tmp_path):
    """``tune_module(model, (prompt,))`` as the docs show it (measured tuning, the routes
    judged, the tuned model checked against the model), and ``frozen=True``."""
    model, ids = build("llama"), prompt()
    expected = generate(model, ids)
    cache = str(tmp_path / "m.sqlite")
    with warnings.catch_warnings():  # a model this small may go to torch whole ("tuned no layer"): which layers do is timing's call
        warnings.simplefilter("ignore", RuntimeWarning)
        tuned = tune_module(model, (ids[:, :1],), budget_s=0.05, cache=cache, progress=False)
    assert generate(tuned, ids) == expected
    counted = stats(tuned)
    assert set(counted["left_to_torch"]) | {name for name, _ in tuned_layers(tuned)} == {
        name for name, module in model.named_modules() if type(module) is torch.nn.Linear}  # every layer tuned, or torch's with a reason
    frozen = tune_module(model, (ids[:, :1],), frozen=True, compare_torch=False, measure=False, cache=cache, progress=False)
    assert all(layer.kernels.frozen for _, layer in tuned_layers(frozen)) and isinstance(frozen.lm_head, TunedLinear)
    assert generate(frozen, ids) == expected


def test_frozen_tunes_gpt2_s_conv1d_projections_and_the_default_path_names_them_left_to_torch(options):
    """GPT-2's attention and MLP projections are transformers' Conv1D (x @ W + b, W [in, out]):
    with frozen=True each becomes an nn.Linear over its weight transposed once and is tuned
    (two layers of four projections, and the LM head); without it each stays torch's, named
    with the reason. The given model keeps its Conv1D layers."""
    model, ids = build("gpt2"), prompt()
    expected = generate(model, ids)
    frozen = tune_module(model, examples(ids), frozen=True, **options)
    layers = dict(tuned_layers(frozen))
    assert len(layers) == 9 and "transformer.h.1.mlp.c_fc" in layers and all(layer.kernels.frozen for layer in layers.values())
    assert generate(frozen, ids) == expected
    counted = stats(frozen)
    assert counted["fallback_calls"] == 0 and counted["looprl_calls"] >= 9 * NEW_TOKENS
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D" and generate(model, ids) == expected
    followed = tune_module(model, examples(ids), **options)
    conv1d = {name for name, module in model.named_modules() if type(module).__name__ == "Conv1D"}
    left = stats(followed)["left_to_torch"]
    assert len(conv1d) == 8 and conv1d <= set(left) and all("frozen=True" in left[name] for name in conv1d)
