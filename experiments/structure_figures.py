"""Measured tune's figures on a committed set of problems, to compare two trees (issue 59's "figures
stay within the run-to-run spread measured at a56e7ac").

    python experiments/structure_figures.py --label LABEL [--repeats N] [--problems NAME,...] [--out-dir DIR]
    python experiments/structure_figures.py --compare A.json B.json

Runs against whichever looprl it imports (it prints which; run by its path, the script's own
folder comes first on the path, not the current one, so name the tree): from the tree before
the restructuring, ``cd <checkout of a56e7ac> && PYTHONPATH=. python <this script> --label
a56e7ac``; from main, ``cd <checkout of main> && PYTHONPATH=. python <this script> --label main``. For each of :data:`PROBLEMS` (eight: compute-bound matmuls, one
off-grid, few-row linear layers read in place, a 64-row linear layer, attention-like
``bmk,bnk->bmn``, bfloat16 linear layers), ``--repeats`` times (the repeats outermost, so a
noisy moment of the machine touches every problem once rather than one problem N times), one
measured tune, nothing shared between calls::

    looprl.tune(problem, cache=":memory:", remember=False, threads=1)

and its answer's GFLOPS (tune's own timing of the kernel it returns). Prints each problem's
median and spread (min-max) and writes ``experiments/results/structure_figures_<label>.json``
(the CPU, the looprl folder and commit, each problem's figures). Timing on a shared machine
says little: run it on a quiet one, both trees on the same host, one after the other.

``--compare A.json B.json`` reads two such files and says, per problem in both, whether B's
median lies within A's spread (A: the reference, e.g. a56e7ac's); its exit status is 1 when one
does not.

``--problems`` picks problems of the set by name, or takes matmuls as ``MxNxK`` (``16x16x16``),
comma-separated.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT = "structure_figures"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# name -> how to build it with looprl's public API (the same names on both trees)
PROBLEMS = {
    "mm64": ("matmul", {"m": 64, "n": 64, "k": 64}),
    "mm96x80x112": ("matmul", {"m": 96, "n": 80, "k": 112}),
    "mm256": ("matmul", {"m": 256, "n": 256, "k": 256}),
    "linear4-1024-1024": ("linear", {"batch": 4, "in_features": 1024, "out_features": 1024}),
    "linear1-2048-2048": ("linear", {"batch": 1, "in_features": 2048, "out_features": 2048}),
    "linear64-768-768": ("linear", {"batch": 64, "in_features": 768, "out_features": 768}),
    "attention-8x64x64x64": ("contraction", {"spec": "bmk,bnk->bmn", "b": 8, "m": 64, "n": 64, "k": 64}),
    "linear16-1024-1024-bf16": ("linear", {"batch": 16, "in_features": 1024, "out_features": 1024, "dtype": "bfloat16"}),
}


def build(name: str):
    """The problem ``name`` of :data:`PROBLEMS`, or a matmul ``MxNxK`` (``looprl.parse_problem``)."""
    import looprl

    if name not in PROBLEMS:
        return looprl.parse_problem(name)
    function, arguments = PROBLEMS[name]
    arguments = dict(arguments)
    if function == "contraction":
        return looprl.contraction(arguments.pop("spec"), **arguments)
    return getattr(looprl, function)(**arguments)


def summary(figures: list[float]) -> dict:
    return {"median": statistics.median(figures), "min": min(figures), "max": max(figures)}


def measure(names: list[str], repeats: int) -> list[dict]:
    """``repeats`` measured tunes of each problem, interleaved: one row per problem."""
    import looprl

    problems = {name: build(name) for name in names}
    rows = {name: {"name": name, "problem": problem.name, "gflops": [], "seconds": []} for name, problem in problems.items()}
    for repeat in range(repeats):
        for name, problem in problems.items():
            started = time.perf_counter()
            result = looprl.tune(problem, cache=":memory:", remember=False, threads=1)
            rows[name]["gflops"].append(float(result.gflops))
            rows[name]["seconds"].append(time.perf_counter() - started)
            print(f"  repeat {repeat + 1}/{repeats} {name:26} {result.gflops:8.2f} GFLOPS ({rows[name]['seconds'][-1]:.2f} s)", flush=True)
    return [{**row, **summary(row["gflops"])} for row in rows.values()]


def looprl_source() -> dict:
    """Where the looprl measured comes from: its folder and that checkout's commit ('+' when
    its looprl folder has changes; 'unknown' outside git)."""
    import looprl

    folder = Path(looprl.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True).stdout
        commit = head + ("+" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"folder": str(folder), "commit": commit}


def run(label: str, repeats: int, names: list[str], out_dir: Path) -> Path:
    from looprl.backend.host import cpu_model_name
    from looprl.target import host_cpu

    source = looprl_source()
    print(f"looprl from {source['folder']} ({source['commit']}); {cpu_model_name()} ({host_cpu()[0]}); {repeats} repeats", flush=True)
    rows = measure(names, repeats)
    document = {"script": SCRIPT, "label": label, "looprl": source, "cpu": cpu_model_name(), "llvm_cpu": host_cpu()[0],
                "repeats": repeats, "call": 'looprl.tune(problem, cache=":memory:", remember=False, threads=1)', "problems": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{SCRIPT}_{label}.json"
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"\n{'problem':26} {'median':>9} {'min':>9} {'max':>9}  GFLOPS")
    for row in rows:
        print(f"{row['name']:26} {row['median']:9.2f} {row['min']:9.2f} {row['max']:9.2f}")
    print(f"wrote {path}")
    return path


def read_figures(path: Path) -> dict:
    """A file :func:`run` wrote; a ValueError naming it when it is not one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot be read as JSON ({error})") from None
    if not isinstance(document, dict) or document.get("script") != SCRIPT or not isinstance(document.get("problems"), list):
        raise ValueError(f"{path}: not a {SCRIPT} results file")
    for row in document["problems"]:
        if not isinstance(row, dict) or not all(isinstance(row.get(key), (int, float)) for key in ("median", "min", "max")):
            raise ValueError(f"{path}: a problem without median, min and max: {row!r:.200}")
    return document


