"""The learning curve of a training run: greedy validation over iterations, with the level of
the policy the run started from drawn across.

    python experiments/learning_curve.py checkpoints/apex-dqn-dqfd

Reads ``<run>/metrics.csv`` (the validation column, and the DQfD learner's agreement with the
demonstrations when it has one) and the starting policy's validation score
(``start_validation`` in ``run.json``, or ``--start``); writes ``<run>/learning_curve.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--start", type=float, default=None,
                        help="the starting policy's validation score (default: run.json's start_validation)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    rows = list(csv.DictReader((args.run / "metrics.csv").open(encoding="utf-8")))
    points = [(int(r["iteration"]), float(r["validation_speedup"])) for r in rows if r.get("validation_speedup") not in ("", "nan", None)
              and not math.isnan(float(r["validation_speedup"]))]
    agreement = [(int(r["iteration"]), float(r["demonstration_agreement"])) for r in rows
                 if r.get("demonstration_agreement") not in ("", "nan", None)]
    start = args.start
    if start is None:
        record = json.loads((args.run / "run.json").read_text(encoding="utf-8"))
        start = record.get("arguments", {}).get("start_validation")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    if start is not None:
        points = [(0, float(start)), *points]
    axis.plot([i for i, _ in points], [v for _, v in points], marker="o", label="greedy validation (geomean speed-up)")
    if start is not None:
        axis.axhline(start, color="grey", linestyle="--", label=f"starting clone {start:.2f}x")
    axis.set_xlabel("iteration")
    axis.set_ylabel("speed-up over untuned (geomean)")
    if agreement:
        twin = axis.twinx()
        twin.plot([i for i, _ in agreement], [v for _, v in agreement], color="C2", alpha=0.5, label="agreement with demonstrations")
        twin.set_ylabel("greedy action = demonstrated (share)")
        twin.set_ylim(0, 1)
        twin.legend(loc="lower center", fontsize=8)
    axis.legend(loc="center right", fontsize=8)
    axis.set_title(args.title or str(args.run), fontsize=9)
    figure.tight_layout()
    out = args.run / "learning_curve.png"
    figure.savefig(out, dpi=120)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
