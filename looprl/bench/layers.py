"""``python -m looprl.bench layers``: fused linear layers against numpy and torch, one thread.

For each layer ``y = act(x @ W.T + b) (+ r)`` (W stored ``[out, in]``, as ``torch.nn.Linear``
has it): ``looprl.tune`` of :func:`looprl.linear` from a cold cache, then, timed by the
common rule under the machine-wide lock, with the same budget:

* **fused**: the tuned kernel, W (and its packing) bound once as a constant, the bias, the
  activation and the residual applied in its write-back;
* **numpy**: the same steps unfused, one numpy call each (``np.matmul(x, W.T)``, ``+= b``, the
  activation, ``+= r``; gelu's erf from ``scipy.special`` when installed), in a child process
  with one BLAS thread and the OpenBLAS kernels of the target's ISA
  (:mod:`looprl.measurement.numpy_baseline`);
* **torch**: what a model runs, ``act(F.linear(x, W, b))`` (+ r), with
  ``torch.set_num_threads(1)`` in this process, under ``torch.inference_mode()`` (torch's
  own kernels whatever ``--target`` says).

GFLOPS count the matmul's 2·m·n·k; the tables give milliseconds and speed-ups. Layers are
given as ``BATCH,IN,OUT[,relu|gelu|gelu_tanh|silu][,residual][,nobias]``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from looprl import checks
from looprl.backend.host import cpu_model_name
from looprl.ir.epilogue import ACTIVATIONS
from looprl.ir.layers import linear
from looprl.measurement.numpy_baseline import baseline_label, numpy_gflops
from looprl.measurement.numpy_epilogue import erf_source
from looprl.measurement.peak import measure_peak_gflops
from looprl.measurement.roofline import roofline
from looprl.measurement.timing import best_time, time_kernel
from looprl.policy.tuner import tune
from looprl.target import Target

# (name, batch, in, out, activation, residual): layers of ViT-S/16 (197 tokens) and BERT-base.
DEFAULT_LAYERS = (
    ("vit-s16 mlp.fc1 + gelu", 197, 384, 1536, "gelu", False),
    ("bert-base ffn.up + relu, 64 tokens", 64, 768, 3072, "relu", False),
    ("bert-base attn.out, 128 tokens", 128, 768, 768, None, False),
    ("bert-base attn.out + residual", 128, 768, 768, None, True),
    ("vit-s16 mlp.fc2 + residual", 197, 1536, 384, None, True),
)


def add_arguments(parser) -> None:
    parser.add_argument("--layers", nargs="+", default=None, metavar="B,IN,OUT[,ACT][,residual][,nobias]",
                        help="layers to run (default: five layers of ViT-S/16 and BERT-base)")
    parser.add_argument("--target", default=None, help="host (default), avx512, avx2 or sse4")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--tune-budget", type=float, default=None, help="looprl.tune's search budget (default: scaled to the layer)")
    parser.add_argument("--budget", type=float, default=0.2, help="seconds to time each implementation of each layer (default 0.2)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch")
    parser.add_argument("--json", type=Path, default=None)


def parse_layer(text: str) -> tuple:
    """``B,IN,OUT[,activation][,residual][,nobias]`` as (name, batch, in, out, activation, residual, bias)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        raise ValueError(f"bad layer {text!r}: expected BATCH,IN,OUT[,activation][,residual][,nobias]")
    activation, residual, bias = None, False, True
    for flag in parts[3:]:
        if flag in ACTIVATIONS and activation is None:
            activation = flag
        elif flag == "residual":
            residual = True
        elif flag == "nobias":
            bias = False
        else:
            raise ValueError(f"bad layer {text!r}: unknown or repeated {flag!r} (activations: {', '.join(ACTIVATIONS)}; residual; nobias)")
    return (text, int(parts[0]), int(parts[1]), int(parts[2]), activation, residual, bias)


def torch_seconds(problem, budget_s: float) -> float:
    """Seconds of one ``act(F.linear(x, W, b)) (+ r)`` in torch on one thread."""
    import torch
    import torch.nn.functional as functional

    torch.set_num_threads(1)
    m, k, n = problem.size("m"), problem.size("k"), problem.size("n")
    generator = torch.Generator().manual_seed(0)
    x, w = torch.rand(m, k, generator=generator) * 2 - 1, torch.rand(n, k, generator=generator) * 2 - 1
    epilogue = problem.epilogue
    b = torch.rand(n, generator=generator) * 2 - 1 if epilogue.bias else None
    r = torch.rand(m, n, generator=generator) * 2 - 1 if epilogue.residual else None
    scale = epilogue.scale
    activation = {
        None: lambda y: y,
        "relu": functional.relu,
        "gelu": functional.gelu,
        "gelu_tanh": lambda y: functional.gelu(y, approximate="tanh"),
        "silu": functional.silu,
    }[epilogue.activation]

    in_gemm = scale == 1.0  # what nn.Linear runs: the bias added by the GEMM call

    def layer():
        y = functional.linear(x, w, b if in_gemm else None)
        if not in_gemm:
            y = y * scale
            if b is not None:
                y = y + b
        y = activation(y)
        return y + r if r is not None else y

    def repeat(reps: int) -> None:
        for _ in range(reps):
            layer()

    with torch.inference_mode():
        return best_time(repeat, budget_s).seconds


