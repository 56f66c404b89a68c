"""What the native linear operator is worth: per call, and per decode token of transformers' model.

    python experiments/native_calls.py [--config qwen2] [--dtype float32] [--rounds 5] [--threads 1] [--out PATH]

The config's transformers model (random weights, as ``experiments/hf_generate.py`` builds it) in
the recommended recipe (``torch.compile(model.forward, backend="looprl", fullgraph=True)``, a
static cache, Inductor's freezing) is prepared twice from one cache: with the native operator
(``looprl_native::linear``, :mod:`looprl.torch.native`, the default) and with the Python one
(``LOOPRL_NATIVE=0`` while it compiles: ``looprl::linear``); the second preparation's answers are
the first's, remembered, so both run the same kernels. The peers: max-autotune with freezing, and
eager.

**Per call.** After a generation, each looprl layer of the native preparation is called on one row
(its decode call) through the native operator, through the Python operator, by torch's own
call (``functional.linear`` and the layer's activation) and by oneDNN's linear on the weight
packed once (torch's faster path on AMD; skipped where oneDNN refuses the dtype), interleaved, best of ``--rounds`` rounds
of 2000 calls each, the weight warm: the operators' own cost is the difference.

**Model.** A 64-token greedy generation after a 32-token prompt by each preparation in turn,
``--rounds`` rounds, every generation checked against eager's tokens. Decode tokens/s, medians.

Writes ``<out>.txt`` (what it prints) and ``<out>.json``; default
``experiments/results/native_calls_<llvm cpu>_<config>[_<dtype>][_t<threads>]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NEW_TOKENS = 64
PROMPT = 32
CALLS = 2000  # calls per timing of one layer


def best_us(function, rounds: int) -> float:
    """Best microseconds per call of ``function()`` over ``rounds`` timings of :data:`CALLS` calls."""
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(CALLS):
            function()
        best = min(best, (time.perf_counter() - began) / CALLS)
    return best * 1e6


def onednn_call(kernels, weight, bias, x):
    """oneDNN's linear on ``weight`` packed once (``torch.ops.mkldnn._reorder_linear_weight``,
    then ``_linear_pointwise``, as :mod:`looprl.bench.torch_baseline` times it; the layer's
    activation after it), or None where oneDNN refuses it (bfloat16 without AVX512_BF16)."""
    import torch

    from looprl.torch.activations import ACTIVATIONS

    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), x.shape[0])
    except RuntimeError:
        return None
    linear = torch.ops.mkldnn._linear_pointwise
    activation = ACTIVATIONS[kernels.activation].function if kernels.activation is not None else None
    if activation is None:
        return lambda: linear(x, packed, bias, "none", [], "none")
    return lambda: activation(linear(x, packed, bias, "none", [], "none"))


def call_costs(layers: list, dtype, rounds: int, log) -> list[dict]:
    """Per looprl layer: one row through the native operator, the Python operator and torch's call."""
    import torch

    rows = []
    for index, kernels in layers:
        if kernels.native is None or 1 not in kernels.native._kept:  # no native plan for one row
            continue
        kept = kernels.native._kept[1]
        if kept is not None:  # bound copies: the plan holds for the weight tensor it was made for
            weight, bias = kept[0], kept[1]
        else:
            weight = torch.randn(kernels.out_features, kernels.in_features, dtype=dtype)
            bias = torch.randn(kernels.out_features, dtype=dtype) if "bias" in kernels.results[1].problem.epilogue.inputs else None
        x = torch.randn(1, kernels.in_features, dtype=dtype)
        native, python = torch.ops.looprl_native.linear.default, torch.ops.looprl.linear.default
        timed = {"native": lambda: native(x, weight, bias, index), "python": lambda: python(x, weight, bias, index),
                 "torch": lambda: kernels.fallback(x, weight, bias)}
        onednn = onednn_call(kernels, weight, bias, x)
        if onednn is not None:
            timed["onednn"] = onednn
        best = {name: float("inf") for name in timed}
        with torch.no_grad():
            for name, function in timed.items():
                function()
            for _ in range(rounds):
                for name, function in timed.items():
                    best[name] = min(best[name], best_us(function, 1))
        rows.append({"layer": f"{kernels.in_features}->{kernels.out_features}", **{f"{name}_us": value for name, value in best.items()}})
    for shape in dict.fromkeys(row["layer"] for row in rows):  # one line per layer shape: the medians of its layers
        same = [row for row in rows if row["layer"] == shape]
        native, python, torch_ = (statistics.median(row[f"{name}_us"] for row in same) for name in ("native", "python", "torch"))
        packed = [row["onednn_us"] for row in same if "onednn_us" in row]
        onednn = f", oneDNN packed {statistics.median(packed):7.2f}" if packed else ", oneDNN packed (refused)"
        log(f"  {shape:>12} ({len(same)} layers): native {native:7.2f} us, Python operator {python:7.2f}, torch's F.linear {torch_:7.2f}"
            f"{onednn}; saved {python - native:.2f} us a call")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="qwen2", choices=("qwen2", "gpt2", "llama"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="the results' path without .txt/.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    caches = tempfile.mkdtemp(prefix="native_calls_")
    os.environ.setdefault("LOOPRL_CACHE_DIR", caches + "/looprl")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", caches + "/inductor")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    import _hf_modes as modes
    from looprl import dynamo
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu
    from looprl.torch import native

    suffix = ("" if args.dtype == "float32" else f"_{args.dtype}") + (f"_t{args.threads}" if args.threads > 1 else "")
    out = args.out or RESULTS / f"native_calls_{host_cpu()[0]}_{args.config}{suffix}"
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/native_calls.py --config {args.config} --dtype {args.dtype} --rounds {args.rounds}"
        + (f" --threads {args.threads}" if args.threads > 1 else ""))
    log(f"{cpu_model_name()} ({host_cpu()[0]}), {args.threads} thread(s), {args.dtype}")
    if native.library() is None:
        raise SystemExit(f"the native operator is not available: {native.unavailable()}")
    torch.set_num_threads(args.threads)
    model = modes.build(args.config, dtype=args.dtype)
    prompt = modes.make_prompt(model, PROMPT)
    runners, layers = {}, []
    for name, switch in (("recipe, native", "1"), ("recipe, Python operator", "0"), ("max-autotune", "1")):
        os.environ["LOOPRL_NATIVE"] = switch
        before = set(dynamo._layers.keys())
        began = time.perf_counter()
        mode = "max-autotune" if name == "max-autotune" else "looprl-compiled"
        runners[name] = modes.prepared(mode, model, prompt, args.threads, None, Path(caches) / "looprl")
        runners[name](prompt, NEW_TOKENS)  # compiled now
        if name == "recipe, native":
            layers = [(index, dynamo._layers[index]) for index in sorted(set(dynamo._layers.keys()) - before)]
        log(f"prepared {name} in {time.perf_counter() - began:.1f} s")
    os.environ["LOOPRL_NATIVE"] = "1"
    runners["eager"] = modes.Runner(model)
    expected = runners["eager"](prompt, NEW_TOKENS)[0]
    decode = {name: [] for name in runners}
    for round_ in range(args.rounds):
        for name, runner in runners.items():
            tokens, _, rate = runner(prompt, NEW_TOKENS)
            if args.dtype == "float32" and tokens != expected:
                raise RuntimeError(f"{name} generated other tokens than eager")
            decode[name].append(rate)
        log(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:.1f}" for name, values in decode.items()))
    medians = {name: statistics.median(values) for name, values in decode.items()}
    log("decode tokens/s, medians: " + ", ".join(f"{name} {value:.2f}" for name, value in medians.items()))
    per_token_ms = 1e3 / medians["recipe, Python operator"] - 1e3 / medians["recipe, native"]
    log(f"native / Python operator {medians['recipe, native'] / medians['recipe, Python operator']:.3f} "
        f"({per_token_ms:.2f} ms a token); native / max-autotune {medians['recipe, native'] / medians['max-autotune']:.3f}; "
        f"native / eager {medians['recipe, native'] / medians['eager']:.3f}")
    calls = sum(kernels.counted().get("looprl", 0) for _, kernels in layers)
    log(f"one row per layer, warm, {len(layers)} looprl layers in the native preparation ({calls} calls served by looprl):")
    costs = call_costs(layers, getattr(torch, args.dtype), args.rounds, log)
    if costs:
        saved = statistics.median(row["python_us"] - row["native_us"] for row in costs)
        best_torch = [min(row["torch_us"], row.get("onednn_us", float("inf"))) for row in costs]
        log(f"median saved per call {saved:.2f} us; native above torch's faster call (F.linear or oneDNN packed): median "
            f"{statistics.median(row['native_us'] - best for row, best in zip(costs, best_torch)):+.2f} us")
    results = {"cpu": cpu_model_name(), "llvm_cpu": host_cpu()[0], "config": args.config, "dtype": args.dtype, "threads": args.threads,
               "decode_tokens_per_s": decode, "medians": medians, "calls": costs}
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
