"""transformers' own decoders generating greedily: looprl against eager, max-autotune with
freezing, CTranslate2 and oneDNN's packed linears (issue 63).

    python experiments/hf_generate.py [--configs qwen2,gpt2,llama] [--prompts 32,512] [--new 64] [--threads 1,2]
        [--modes eager,max-autotune,ctranslate2,onednn-packed,looprl,looprl-frozen,looprl-compiled] [--runs 3]
        [--target avx2] [--quick] [--out PREFIX]

Needs transformers 5 (``pip install -e .[hf]``); CTranslate2 (``pip install ctranslate2``) only for
its mode, which is skipped with the reason printed where it is not installed. Each model is
built from a config written here (random weights, seed 0; nothing is downloaded), float32:

* ``qwen2``: ``Qwen2ForCausalLM``, hidden size 512, 16 layers, 8 heads and 2 key-value heads
  (grouped-query attention, biases on q, k and v), MLP width 1408, vocabulary 32,000, its LM head
  untied: 77.9M parameters, the model of issues 60 and 63;
* ``gpt2``: ``GPT2LMHeadModel``, GPT-2 small's shape: hidden size 768, 12 layers, 12 heads (as
  many key-value heads), MLP width 3072, vocabulary 50,257, the LM head tied to the embedding
  (its projections are transformers' ``Conv1D``, not ``nn.Linear``: looprl tunes its LM head alone);
* ``llama``: ``LlamaForCausalLM``, hidden size 2048, 6 layers, 16 heads and 4 key-value heads, MLP
  width 5632, vocabulary 32,000, untied: 401M parameters, 1.60 GB of float32 weights (1.34 GB of
  them read per generated token).

``--quick``: the same architectures at hidden size 64 (2 layers, 4 heads, 2 key-value heads but
GPT-2's 4, MLP width 128, vocabulary 1,000), ``--new 4``, 2 runs: a check that every mode runs,
not a measurement. ``generate`` is called with ``max_new_tokens=--new``, ``min_new_tokens`` the
same and ``do_sample=False`` after a prompt of random token ids (each of ``--prompts``).

Modes (``--modes``; default all but ``copy``, ``fast`` and ``tune``):

* ``eager``: the model as built;
* ``max-autotune``: transformers' compile recipe, ``model.generation_config.cache_implementation
  = "static"`` and ``model.forward = torch.compile(model.forward, mode="max-autotune",
  fullgraph=True)``, compiled and called under ``torch.no_grad()`` with
  ``torch._inductor.config.freezing = True`` (Inductor's prepacked GEMMs and its C++ GEMM template);
* ``ctranslate2``: the model saved to a temporary folder (with a word-level tokenizer of the ids,
  which the converter reads the vocabulary from), converted by
  ``ctranslate2.converters.TransformersConverter`` to float32 and run by ``ctranslate2.Generator``
  (``compute_type="float32"``, ``intra_threads`` = the threads), greedy;
* ``onednn-packed``: every ``nn.Linear`` (and GPT-2's ``Conv1D``) computed by oneDNN's linear on
  its weight packed once for one row (``torch.ops.mkldnn._reorder_linear_weight`` then
  ``_linear_pointwise``, what Inductor's freezing runs for a linear layer), the rest eager;
* ``looprl``: ``tune_module(model, (prompt,))``, the default (measured tuning, the weights followed);
* ``looprl-frozen``: the same with ``frozen=True`` (the weights bound once, as freezing promises):
  **looprl's recommended recipe for generation**. Of looprl's paths it decoded fastest where they
  were compared (docs/torch.md: GPT-2-shaped generation, decode 42.4 tokens/s frozen against 38.5
  for ``backend="looprl"`` with freezing; issue 63's Qwen2 runs 1.03-1.08x eager against 0.91-1.09x
  for the default) and it prepares in the least time of the measured ones;
* ``looprl-compiled``: the compile recipe of ``max-autotune`` with ``backend="looprl"`` (looprl's
  linear layers, Inductor for the rest of the graph, freezing on);
* ``copy``, ``fast``, ``tune`` (the earlier modes, kept so that the commands in docs/results.md
  still run): a deep copy of the model (the spread between two copies of one model is the floor
  under which a ratio says nothing); ``tune_module(model, [(prompt,), (prompt[:, :1],)],
  measure=False)``; the same measured.

Per case (a config, a prompt, a thread count; ``torch.set_num_threads`` and looprl's kernels for
that many threads): each mode is prepared first in a child process of its own with every cache
empty (``LOOPRL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` fresh temporary folders, set before
torch is imported): ``prepare_s`` is the time from the built model to the end of its first
generation (tuning, compiling, converting, packing; that generation warms). Then this process
prepares every mode again on those caches (tuning is a lookup, Inductor's compilation is read
back) and times ``--runs`` generations, the modes interleaved run by run, each run starting at
the next mode in turn. Per run and mode: prefill milliseconds (until the first new token),
decode tokens per second (the other new tokens over the time after the first) and its ratio to
eager's in the same run; the medians of the runs; ``of_bound``: the decode rate over the DRAM
bound, the rate at which the bytes read per generated token (every linear layer's weight and
bias, the LM head included, and the KV cache at the decode's mean context, float32) stream at the
host's DRAM read bandwidth on that many threads (``looprl.measurement.roofline.memory_bandwidth``,
as ``experiments/bandwidth_bound.py`` measures it). Every mode's tokens are checked against
eager's (float32, greedy); the exit status is 1 if one differed. Writes
``experiments/results/hf_generate_<llvm cpu>_peers[_avx2][_quick].csv`` and ``.json`` (``--out``:
another path without the suffix), a row per run and mode and a row per mode for the medians
(``run`` = ``median``), and prints a table of the medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _hf_modes import CONFIGS, QUICK, build, generate, prepared, read_bytes_per_token

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("eager", "max-autotune", "ctranslate2", "onednn-packed", "looprl", "looprl-frozen", "looprl-compiled", "copy", "fast", "tune")
DEFAULT_MODES = MODES[:7]
RECOMMENDED = "looprl-frozen"
FIELDS = ["config", "prompt", "new_tokens", "threads", "mode", "run", "target", "llvm_cpu", "cpu", "parameters", "prepare_s", "prefill_ms",
          "decode_tokens_per_s", "vs_eager", "bytes_per_token", "dram_gbs", "of_bound", "same_tokens", "skipped"]


def child(args) -> int:
    """Prepare one mode with the caches this process was given (empty) and print its prepare time."""
    import torch

    torch.set_num_threads(args.threads_one)
    model = build(args.child_config, args.quick)
    prompt = make_prompt(model, args.child_prompt)
    started = time.perf_counter()
    runner = prepared(args.child_mode, model, prompt, args.threads_one, args.target, Path(os.environ["LOOPRL_CACHE_DIR"]))
    generate(runner, prompt, args.new)
    print(json.dumps({"prepare_s": time.perf_counter() - started}), flush=True)
    return 0


def make_prompt(model, length: int):
    import torch

    return torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))


def prepare_in_child(mode: str, config: str, prompt: int, threads: int, args, caches: Path) -> float | str:
    """``mode``'s prepare seconds with every cache empty (a child process with fresh cache
    folders under ``caches``), or why the mode cannot run (its child's last line of error)."""
    looprl_dir, inductor_dir = caches / "looprl", caches / "inductor"
    environment = dict(os.environ, LOOPRL_CACHE_DIR=str(looprl_dir), TORCHINDUCTOR_CACHE_DIR=str(inductor_dir))
    command = [sys.executable, str(Path(__file__).resolve()), "--child-mode", mode, "--child-config", config, "--child-prompt", str(prompt),
               "--threads", str(threads), "--new", str(args.new)] + (["--quick"] if args.quick else []) + (
                   ["--target", args.target] if args.target else [])
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]  # the exception, not torch's advice after it
        return (raised or lines or [f"exit status {done.returncode}"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])["prepare_s"]


