"""What ``hf_generate.py`` runs: its models' configs, each mode's preparation and a timed greedy
generation. Not a script (``test_experiments`` skips names that start with ``_``)."""

from __future__ import annotations

import contextlib
import copy
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

# The models' shapes: hidden size, decoder layers, attention heads, key-value heads, MLP width, vocabulary.
CONFIGS = {
    "qwen2": {"arch": "qwen2", "hidden": 512, "layers": 16, "heads": 8, "kv_heads": 2, "mlp": 1408, "vocab": 32000},
    "gpt2": {"arch": "gpt2", "hidden": 768, "layers": 12, "heads": 12, "kv_heads": 12, "mlp": 3072, "vocab": 50257},
    "llama": {"arch": "llama", "hidden": 2048, "layers": 6, "heads": 16, "kv_heads": 4, "mlp": 5632, "vocab": 32000},
}
QUICK = {name: dict(shape, hidden=64, layers=2, heads=4, kv_heads=4 if name == "gpt2" else 2, mlp=128, vocab=1000)
         for name, shape in CONFIGS.items()}
POSITIONS = 1024  # the longest prompt and its new tokens fit


def build(name: str, quick: bool = False, dtype: str = "float32"):
    """The model of config ``name`` (tiny where ``quick``), random weights drawn from seed 0 (in
    float32, then cast to ``dtype``: ``"float32"`` or ``"bfloat16"``), eval mode."""
    import transformers

    shape = (QUICK if quick else CONFIGS)[name]
    if shape["arch"] == "gpt2":
        config = transformers.GPT2Config(n_embd=shape["hidden"], n_layer=shape["layers"], n_head=shape["heads"], n_inner=shape["mlp"],
                                         vocab_size=shape["vocab"], n_positions=POSITIONS, bos_token_id=None, eos_token_id=None)
        model_class = transformers.GPT2LMHeadModel
    else:
        kind = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[shape["arch"]]
        config = kind[0](hidden_size=shape["hidden"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"], intermediate_size=shape["mlp"], vocab_size=shape["vocab"],
                         max_position_embeddings=POSITIONS, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
        model_class = kind[1]
    torch.manual_seed(0)
    return model_class(config).eval().to(getattr(torch, dtype))


def make_prompt(model, length: int):
    """A prompt of ``length`` random token ids of ``model``'s vocabulary (seed 1), one sequence."""
    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))


def _projections(model) -> list[nn.Module]:
    from transformers.pytorch_utils import Conv1D

    return [module for module in model.modules() if type(module) in (nn.Linear, Conv1D)]


def read_bytes_per_token(model, context: float) -> int:
    """Bytes a decode step reads at least: every linear layer's (and ``Conv1D``'s) weight and bias,
    each tensor once, and the KV cache of ``context`` positions (in the model's dtype)."""
    tensors = {}
    for module in _projections(model):
        for tensor in (module.weight, module.bias):
            if tensor is not None:
                tensors[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return int(sum(tensors.values()) + 2 * layers * heads * head_dim * context * element)


class TokenClock:
    """A ``generate`` streamer that notes when each new token comes (the first ``put`` is the prompt)."""

    def __init__(self):
        self.started, self.times, self.prompt_seen = time.perf_counter(), [], False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def rates(started: float, times: list[float]) -> tuple[float, float]:
    """Prefill seconds (until the first new token) and decode tokens per second (the others)."""
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    return times[0] - started, decode


class Runner:
    """A transformers model's timed greedy generation, each call inside ``context()``."""

    def __init__(self, model, context=contextlib.nullcontext):
        self.model, self.context = model, context

    def __call__(self, prompt, new: int) -> tuple[list[int], float, float]:
        clock = TokenClock()
        with torch.no_grad(), self.context():
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, streamer=clock, pad_token_id=0)
        return (out[0, prompt.shape[1]:].tolist(), *rates(clock.started, clock.times))


def generate(runner, prompt, new: int) -> tuple[list[int], float, float]:
    """Greedy: the new token ids, prefill seconds and decode tokens per second."""
    return runner(prompt, new)


