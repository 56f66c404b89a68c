"""bfloat16 GEMMs of models against torch's bfloat16 calls: the models dataset's test split at
64 rows and more, each as a model holds it (its weight constant), in bfloat16.

    python experiments/bfloat16_gemms.py [--threads 1,2] [--min-rows 64] [--budget 0.05] [--dtype bfloat16]
        [--quick] [--out experiments/results]

Each problem (``envs/models.json``'s test split, ``m >= --min-rows``, declared ``const=in1``) is
tuned by ``looprl.tune`` (measured, the shipped policy, its budget scaled to the problem) on
each thread count and timed in turn with ``torch.matmul``, ``F.linear`` and oneDNN's linear on
a weight packed once, all on bfloat16 tensors (numpy has no bfloat16): ``looprl-bench tune
--dtype bfloat16``, its table with the bfloat16 peak (``vdpbf16ps`` chains where the host has
AVX512_BF16) and each problem's roofline bound. ``--dtype float32``: the same problems in
float32 (looprl's own float32 kernels, the reference for the bfloat16 speed-up). Writes
``<out>/bfloat16_gemms_<llvm cpu>[_float32].txt`` and ``.json``. ``--quick``: two small
problems, short budgets: checks that the script runs.
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


def model_problems(min_rows: int) -> list[str]:
    """The test split's GEMMs of at least ``min_rows`` rows, their weight constant."""
    names = []
    for entry in json.loads(DATASET.read_text())["test"]:
        sizes = entry["sizes"]
        if entry["spec"] == "mk,kn->mn" and sizes["m"] >= min_rows:
            names.append(f"mk,kn->mn:m={sizes['m']},k={sizes['k']},n={sizes['n']};const=in1")
    return list(dict.fromkeys(names))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--min-rows", type=int, default=64, help="the fewest rows a problem has (default 64)")
    parser.add_argument("--budget", type=float, default=0.05, help="seconds to time each kernel and peer in a round (default 0.05)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="two small problems, short budgets: checks the script runs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from looprl.cli.bench import main as bench
    from looprl.target import host_cpu

    problems = model_problems(args.min_rows)
    if args.quick:
        problems = ["mk,kn->mn:m=64,k=96,n=128;const=in1", "mk,kn->mn:m=80,k=64,n=48;const=in1"]
    stem = f"bfloat16_gemms_{host_cpu()[0]}" + ("_float32" if args.dtype == "float32" else "") + ("_quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    command = ["tune", "--problems", " ".join(problems), "--threads", args.threads, "--dtype", args.dtype,
               "--budget", str(0.002 if args.quick else args.budget), "--json", str(args.out / f"{stem}.json")]
    command += ["--tune-budget", "0.05"] if args.quick else []
    with open(args.out / f"{stem}.txt", "w") as table:
        table.write("$ python experiments/bfloat16_gemms.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "\n")
        with contextlib.redirect_stdout(Tee(sys.stdout, table)):
            status = bench(command)
    print(f"wrote {args.out / f'{stem}.txt'} and .json")
    return status


if __name__ == "__main__":
    sys.exit(main())
