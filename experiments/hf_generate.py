"""transformers' own decoders generating greedily: looprl against eager, max-autotune with
freezing, CTranslate2 and oneDNN's packed linears (issue 63).

    python experiments/hf_generate.py [--configs qwen2,gpt2,llama] [--prompts 32,512] [--new 64] [--threads 1,2]
        [--modes eager,max-autotune,ctranslate2,onednn-packed,looprl,looprl-frozen,looprl-compiled] [--runs 3]
        [--live N] [--target avx2] [--dtype bfloat16] [--quick] [--out PREFIX]

Needs transformers 5 (``pip install -e .[hf]``); CTranslate2 (``pip install ctranslate2``) only for
its mode, which is skipped with the reason printed where it is not installed. Each model is
built from a config written here (random weights, seed 0; nothing is downloaded), float32:

* ``qwen2``: ``Qwen2ForCausalLM``, hidden size 512, 16 layers, 8 heads and 2 key-value heads
  (grouped-query attention, biases on q, k and v), MLP width 1408, vocabulary 32,000, its LM head
  untied: 77.9M parameters, the model of issues 60 and 63;
* ``gpt2``: ``GPT2LMHeadModel``, GPT-2 small's shape: hidden size 768, 12 layers, 12 heads (as
  many key-value heads), MLP width 3072, vocabulary 50,257, the LM head tied to the embedding
  (its projections are transformers' ``Conv1D``, not ``nn.Linear``: ``tune_module`` tunes its LM
  head alone, with ``frozen=True`` every projection too, looprl.torch.conv1d; the recommended
  recipe, under freezing, every projection: looprl.torch.transposed);
* ``llama``: ``LlamaForCausalLM``, hidden size 2048, 6 layers, 16 heads and 4 key-value heads, MLP
  width 5632, vocabulary 32,000, untied: 401M parameters, 1.60 GB of float32 weights (1.34 GB of
  them read per generated token).

``--dtype bfloat16``: each model drawn in float32 and cast to bfloat16, every mode run in
bfloat16 (CTranslate2 converted to and computing in bfloat16, looprl's bfloat16 kernels); each
mode's tokens are compared with eager's bfloat16 generation but a difference does not fail the
run (each library's rounding may tip a close greedy choice); the files end in ``_bfloat16``.

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
* ``looprl-frozen``: the same with ``frozen=True`` (the weights bound once, as freezing promises);
* ``looprl-compiled``: the compile recipe of ``max-autotune`` with ``backend="looprl"`` (looprl's
  linear layers, sibling projections such as q/k/v and gate/up merged into one kernel each,
  Inductor for the rest of the graph, freezing on): **looprl's recommended recipe for
  generation**. Before the merge it decoded as fast as ``looprl-frozen`` (issue 63's Qwen2-style
  run, one thread, quiet Zen 4: 56.25 against 56.28 tokens/s, 1.73x and 1.67x eager); merging
  took 2.4 ms off its decode token (16.6 against 18.9 ms, docs/torch.md), so it now decodes
  fastest of looprl's modes. It prepares in more time than ``looprl-frozen`` (96 against 51 s
  in that run: Inductor's compilation);
* ``copy``, ``fast``, ``tune`` (the earlier modes, kept so that the commands in docs/results.md
  still run): a deep copy of the model (the spread between two copies of one model is the floor
  under which a ratio says nothing); ``tune_module(model, [(prompt,), (prompt[:, :1],)],
  measure=False)``; the same measured.

Per case (a config, a prompt, a thread count; ``torch.set_num_threads`` and looprl's kernels for
that many threads) each mode lives in a worker process of its own (``_hf_worker.py``), started
one at a time with every cache empty (``LOOPRL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` fresh
temporary folders, set before torch is imported): it builds the model, prepares its mode once
(``prepare_s``: the time from the built model to the end of its first generation: tuning,
compiling, converting, packing; that generation warms) and then runs one timed generation
whenever this process asks. This process holds no model: it orchestrates ``--runs`` rounds, each
round asking every live mode for one generation, the modes interleaved, each round starting at
the next mode in turn. Per run and mode: prefill milliseconds (until the first new token),
decode tokens per second (the other new tokens over the time after the first) and its ratio to
eager's in the same run; the medians of the runs; ``of_bound``: the decode rate over the DRAM
bound, the rate at which the bytes read per generated token (every linear layer's weight and
bias, the LM head included, and the KV cache at the decode's mean context, float32) stream at the
host's DRAM read bandwidth on that many threads (``looprl.measurement.roofline.memory_bandwidth``,
as ``experiments/bandwidth_bound.py`` measures it). Every mode's tokens are checked against
eager's (greedy); the exit status is 1 if one differed in float32. Writes
``experiments/results/hf_generate_<llvm cpu>_peers[_avx2][_bfloat16][_quick].csv`` and ``.json`` (``--out``:
another path without the suffix), a row per run and mode and a row per mode for the medians
(``run`` = ``median``), and prints a table of the medians and each worker's peak resident memory.

Memory: a case needs about the sum of its live workers' peaks (this process holds no model; its
own peak, about 0.6 GB, is the DRAM bandwidth measurement's buffer). Measured on the 1.6 GB
Llama-style config (32-token prompt, one thread, Zen 4): eager's worker peaked at 2.0 GB and
``looprl-frozen``'s at 13.5 GB (10.2 GB resident once prepared: looprl's tuned copy holds far
more than the model's weights), so on a 24 GB host that config runs with ``--live 2``. The
tiny ``--quick`` configs' workers peak at 0.4-0.8 GB each. ``--live N`` keeps at most N workers
alive: eager's worker lives through the case and the other modes run in groups of N - 1 beside
it, each group its ``--runs`` rounds (numbered on across the groups; eager has a row for every
round and each mode's ``vs_eager`` is against eager's generation of the same round).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _hf_modes import CONFIGS, QUICK
from _hf_worker import Worker, WorkerFailed, memory

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("eager", "max-autotune", "ctranslate2", "onednn-packed", "looprl", "looprl-frozen", "looprl-compiled", "copy", "fast", "tune")
DEFAULT_MODES = MODES[:7]
RECOMMENDED = "looprl-compiled"
FIELDS = ["config", "prompt", "new_tokens", "threads", "mode", "run", "dtype", "target", "llvm_cpu", "cpu", "parameters", "prepare_s", "prefill_ms",
          "decode_tokens_per_s", "vs_eager", "bytes_per_token", "dram_gbs", "of_bound", "same_tokens", "skipped"]


def groups(modes: list[str], live: int) -> list[list[str]]:
    """The modes' workers alive together, each group with eager (the reference): every mode at
    once where ``live`` is 0, else at most ``live`` workers, eager's one of them."""
    others = [mode for mode in modes if mode != "eager"]
    size = len(others) if live == 0 else live - 1
    return [["eager"] + others[start:start + size] for start in range(0, max(len(others), 1), max(size, 1))]


