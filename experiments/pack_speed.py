"""How fast a kernel packs a right operand that changes per call into column panels: the packed
flat register tile of each problem (``looprl.matmul(m, n, k)``, B an input, the host's widest
6-row tile's columns) called with B, against the same kernel bound to B (packed once), in
interleaved rounds; the difference is the pack. Once with the pack copying
``PACK_ROW_GROUP`` rows chunk by chunk (looprl's code) and once row by row (the group set to 1:
the code before), beside numpy copying B into a buffer of its size.

    python experiments/pack_speed.py [--problems 6x4096x4096,6x4096x1024] [--rounds 5] [--out experiments/results]

Writes ``<out>/pack_speed_<cpu>.txt``.

``--threads 2``: instead, each problem's flat packed tile with its column loop parallel, compiled
twice, once with the right operand packed by the kernel's team (looprl's code) and once by the
calling thread alone (``TEAM_PACK_ELEMENTS`` out of reach: the code before), called with B on
two threads in interleaved rounds; writes ``<out>/pack_speed_<cpu>_t2.txt``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"
PROBLEMS = "6x4096x4096,6x4096x1024"


def _six_row_columns(target) -> int:
    """The columns of ``target``'s widest 6-row register tile (two vectors where it has none)."""
    vectors = [v for rows, v in target.register_tiles() if rows == 6]
    return (max(vectors) if vectors else 2) * target.vector_width


def _operands(m: int, n: int, k: int):
    """A [m, k] and B [k, n] (random, float32) and an output for them."""
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32), np.empty((m, n), np.float32)


def _best_seconds(call, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv=None) -> int:
    import numpy as np

    import looprl
    from looprl.backend import packing
    from looprl.backend.buffers import aligned_empty
    from looprl.backend.host import host_cpu
    from looprl.ir.register_tiles import packed_right, tile_steps
    from looprl.target import host_target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=PROBLEMS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, choices=(1, 2))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads == 2:
        return _team_pack(args)
    target = host_target()
    columns = _six_row_columns(target)
    path = args.out / f"pack_speed_{host_cpu()[0]}.txt"
    grouped = packing.PACK_ROW_GROUP
    with open(path, "w") as file:
        out = Tee(sys.stdout, file)
        print(f"{host_cpu()[0]} ({target.isa}), one thread; a 6 x {columns} tile's right operand packed into {columns}-column "
              f"panels on every call; median over {args.rounds} interleaved rounds of each one's best of 3", file=out)
        for text in args.problems.split(","):
            m, n, k = (int(part) for part in text.split("x"))
            problem = looprl.matmul(m, n, k)
            nest = packed_right(looprl.initial_nest(problem).apply(tuple(tile_steps(problem, 6, columns))))
            kernels = {}
            for group in (grouped, 1):
                packing.PACK_ROW_GROUP = group  # the code generator reads it when it emits the pack
                try:
                    kernels[group] = looprl.compile(nest, target=target)
                finally:
                    packing.PACK_ROW_GROUP = grouped
            a, b, out_array = _operands(m, n, k)
            copy = np.zeros_like(b)
            for kernel in kernels.values():
                np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-3)
            bound = kernels[grouped].bind(b=b)
            workspace = aligned_empty(max(kernel.workspace_elements for kernel in kernels.values()))
            workspace[:] = 0
            figures = {"bound": [], "numpy copy": [], **{f"group {group}": [] for group in kernels}}
            for _ in range(args.rounds):
                figures["bound"].append(_best_seconds(lambda: bound.run(a, out=out_array, workspace=workspace)))
                for group, kernel in kernels.items():
                    figures[f"group {group}"].append(_best_seconds(lambda: kernel.run(a, b, out_array, workspace=workspace)))
                figures["numpy copy"].append(_best_seconds(lambda: np.copyto(copy, b)))
            median = {name: statistics.median(values) for name, values in figures.items()}
            packs = {group: median[f"group {group}"] - median["bound"] for group in kernels}
            print(f"{text} (B {b.nbytes / 2**20:.0f} MiB): call with B packed once {median['bound'] * 1e3:.2f} ms; "
                  + "; ".join(f"pack {'rows together' if group > 1 else 'row by row'} (group {group}) {packs[group] * 1e3:.2f} ms "
                              f"({b.nbytes / packs[group] / 1e9:.1f} GB/s of B)" for group in kernels)
                  + f"; numpy's copy of B {median['numpy copy'] * 1e3:.2f} ms", file=out)
    return 0


def _team_pack(args) -> int:
    """``--threads 2``: the team's pack against the calling thread's, in one kernel schedule."""
    import numpy as np

    import looprl
    from looprl.backend import codegen
    from looprl.backend.buffers import aligned_empty
    from looprl.backend.host import host_cpu
    from looprl.ir.register_tiles import packed_right, tile_steps
    from looprl.target import host_target

    target = host_target()
    columns = _six_row_columns(target)
    path = args.out / f"pack_speed_{host_cpu()[0]}_t2.txt"
    reach = codegen.TEAM_PACK_ELEMENTS
    with open(path, "w") as file:
        out = Tee(sys.stdout, file)
        print(f"{host_cpu()[0]} ({target.isa}), two threads; each problem's flat packed 6 x {columns} tile, its column loop "
              f"parallel, B an input packed on every call by the team or by the calling thread; GFLOPS, median and best "
              f"of {args.rounds} interleaved rounds of each one's best of 3", file=out)
        for text in args.problems.split(","):
            m, n, k = (int(part) for part in text.split("x"))
            problem = looprl.matmul(m, n, k)
            nest = packed_right(looprl.initial_nest(problem).apply(tuple(tile_steps(problem, 6, columns))))
            nest = nest.parallel([loop.var for loop in nest.compute].index("n"))
            team = looprl.compile(nest, target=target, threads=2)
            codegen.TEAM_PACK_ELEMENTS = 1 << 62  # out of reach: the calling thread packs
            try:
                caller = looprl.compile(nest, target=target, threads=2)
            finally:
                codegen.TEAM_PACK_ELEMENTS = reach
            a, b, out_array = _operands(m, n, k)
            workspace = aligned_empty(max(team.workspace_elements, caller.workspace_elements))
            workspace[:] = 0
            figures = {"team": [], "caller": []}
            for _ in range(args.rounds):
                for name, kernel in (("team", team), ("caller", caller)):
                    seconds = _best_seconds(lambda: kernel.run(a, b, out_array, workspace=workspace, threads=2))
                    figures[name].append(problem.flops / seconds / 1e9)
            for kernel in (team, caller):
                np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-2)
            ratio = statistics.median(t / c for t, c in zip(figures["team"], figures["caller"]))
            print(f"{text}: team packs {statistics.median(figures['team']):.1f} (best {max(figures['team']):.1f}), "
                  f"caller packs {statistics.median(figures['caller']):.1f} (best {max(figures['caller']):.1f}); "
                  f"median ratio of the rounds {ratio:.3f}", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