def compare(reference_path: Path, other_path: Path) -> int:
    """Print, per problem in both files, whether the other's median lies within the
    reference's spread; 1 when one does not, else 0."""
    reference, other = read_figures(reference_path), read_figures(other_path)
    if reference.get("cpu") != other.get("cpu") or reference.get("llvm_cpu") != other.get("llvm_cpu"):
        print(f"warning: measured on different CPUs ({reference.get('cpu')} {reference.get('llvm_cpu')} against "
              f"{other.get('cpu')} {other.get('llvm_cpu')}): the comparison says little")
    theirs = {row["name"]: row for row in other["problems"]}
    a, b = reference.get("label", "A"), other.get("label", "B")
    print(f"{'problem':26} {a + ' spread':>21} {b + ' median':>13}  within")
    outside = []
    for row in reference["problems"]:
        found = theirs.get(row["name"])
        if found is None:
            print(f"{row['name']:26} {row['min']:9.2f}-{row['max']:<9.2f}  {'-':>13}  not measured in {other_path}")
            continue
        within = row["min"] <= found["median"] <= row["max"]
        ratio = found["median"] / row["median"] if row["median"] > 0 else float("nan")
        print(f"{row['name']:26} {row['min']:9.2f}-{row['max']:<9.2f}  {found['median']:13.2f}  "
              f"{'yes' if within else 'NO'} ({ratio:.3f}x the median)")
        if not within:
            outside.append(row["name"])
    print(f"{len(outside)} outside the spread" + (f": {', '.join(outside)}" if outside else ""))
    return 1 if outside else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", help="names the results file: experiments/results/structure_figures_<label>.json (e.g. a56e7ac, main)")
    parser.add_argument("--repeats", type=int, default=5, help="measured tunes of each problem (default 5)")
    parser.add_argument("--problems", default=",".join(PROBLEMS),
                        help="comma-separated names of the set, or matmuls as MxNxK (default: the whole set)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help=f"where the results file goes (default {RESULTS})")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                        help="say per problem whether B's median lies within A's spread (exit status 1 if one does not)")
    args = parser.parse_args(argv)
    if args.compare:
        try:
            return compare(*args.compare)
        except ValueError as error:
            parser.error(str(error))
    if args.label is None or not _LABEL.fullmatch(args.label):
        parser.error(f"--label must be given, letters, digits, '.', '_' or '-' (it names the file), got {args.label!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    names = [name for name in (item.strip() for item in args.problems.split(",")) if name]
    if not names:
        parser.error("--problems names no problem")
    try:
        for name in names:
            build(name)
    except ValueError as error:
        parser.error(f"--problems: {error}")
    run(args.label, args.repeats, names, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