def run_case(config: str, prompt_length: int, threads: int, modes: list[str], args, common: dict) -> list[dict]:
    """One case: every mode prepared in a worker of its own (every cache empty), then ``--runs``
    rounds of generations per group of workers alive together, interleaved."""
    from looprl.measurement.roofline import memory_bandwidth

    dram_gbs = memory_bandwidth(cache=":memory:", threads=threads)["dram"]
    measured, prepare, skipped, peaks, rows = {}, {}, {}, {}, []
    with tempfile.TemporaryDirectory(prefix="hf_generate_") as folder:
        def start(mode: str) -> Worker | None:
            if mode == "ctranslate2" and importlib.util.find_spec("ctranslate2") is None:
                skipped[mode] = "CTranslate2 is not installed (pip install ctranslate2)"
            else:
                try:
                    worker = Worker(mode, config, prompt_length, threads, args.new, args.quick, args.target, Path(folder) / mode, args.dtype)
                except WorkerFailed as error:
                    skipped[mode] = str(error)
                else:
                    prepare[mode] = 0.0 if mode == "eager" else worker.ready["prepare_s"]
                    measured[mode], peaks[mode] = [], worker.ready["peak_rss_mb"]
                    print(f"{mode:>16}: prepared in {prepare[mode]:.1f} s with every cache empty; resident {worker.ready['rss_mb']} MB, "
                          f"peak {worker.ready['peak_rss_mb']} MB", flush=True)
                    return worker
            print(f"{mode:>16}: skipped ({skipped[mode]})", flush=True)
            return None

        eager = start("eager")
        if eager is None:
            raise RuntimeError(f"eager, the reference, did not run: {skipped['eager']}")
        reference, facts = eager.ready["tokens"], eager.ready
        per_token = facts["bytes_per_token"]
        case = dict(common, config=config, prompt=prompt_length, new_tokens=args.new, threads=threads, parameters=facts["parameters"],
                    bytes_per_token=per_token, dram_gbs=round(dram_gbs, 2))
        print(f"{config}: {facts['parameters'] / 1e6:.1f}M parameters, {per_token / 1e6:.0f} MB read per token; {prompt_length}-token "
              f"prompt, {args.new} new tokens; {threads} thread(s); DRAM {dram_gbs:.1f} GB/s", flush=True)
        number = 0
        try:
            for group in groups(modes, args.live):
                workers = {"eager": eager}
                try:
                    for mode in group[1:]:
                        worker = start(mode)
                        if worker is not None:
                            workers[mode] = worker
                    if len(workers) == 1 and len(group) > 1:
                        continue  # every other mode of the group skipped: eager alone would add rounds that compare nothing
                    for run in range(args.runs):  # interleaved, each round starting at the next mode
                        number += 1
                        ran = [mode for mode in group if mode in workers]
                        order = ran[run % len(ran):] + ran[:run % len(ran)]
                        results = {}
                        for mode in order:
                            try:
                                results[mode] = workers[mode].run()
                            except WorkerFailed as error:
                                if mode == "eager":
                                    raise RuntimeError(f"eager, the reference, failed: {error}") from None
                                skipped[mode] = str(error)
                                workers.pop(mode).close()
                                print(f"{mode:>16}: failed in round {number} ({error})", flush=True)
                        for mode in (mode for mode in group if mode in results):
                            result = results[mode]
                            rate, tokens = result["decode_tokens_per_s"], result["tokens"]
                            ratio = rate / results["eager"]["decode_tokens_per_s"]
                            peaks[mode] = result["peak_rss_mb"]
                            measured[mode].append((result["prefill_s"], rate, ratio, tokens == reference))
                            rows.append(dict(case, mode=mode, run=number, prepare_s=round(prepare[mode], 2),
                                             prefill_ms=round(1e3 * result["prefill_s"], 2), decode_tokens_per_s=round(rate, 2),
                                             vs_eager=round(ratio, 3), of_bound=round(rate * per_token / 1e9 / dram_gbs, 3),
                                             same_tokens=tokens == reference))
                finally:
                    for mode, worker in workers.items():
                        if mode != "eager":
                            worker.close()
                print(f"  peak resident memory (MB) of the workers alive together: "
                      f"{', '.join(f'{mode} {peaks[mode]:.0f}' for mode in group if mode in peaks)}; this process "
                      f"{memory()['peak_rss_mb']:.0f}", flush=True)
        finally:
            eager.close()
    for mode in modes:
        if mode in skipped or not measured.get(mode):
            rows.append(dict(case, mode=mode, run="median", skipped=skipped.get(mode, "no run")))
            continue
        prefills, rates, ratios, same = zip(*measured[mode])
        rate = statistics.median(rates)
        rows.append(dict(case, mode=mode, run="median", prepare_s=round(prepare[mode], 2), prefill_ms=round(1e3 * statistics.median(prefills), 2),
                         decode_tokens_per_s=round(rate, 2), vs_eager=round(statistics.median(ratios), 3),
                         of_bound=round(rate * per_token / 1e9 / dram_gbs, 3), same_tokens=all(same)))
    return rows


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
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the models' dtype (default float32; bfloat16: every mode in bfloat16, tokens compared but not required equal)")
    parser.add_argument("--quick", action="store_true", help="tiny configs, 4 new tokens: a check that every mode runs")
    parser.add_argument("--out", type=Path, default=None, help="the results' path without .csv/.json")
    parser.add_argument("--live", type=int, default=0,
                        help="at most this many mode workers alive at once, eager's one of them (default 0: every mode at once)")
    args = parser.parse_args(argv)
    args.new = args.new if args.new is not None else (4 if args.quick else 64)
    args.runs = args.runs if args.runs is not None else (2 if args.quick else 3)
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
    if args.live == 1 or args.live < 0:
        parser.error(f"--live: {args.live} workers cannot hold eager and another mode; give 0 (every mode at once) or at least 2")
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu

    llvm_cpu = host_cpu()[0]
    out = args.out or RESULTS / (f"hf_generate_{llvm_cpu}_peers" + (f"_{args.target}" if args.target else "")
                                 + ("_bfloat16" if args.dtype == "bfloat16" else "") + ("_quick" if args.quick else ""))
    common = {"target": args.target or "host", "llvm_cpu": llvm_cpu, "cpu": cpu_model_name(), "dtype": args.dtype}
    print(f"{cpu_model_name()} ({llvm_cpu}); configs {', '.join(configs)}{' (quick: tiny)' if args.quick else ''}; modes {', '.join(modes)}; "
          f"{args.runs} run(s)", flush=True)
    rows = []
    about = dict(common, configs={name: (QUICK if args.quick else CONFIGS)[name] for name in configs}, recommended=RECOMMENDED,
                 command=" ".join(sys.argv))
    for config in configs:
        for prompt in prompts:
            for count in threads:
                rows.extend(run_case(config, prompt, count, modes, args, common))
                write(out, rows, about)  # each case's rows kept as it ends: a later case that fails loses only itself
    print_table(rows)
    write(out, rows, about)
    # Greedy tokens must match eager's in float32; in bfloat16 each kernel's rounding may tip a close choice (reported, not failed).
    return 0 if args.dtype == "bfloat16" or all(row.get("same_tokens", True) for row in rows if not row.get("skipped")) else 1


def write(out: Path, rows: list[dict], about: dict) -> None:
    from _torch_timing import write_csv

    write_csv(out, FIELDS, rows)
    path = out.with_suffix(".json")
    path.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
