"""Where a decode token's time goes: transformers' own decoder (a config of ``hf_generate.py``)
generating greedily in one mode, profiled by torch's profiler (issue 63: "say what each part is
worth, in ms per token").

    python experiments/hf_token_profile.py [--config qwen2] [--modes looprl-compiled,max-autotune] [--threads 1]
        [--prompt 32] [--new 33] [--out PATH]

``max-autotune`` is transformers' compile recipe with Inductor's freezing on
(``torch._inductor.config.freezing = True``: its prepacked GEMMs and its C++ GEMM template) under
``torch.no_grad()``, and a static cache; ``looprl-compiled`` the same recipe with
``backend="looprl"``. This script sets freezing itself around every generation of a compiled
mode (as ``_hf_modes.Runner`` also does), and checks that it is on there.

Per mode (``hf_generate.py``'s modes; each prepared in this process, one after the other, with
every cache empty: ``LOOPRL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` are fresh temporary folders
set before torch is imported): the prepared model generates ``--new`` tokens after a
``--prompt``-token prompt three times unprofiled (the decode rate printed is the best of them),
then once under ``torch.profiler`` (CPU activities, input shapes recorded). The profiled run's
operators' own (self) CPU time is divided among its ``--new - 1`` decode tokens; the linear
calls on more than one row (the prompt's) are left out of their rows and counted with
everything else, as is the prompt's other work (a few milliseconds spread over the tokens):

* ``looprl::linear`` (``looprl_native::linear`` where the native operator runs it,
  ``looprl_native::try_linear`` for a tuned module's layer) per weight shape (each a row:
  microseconds a call, calls a token, GB/s of its weight and bias read per call), where
  looprl's backend runs the linear layers;
* ``mkldnn`` / ``aten`` linear calls where torch runs them, per weight shape likewise;
* the compiled graph's own time (``## Call CompiledFxGraph``: Inductor's kernels, its GEMMs
  among them under max-autotune), Dynamo's guard check (``TorchDynamo Cache Lookup``), attention
  (``scaled_dot_product``), and every other operator together.

The profiler adds its own cost to every operator call (a few microseconds): the shares are what
to compare, not the sum with the unprofiled rate. Writes ``PATH.txt`` (default
``experiments/results/hf_token_profile_<llvm cpu>_<config>_t<threads>.txt``) with what it prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LINEARS = ("looprl::linear", "looprl_native::linear", "looprl_native::try_linear", "mkldnn::_linear_pointwise", "aten::linear",
           "aten::addmm", "aten::mm", "mkl::_mkl_linear")
GROUPS = (("compiled graph (own time)", "## Call CompiledFxGraph"), ("Dynamo guards", "TorchDynamo Cache Lookup"),
          ("attention", "scaled_dot_product"))
COMPILED = ("max-autotune", "looprl-compiled")  # modes compiled by Inductor: generated with freezing on


def _weight_shape(shapes) -> tuple[int, ...] | None:
    """The weight's shape among an operator call's input shapes (the first two-dimensional one
    after the input), or None."""
    for shape in shapes[1:]:
        if isinstance(shape, (list, tuple)) and len(shape) == 2 and all(isinstance(d, int) for d in shape):
            return tuple(shape)
    return None


def _rows(shapes) -> int:
    """The rows of an operator call's first input (the product of its leading dimensions)."""
    first = shapes[0] if shapes else []
    rows = 1
    for extent in (first[:-1] if isinstance(first, (list, tuple)) else []):
        rows *= extent
    return rows


