"""``python -m looprl.bench layers``: fused linear layers against numpy and torch, one thread.

For each layer ``y = act(x @ W.T + b) (+ r)`` (W stored ``[out, in]``, as ``torch.nn.Linear``
has it): ``looprl.tune`` of :func:`looprl.linear` from a cold cache, then, after tuning, these
timed in turn, round after round (best of :data:`~looprl.bench.peers.TIMING_ROUNDS`, ``--budget``
seconds each, under the machine-wide lock; :mod:`looprl.bench.peers`):

* **fused**: the tuned kernel, W (and its packing) bound once as a constant, outside the timed
  call, the bias, the activation and the residual applied in its write-back;
* **numpy**: the same steps unfused, one numpy call each (``np.matmul(x, W.T)``, ``+= b``, the
  activation, ``+= r``; gelu's erf from ``scipy.special`` when installed), in a child process
  with one BLAS thread and the OpenBLAS kernels of the target's ISA
  (:mod:`looprl.measurement.numpy_baseline`);
* **F.linear**: what an eager model runs, ``act(F.linear(x, W, b))`` (+ r);
* **oneDNN**: oneDNN's linear on W packed once beforehand, outside the timed call, as looprl's
  is (``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise`` with the
  activation fused): what ``torch.compile`` with Inductor's freezing runs for a linear layer;
  on the project's Zen 5 host about 2.3x ``F.linear`` at 64-512 rows.

Both torch calls run in one child process (:mod:`looprl.bench.torch_baseline`), one thread,
its kernels held to the target's ISA where that is narrower than the host's.

GFLOPS count the matmul's 2·m·n·k; the table gives milliseconds and speed-ups (a peer's time /
the fused kernel's): ``x numpy``, ``x F.linear``, ``x oneDNN``, and the headline ``x best``,
against the fastest peer of the layer (``best``: which one). ``--no-torch`` leaves both torch
peers out. Layers are given as ``BATCH,IN,OUT[,relu|gelu|gelu_tanh|silu][,residual][,nobias]``.
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
from looprl.bench.peers import TIMING_ROUNDS, Peers
from looprl.measurement.numpy_baseline import baseline_label
from looprl.measurement.numpy_epilogue import erf_source
from looprl.measurement.peak import measure_peak_gflops
from looprl.measurement.roofline import roofline
from looprl.tune.api import tune
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


def _geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return statistics.geometric_mean(values) if values else math.nan


PEERS = ("numpy", "F.linear", "oneDNN")


def _seconds(problem, gflops) -> float:
    """Seconds of one call at ``gflops`` (NaN: not timed)."""
    return problem.flops / gflops / 1e9 if gflops is not None and gflops > 0 else math.nan


def main(args, out=None) -> dict:
    out = sys.stdout if out is None else out  # the stream at the call, not at import
    checks.seconds(args.budget, "--budget")
    if args.tune_budget is not None:  # None: scaled to the layer
        checks.seconds(args.tune_budget, "--tune-budget", allow_zero=True)
    layers = [parse_layer(t) for t in args.layers] if args.layers else [(*spec, True) for spec in DEFAULT_LAYERS]
    target = Target.resolve(args.target)
    target.check_runs_on_host()
    problems = [linear(b, i, o, bias=bias, activation=act, residual=res) for _, b, i, o, act, res, bias in layers]
    ceilings = roofline(measure_peak_gflops(target), target, ":memory:", fresh=True)
    peers = Peers(target.isa, [1], torch=not args.no_torch)
    try:
        return _run(args, out, target, layers, problems, ceilings, peers)
    finally:
        peers.close()


def _run(args, out, target, layers, problems, ceilings, peers) -> dict:
    torch_label = peers.label("torch", 1)
    print(f"target {target}; CPU {cpu_model_name()}; one thread; compared with {baseline_label(target.isa)} "
          f"(gelu's erf: {erf_source()}){'' if args.no_torch else f' and {torch_label}: F.linear and oneDNN on a weight packed once'}; "
          f"timed in turn, best of {TIMING_ROUNDS} rounds", file=out)
    print(ceilings.describe(), file=out)
    print(f"{'layer':>38} {'m x k -> n':>16} {'tune s':>6} {'fused ms':>8} {'numpy ms':>8} {'F.lin ms':>8} {'oneDNN ms':>9} {'GFLOPS':>7} "
          f"{'x numpy':>7} {'x F.lin':>7} {'x oneDNN':>8} {'x best':>6} {'best':>8} {'bound':>7} {'of bound':>8}", file=out)
    rows = []
    for (name, *_), problem in zip(layers, problems):
        result = tune(problem, args.policy if args.policy == "default" else Path(args.policy), cache=":memory:", target=target,
                      budget_s=args.tune_budget, threads=1)  # one thread, as numpy and torch here
        timed = peers.timed_with({"fused": result.kernel}, problem, args.budget, 1)
        fused_s = _seconds(problem, timed["fused"])
        peer_s = {"numpy": _seconds(problem, timed["numpy"]), "F.linear": _seconds(problem, timed["torch"].get("F.linear")),
                  "oneDNN": _seconds(problem, timed["torch"].get("oneDNN packed"))}
        timed_peers = {peer: seconds for peer, seconds in peer_s.items() if seconds == seconds}
        best_peer = min(timed_peers, key=timed_peers.get) if timed_peers else None
        best_s = timed_peers[best_peer] if best_peer else math.nan
        bound = ceilings.bound(problem)
        row = {"layer": name, "problem": problem.name, "tune_s": result.seconds, "fused_s": fused_s, "numpy_s": peer_s["numpy"],
               "torch_s": peer_s["F.linear"], "onednn_s": peer_s["oneDNN"], "best_peer": best_peer, "best_peer_s": best_s,
               "fused_gflops": timed["fused"], "vs_numpy": peer_s["numpy"] / fused_s, "vs_torch": peer_s["F.linear"] / fused_s,
               "vs_onednn": peer_s["oneDNN"] / fused_s, "vs_best": best_s / fused_s,
               "bound_gflops": bound.gflops, "bound": bound.limit, "schedule": result.nest.key}
        rows.append(row)
        shape = f"{problem.size('m')}x{problem.size('k')}->{problem.size('n')}"
        print(f"{name:>38} {shape:>16} {result.seconds:6.2f} {1e3 * fused_s:8.3f} {1e3 * peer_s['numpy']:8.3f} "
              f"{1e3 * peer_s['F.linear']:8.3f} {1e3 * peer_s['oneDNN']:9.3f} {timed['fused']:7.1f} {row['vs_numpy']:7.2f} "
              f"{row['vs_torch']:7.2f} {row['vs_onednn']:8.2f} {row['vs_best']:6.2f} {best_peer or '-':>8} "
              f"{bound.gflops:6.1f}{bound.letter} {timed['fused'] / bound.gflops:8.2f}", file=out, flush=True)
    activated = [r for r, p in zip(rows, problems) if p.epilogue.activation is not None]
    summary = {}
    for key in ("vs_best", "vs_numpy", "vs_torch", "vs_onednn"):
        summary[f"{key}_geomean"] = _geomean(r[key] for r in rows)
        summary[f"activation_layers_{key}_geomean"] = _geomean(r[key] for r in activated)
    print(f"geomean fused/best peer {summary['vs_best_geomean']:.2f} (layers with an activation: "
          f"{summary['activation_layers_vs_best_geomean']:.2f}); fused/numpy {summary['vs_numpy_geomean']:.2f} (with an activation: "
          f"{summary['activation_layers_vs_numpy_geomean']:.2f}); fused/F.linear {summary['vs_torch_geomean']:.2f}; "
          f"fused/oneDNN packed {summary['vs_onednn_geomean']:.2f}", file=out)
    report = {"target": target.to_dict(), "cpu": cpu_model_name(), "numpy": baseline_label(target.isa), "torch": torch_label,
              "erf": erf_source(), "budget_s": args.budget, "rounds": TIMING_ROUNDS, "summary": summary, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report
