"""The contractions of published models, derived from each model's configuration.

Each model is described by its configuration (hidden size, heads, key/value heads, FFN or
intermediate size, channels and kernel sizes per stage) and the code below turns it into the
contractions one inference runs, one :class:`~looprl.workloads.entries.DatasetEntry` per distinct
shape of a model (layers that share a shape are listed together in ``layer``):

* a linear layer or a 1x1 convolution is ``mk,kn->mn``: m rows (tokens, output pixels, or the
  batch for a classifier head), k inputs, n outputs, the weight stored k x n;
* a k x k convolution is its im2col GEMM: m = output pixels, n = output channels,
  k = input channels x kernel area (batch 1, 224x224 images);
* self-attention's scores are ``bmk,bnk->bmn`` (b = heads, m = n = sequence, k = head dim)
  and its context ``bmk,bkn->bmn`` (k = sequence, n = head dim); a grouped-query model keeps
  b = heads (each key/value head is shared by a group of query heads).

Models: BERT-base and BERT-large at sequence 128 and 512 (q,k,v fused, output projection,
FFN up and down, the attention products, the pooler and a 2-label classifier); GPT-2 and
GPT-2 medium, SmolLM-135M, SmolLM-360M (Llama-style, grouped-query k/v projections of
kv_heads x head_dim outputs, gated MLP) and TinyLlama-1.1B, each at prefill over 128, 512 and
1024 tokens (with the attention products) and at decode of one token for a batch of 1, 4 and
16 sequences (m = batch: GEMV-like); ViT-S/16 (DeiT-S: 197 tokens, hidden 384, 6 heads, MLP
1536; the 16x16 patch embedding as im2col, the head); ResNet-50 (torchvision, v1.5: stem 7x7,
every bottleneck's 1x1 and 3x3 convs, the downsampling 1x1 convs, fc) and MobileNetV2 (stem,
the 1x1 expand and project convs, the last 1x1 conv, the classifier).

Bounds: n and k at most 4096 and m*n*k (times b for the batched products) at most 2**31, so
one run of even the untuned nest stays under a second. Left out (:func:`excluded_entries`
lists them with the reason):

* every lm_head (gpt2, gpt2-medium: vocab 50257; smollm-135m, smollm-360m: 49152;
  tinyllama-1.1b: 32000; n > 4096);
* tinyllama-1.1b's mlp.gate_proj, mlp.up_proj (n = 5632) and mlp.down_proj (k = 5632), at
  every prefill length and decode batch;
* resnet-50's stage-4 3x3 convs layer4.{0,1,2}.conv2 (k = 512*3*3 = 4608);
* prefill over 1024 tokens where m*n*k > 2**31: gpt2's ffn.up and ffn.down (2.4e9),
  gpt2-medium's attention.qkv_proj (3.2e9), ffn.up and ffn.down (4.3e9), smollm-360m's
  mlp.gate_proj, mlp.up_proj and mlp.down_proj (2.5e9), tinyllama-1.1b's attention.q_proj and
  attention.o_proj (4.3e9);
* mobilenet-v2's depthwise 3x3 convs (not generated): each channel has its own filter, so
  they are not a GEMM of this form (after im2col, a batch of GEMVs with k = 9).

Split by model: the test split is vit-s16, smollm-360m and mobilenet-v2, whole models that no
training problem comes from, and no test shape occurs in training. They cover an encoder
transformer, a Llama-style decoder (grouped-query attention, gated MLP, prefill and decode)
and a CNN, with widths that are on no training model's grid (384, 960 = 15 heads of 64, 197
tokens), and they make about 28% of the problems. BERT-large and GPT-2 medium were not
chosen: they have the same width (1024, 16 heads of 64, FFN 4096), so at the same sequence
lengths their layers are the same GEMMs (as are BERT-base's and GPT-2's); one of a pair in
test would leak its shapes from the other in training, and both pairs in test would make
about 40% of the problems.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

from looprl.workloads.entries import MATMUL_SPEC, DatasetEntry

MAX_NK = 4096  # bound on n and k
MAX_MACS = 2**31  # bound on the product of all extents (one untuned run well under a second)
SCORES_SPEC = "bmk,bnk->bmn"  # q . k^T per head
CONTEXT_SPEC = "bmk,bkn->bmn"  # probabilities @ v per head
PREFILL = (128, 512, 1024)  # decoder prompt lengths
DECODE = (1, 4, 16)  # decoder batch sizes: one new token per sequence

# The split by model (see the module docstring for why these).
TEST_MODELS = ("smollm-360m", "vit-s16", "mobilenet-v2")


@dataclass(frozen=True)
class Excluded:
    """A layer left out of the dataset, and why."""

    entry: DatasetEntry
    reason: str


def _linear(model: str, layer: str, derivation: str, m: int, n: int, k: int) -> DatasetEntry:
    """``out[m, n] = in[m, k] @ w[k, n]``: m rows (tokens, pixels), k inputs, n outputs."""
    return DatasetEntry(MATMUL_SPEC, (("m", m), ("n", n), ("k", k)), model, layer, derivation)


def _attention(model: str, at: str, heads: int, seq: int, head_dim: int, note: str = "") -> list[DatasetEntry]:
    """The two batched products of self-attention over ``seq`` tokens, one batch per head."""
    scores = DatasetEntry(
        SCORES_SPEC, (("b", heads), ("m", seq), ("n", seq), ("k", head_dim)), model, f"{at}attention.scores",
        f"{heads} heads{note}: q (seq {seq} x head dim {head_dim}) . k^T -> {seq} x {seq} scores",
    )
    context = DatasetEntry(
        CONTEXT_SPEC, (("b", heads), ("m", seq), ("n", head_dim), ("k", seq)), model, f"{at}attention.context",
        f"{heads} heads{note}: probabilities ({seq} x seq {seq}) @ v (seq {seq} x head dim {head_dim})",
    )
    return [scores, context]


def _block(model: str, at: str, rows: str, m: int, hidden: int, heads: int, ffn: int, attention: bool) -> list[DatasetEntry]:
    """A GPT-2/BERT/ViT block: fused q,k,v projection, output projection, a two-layer MLP;
    ``rows`` says what the m rows are ("seq 128", "batch 4 tokens")."""
    entries = [
        _linear(model, f"{at}attention.qkv_proj", f"{rows} x hidden {hidden} -> 3*{hidden} (fused q,k,v)", m, 3 * hidden, hidden),
        _linear(model, f"{at}attention.out_proj", f"{rows} x {heads} heads*{hidden // heads} -> hidden {hidden}", m, hidden, hidden),
        _linear(model, f"{at}ffn.up", f"{rows} x hidden {hidden} -> ffn {ffn}", m, ffn, hidden),
        _linear(model, f"{at}ffn.down", f"{rows} x ffn {ffn} -> hidden {hidden}", m, hidden, ffn),
    ]
    return entries + (_attention(model, at, heads, m, hidden // heads) if attention else [])


def _llama_block(model: str, at: str, rows: str, m: int, config: tuple, attention: bool) -> list[DatasetEntry]:
    """A Llama block: separate q, k, v, o projections (k and v grouped-query: kv_heads x
    head_dim outputs) and a gated MLP (gate and up, then down)."""
    hidden, heads, kv_heads, ffn = config
    head_dim = hidden // heads
    grouped = f"{rows} x hidden {hidden} -> {kv_heads} kv heads*{head_dim} (grouped-query)"
    entries = [
        _linear(model, f"{at}attention.q_proj", f"{rows} x hidden {hidden} -> {heads} heads*{head_dim}", m, heads * head_dim, hidden),
        _linear(model, f"{at}attention.k_proj", grouped, m, kv_heads * head_dim, hidden),
        _linear(model, f"{at}attention.v_proj", grouped, m, kv_heads * head_dim, hidden),
        _linear(model, f"{at}attention.o_proj", f"{rows} x {heads} heads*{head_dim} -> hidden {hidden}", m, hidden, heads * head_dim),
        _linear(model, f"{at}mlp.gate_proj", f"{rows} x hidden {hidden} -> intermediate {ffn}", m, ffn, hidden),
        _linear(model, f"{at}mlp.up_proj", f"{rows} x hidden {hidden} -> intermediate {ffn}", m, ffn, hidden),
        _linear(model, f"{at}mlp.down_proj", f"{rows} x intermediate {ffn} -> hidden {hidden}", m, hidden, ffn),
    ]
    note = f" ({kv_heads} kv heads, each shared by {heads // kv_heads})"
    return entries + (_attention(model, at, heads, m, head_dim, note) if attention else [])


def _conv(model: str, layer: str, in_channels: int, out_channels: int, size: int, kernel: int, stride: int = 1, padding: int | None = None):
    """A convolution of a ``size`` x ``size`` image (batch 1) as its im2col GEMM: one row per
    output pixel, one column per output channel, a reduction over input channels x kernel
    area. Returns the entry and the output's side."""
    padding = kernel // 2 if padding is None else padding
    side = (size + 2 * padding - kernel) // stride + 1
    strided = f", stride {stride}" if stride > 1 else ""
    derivation = (f"{kernel}x{kernel} conv{strided}: im2col: {side}*{side} output pixels, {out_channels} out channels, "
                  f"{in_channels}*{kernel}*{kernel} inputs, batch 1")
    return _linear(model, layer, derivation, side * side, out_channels, in_channels * kernel * kernel), side


