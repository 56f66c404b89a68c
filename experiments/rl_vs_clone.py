"""A fine-tuned policy against the clone it started from, the policy alone (issue 28's target).

    python experiments/rl_vs_clone.py --run checkpoints/apex-dqn-dqfd [--target avx2]

For each test problem, one greedy episode of each policy in the run folder (the paper's
protocol: the state the episode ends in, invalid actions are no-ops): ``pretrained/`` (the
clone the run started from), ``demonstrations-clone/`` (a clone of the run's demonstrations
alone, no RL; a run whose pretraining cloned tune's answers has none: its ``pretrained/`` is
that clone) and ``policy-best/`` (the RL policy, the one shipped), and any ``--also`` policy
(e.g. the default it would replace). The untuned nest and the
final nests are then re-timed together, ``--rounds`` interleaved rounds, best kept, so a slow
phase of the machine hits every policy alike. Prints, per split, each policy's geometric-mean
speed-up over the untuned nest and its ratio to the starting clone; writes one CSV row per
problem and policy (``<out>.csv``) and a bar chart (``<out>.png``).

Choosing between policies (the clone or an RL snapshot to ship) uses the ``validation`` split,
never ``test``: ``dataset:validation:count`` spreads ``count`` problems over the dataset's
training problems that the run's pretraining did not demonstrate (its agent's
``pretrain.problems_per_dataset`` spread over each dataset, the same rule that chose them), so
no policy compared was trained on their labels. A dataset whose training problems were all
demonstrated (``models``: 150 of 150 at 200 per dataset) has no validation problems.
``--unseen-by RUN`` leaves out the problems another run demonstrated too (the run of a policy
compared with ``--also``), so that no policy compared saw the validation problems' labels.

    python experiments/rl_vs_clone.py --run checkpoints/apex-dqn-plans-avx2 --target avx2 \
        --splits gemm-shapes:validation:40,mm64-256:validation:40 \
        --also "RL snapshot=checkpoints/apex-dqn-plans-avx2/policy" --out experiments/results/select_default_avx2
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from looprl.backend.host import cpu_model_name
from looprl.backend.kernel import compile
from looprl.ir.nest import initial_nest
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.timing import time_kernel
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import greedy_rollout
from looprl.target import TARGET_CHOICES, Target
from looprl.train.config import read_agent
from looprl.train.validation import spread, spread_over_datasets
from looprl.workloads.datasets import dataset_problems

RESULTS = Path(__file__).resolve().parent / "results"
POLICIES = {"clone (start)": "pretrained", "demonstrations clone": "demonstrations-clone", "RL (shipped)": "policy-best"}
SPLITS = "models:test:57,mm64-256:test:110,gemm-shapes:test:120"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True, help="run folder with pretrained/, demonstrations-clone/ and policy-best/")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES)
    parser.add_argument("--splits", default=SPLITS, help="dataset:split:count, comma-separated (count: problems spread over the split)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--unseen-by", action="append", default=[], type=Path, metavar="RUN",
                        help="validation: also leave out the problems this other run's pretraining demonstrated "
                             "(e.g. the shipped default's run, when it is among the policies compared)")
    parser.add_argument("--out", default=None, help="path prefix of the CSV and plot (default experiments/results/rl_vs_clone_<isa>)")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=POLICY",
                        help="another policy folder to compare in the same runs (e.g. 'previous default=checkpoints/apex-dqn-dqfd/policy')")
    args = parser.parse_args(argv)
    target = Target.resolve(args.target)
    policies = {label: Policy.load(args.run / folder) for label, folder in POLICIES.items() if (args.run / folder).exists()}
    if "clone (start)" not in policies:
        parser.error(f"{args.run} has no pretrained/ policy to compare with")
    for item in args.also:
        label, _, folder = item.partition("=")
        if not label or not folder:
            parser.error(f"--also wants LABEL=POLICY, got {item!r}")
        policies[label] = Policy.load(folder)
    out = Path(args.out) if args.out else RESULTS / f"rl_vs_clone_{target.isa}"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"target {target.isa} ({target.cpu}); CPU {cpu_model_name()}; run {args.run}", flush=True)
    for item in args.splits.split(","):
        dataset, split, count = item.split(":")
        held_out = split_problems(args.run, dataset, split)
        if split == "validation":
            for other in args.unseen_by:
                seen = demonstrated(other)
                held_out = [p for p in held_out if p.name not in seen]
            if not held_out:
                raise SystemExit(f"{dataset}: no training problem is left undemonstrated by {args.run} and {args.unseen_by}")
        problems = spread(held_out, int(count))
        for problem in problems:
            evaluator = Evaluator(":memory:", target=target, samples=1)
            finals = {label: greedy_rollout(policy, problem, evaluator).final_nest for label, policy in policies.items()}
            untuned = initial_nest(problem)
            kernels = {nest.key: compile(nest, target=target) for nest in [untuned, *finals.values()]}
            best = dict.fromkeys(kernels, 0.0)
            for _ in range(args.rounds):
                for key, kernel in kernels.items():
                    best[key] = max(best[key], time_kernel(kernel, 0.02).gflops)
            for label, nest in finals.items():
                rows.append({"dataset": dataset, "split": split, "problem": problem.name, "policy": label,
                             "untuned_gflops": round(best[untuned.key], 2), "gflops": round(best[nest.key], 2),
                             "speedup": round(best[nest.key] / best[untuned.key], 4)})
        summarise(rows, dataset, split)
    with out.with_suffix(".csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out.with_suffix(".png"), f"{target.isa} code on {cpu_model_name()}")
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")
    return 0


def demonstrated(run: Path) -> set[str]:
    """The names of the problems ``run``'s pretraining demonstrated (the rule that chose them)."""
    agent = read_agent(run / "agent.yaml")
    return {p.name for p in spread_over_datasets(agent, agent["pretrain"]["problems_per_dataset"])}


