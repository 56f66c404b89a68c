"""What packing a changing right operand strip by strip is worth: for each problem
(``looprl.matmul(m, n, k)``, B an input), the host's widest 6-row register tile flat with the
whole of B packed on every call (the packed flat tile), the same tile with B packed in column
strips of 1, 2, 4 and 8 of its panels, each strip the whole reduction deep and packed just
before the row tiles read it (``blocked_steps(..., Blocks(None, None, width), stage="n")``),
and with B's panels packed per reduction block (the first of ``cache_blocks``' candidates,
``stage="k"``), all called with A and B, in interleaved rounds, one thread. Marks the strips
that tune measures (``column_strips``, from the host's L2), in their order.

    python experiments/column_strips.py [--problems 128x960x960,384x4096x1024] [--rounds 7] [--out experiments/results]

Prints GFLOPS (each the median over the rounds of a round's best of three calls) and writes
``<out>/column_strips_<cpu>.txt``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"
PROBLEMS = "128x960x960,197x1536x384,384x4096x1024,128x4096x4096,512x960x2560"
PANELS = (1, 2, 4, 8)


def _best_seconds(call, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _variants(problem, rows: int, columns: int) -> dict[str, object]:
    """The schedules compared on ``problem``, by label: the packed flat tile, each strip width,
    the first k-staged block."""
    from looprl.ir.cache_blocks import Blocks, blocked_steps
    from looprl.ir.nest import initial_nest
    from looprl.ir.register_tiles import packed_right, tile_steps
    from looprl.ir.schedules import cache_blocks, column_strips

    found = {"flat, B packed whole": packed_right(initial_nest(problem).apply(tuple(tile_steps(problem, rows, columns))))}
    measured = column_strips(problem, rows, columns)
    n = problem.size(problem.output[-1])
    for panels in PANELS:
        width = panels * columns
        if width >= n:
            continue
        order = [i for i, blocks in enumerate(measured) if blocks.n == width]
        label = f"strips of {panels} panel{'s' if panels > 1 else ''} ({width} columns)" + (f", tune's #{order[0] + 1}" if order else "")
        found[label] = initial_nest(problem).apply(blocked_steps(problem, rows, columns, Blocks(None, None, width), stage="n"))
    blocks = cache_blocks(problem, rows, columns)
    if blocks:
        found[f"k-staged block {blocks[0].k}x{blocks[0].n or blocks[0].m}"] = initial_nest(problem).apply(
            blocked_steps(problem, rows, columns, blocks[0], stage="k"))
    return found


def main(argv=None) -> int:
    import numpy as np

    import looprl
    from looprl.backend.host import host_cpu
    from looprl.ir.cache_blocks import host_caches
    from looprl.target import Target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default=PROBLEMS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    target = Target.default()
    vectors = [v for rows, v in target.register_tiles() if rows == 6]
    columns = (max(vectors) if vectors else 2) * target.vector_width
    cpu = host_cpu()[0]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"column_strips_{cpu}.txt", "w") as file:
        tee = Tee(sys.stdout, file)
        print(f"{cpu} ({target.isa}), one thread, 6x{columns} tile; caches {host_caches()}; "
              f"GFLOPS: median over {args.rounds} interleaved rounds of each round's best of three calls with A and B", file=tee)
        for text in args.problems.split(","):
            m, n, k = (int(part) for part in text.split("x"))
            problem = looprl.matmul(m, n, k)
            rng = np.random.default_rng(0)
            a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
            output = np.empty((m, n), np.float32)
            kernels = {label: looprl.compile(nest) for label, nest in _variants(problem, 6, columns).items()}
            seconds: dict[str, list[float]] = {label: [] for label in kernels}
            for _ in range(args.rounds):
                for label, kernel in kernels.items():
                    seconds[label].append(_best_seconds(lambda: kernel.run(a, b, output)))
            print(f"{problem.name} (B {b.nbytes / 2**20:.1f} MiB)", file=tee)
            for label, taken in seconds.items():
                print(f"  {label:46s} {problem.flops / statistics.median(taken) / 1e9:7.1f}", file=tee)
            tee.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