def _bert(model: str, hidden: int, heads: int, ffn: int, labels: int = 2) -> list[DatasetEntry]:
    entries = []
    for seq in (128, 512):
        entries += _block(model, f"seq{seq}/", f"seq {seq}", seq, hidden, heads, ffn, attention=True)
    entries.append(_linear(model, "pooler", f"[CLS] token (batch 1) x hidden {hidden} -> {hidden}", 1, hidden, hidden))
    entries.append(_linear(model, "classifier", f"pooled (batch 1) x hidden {hidden} -> {labels} labels", 1, labels, hidden))
    return entries


def _lm_head(model: str, hidden: int, vocab: int) -> DatasetEntry:
    return _linear(model, "lm_head", f"last token (batch 1) x hidden {hidden} -> vocab {vocab}", 1, vocab, hidden)


def _gpt2(model: str, hidden: int, heads: int, vocab: int = 50257) -> list[DatasetEntry]:
    entries = []
    for seq in PREFILL:
        entries += _block(model, f"prefill{seq}/", f"seq {seq}", seq, hidden, heads, 4 * hidden, attention=True)
    for batch in DECODE:
        entries += _block(model, f"decode-b{batch}/", f"batch {batch} tokens", batch, hidden, heads, 4 * hidden, attention=False)
    return entries + [_lm_head(model, hidden, vocab)]