def run_case(config: str, prompt_length: int, threads: int, modes: list[str], args, common: dict) -> list[dict]:
    """Every mode of one case prepared (timed in a child, then here) and its generations timed."""
    import torch

    from looprl.measurement.roofline import memory_bandwidth

    torch.set_num_threads(threads)
    model = build(config, args.quick)
    prompt = make_prompt(model, prompt_length)
    parameters = sum(p.numel() for p in model.parameters())
    per_token = read_bytes_per_token(model, prompt_length + args.new / 2)
    dram_gbs = memory_bandwidth(cache=":memory:", threads=threads)["dram"]
    case = dict(common, config=config, prompt=prompt_length, new_tokens=args.new, threads=threads, parameters=parameters,
                bytes_per_token=per_token, dram_gbs=round(dram_gbs, 2))
    print(f"\n{config}: {parameters / 1e6:.1f}M parameters, {per_token / 1e6:.0f} MB read per token; {prompt_length}-token prompt, "
          f"{args.new} new tokens; {threads} thread(s); DRAM {dram_gbs:.1f} GB/s", flush=True)
    reference, _, _ = generate(prepared("eager", model, prompt, threads, args.target, Path()), prompt, args.new)
    runners, prepare, rows, skipped = {}, {}, [], {}
    with tempfile.TemporaryDirectory(prefix="hf_generate_") as folder:
        for mode in modes:
            caches = Path(folder) / mode
            if mode == "ctranslate2" and importlib.util.find_spec("ctranslate2") is None:
                result = "CTranslate2 is not installed (pip install ctranslate2)"
            else:
                result = 0.0 if mode == "eager" else prepare_in_child(mode, config, prompt_length, threads, args, caches)
            if isinstance(result, str):
                skipped[mode] = result
                print(f"{mode:>16}: skipped ({result})", flush=True)
                continue
            prepare[mode] = result
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")  # the child's compilation, read back (Inductor reads it when it compiles)
            runners[mode] = prepared(mode, model, prompt, threads, args.target, caches / "looprl")
            generate(runners[mode], prompt, args.new)  # warm, here too
            print(f"{mode:>16}: prepared in {prepare[mode]:.1f} s with every cache empty", flush=True)
        ran = [mode for mode in modes if mode in runners]
        measured = {mode: [] for mode in ran}
        for run in range(1, args.runs + 1):  # interleaved, each run starting at the next mode
            turn = (run - 1) % len(ran)
            results = {mode: generate(runners[mode], prompt, args.new) for mode in ran[turn:] + ran[:turn]}
            for mode in ran:
                tokens, prefill, rate = results[mode]
                ratio = rate / results["eager"][2]
                measured[mode].append((prefill, rate, ratio, tokens == reference))
                rows.append(dict(case, mode=mode, run=run, prepare_s=round(prepare[mode], 2), prefill_ms=round(1e3 * prefill, 2),
                                 decode_tokens_per_s=round(rate, 2), vs_eager=round(ratio, 3),
                                 of_bound=round(rate * per_token / 1e9 / dram_gbs, 3), same_tokens=tokens == reference))
    for mode in modes:
        if mode in skipped:
            rows.append(dict(case, mode=mode, run="median", skipped=skipped[mode]))
            continue
        prefills, rates, ratios, same = zip(*measured[mode])
        rate = statistics.median(rates)
        rows.append(dict(case, mode=mode, run="median", prepare_s=round(prepare[mode], 2), prefill_ms=round(1e3 * statistics.median(prefills), 2),
                         decode_tokens_per_s=round(rate, 2), vs_eager=round(statistics.median(ratios), 3),
                         of_bound=round(rate * per_token / 1e9 / dram_gbs, 3), same_tokens=all(same)))
    return rows