def _geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return statistics.geometric_mean(values) if values else math.nan


def main(args, out=sys.stdout) -> dict:
    checks.seconds(args.budget, "--budget")
    if args.tune_budget is not None:  # None: scaled to the layer
        checks.seconds(args.tune_budget, "--tune-budget", allow_zero=True)
    layers = [parse_layer(t) for t in args.layers] if args.layers else [(*spec, True) for spec in DEFAULT_LAYERS]
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    problems = [linear(b, i, o, bias=bias, activation=act, residual=res) for _, b, i, o, act, res, bias in layers]
    numpy = numpy_gflops(problems, args.budget, isa=target.isa)
    ceilings = roofline(measure_peak_gflops(target), target, ":memory:", fresh=True)
    print(f"target {target}; CPU {cpu_model_name()}; one thread; compared with {baseline_label(target.isa)} "
          f"(gelu's erf: {erf_source()}){'' if args.no_torch else ' and torch'}", file=out)
    print(ceilings.describe(), file=out)
    print(f"{'layer':>38} {'m x k -> n':>16} {'tune s':>6} {'fused ms':>8} {'numpy ms':>8} {'torch ms':>8} {'GFLOPS':>7} "
          f"{'x numpy':>7} {'x torch':>7} {'bound':>7} {'of bound':>8}", file=out)
    rows = []
    for (name, *_), problem, numpy_value in zip(layers, problems, numpy):
        result = tune(problem, args.policy if args.policy == "default" else Path(args.policy), cache=":memory:", target=target,
                      budget_s=args.tune_budget, threads=1)  # one thread, as numpy and torch here
        fused = time_kernel(result.kernel, args.budget)
        numpy_s = problem.flops / numpy_value / 1e9
        torch_s = math.nan if args.no_torch else torch_seconds(problem, args.budget)
        bound = ceilings.bound(problem)
        row = {"layer": name, "problem": problem.name, "tune_s": result.seconds, "fused_s": fused.seconds, "numpy_s": numpy_s,
               "torch_s": torch_s, "fused_gflops": fused.gflops, "vs_numpy": numpy_s / fused.seconds, "vs_torch": torch_s / fused.seconds,
               "bound_gflops": bound.gflops, "bound": bound.limit, "schedule": result.nest.key}
        rows.append(row)
        shape = f"{problem.size('m')}x{problem.size('k')}->{problem.size('n')}"
        print(f"{name:>38} {shape:>16} {result.seconds:6.2f} {1e3 * fused.seconds:8.3f} {1e3 * numpy_s:8.3f} {1e3 * torch_s:8.3f} "
              f"{fused.gflops:7.1f} {row['vs_numpy']:7.2f} {row['vs_torch']:7.2f} {bound.gflops:6.1f}{bound.limit[0].upper()}"
              f" {fused.gflops / bound.gflops:8.2f}", file=out, flush=True)
    activated = [r for r, p in zip(rows, problems) if p.epilogue.activation is not None]
    summary = {
        "vs_numpy_geomean": _geomean(r["vs_numpy"] for r in rows),
        "vs_torch_geomean": _geomean(r["vs_torch"] for r in rows),
        "activation_layers_vs_numpy_geomean": _geomean(r["vs_numpy"] for r in activated),
        "activation_layers_vs_torch_geomean": _geomean(r["vs_torch"] for r in activated),
    }
    print(f"geomean fused/numpy {summary['vs_numpy_geomean']:.2f} (layers with an activation: "
          f"{summary['activation_layers_vs_numpy_geomean']:.2f}); fused/torch {summary['vs_torch_geomean']:.2f} "
          f"(with an activation: {summary['activation_layers_vs_torch_geomean']:.2f})", file=out)
    report = {"target": target.to_dict(), "cpu": cpu_model_name(), "numpy": baseline_label(target.isa), "erf": erf_source(),
              "budget_s": args.budget, "summary": summary, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
