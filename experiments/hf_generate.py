"""transformers' own Qwen2 model generating greedily: torch eager against looprl's fast path and measured tune.

    python experiments/hf_generate.py [--runs 3] [--target avx2] [--modes eager,copy,fast,tune] [--layers 16] [--tiny] [--out PREFIX]

Needs transformers 5 (``pip install -e .[hf]``). The model is ``transformers.Qwen2ForCausalLM``
built from a config (random weights, seeded; nothing is downloaded): hidden size 512,
``--layers`` decoder layers (default 16), 8 attention heads and 2 key-value heads, MLP width
1408, a vocabulary of 32,000 with an LM head of its own (not tied to the embedding): 77.9M
parameters with 16 layers, about the 78M of the model issue 60 measured (55.3M with 8).
``--tiny`` (2 layers, hidden size 64, 4 heads, 2 key-value heads, MLP width 176, vocabulary
1,000) is a smoke test of the script, not a measurement. The prompt is ``--prompt`` random token ids (default 32); ``generate`` is called
with ``max_new_tokens=--new`` (default 32), ``min_new_tokens`` the same (no early end of
sequence) and ``do_sample=False``. Everything runs on one thread (``torch.set_num_threads(1)``,
and looprl's kernels are tuned for one).

Modes (``--modes``):

* ``eager``: the model as built;
* ``copy``: a deep copy of it (``tune_module`` returns a copy too: the spread between two
  copies of one model, weights in other memory, is the floor under which a ratio says nothing);
* ``fast``: ``looprl.torch.tune_module(model, [(prompt,), (prompt[:, :1],)], measure=False)``,
  the fast path: every linear layer scheduled by the shipped policy alone, the routes to torch
  judged (each layer shape's looprl plan against torch's call, and the tuned model against the
  model on the prefill and on a one-token call, the decode step's shape);
* ``tune``: the same with ``tune_module``'s default, measured tuning.

``--target avx2`` tunes looprl's kernels for AVX2 (on a host that runs it; torch is left as it
is). Each mode is prepared once (``prepare_s``: ``tune_module``, plus the first generation,
which warms it), then ``--runs`` generations, the modes interleaved run by run (a slow phase of
the machine hits each mode alike), each run starting at the next mode in turn (so that no
mode's figure rests on its place in the order: before, the fast path always ran third and decoded
about 1.5% below the copy, always second). Per run and mode: prefill milliseconds (the call until the
first new token), decode tokens per second (the other new tokens over the time after the first)
and the decode rate over eager's in the same run; then the median of the runs. Every mode must
generate eager's tokens (greedy, float32: a wrong answer shows); the exit status is 1 if one
did not. Writes ``experiments/results/hf_generate_<llvm cpu>[_avx2][_layers<n>|_tiny].csv`` (``--out``: another
prefix) with a row per run and mode and a row per mode for the median (``run`` = ``median``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

from _torch_timing import write_csv

from looprl.backend.host import cpu_model_name
from looprl.target import host_cpu

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("eager", "copy", "fast", "tune")
FIELDS = ["mode", "run", "target", "llvm_cpu", "cpu", "parameters", "prompt", "new_tokens", "prepare_s", "prefill_ms",
          "decode_tokens_per_s", "vs_eager", "same_tokens"]
FULL = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1408, "vocab_size": 32000}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
        "vocab_size": 1000}


def qwen2(tiny: bool, layers: int = 16):
    """A ``Qwen2ForCausalLM`` of random weights (seed 0) in eval mode: the tiny one, or the full
    one with ``layers`` decoder layers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = TINY if tiny else dict(FULL, num_hidden_layers=layers)
    config = Qwen2Config(**shape, max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


class TokenClock:
    """A ``generate`` streamer that notes when each new token comes: the first ``put`` is the
    prompt, each later one a new token."""

    def __init__(self):
        self.started = time.perf_counter()
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def generate(model, prompt, new: int) -> tuple[list[int], float, float]:
    """Greedy new tokens after ``prompt``, prefill seconds (until the first new token) and decode
    tokens per second (the others)."""
    clock = TokenClock()
    with torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             streamer=clock, pad_token_id=0)
    tokens = out[0, prompt.shape[1]:].tolist()
    prefill = clock.times[0] - clock.started
    decode = (len(clock.times) - 1) / (clock.times[-1] - clock.times[0]) if len(clock.times) > 1 else float("nan")
    return tokens, prefill, decode