def _release() -> None:
    """Free what a case's modes left behind before the next case builds its model: torch's
    compiled graphs (Dynamo's caches hold the compiled models and their frozen weights) and the
    garbage. With the Qwen2- and the 1.6 GB Llama-style configs in one run, the process grew to
    15.5 GB and was killed for memory during the Llama's preparation."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()


def print_table(rows: list[dict]) -> None:
    print(f"\n{'config':>7} {'prompt':>6} {'thr':>3} {'mode':>16} {'prepare s':>9} {'prefill ms':>10} {'tokens/s':>9} {'x eager':>7} "
          f"{'of bound':>8}  tokens")
    for row in rows:
        if row["run"] != "median":
            continue
        name = row["mode"] + (" *" if row["mode"] == RECOMMENDED else "")
        if row.get("skipped"):
            print(f"{row['config']:>7} {row['prompt']:>6} {row['threads']:>3} {name:>16}  skipped: {row['skipped']}")
            continue
        print(f"{row['config']:>7} {row['prompt']:>6} {row['threads']:>3} {name:>16} {row['prepare_s']:>9.1f} {row['prefill_ms']:>10.1f} "
              f"{row['decode_tokens_per_s']:>9.2f} {row['vs_eager']:>7.3f} {row['of_bound']:>8.2f}  "
              f"{'eager' if row['same_tokens'] else 'OTHER'}")
    print(f"(* looprl's recommended recipe: {RECOMMENDED}; medians of the runs)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="qwen2,gpt2,llama")
    parser.add_argument("--prompts", default="32,512", help="prompt lengths in tokens, comma-separated")
    parser.add_argument("--prompt", type=int, default=None, help="one prompt length (as --prompts)")
    parser.add_argument("--new", type=int, default=None, help="new tokens to generate (default 64; --quick: 4)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES))
    parser.add_argument("--runs", type=int, default=None, help="generations per mode, interleaved (default 3; --quick: 2)")
    parser.add_argument("--target", choices=("avx2",), default=None, help="looprl's kernels for this target (default: the host's)")
    parser.add_argument("--quick", action="store_true", help="tiny configs, 4 new tokens: a check that every mode runs")
    parser.add_argument("--out", type=Path, default=None, help="the results' path without .csv/.json")
    for hidden in ("--child-mode", "--child-config", "--child-prompt"):
        parser.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.new = args.new if args.new is not None else (4 if args.quick else 64)
    args.runs = args.runs if args.runs is not None else (2 if args.quick else 3)
    if args.child_mode is not None:
        args.threads_one, args.child_prompt = int(args.threads), int(args.child_prompt)
        return child(args)
    modes, configs = args.modes.split(","), args.configs.split(",")
    prompts = [args.prompt] if args.prompt is not None else [int(p) for p in args.prompts.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if "eager" not in modes:
        parser.error("--modes: eager is the reference every mode is compared with; include it")
    for config in configs:
        if config not in CONFIGS:
            parser.error(f"--configs: unknown config {config!r}; configs: {', '.join(CONFIGS)}")
    if args.runs < 1 or args.new < 2 or min(prompts) < 1 or min(threads) < 1:
        parser.error("--runs, --prompts and --threads must be at least 1, --new at least 2")
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu

    llvm_cpu = host_cpu()[0]
    out = args.out or RESULTS / (f"hf_generate_{llvm_cpu}_peers" + (f"_{args.target}" if args.target else "") + ("_quick" if args.quick else ""))
    common = {"target": args.target or "host", "llvm_cpu": llvm_cpu, "cpu": cpu_model_name()}
    print(f"{cpu_model_name()} ({llvm_cpu}); configs {', '.join(configs)}{' (quick: tiny)' if args.quick else ''}; modes {', '.join(modes)}; "
          f"{args.runs} run(s)", flush=True)
    rows = []
    about = dict(common, configs={name: (QUICK if args.quick else CONFIGS)[name] for name in configs}, recommended=RECOMMENDED,
                 command=" ".join(sys.argv))
    for config in configs:
        for prompt in prompts:
            for count in threads:
                rows.extend(run_case(config, prompt, count, modes, args, common))
                write(out, rows, about)  # each case's rows kept as it ends: a later case killed for memory loses only itself
                _release()
    print_table(rows)
    write(out, rows, about)
    return 0 if all(row.get("same_tokens", True) for row in rows if not row.get("skipped")) else 1


def write(out: Path, rows: list[dict], about: dict) -> None:
    from _torch_timing import write_csv

    write_csv(out, FIELDS, rows)
    path = out.with_suffix(".json")
    path.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
