"""A GPT-2-small-shaped decoder generating text: looprl against torch eager and torch.compile.

    python experiments/gpt2_generate.py [--threads 1,2] [--prefill 128] [--generate 64] [--runs 3]
        [--modes eager,looprl,inductor,max-autotune,backend] [--dtype float32|bfloat16] [--out experiments/results/gpt2_generate]

The model is built from ``torch.nn`` with random weights (nothing is downloaded) in GPT-2
small's shape: 12 pre-norm blocks of width 768 with 12 heads (a qkv ``Linear(768, 2304)``, causal
attention, an output ``Linear(768, 768)``, an MLP ``Linear(768, 3072) -> GELU(tanh) ->
Linear(3072, 768)``), token and position embeddings (50,257 and 1,024), a final LayerNorm and
an LM head ``Linear(768, 50257)`` applied to the last position only. Generation is greedy: a
prefill of ``--prefill`` tokens, then ``--generate`` tokens one at a time with a KV cache (the
keys and values of earlier positions, concatenated).

Modes, each at every ``--threads`` count (``torch.set_num_threads``):

* ``eager``: the model as built;
* ``looprl``: ``looprl.torch.tune_module(model, [a prefill call, a decode call], threads=N)``;
* ``looprl-frozen``: the same with ``frozen=True`` (the weights promised constant, bound once:
  no comparison per call, the promise Inductor's ``freezing`` makes);
* ``looprl-fast`` / ``looprl-fast-frozen``: the fast path, the same calls with ``measure=False``
  (every layer scheduled by the shipped policy alone, nothing searched; the routes to torch
  judged as in ``looprl``); ``--policy`` names another policy folder for the looprl modes;
  ``looprl-fast-random``: the fast path with the policy's network re-initialised at random (the
  ablation: what the trained weights are worth where nothing measured corrects them);
* ``inductor``: ``torch.compile(model, dynamic=True)``;
* ``max-autotune``: ``torch.compile(model, dynamic=True, mode="max-autotune")`` compiled and
  called with ``torch._inductor.config.freezing = True`` (without freezing, Inductor's GEMM
  template with prepacked weights never competes and max-autotune is about inductor);
* ``backend``: ``torch.compile(model, backend="looprl", dynamic=True, options={"threads": N})``;
* ``backend-frozen``: the same compiled and called with ``torch._inductor.config.freezing = True``
  (looprl's kernels bound to the weights once, the rest of the graph compiled by Inductor with
  freezing: the peer of ``max-autotune``);
* ``onednn-packed``: the model with every ``nn.Linear`` run by oneDNN's linear on its weight
  packed once for one row (what Inductor's freezing runs for a linear layer), the rest eager.

Beside each mode's decode rate: ``of_bound``, the weights' bytes read per generated token (every
linear layer's weight once, the LM head's included) at that rate, as a fraction of this host's
DRAM read bandwidth on that many threads (``looprl.measurement.roofline.memory_bandwidth``: the
bound of a decode step whose weights outgrow the caches).

``--dtype bfloat16``: the model (every parameter, so every activation) in bfloat16, as LLMs are
served on CPUs; looprl's modes get bfloat16 kernels. Each layer's output is then rounded to
bfloat16, and two correct implementations may round a value differently, so in bfloat16 a
mode's greedy tokens may part from eager's at a near-tie of two logits: ``first_difference``
says where (None: the same tokens), and only a float32 run fails on a difference.

Every mode must generate the same tokens as eager (greedy, so a wrong answer shows); its
time to prepare (tuning, compiling: the first generation) is reported, then the best of
``--runs`` generations, the modes interleaved run by run: prefill milliseconds and generated
tokens per second. Writes
``<out>.csv`` and prints a table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

from _torch_timing import onednn_packed, write_csv

from looprl.backend.host import cpu_model_name

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("eager", "looprl", "looprl-frozen", "looprl-fast", "looprl-fast-frozen", "looprl-fast-random", "inductor", "max-autotune", "backend", "backend-frozen", "onednn-packed")
FIELDS = ["mode", "threads", "cpu", "dtype", "prepare_s", "prefill_ms", "decode_tokens_per_s", "vs_eager", "same_tokens", "first_difference",
          "weight_mb_per_token", "dram_gbs", "of_bound"]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x, past_k, past_v):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.reshape(batch, tokens, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        else:  # the cache's tensors always contiguous: one layout, so a compiled model is not compiled again per step
            k, v = k.contiguous(), v.contiguous()
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=past_k is None)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp(self.ln2(x)), k, v


class GPT2Shaped(nn.Module):
    def __init__(self, layers: int = 12, dim: int = 768, heads: int = 12, vocab: int = 50257, positions: int = 1024):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, past: tuple | None = None):
        start = 0 if past is None else past[0][0].shape[2]
        x = self.tokens(idx) + self.positions(torch.arange(start, start + idx.shape[1]))
        present = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, None if past is None else past[i][0], None if past is None else past[i][1])
            present.append((k, v))
        return self.head(self.ln(x[:, -1:, :])), tuple(present)


def generate(model, prompt, steps: int) -> tuple[list[int], float, float]:
    """Greedy tokens after ``prompt``, prefill seconds and seconds of the ``steps`` decode steps."""
    with torch.inference_mode():
        started = time.perf_counter()
        logits, past = model(prompt)
        token = logits[:, -1].argmax(-1, keepdim=True)
        prefill = time.perf_counter() - started
        out = [int(token)]
        started = time.perf_counter()
        for _ in range(steps - 1):
            logits, past = model(token, past)
            token = logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(token))
        return out, prefill, time.perf_counter() - started


def prepared(mode: str, model, prompt, threads: int, policy="default"):
    """The model of ``mode`` for ``threads`` threads (``policy``: the looprl modes' policy)."""
    if mode == "eager":
        return model
    if mode in ("looprl", "looprl-frozen", "looprl-fast", "looprl-fast-frozen", "looprl-fast-random"):
        from looprl.torch import tune_module

        if mode == "looprl-fast-random":  # the ablation: the same network, its weights drawn at random
            from looprl.policy.loading import load_policy

            policy = load_policy(policy, weights=True).with_random_weights(seed=0)  # the network tune picks for these layers

        with torch.inference_mode():
            _, past = model(prompt)
        return tune_module(model, [(prompt,), (prompt[:, :1], past)], threads=threads, cache=":memory:", frozen=mode.endswith("-frozen"),
                           measure="-fast" not in mode, policy=policy)
    if mode == "inductor":
        return torch.compile(model, dynamic=True)
    if mode in ("max-autotune", "backend-frozen"):
        import torch._inductor.config as inductor_config

        if mode == "max-autotune":
            compiled = torch.compile(model, dynamic=True, mode="max-autotune")
        else:
            compiled = torch.compile(model, backend="looprl", dynamic=True, options={"threads": threads, "cache": ":memory:"})

        def frozen(*args):  # every compilation (the first call's, each recompilation's) with freezing
            with inductor_config.patch(freezing=True):
                return compiled(*args)

        return frozen
    if mode == "backend":
        return torch.compile(model, backend="looprl", dynamic=True, options={"threads": threads, "cache": ":memory:"})
    if mode == "onednn-packed":
        packed = onednn_packed(model, 1)
        if packed is None:
            raise ValueError("mode onednn-packed: this torch has no oneDNN (torch.backends.mkldnn)")
        return packed
    raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--generate", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path, default=RESULTS / "gpt2_generate")
    parser.add_argument("--policy", default="default", help="the looprl modes' policy folder (default: the shipped one)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's dtype (default float32)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r}; modes: {', '.join(MODES)}")
    counts = [int(t) for t in args.threads.split(",")]
    torch.manual_seed(0)
    model = GPT2Shaped().eval().to(getattr(torch, args.dtype))
    prompt = torch.randint(0, 50257, (1, args.prefill))
    rows = []
    for threads in counts:
        torch.set_num_threads(threads)
        torch._dynamo.reset()  # the compiled modes compile afresh for this thread count
        reference, _, _ = generate(model, prompt, args.generate)
        runners, prepare = {}, {}
        for mode in modes:
            started = time.perf_counter()
            runners[mode] = prepared(mode, model, prompt, threads, args.policy)
            generate(runners[mode], prompt, args.generate)  # the first generation: compiles, warms
            prepare[mode] = time.perf_counter() - started
        best = {mode: [math.inf, math.inf, None] for mode in modes}  # prefill s, decode s, tokens
        for _ in range(args.runs):  # interleaved: a slow phase of the machine hits every mode alike
            for mode in modes:
                tokens, prefill, decode = generate(runners[mode], prompt, args.generate)
                entry = best[mode]
                entry[0], entry[1], entry[2] = min(entry[0], prefill), min(entry[1], decode), tokens
        eager_rate = (args.generate - 1) / best["eager"][1] if "eager" in best else None
        from looprl.measurement.roofline import memory_bandwidth

        dram_gbs = memory_bandwidth(cache=":memory:", threads=threads)["dram"]
        weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in model.modules() if isinstance(layer, nn.Linear))
        for mode in modes:
            prefill, decode, tokens = best[mode]
            rate = (args.generate - 1) / decode
            differs = [i for i, (ours, theirs) in enumerate(zip(tokens, reference)) if ours != theirs]
            rows.append({"mode": mode, "threads": threads, "cpu": cpu_model_name(), "dtype": args.dtype, "prepare_s": round(prepare[mode], 2),
                         "prefill_ms": round(1e3 * prefill, 2), "decode_tokens_per_s": round(rate, 2),
                         "vs_eager": round(rate / eager_rate, 3) if eager_rate else None, "same_tokens": tokens == reference,
                         "first_difference": differs[0] if differs else None,
                         "weight_mb_per_token": round(weight_bytes / 1e6, 1), "dram_gbs": round(dram_gbs, 2),
                         "of_bound": round(rate * weight_bytes / 1e9 / dram_gbs, 3)})
            row = rows[-1]
            print(f"{threads} thread(s) {mode:>13}: prepare {row['prepare_s']:7.1f} s, prefill {row['prefill_ms']:8.1f} ms, "
                  f"decode {row['decode_tokens_per_s']:6.2f} tokens/s ({row['vs_eager']}x eager, {row['of_bound']:.2f} of the "
                  f"{dram_gbs:.1f} GB/s bound), "
                  f"{'same tokens' if row['same_tokens'] else 'OTHER TOKENS from token ' + str(row['first_difference'])}", flush=True)
    write_csv(args.out, FIELDS, rows)
    return 0 if args.dtype != "float32" or all(row["same_tokens"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
