"""``looprl-tune`` (or ``python -m looprl tune``): tune one contraction with the shipped policy and report it.

(The library function is :func:`looprl.tune`, defined in :mod:`looprl.tune.api`; this
module is its command line.)

    looprl-tune 256 256 256                    # a matmul, m n k
    looprl-tune --spec "bmk,bkn->bmn" --sizes b=4,m=128,k=64,n=96
    looprl-tune --linear 197,384,1536 --activation gelu   # torch.nn.Linear + GELU, fused
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from looprl.cli.common import cache_path, run_command
from looprl.ir.epilogue import ACTIVATIONS
from looprl.ir.layers import linear
from looprl.ir.dtypes import DTYPES
from looprl.ir.problem import matmul, parse_problem
from looprl.tune.api import TUNE_BUDGET_S, tune
from looprl.target import TARGET_CHOICES

# Past this much work one run of an untuned kernel (a few GFLOPS) takes about a second or more:
# tuning then takes far longer than a small --budget, and the command says why before it starts.
LONG_KERNEL_FLOPS = 2e9
# Rounds of the tuned kernel and numpy timed in turn for the printed ratio: one figure each, taken
# at another moment than the other, swung the ratio of `looprl-tune 256 256 256` on two threads of
# a shared 2-vCPU Zen 3 (numpy's child timed after tune, against tune's own best sample).
BASELINE_ROUNDS = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="looprl-tune", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mnk", nargs="*", type=int, help="matmul sizes: m n k")
    parser.add_argument("--spec", default=None, help="einsum-style contraction, e.g. bmk,bkn->bmn")
    parser.add_argument("--sizes", default=None, help="dimension sizes for --spec, e.g. b=4,m=128,k=64,n=96")
    parser.add_argument("--linear", default=None, metavar="BATCH,IN,OUT",
                        help="a linear layer y = act(x @ W.T + b) (+ r), W stored [out, in] as torch.nn.Linear has it")
    parser.add_argument("--activation", default=None, choices=ACTIVATIONS, help="activation fused after the contraction")
    parser.add_argument("--no-bias", action="store_true", help="--linear without a bias")
    parser.add_argument("--residual", action="store_true", help="add a residual input of the output's shape at the end")
    parser.add_argument("--epilogue", default=None, help="epilogue of a matmul or --spec problem, e.g. bias+relu or scale0.125")
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="the tensors' dtype (bfloat16: inputs and output in bfloat16, float32 sums; default float32)")
    parser.add_argument("--policy", default="default", help="policy folder (default: the shipped policy for the target)")
    parser.add_argument("--target", default=None, choices=TARGET_CHOICES, help="generate code for this target (default: this machine)")
    parser.add_argument("--episode-length", "--steps", dest="episode_length", type=int, default=None,
                        help="actions of the policy's greedy rollout (default: its training episode length; --steps is its former name)")
    parser.add_argument("--budget", type=float, default=TUNE_BUDGET_S,
                        help=f"seconds of measured search guided by the policy (default {TUNE_BUDGET_S}; 0: the rollout only)")
    parser.add_argument("--max-evaluations", "--max-measurements", dest="max_evaluations", type=int, default=None,
                        help="at most this many schedules in the serial search, the untuned nest and the rollout's included "
                             "(default: no cap, only --budget); a capped answer is not remembered")
    parser.add_argument("--fresh", action="store_true", help="tune again even if this problem was tuned before (no lookup)")
    parser.add_argument("--no-measure", action="store_true", help="follow the policy without measuring (pure policy mode)")
    parser.add_argument("--no-numpy", action="store_true", help="skip timing numpy")
    parser.add_argument("--cache", default=None, help="measurement cache path (default: the per-user cache)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads the kernel may use (default: the cores this process may use; 1: serial); "
                             "numpy is timed with as many BLAS threads")
    return parser


def _problem(args):
    if args.linear is not None:
        if args.mnk or args.spec is not None or args.epilogue is not None:
            raise ValueError("--linear takes neither m n k, --spec nor --epilogue (use --activation, --no-bias, --residual)")
        parts = [part.strip() for part in args.linear.split(",")]
        if len(parts) != 3 or not all(part.isdigit() for part in parts):
            raise ValueError(f"--linear wants BATCH,IN,OUT (three positive integers), got {args.linear!r}")
        batch, inputs, outputs = (int(part) for part in parts)
        return linear(batch, inputs, outputs, bias=not args.no_bias, activation=args.activation, residual=args.residual)
    if args.activation is not None or args.no_bias or args.residual:
        raise ValueError("--activation, --no-bias and --residual go with --linear; give other problems --epilogue")
    return _contraction(args).with_epilogue(args.epilogue)


def _contraction(args):
    if args.spec is not None:
        if args.mnk:
            raise ValueError("give either m n k or --spec/--sizes, not both")
        if not args.sizes:
            raise ValueError("--spec needs --sizes, e.g. --sizes b=4,m=128,k=64,n=96")
        if any(mark in args.spec for mark in ":;"):
            raise ValueError(f"bad --spec {args.spec!r}; expected an einsum-style contraction such as bmk,bkn->bmn")
        return parse_problem(f"{args.spec}:{args.sizes}")  # its rule for sizes: letter=integer, each once
    if len(args.mnk) != 3:
        raise ValueError("give the matmul sizes m n k (three integers) or --spec with --sizes")
    m, n, k = args.mnk
    return matmul(m=m, n=n, k=k)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command("looprl-tune", lambda: _main(args))


def _main(args) -> int:
    problem = _problem(args)
    if args.dtype is not None:
        problem = problem.with_dtype(args.dtype)
    cache = cache_path(args.cache)
    policy = args.policy if args.policy == "default" else Path(args.policy)
    if not args.no_measure and problem.flops >= LONG_KERNEL_FLOPS:
        print(f"looprl-tune: {problem.name} is {problem.flops / 1e9:.0f} GFLOP of work: timing it runs the whole kernel, "
              f"so measuring the untuned nest and each state of the policy's rollout (measured whole, whatever --budget says) "
              f"takes seconds each, then the best schedule is compiled", file=sys.stderr, flush=True)
    result = tune(problem, policy, episode_length=args.episode_length, measure=not args.no_measure, cache=cache, budget_s=args.budget,
                  target=args.target, remember=not args.fresh, threads=args.threads, max_evaluations=args.max_evaluations)
    print(result.nest.to_text())
    if result.mode == "remembered":
        print("actions: (the schedule tuned before for this problem and target; --fresh tunes again)")
    else:
        print("actions:", " ".join(result.actions) or "(none)")
    untuned = (f"{result.speedup:.2f}x over the untuned nest ({result.initial_gflops:.1f} GFLOPS)" if result.initial_gflops > 0
               else "the untuned nest not timed (policy mode)")
    print(f"{result.gflops:.1f} GFLOPS, {untuned}; tuned in {result.seconds * 1000:.0f} ms ({result.mode} mode, target {result.target.isa}, {result.measured} schedules timed)")
    if result.load is not None and result.load.busy:
        print(f"tuned while the machine was busy ({result.load.describe()}): this answer is kept as provisional, "
              f"and the next tune of this problem searches again")
    if result.waited_s > 0.05:
        print(f"(of which {result.waited_s * 1000:.0f} ms waiting for another looprl process's timing)")
    if result.threads > 1:
        runs = f"on {result.threads} threads" if result.nest.is_parallel else "serial: threads did not pay"
        serial = f" (best serial schedule {result.serial_gflops:.1f} GFLOPS)" if result.serial_gflops is not None else ""
        print(f"threads: {result.threads} offered, the kernel runs {runs}{serial}")
    if not args.no_numpy and not problem.dtype.numpy_computes:
        print(f"numpy: not compared (numpy has no {problem.dtype})")
    elif not args.no_numpy:
        _print_baseline(problem, result, cache)
    return 0


def _print_baseline(problem, result, cache) -> None:
    """numpy's GFLOPS on ``problem`` (the same ISA, as many threads as the kernel was offered)
    and the tuned kernel's, timed in turn round after round
    (:func:`~looprl.measurement.numpy_baseline.in_turn_with_numpy`), and looprl's over numpy's,
    between two readings of the machine's load (:func:`~looprl.measurement.load.check_load`,
    against the quiet figure in ``cache``, a path or None): when either says the machine was
    busy, a line after it says the figure is not a fair one."""
    from looprl.measurement.evaluator import open_cache
    from looprl.measurement.load import busiest, check_load
    from looprl.measurement.numpy_baseline import baseline_label, in_turn_with_numpy

    label = baseline_label(result.target.isa, threads=result.threads)
    store = open_cache(cache)
    try:
        before = check_load(result.target, store, threads=result.threads)
        try:
            mine, reference = in_turn_with_numpy(result.kernel, problem, 0.1, isa=result.target.isa, threads=result.threads,
                                                 rounds=BASELINE_ROUNDS)
        except RuntimeError as error:  # the baseline's child process failed: the tuned figures above stand
            print(f"{label}: not measured ({error})", file=sys.stderr)
            return
        load = busiest(before, check_load(result.target, store, threads=result.threads))
    finally:
        store.close()  # ``cache`` is a path (or None): this process's own connection
    print(f"{label}: {reference:.1f} GFLOPS, the tuned kernel {mine:.1f} GFLOPS, timed in turn (best of {BASELINE_ROUNDS} rounds each); "
          f"looprl / numpy = {mine / reference:.2f}")
    if load.busy:
        print(f"{label}: timed while the machine was busy ({load.describe()}): not a fair figure")


if __name__ == "__main__":
    sys.exit(main())