def _freezing():
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def compiled(model, backend: str, threads: int, looprl_cache: Path | None):
    """transformers' compile recipe on a copy: a static cache, ``model.forward`` compiled whole
    (``fullgraph=True``), compiled and called with Inductor's freezing (``backend``: "max-autotune"
    or "looprl")."""
    model = copy.deepcopy(model)
    model.generation_config.cache_implementation = "static"
    if backend == "max-autotune":
        model.forward = torch.compile(model.forward, mode="max-autotune", fullgraph=True)
    else:
        options = {"threads": threads, "cache": str(looprl_cache / "looprl.sqlite")}
        model.forward = torch.compile(model.forward, backend="looprl", fullgraph=True, options=options)
    return Runner(model, _freezing)


class PackedLinear(nn.Module):
    """``x @ weight.T + bias`` by oneDNN's linear on ``weight`` ([out, in]) packed once for one row."""

    def __init__(self, weight, bias):
        super().__init__()
        self.out_features = weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x):
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)


def onednn_packed(model):
    """A copy whose ``nn.Linear`` layers and GPT-2 ``Conv1D`` projections are :class:`PackedLinear`."""
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("this torch has no oneDNN (torch.backends.mkldnn)")
    packed = copy.deepcopy(model)
    layers = set(_projections(packed))
    for parent in list(packed.modules()):
        for name, child in list(parent.named_children()):
            if child in layers:
                weight = child.weight if type(child) is nn.Linear else child.weight.t()  # Conv1D keeps W as [in, out]
                setattr(parent, name, PackedLinear(weight, child.bias))
    return Runner(packed)


class CTranslate2Runner:
    """The model converted by CTranslate2 (in the model's dtype, float32 or bfloat16) and run by its generator, greedy."""

    def __init__(self, model, threads: int):
        import ctranslate2

        self.folder = tempfile.TemporaryDirectory(prefix="hf_generate_ct2_")
        source, target = Path(self.folder.name) / "model", Path(self.folder.name) / "ct2"
        model.save_pretrained(source)
        _id_tokenizer(model.config.vocab_size).save_pretrained(source)  # the converter reads the vocabulary from a tokenizer
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        ctranslate2.converters.TransformersConverter(str(source)).convert(str(target), quantization=dtype)
        self.generator = ctranslate2.Generator(str(target), device="cpu", compute_type=dtype, intra_threads=threads)

    def __call__(self, prompt, new: int) -> tuple[list[int], float, float]:
        tokens, times = [], []
        started = time.perf_counter()
        steps = self.generator.generate_tokens([f"t{i}" for i in prompt[0].tolist()], max_length=new, sampling_topk=1, end_token=[])
        for step in steps:
            times.append(time.perf_counter())
            tokens.append(step.token_id)
        return (tokens, *rates(started, times))


def _id_tokenizer(vocab: int):
    """A word-level tokenizer whose token ``t<i>`` is id ``i``: what a model built from a config lacks.
    Its special tokens are words of the vocabulary (the converter adds any special token it
    does not find, which would make the vocabulary one longer than the model's); generation
    never stops at one (``end_token=[]``)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(words, unk_token="t0")), unk_token="t0", bos_token="t1",
                                   eos_token="t2", pad_token="t0")


def prepared(mode: str, model, prompt, threads: int, target: str | None, looprl_cache: Path):
    """The runner of ``mode`` for ``model`` (``prompt``: the example looprl is tuned on; its
    measurement cache in the folder ``looprl_cache``)."""
    if mode == "eager":
        return Runner(model)
    if mode == "copy":
        return Runner(copy.deepcopy(model))
    if mode == "max-autotune":
        return compiled(model, "max-autotune", threads, None)
    if mode == "looprl-compiled":
        looprl_cache.mkdir(parents=True, exist_ok=True)
        return compiled(model, "looprl", threads, looprl_cache)
    if mode == "onednn-packed":
        return onednn_packed(model)
    if mode == "ctranslate2":
        try:
            import ctranslate2  # noqa: F401
        except ImportError as error:
            raise RuntimeError(f"CTranslate2 is not installed ({error}): pip install ctranslate2") from None
        return CTranslate2Runner(model, threads)
    from looprl.torch import tune_module

    looprl_cache.mkdir(parents=True, exist_ok=True)
    options = {"target": target, "threads": threads, "cache": str(looprl_cache / "looprl.sqlite"), "progress": False}
    if mode == "looprl":
        return Runner(tune_module(model, (prompt,), **options))
    if mode == "looprl-frozen":
        return Runner(tune_module(model, (prompt,), frozen=True, **options))
    if mode in ("fast", "tune"):
        return Runner(tune_module(model, [(prompt,), (prompt[:, :1],)], measure=mode == "tune", **options))
    raise ValueError(f"unknown mode {mode!r}")
