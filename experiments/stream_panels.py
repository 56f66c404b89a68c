"""A cold weight read as several panels side by side against one panel at a time: one-row linear
layers whose weights come from memory on every call (a decode step), packed once.

    python experiments/stream_panels.py [--layers 512x512,768x512,...] [--rounds 9] [--out PATH]

Per layer (``out x in``, no bias; the Qwen2-style config's decode projections and its LM head by
default): looprl's packed panel schedules of ``looprl.ir.schedules`` on the layer's cold problem
(``looprl.linear(1, in, out, bias=False).with_cold()``), each bound to copies of the weight that
together span about 256 MB and called on each copy in turn (every call reads its weight from
memory): :func:`~looprl.ir.schedules.panel_steps` (one panel at a time, the weight one sequential
read) at each of its widths, and :func:`~looprl.ir.schedules.stream_panel_steps` (``streams``
panels read side by side) at each of its shapes; then what ``looprl.tune`` returns for the
problem; and the peers on the same copies: numpy (``x @ w.T``), torch's ``F.linear`` and oneDNN's
linear on each copy packed once. Interleaved, best of ``--rounds`` rounds, GB/s of weight read.
Before them, the host's stream kernel (``looprl.backend.stream_kernel``) on 1 MB regions of the
same kind of memory read in turn, as one stream and as four regions side by side.

Writes ``<out>.txt`` (what it prints); default ``experiments/results/stream_panels_<llvm cpu>``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = "512x512,768x512,2816x512,512x1408,32000x512"  # out x in
SPAN_BYTES = 256 << 20  # the copies of one layer's weight together


def stream_bound(log) -> None:
    """The stream kernel over 1 MB regions read in turn: one stream, and four side by side."""
    import numpy as np

    from looprl.backend import weight_memory
    from looprl.backend.jit import CompiledModule
    from looprl.backend.stream_kernel import STREAM_ACCUMULATORS, stream_ir
    from looprl.target import Target

    target = Target.default()
    regions = [weight_memory.weight_empty(1 << 18) for _ in range(256)]
    for region in regions:
        region[:] = 1.0
    out = np.zeros(64, np.float32)
    blocks = (1 << 18) // (target.vector_width * STREAM_ACCUMULATORS)
    figures = {}
    for streams in (1, 4):
        module = CompiledModule(stream_ir(target, streams=streams), "stream", target)
        kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(module.address)
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for region in regions:
                kernel(region.ctypes.data, blocks, 1, out.ctypes.data)
            best = min(best, (time.perf_counter() - began) / len(regions))
        figures[streams] = (1 << 20) / best / 1e9
    log(f"stream kernel, 256 regions of 1 MB read in turn: one stream {figures[1]:.1f} GB/s, four side by side {figures[4]:.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default=LAYERS, help=f"out x in, comma-separated (default {LAYERS})")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=None, help="the result's path without .txt")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        shapes = [tuple(int(size) for size in layer.split("x")) for layer in args.layers.split(",")]
    except ValueError:
        parser.error(f"--layers takes out x in sizes, comma-separated, not {args.layers!r}")
    if any(len(shape) != 2 or min(shape) < 2 for shape in shapes):
        parser.error(f"--layers takes two sizes of at least 2 per layer, not {args.layers!r}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np
    import torch

    import looprl
    from looprl.backend.host import cpu_model_name
    from looprl.backend.kernel import compile as compile_nest
    from looprl.ir.nest import initial_nest
    from looprl.ir.register_tiles import packed_right
    from looprl.ir.rewrites import relaid
    from looprl.ir.schedules import panel_steps, panel_widths, stream_panel_shapes, stream_panel_steps
    from looprl.target import Target, host_cpu

    torch.set_num_threads(1)
    target = Target.default()
    out = args.out or RESULTS / f"stream_panels_{host_cpu()[0]}"
    lines = []

    def log(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    log(f"$ python experiments/stream_panels.py --layers {args.layers} --rounds {args.rounds}")
    log(f"{cpu_model_name()} ({host_cpu()[0]}), target {target.isa}, one thread, torch {torch.__version__}; one row, each weight read "
        f"from memory (copies spanning {SPAN_BYTES >> 20} MB, called in turn), best of {args.rounds} interleaved rounds, GB/s of weight")
    stream_bound(log)
    for out_features, in_features in shapes:
        problem = looprl.linear(1, in_features, out_features, bias=False).with_cold()
        rewrite = relaid(problem)
        twin = rewrite.coordinates
        schedules = {f"panels {columns}": panel_steps(twin, columns) for columns in panel_widths(twin, target)}
        schedules |= {f"{streams} x {columns} side by side": stream_panel_steps(twin, streams, columns)
                      for streams, columns in stream_panel_shapes(twin, target)}
        kernels = {name: compile_nest(rewrite.schedule(packed_right(initial_nest(twin).apply(steps)))) for name, steps in schedules.items()}
        began = time.perf_counter()
        answer = looprl.tune(problem, threads=1, cache=":memory:", remember=False)
        tune_s = time.perf_counter() - began
        kernels["tune's answer"] = answer.kernel
        copies = max(2, SPAN_BYTES // (out_features * in_features * 4))
        rng = np.random.default_rng(0)
        weights = [rng.standard_normal((out_features, in_features), dtype=np.float32) for _ in range(copies)]
        x = rng.standard_normal((1, in_features), dtype=np.float32)
        expected = x @ weights[0].T
        calls = {name: [kernel.bind(b=weight) for weight in weights] for name, kernel in kernels.items()}
        for name, bound in calls.items():
            if not np.allclose(bound[0](x), expected, rtol=1e-4, atol=1e-3):
                raise RuntimeError(f"{name} computed another answer than numpy")
        torch_weights = [torch.from_numpy(weight) for weight in weights]
        tx = torch.from_numpy(x)
        packed = [torch.ops.mkldnn._reorder_linear_weight(weight, 1) for weight in torch_weights]
        peers = {"numpy": lambda i: x @ weights[i].T, "F.linear": lambda i: torch.nn.functional.linear(tx, torch_weights[i]),
                 "oneDNN packed": lambda i: torch.ops.mkldnn._linear_pointwise(tx, packed[i], None, "none", [], "none")}
        timed = {name: (lambda bound: lambda i: bound[i](x))(bound) for name, bound in calls.items()} | peers
        best = {name: float("inf") for name in timed}
        with torch.no_grad():
            for _ in range(args.rounds):
                for name, call in timed.items():
                    began = time.perf_counter()
                    for i in range(copies):
                        call(i)
                    best[name] = min(best[name], (time.perf_counter() - began) / copies)
        rates = {name: out_features * in_features * 4 / seconds / 1e9 for name, seconds in best.items()}
        log(f"1 x {in_features} -> {out_features} ({out_features * in_features * 4 / 2**20:.2f} MB, {copies} copies; tune {tune_s:.1f} s, "
            f"its answer {answer.nest.key[:70]})")
        for name, rate in rates.items():
            log(f"    {name:>24} {rate:6.1f}")
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out.with_suffix('.txt')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