def prepared(mode: str, model, prompt, target: str | None):
    """The model of ``mode``."""
    if mode == "eager":
        return model
    if mode == "copy":
        return copy.deepcopy(model)
    from looprl.torch import tune_module

    return tune_module(model, [(prompt,), (prompt[:, :1],)], measure=mode == "tune", target=target, cache=":memory:", threads=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--target", choices=("avx2",), default=None, help="tune looprl's kernels for this target (default: the host's)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    parser.add_argument("--new", type=int, default=32, help="new tokens to generate")
    parser.add_argument("--layers", type=int, default=16, help="decoder layers of the full model (default 16: 77.9M parameters)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of width 64: a smoke test of the script")
    parser.add_argument("--out", type=Path, default=None, help="the CSV's path without .csv (default: experiments/results/hf_generate_...)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if "eager" not in modes:
        parser.error("--modes: eager is the reference every mode is compared with; include it")
    if args.runs < 1 or args.prompt < 1 or args.new < 2 or args.layers < 1:
        parser.error("--runs, --prompt and --layers must be at least 1, --new at least 2")
    llvm_cpu = host_cpu()[0]
    suffix = (f"_{args.target}" if args.target else "") + ("_tiny" if args.tiny else f"_layers{args.layers}" if args.layers != 16 else "")
    out = args.out or RESULTS / f"hf_generate_{llvm_cpu}{suffix}"
    torch.set_num_threads(1)
    model = qwen2(args.tiny, args.layers)
    parameters = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    print(f"Qwen2ForCausalLM, {parameters / 1e6:.1f}M parameters; {args.prompt}-token prompt, {args.new} new tokens; one thread; "
          f"looprl's target: {args.target or 'the host'}; {cpu_model_name()} ({llvm_cpu})", flush=True)
    reference, _, _ = generate(model, prompt, args.new)
    runners, prepare = {}, {}
    for mode in modes:
        started = time.perf_counter()
        runners[mode] = prepared(mode, model, prompt, args.target)
        generate(runners[mode], prompt, args.new)  # the first generation: warms
        prepare[mode] = time.perf_counter() - started
        print(f"{mode:>6}: prepared in {prepare[mode]:.1f} s", flush=True)
    common = {"target": args.target or "host", "llvm_cpu": llvm_cpu, "cpu": cpu_model_name(), "parameters": parameters,
              "prompt": args.prompt, "new_tokens": args.new}
    rows, measured = [], {mode: [] for mode in modes}  # mode -> (prefill s, decode tokens/s, ratio, same tokens) per run
    for run in range(1, args.runs + 1):  # interleaved: a slow phase of the machine hits every mode alike
        turn = (run - 1) % len(modes)  # each run starts at another mode: no mode always runs in the same place
        results = {mode: generate(runners[mode], prompt, args.new) for mode in modes[turn:] + modes[:turn]}
        eager_rate = results["eager"][2]
        for mode in modes:
            tokens, prefill, rate = results[mode]
            measured[mode].append((prefill, rate, rate / eager_rate, tokens == reference))
            rows.append(dict(common, mode=mode, run=run, prepare_s=round(prepare[mode], 2), prefill_ms=round(1e3 * prefill, 2),
                             decode_tokens_per_s=round(rate, 2), vs_eager=round(rate / eager_rate, 3), same_tokens=tokens == reference))
            print(f"run {run} {mode:>6}: prefill {1e3 * prefill:8.2f} ms, decode {rate:8.2f} tokens/s ({rate / eager_rate:.3f}x eager), "
                  f"{'same tokens' if tokens == reference else 'OTHER TOKENS'}", flush=True)
    for mode in modes:
        prefills, rates, ratios, same = zip(*measured[mode])
        rows.append(dict(common, mode=mode, run="median", prepare_s=round(prepare[mode], 2),
                         prefill_ms=round(1e3 * statistics.median(prefills), 2),
                         decode_tokens_per_s=round(statistics.median(rates), 2), vs_eager=round(statistics.median(ratios), 3),
                         same_tokens=all(same)))
        row = rows[-1]
        print(f"median {mode:>6}: prepare {row['prepare_s']:7.1f} s, prefill {row['prefill_ms']:8.2f} ms, decode "
              f"{row['decode_tokens_per_s']:8.2f} tokens/s ({row['vs_eager']:.3f}x eager), "
              f"{'same tokens' if row['same_tokens'] else 'OTHER TOKENS'}", flush=True)
    write_csv(out, FIELDS, rows)
    return 0 if all(row["same_tokens"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
