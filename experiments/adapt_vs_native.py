"""A policy adapted to a target (``looprl-train --adapt``) against the target's own shipped
default: one greedy episode each on the held-out problems, the final schedules re-timed
together.

    python experiments/adapt_vs_native.py ADAPTED --target avx2 [--starting POLICY] [--native default]
        [--held-out 57] [--rounds 5] [--quick] [--out experiments/results]

ADAPTED is the ``policy`` folder an adaptation wrote (``runs/<name>/policy``); ``--native`` the
policy made for ``--target`` (``default``: the shipped one); ``--starting``, where given, the
policy the adaptation started from, whose plans are mapped to the target's
(``looprl.policy.retarget``) as ``--adapt`` maps them: its episodes are the ``mapped`` column.
The held-out problems are ``--adapt``'s (``looprl.train.adapt.HELD_OUT``, spread over
``--held-out`` of them); every policy's greedy episode runs without measurements, and the
distinct final schedules are timed in ``--rounds`` interleaved rounds
(``looprl.train.adapt.retimed``, best kept), so a problem two policies schedule alike gets
one figure. Prints each problem's GFLOPS and the geometric means adapted / native (and mapped /
native), and writes ``<out>/adapt_vs_native_<target>_<cpu>.json`` (the CPU as
``looprl.backend.host.cpu_model_name()`` reports it, in lower case, runs of other characters
as ``_``). ``--quick``: 3 problems, one round: checks that the script runs, measures nothing
worth keeping.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    from looprl.target import TARGET_CHOICES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapted", help="the adapted policy (folder or file)")
    parser.add_argument("--target", required=True, choices=TARGET_CHOICES, help="the target the policy was adapted to")
    parser.add_argument("--native", default="default", help="the target's own policy (default: the shipped one)")
    parser.add_argument("--starting", default=None, help="the policy the adaptation started from (adds the mapped column)")
    parser.add_argument("--held-out", type=int, default=57, help="held-out problems, spread over the split")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds, best kept")
    parser.add_argument("--quick", action="store_true", help="3 problems, one round: the script runs, nothing worth keeping")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.held_out, args.rounds = 3, 1

    from looprl.backend.host import cpu_model_name
    from looprl.policy.loading import load_policy
    from looprl.policy.retarget import retargeted
    from looprl.policy.rollout import greedy_rollout
    from looprl.target import Target
    from looprl.train.adapt import HELD_OUT, geomean_ratio, retimed
    from looprl.train.validation import spread
    from looprl.workloads.datasets import dataset_problems

    target = Target.resolve(args.target)
    target.check_runs_on_host()
    problems = spread(dataset_problems(*HELD_OUT), args.held_out)
    policies = {"adapted": load_policy(args.adapted, target), "native": load_policy(args.native, target)}
    if args.starting is not None:
        policies["mapped"] = retargeted(load_policy(args.starting, target), target)
    nests = {name: [greedy_rollout(policy, problem, None).final_nest for problem in problems] for name, policy in policies.items()}
    gflops = retimed(nests, target, rounds=args.rounds)
    ratios = {f"{name}_over_native_geomean": round(geomean_ratio(gflops[name], gflops["native"]), 4)
              for name in gflops if name != "native"}

    names = list(gflops)
    print(f"{'held-out problem':<46}" + "".join(f"{name:>10}" for name in names))
    for index, problem in enumerate(problems):
        print(f"{problem.name:<46}" + "".join(f"{gflops[name][index]:>10.1f}" for name in names))
    for key, value in ratios.items():
        print(f"{key.replace('_over_native_geomean', '')} / native, geomean over {len(problems)} problems: {value:.3f}")
    cpu = cpu_model_name()
    args.out.mkdir(parents=True, exist_ok=True)
    from _names import cpu_slug  # the experiments' folder
    path = args.out / f"adapt_vs_native_{target.isa}_{cpu_slug(cpu)}.json"
    path.write_text(json.dumps({
        "command": " ".join(["python", "experiments/adapt_vs_native.py", *(sys.argv[1:] if argv is None else argv)]),
        "cpu": cpu, "target": target.isa, "quick": args.quick, "rounds": args.rounds,
        "policies": {"adapted": args.adapted, "native": args.native, "starting": args.starting},
        "held_out": [problem.name for problem in problems],
        **{f"{name}_gflops": [round(value, 2) for value in values] for name, values in gflops.items()},
        **ratios,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