def split_problems(run: Path, dataset: str, split: str) -> list:
    """The problems of ``split`` of ``dataset``; ``validation``: its training problems that the
    run's pretraining did not demonstrate (see the module docstring)."""
    if split != "validation":
        return list(dataset_problems(dataset, split))
    seen = demonstrated(run)
    held_out = [p for p in dataset_problems(dataset, "train") if p.name not in seen]
    if not held_out:
        raise SystemExit(f"{dataset}: every training problem was demonstrated to {run}: no validation problems")
    return held_out


def geomeans(rows, dataset, split) -> dict[str, float]:
    labels = dict.fromkeys(r["policy"] for r in rows)
    return {label: statistics.geometric_mean([r["speedup"] for r in rows if r["policy"] == label and r["dataset"] == dataset
                                              and r["split"] == split]) for label in labels}


def summarise(rows, dataset, split) -> None:
    means = geomeans(rows, dataset, split)
    start = means["clone (start)"]
    count = sum(1 for r in rows if r["dataset"] == dataset and r["split"] == split and r["policy"] == "clone (start)")
    text = "  ".join(f"{label} {value:.2f}x ({value / start:.2f} of start)" for label, value in means.items())
    print(f"{dataset}/{split} ({count} problems), speed-up over untuned, geomean: {text}", flush=True)


def plot(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["dataset"], r["split"]) for r in rows))
    labels = list(dict.fromkeys(r["policy"] for r in rows))
    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(labels)
    for position, label in enumerate(labels):
        values = [geomeans(rows, d, s)[label] / geomeans(rows, d, s)["clone (start)"] for d, s in groups]
        axis.bar([g + position * width for g in range(len(groups))], values, width, label=label)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.axhline(1.1, color="grey", linestyle="--", linewidth=0.8, label="target 1.1x")
    axis.set_xticks([g + width * (len(labels) - 1) / 2 for g in range(len(groups))], [f"{d} {s}" for d, s in groups])
    axis.set_ylabel("greedy rollout / starting clone (geomean)")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