def breakdown(events, tokens: int) -> list[tuple[str, float, str]]:
    """``(what, ms per token, detail)`` rows from the profiler's averages grouped by input
    shape: each linear operator per weight shape (decode calls only: one row), the groups of
    :data:`GROUPS`, and the rest."""
    rows, linear_ms, grouped, total_us = [], {}, {name: 0.0 for name, _ in GROUPS}, 0.0
    for event in events:
        own = event.self_cpu_time_total  # microseconds
        total_us += own
        if event.key in LINEARS:
            shape = _weight_shape(event.input_shapes)
            if _rows(event.input_shapes) == 1 and shape is not None:
                key = (event.key, shape)
                calls, us = linear_ms.get(key, (0, 0.0))
                linear_ms[key] = (calls + event.count, us + own)
                continue
        for name, mark in GROUPS:
            if mark in event.key:
                grouped[name] += own
                break
    counted = sum(us for _, us in linear_ms.values()) + sum(grouped.values())
    for (name, shape), (calls, us) in sorted(linear_ms.items(), key=lambda item: -item[1][1]):
        per_call = us / calls
        gbs = 4 * shape[0] * shape[1] / (per_call * 1e3)
        rows.append((f"{name} {shape[0]}x{shape[1]}", us / 1e3 / tokens, f"{per_call:8.1f} us a call, {calls / tokens:5.1f} calls a token, "
                     f"{gbs:5.1f} GB/s of float32 weight"))
    for name, us in grouped.items():
        rows.append((name, us / 1e3 / tokens, ""))
    rows.append(("everything else", (total_us - counted) / 1e3 / tokens, "(prefill's other calls included)"))
    return rows


@contextlib.contextmanager
def _frozen(compiled: bool):
    """Inductor's freezing on for a compiled mode (checked), else nothing."""
    if not compiled:
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        if not inductor_config.freezing:
            raise RuntimeError("Inductor's freezing did not turn on: the max-autotune comparison needs it")
        yield


def profile_mode(mode: str, config: str, prompt_length: int, new: int, threads: int, target: str | None, log) -> None:
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from _hf_modes import build, make_prompt, prepared

    torch.set_num_threads(threads)
    compiled = mode in COMPILED
    model = build(config)
    prompt = make_prompt(model, prompt_length)
    started = time.perf_counter()
    runner = prepared(mode, model, prompt, threads, target, Path(os.environ["LOOPRL_CACHE_DIR"]) / mode)
    with _frozen(compiled), torch.no_grad():
        runner(prompt, new)
        prepare_s = time.perf_counter() - started
        rates = [runner(prompt, new)[2] for _ in range(3)]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
            runner(prompt, new)
    log(f"{mode}{' (Inductor freezing on)' if compiled else ''}: prepared in {prepare_s:.1f} s; decode {max(rates):.2f} tokens/s unprofiled "
        f"(best of 3: {', '.join(f'{r:.2f}' for r in rates)}), {1e3 / max(rates):.2f} ms a token")
    for what, ms, detail in breakdown(profiled.key_averages(group_by_input_shape=True), new - 1):
        log(f"    {what:<44} {ms:7.3f} ms a token  {detail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="qwen2", choices=("qwen2", "gpt2", "llama"))
    parser.add_argument("--modes", default="looprl-compiled,max-autotune")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=33, help="new tokens a generation (the first is the prefill's)")
    parser.add_argument("--target", choices=("avx2",), default=None)
    parser.add_argument("--out", type=Path, default=None, help="the result's path without .txt")
    args = parser.parse_args(argv)
    if args.new < 2 or args.prompt < 1 or args.threads < 1:
        parser.error("--new must be at least 2, --prompt and --threads at least 1")
    caches = tempfile.mkdtemp(prefix="hf_token_profile_")
    os.environ["LOOPRL_CACHE_DIR"], os.environ["TORCHINDUCTOR_CACHE_DIR"] = caches + "/looprl", caches + "/inductor"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu

    out = args.out or RESULTS / f"hf_token_profile_{host_cpu()[0]}_{args.config}_t{args.threads}"
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/hf_token_profile.py --config {args.config} --modes {args.modes} --threads {args.threads} "
        f"--prompt {args.prompt} --new {args.new}" + (f" --target {args.target}" if args.target else ""))
    log(f"{cpu_model_name()} ({host_cpu()[0]}); one decode token = the profiled generation's {args.new - 1} tokens after the first; "
        "operators' own CPU time")
    for mode in args.modes.split(","):
        profile_mode(mode, args.config, args.prompt, args.new, args.threads, args.target, log)
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