def _llama(model: str, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> list[DatasetEntry]:
    config = (hidden, heads, kv_heads, ffn)
    entries = []
    for seq in PREFILL:
        entries += _llama_block(model, f"prefill{seq}/", f"seq {seq}", seq, config, attention=True)
    for batch in DECODE:
        entries += _llama_block(model, f"decode-b{batch}/", f"batch {batch} tokens", batch, config, attention=False)
    return entries + [_lm_head(model, hidden, vocab)]


def _vit_s16() -> list[DatasetEntry]:
    """ViT-S/16 (DeiT-S): 224x224 image, 14*14 patches + [CLS] = 197 tokens."""
    model = "vit-s16"
    patches, _ = _conv(model, "patch_embed", 3, 384, 224, 16, stride=16, padding=0)
    head = _linear(model, "head", "[CLS] token (batch 1) x hidden 384 -> 1000 classes", 1, 1000, 384)
    return [patches, *_block(model, "", "seq 197", 197, 384, 6, 1536, attention=True), head]


def _resnet50() -> list[DatasetEntry]:
    """torchvision's ResNet-50 (v1.5: the stride is on each stage's first 3x3 conv)."""
    model = "resnet-50"
    stem, _ = _conv(model, "conv1", 3, 64, 224, 7, stride=2)
    entries, side, channels = [stem], 56, 64  # 56: after the stem and the 3x3/2 max pool
    for stage, (blocks, width, stride) in enumerate(((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)), start=1):
        for block in range(blocks):
            name, step = f"layer{stage}.{block}", stride if block == 0 else 1
            reduce, _ = _conv(model, f"{name}.conv1", channels, width, side, 1)
            spatial, out_side = _conv(model, f"{name}.conv2", width, width, side, 3, stride=step)
            expand, _ = _conv(model, f"{name}.conv3", width, 4 * width, out_side, 1)
            entries += [reduce, spatial, expand]
            if block == 0:
                entries.append(_conv(model, f"{name}.downsample.0", channels, 4 * width, side, 1, stride=step)[0])
            side, channels = out_side, 4 * width
    return entries + [_linear(model, "fc", "pooled features (batch 1) x 2048 -> 1000 classes", 1, 1000, 2048)]


def _mobilenet_v2() -> list[DatasetEntry]:
    """torchvision's MobileNetV2: the stem, each inverted residual's 1x1 expand and project
    convs (its depthwise 3x3 is no GEMM), the last 1x1 conv and the classifier."""
    model = "mobilenet-v2"
    stem, side = _conv(model, "features.0", 3, 32, 224, 3, stride=2)
    entries, channels, index = [stem], 32, 1
    # (expansion t, output channels c, repeats n, first stride s), as in the paper's table 2
    stages = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
    for expansion, out_channels, repeats, stride in stages:
        for repeat in range(repeats):
            wide = channels * expansion
            if expansion != 1:
                entries.append(_conv(model, f"features.{index}.conv.0", channels, wide, side, 1)[0])
            side = (side - 1) // (stride if repeat == 0 else 1) + 1  # the depthwise 3x3, padding 1
            project = "conv.2" if expansion != 1 else "conv.1"
            entries.append(_conv(model, f"features.{index}.{project}", wide, out_channels, side, 1)[0])
            channels, index = out_channels, index + 1
    entries.append(_conv(model, f"features.{index}.0", channels, 1280, side, 1)[0])
    return entries + [_linear(model, "classifier.1", "pooled features (batch 1) x 1280 -> 1000 classes", 1, 1000, 1280)]


_MODELS = (
    ("bert-base", lambda: _bert("bert-base", 768, 12, 3072)),
    ("bert-large", lambda: _bert("bert-large", 1024, 16, 4096)),
    ("gpt2", lambda: _gpt2("gpt2", 768, 12)),
    ("gpt2-medium", lambda: _gpt2("gpt2-medium", 1024, 16)),
    ("smollm-135m", lambda: _llama("smollm-135m", 576, 9, 3, 1536, vocab=49152)),
    ("smollm-360m", lambda: _llama("smollm-360m", 960, 15, 5, 2560, vocab=49152)),
    ("tinyllama-1.1b", lambda: _llama("tinyllama-1.1b", 2048, 32, 4, 5632, vocab=32000)),
    ("vit-s16", _vit_s16),
    ("resnet-50", _resnet50),
    ("mobilenet-v2", _mobilenet_v2),
)
MODEL_NAMES = tuple(name for name, _ in _MODELS)


def _merged(entries: list[DatasetEntry]) -> list[DatasetEntry]:
    """One entry per shape, in order of first appearance; the layers sharing a shape are
    joined in ``layer`` (and their distinct derivations in ``derivation``)."""
    groups: dict[tuple, list[DatasetEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.spec, entry.sizes), []).append(entry)
    return [
        replace(group[0], layer=", ".join(e.layer for e in group), derivation="; ".join(dict.fromkeys(e.derivation for e in group)))
        for group in groups.values()
    ]


def exclusion_reason(entry: DatasetEntry) -> str | None:
    """Why ``entry`` is beyond the dataset's bounds, or None when it is within them."""
    sizes = dict(entry.sizes)
    wide = [f"{d}={sizes[d]}" for d in ("n", "k") if sizes[d] > MAX_NK]
    if wide:
        return f"{' and '.join(wide)} > {MAX_NK}"
    if entry.macs > MAX_MACS:
        return f"{' * '.join(str(v) for _, v in entry.sizes)} = {entry.macs} multiply-adds > 2**31"
    return None


@cache
def _derived() -> tuple[tuple[DatasetEntry, ...], tuple[Excluded, ...]]:
    kept, excluded = [], []
    for _, build in _MODELS:
        for entry in _merged(build()):
            reason = exclusion_reason(entry)
            if reason is None:
                kept.append(entry)
            else:
                excluded.append(Excluded(entry, reason))
    return tuple(kept), tuple(excluded)


def model_entries() -> tuple[DatasetEntry, ...]:
    """Every contraction of every model within the bounds, model by model."""
    return _derived()[0]


def excluded_entries() -> tuple[Excluded, ...]:
    """The layers beyond the bounds, with the reason for each."""
    return _derived()[1]
