"""Decode GEMMs against every library on the host: the few-row linear layers of generating one
token at a time, as ``nn.Linear`` holds them (``mk,nk->mn``, the weight ``[out, in]`` constant).

    python experiments/decode_gemms.py [--threads 1,2] [--rows 1,2,4,16] [--budget 0.05] [--quick]
        [--dtype float32|bfloat16] [--cold] [--wide-only] [--target avx2] [--out experiments/results]

The problems: every GEMM of the models dataset's test split with at most 16 rows
(``envs/models.json``, written there as ``mk,kn->mn``; here as the linear layer they come from),
and the wide LLM layers 4096->4096, 4096->11008, 11008->4096 and 2560->10240 at each of
``--rows``. Each is tuned by ``looprl.tune`` (measured, the shipped policy, its budget scaled to
the problem) on each thread count, then timed in turn with numpy, ``torch.matmul``,
``F.linear`` and oneDNN's linear on a weight packed once (``looprl-bench tune``: its table,
the roofline's bound of each problem and the GB/s the kernel reads at). Writes
``<out>/decode_gemms_<cpu>.txt`` (the table) and ``.json`` (every figure). ``--quick``: two
small problems, short budgets: checks that the script runs, measures nothing worth keeping.
``--dtype bfloat16``: every layer in bfloat16 (torch's calls too; numpy has no bfloat16), the
files named ``..._bfloat16``. ``--cold``: every layer read cold (``;cold``: its weight from
memory on every call, as a decode step's other layers leave it; looprl, numpy and torch all
timed on rotating copies of it, as many as put twice the last-level cache per thread between
two uses of one: two threads may read their halves through two caches, and copies sized for
one cache let the two-thread run of 2026-11-29 read 1x4096x4096 bfloat16 at 2.9x the DRAM
bound), the files named ``..._cold``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from _tee import Tee

RESULTS = Path(__file__).resolve().parent / "results"
DATASET = Path(__file__).resolve().parent.parent / "envs" / "models.json"
WIDE_LAYERS = ((4096, 4096), (4096, 11008), (11008, 4096), (2560, 10240))  # (in_features, out_features)
DECODE_ROWS = 16


def decode_problems(rows: list[int], wide_only: bool = False) -> list[str]:
    """The problem names: the test split's few-row GEMMs as linear layers (unless
    ``wide_only``), then the wide layers."""
    from looprl.ir.layers import linear

    names = []
    for entry in ([] if wide_only else json.loads(DATASET.read_text())["test"]):
        sizes = entry["sizes"]
        if entry["spec"] == "mk,kn->mn" and sizes["m"] <= DECODE_ROWS:
            names.append(linear(sizes["m"], sizes["k"], sizes["n"], bias=False).name)
    for in_features, out_features in WIDE_LAYERS:
        names += [linear(count, in_features, out_features, bias=False).name for count in rows]
    return list(dict.fromkeys(names))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--rows", default="1,2,4,16", help="row counts of the wide layers (default 1,2,4,16)")
    parser.add_argument("--budget", type=float, default=0.05, help="seconds to time each kernel and peer in a round (default 0.05)")
    parser.add_argument("--quick", action="store_true", help="two small problems, short budgets: checks the script runs")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the layers' dtype (default float32)")
    parser.add_argument("--cold", action="store_true", help="every layer's weight read from memory on every call (;cold)")
    parser.add_argument("--wide-only", action="store_true", help="the wide layers alone, the untuned nests not timed (files named ..._wide)")
    parser.add_argument("--target", default=None, help="looprl's target (e.g. avx2: peers held to AVX2 too; files named ..._avx2code)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from looprl.backend.host import cpu_model_name
    from looprl.cli.bench import main as bench

    rows = [int(r) for r in args.rows.split(",")]
    problems = decode_problems(rows, args.wide_only)
    if args.quick:
        problems = ["mk,nk->mn:m=1,k=256,n=128;const=in1", "mk,nk->mn:m=4,k=128,n=96;const=in1"]
    if args.cold:
        problems = [name + ";cold" for name in problems]
    from looprl.target import host_cpu

    stem = (f"decode_gemms_{host_cpu()[0]}" + ("_bfloat16" if args.dtype == "bfloat16" else "") + ("_cold" if args.cold else "")
            + ("_wide" if args.wide_only else "") + (f"_{args.target}code" if args.target else "") + ("_quick" if args.quick else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    command = ["tune", "--problems", " ".join(problems), "--threads", args.threads, "--budget", str(0.002 if args.quick else args.budget),
               "--json", str(args.out / f"{stem}.json"), "--dtype", args.dtype] + (["--tune-budget", "0.05"] if args.quick else [])
    command += ["--target", args.target] if args.target else []
    command += ["--no-untuned"] if args.wide_only else []  # one untuned call of 512 rows of 4096->11008 takes minutes
    with open(args.out / f"{stem}.txt", "w") as table:
        table.write("$ python experiments/decode_gemms.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "\n")
        with contextlib.redirect_stdout(Tee(sys.stdout, table)):
            status = bench(command)
    print(f"wrote {args.out / f'{stem}.txt'} and .json")
    return status


if __name__ == "__main__":
    sys.exit(main())
