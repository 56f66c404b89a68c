"""The committed schedule records the restructuring of issue 59 must replay bit-identically.

Writes ``tests/data/records_a56e7ac.json``: a tuned-records file (the form
:meth:`MeasurementCache.export_tuned <looprl.measurement.cache.MeasurementCache.export_tuned>`
and :func:`~looprl.measurement.tuned_records.write_tuned_records` give tune's answers: each
record the schedule's key, its action names and the rewrite they replay on) plus a ``replay``
section that ``tests/measurement/test_records_replay.py`` checks against:

* for each record, the target and threads its kernel is compiled for, what the kernel is (its
  loops and the layout of each tensor it stores re-laid, :func:`kernel_facts`) and the sha256
  of its output bytes on seeded inputs (and, where the problem has a constant input, of the
  output of the kernel bound to it);
* for each problem and named target, the default policy's greedy actions (nothing measured:
  :func:`~looprl.policy.rollout.greedy_rollout` without an evaluator, the policy tune loads and
  retargets) and the same facts of the kernel they end in.

Nothing is timed: every schedule is built by replaying a fixed action path (a plan, a cursor
path, a tile stage's path of IR steps) or the policy's greedy actions on the untuned nest, so
the file is the same on every run on the same looprl. The GFLOPS of the records are a
placeholder (:data:`PLACEHOLDER_GFLOPS`), not a measurement. Kernels are compiled for the named
targets ``avx2`` and ``avx512`` (generic: they run on any CPU with the ISA), except the
bfloat16 kernels that need ``vdpbf16ps``: those are compiled for this host's own target (its
LLVM CPU name and features are kept in the file; the test skips them on a CPU lacking one of
those features).

Inputs (the one recipe; the test implements the same and checks the inputs' own hash first):
``numpy.random.default_rng(seed)`` draws ``standard_normal`` float32 arrays for the problem's
inputs in call order (``in0``, ``in1``, then the epilogue's ``bias`` and ``residual``), each
stored in the problem's dtype (:func:`looprl.ir.dtypes.storage`: bfloat16 rounded to nearest
even); the digest of a list of arrays is the sha256 of their bytes, one after another.

Written against looprl at a56e7ac (the code before the restructuring), run there::

    cd <checkout of a56e7ac> && PYTHONPATH=. python <this script> --out records_a56e7ac.json

It imports whichever looprl comes first on the path (it prints which; run by its path, the
script's own folder comes first, not the current one, hence ``PYTHONPATH``); the names it uses
(action sets, plans, the twin rewrites) are those of a56e7ac. Run on main before the
restructuring it writes the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "records_a56e7ac.json"
PLACEHOLDER_GFLOPS = 1.0  # records need a positive figure; these are replayed, not timed
SEARCH_BUDGET_S = 0.4  # the search budget the records say they were found with (tune's smallest scaled budget)
SEED = 59


@dataclass(frozen=True)
class Case:
    """One record of the fixture: ``build(problem, target)`` gives ``(actions, nest, replays_on,
    found_by)`` for the problem ``problem()``, on ``target`` (a named target, or ``"host"``
    for the bfloat16 kernels that use this host's ``vdpbf16ps``) and ``threads``."""

    name: str
    covers: str
    problem: Callable
    target: str
    build: Callable
    threads: int = 1


def seeded_inputs(problem, seed: int = SEED) -> list[np.ndarray]:
    """The problem's inputs in call order, drawn as the module docstring says."""
    from looprl.ir.dtypes import storage

    rng = np.random.default_rng(seed)
    shapes = [*problem.input_shapes, *(shape for _, shape in problem.epilogue_shapes)]
    return [np.ascontiguousarray(storage(rng.standard_normal(shape, dtype=np.float32), problem.dtype)) for shape in shapes]


def digest(arrays) -> str:
    """sha256 of the arrays' bytes, one after another."""
    hasher = hashlib.sha256()
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()


def kernel_facts(nest, target, threads: int) -> dict:
    """What ``nest``'s kernel for ``target`` is, in words that do not depend on how a schedule
    is written: its loops (compute, then write-back: ``[var, size, step, tail, parallel]``
    each) and the layout it stores each tensor in where that is not row-major (the schedule's
    and those the code generator chose, :attr:`Kernel.layouts`); and the digests of its
    output on the seeded inputs, called with every input and, where the problem has constant
    inputs, bound to them first. (Register tiles that sum the reduction in the same order give
    the same bits: the loops and layouts say which kernel it is, the output that it computes
    the same.)"""
    from looprl import compile

    kernel = compile(nest, target=target, threads=threads)
    inputs = seeded_inputs(nest.problem)
    found = {"loops": [[[lp.var, lp.size, lp.step, lp.tail, lp.parallel] for lp in loops] for loops in (nest.compute, nest.write_back)],
             "layouts": {tensor: layout.key for tensor, layout in sorted(kernel.layouts.items())},
             "output_sha256": digest([kernel(*inputs)])}
    constant = [name for name in ("in0", "in1") if name in nest.problem.constant]
    if constant:
        names = ("in0", "in1", *(name for name, _ in nest.problem.epilogue_shapes))
        given = dict(zip(names, inputs))
        bound = kernel.bind(**{name: given.pop(name) for name in constant})
        found["bound_output_sha256"] = digest([bound(*given.values())])
    return found


# -- how each record's schedule is reached (a56e7ac's names) ------------------------------------
def replayed(names, replays_on: str | None = None, found_by: str = "tiles"):
    """A record reached by the action ``names`` from the untuned nest of the problem (or of the
    rewrite ``replays_on`` names: its schedule is then carried back)."""

    def build(problem, target):
        return path_record(problem, target, tuple(names), replays_on, found_by)

    return build


def path_record(problem, target, names, replays_on, found_by):
    from looprl.actions import ActionSet, State
    from looprl.actions.transition import follow
    from looprl.ir.nest import initial_nest

    rewrite = _rewrite(problem, replays_on)
    searched = problem if rewrite is None else rewrite.coordinates
    actions = ActionSet.covering(names, target=target)
    state = follow(actions, State(initial_nest(searched), 0), names)
    if state is None:
        raise SystemExit(f"{problem.name}: the path {names} does not replay exactly")
    nest = state.nest if rewrite is None else rewrite.schedule(state.nest)
    return names, nest, replays_on, found_by


def _rewrite(problem, replays_on):
    """The re-laid start (a56e7ac's twin) ``replays_on`` names for ``problem`` (None: none)."""
    from looprl.ir.rewrites import relaid, replays_on as read

    try:
        return None if read(replays_on) is None else relaid(problem)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def policy_path(replays_on: str | None = None):
    """A record reached by the default policy's greedy actions (its episode's final state)."""

    def build(problem, target):
        rewrite = _rewrite(problem, replays_on)
        searched = problem if rewrite is None else rewrite.coordinates
        names = greedy(searched, target).final_actions
        return path_record(problem, target, names, replays_on, "policy")

    return build


def steps_path(steps_of, pack: bool = False, parallel: bool = False, found_by: str = "tiles"):
    """A record reached by the action path that carries out IR steps (``steps_of(problem,
    target)``), as the tile stage reaches its tiles, with the right operand then packed at the
    innermost column loop when ``pack``, and the outermost loop then made parallel when
    ``parallel``."""

    def build(problem, target):
        from looprl.actions import ActionSet, State
        from looprl.actions.transition import follow
        from looprl.ir.nest import initial_nest
        from looprl.ir.step import SPLIT
        from looprl.search.tiles import packed_path

        steps = steps_of(problem, target)
        actions = ActionSet.for_target(target).with_splits(step.arg for step in steps if step.op == SPLIT)
        found = actions.path(State(initial_nest(problem), 0), steps)
        if found is None:
            raise SystemExit(f"{problem.name}: no action path takes {steps}")
        names = tuple(actions.names[a] for a in found[0])
        if pack:
            names = packed_path(problem, names, actions)[0]
        if parallel:
            actions = actions.extended(list(names) + ["parallel"])
            state = follow(actions, State(initial_nest(problem), 0), names)
            names += tuple(actions.names[a] for a in actions.moves(state.cursor, 0)) + ("parallel",)
        return path_record(problem, target, names, None, found_by)

    return build


def layout_start(steps_of):
    """A record with no action path: the untuned nest with its inputs re-laid (a joint layout
    search's start, :func:`~looprl.ir.schedules.layout_starts`), then IR steps."""

    def build(problem, target):
        from looprl.ir.schedules import layout_starts

        return None, layout_starts(problem)[-1].apply(steps_of(problem, target)), None, "beam4bfs"

    return build


def _tile(rows, columns):
    def steps(problem, target):
        from looprl.ir.register_tiles import tile_steps

        return tile_steps(problem, rows, columns)

    return steps


def _panel(columns):
    def steps(problem, target):
        from looprl.ir.schedules import panel_steps

        return panel_steps(problem, columns)

    return steps


def greedy(problem, target):
    """The default policy's greedy rollout on ``problem`` for ``target``, as tune runs it
    (the weights policy where the right operand is constant; retargeted), nothing measured."""
    from looprl.policy.loading import load_policy
    from looprl.policy.retarget import retargeted
    from looprl.policy.rollout import greedy_rollout

    policy = retargeted(load_policy("default", target, weights="in1" in problem.constant), target)
    return greedy_rollout(policy, problem, None)


# -- the problems -----------------------------------------------------------------------------
def _public(name: str, *args, **options):
    """A maker of the problem ``looprl.<name>(*args, **options)`` builds (looprl imported when
    it is made, so ``--help`` imports nothing of it)."""

    def problem():
        import looprl

        return getattr(looprl, name)(*args, **options)

    return problem


def _mm(m, n, k, **options):
    return _public("matmul", m=m, n=n, k=k, **options)


def _linear(batch, in_features, out_features, **options):
    return _public("linear", batch, in_features, out_features, **options)


def _twin_of(make):
    def problem():
        from looprl.ir.rewrites import relaid

        return relaid(make()).coordinates  # a56e7ac's transposed twin

    return problem


def _contraction(spec, **options):
    return _public("contraction", spec, **options)


LINEAR_64 = _linear(64, 256, 192, activation="relu")
LINEAR_64_BF16 = _linear(64, 512, 256, dtype="bfloat16")
ATTENTION = _contraction("bmk,bnk->bmn", b=2, m=32, n=48, k=64)
COLD_LINEAR = _contraction("mk,nk->mn", m=8, n=512, k=256, constant="in1", cold=True)

CASES = (
    Case("mm64-avx512-tile", "compute-bound 64^3, the target's register tile (a plan action)", _mm(64, 64, 64), "avx512",
         replayed(["plan_14x2"])),
    Case("mm64-avx2-policy", "compute-bound 64^3, the AVX2 policy's greedy answer", _mm(64, 64, 64), "avx2", policy_path()),
    Case("mm96x80x112-avx512-policy", "compute-bound 96x80x112, the AVX-512 policy's greedy answer", _mm(96, 80, 112), "avx512",
         policy_path()),
    Case("mm50x70x90-avx2-cursor", "off-grid 50x70x90 (tails in m and n), a cursor path of splits and swaps", _mm(50, 70, 90), "avx2",
         replayed(["down", "down", "split_16", "up", "swap_down", "up", "up", "split_4", "down", "swap_down", "swap_down"],
                  found_by="rollout")),
    Case("mm64x288x600-avx512-k512-pack", "cache-blocked register tile with the right operand packed (a plan with a layout)",
         _mm(64, 288, 600), "avx512", replayed(["plan_14x2_k512_pack"])),
    Case("mm48x40x70-avx2-pack-pad", "layout actions: pack and pad on a cursor path", _mm(48, 40, 70), "avx2",
         replayed(["down", "down", "split_8", "up", "swap_down", "up", "pack", "down", "pad"], found_by="rollout")),
    Case("mm4x1024x512-avx512-stream", "few rows, not a weight: a streaming tile (a plan)", _mm(4, 1024, 512), "avx512",
         replayed(["plan_stream_8x64"])),
    Case("mm128x96x64-avx512-2threads", "two threads: a register tile with its outermost loop parallel", _mm(128, 96, 64), "avx512",
         replayed(["plan_14x2", "parallel"], found_by="parallel"), threads=2),
    Case("linear64-avx2-2threads", "two threads on a linear layer's twin (AVX2 tile, parallel, the weight packed)",
         _twin_of(_linear(64, 128, 96)), "avx2", steps_path(_tile(6, 16), pack=True, parallel=True, found_by="parallel"),
         threads=2),
    Case("linear4-avx512-dot", "few-row linear layer read in place: a dot-product tile (bias)", _linear(4, 256, 512), "avx512",
         replayed(["plan_dot_4x6"], found_by="dots")),
    Case("linear1-avx2-dot", "one-row linear layer read in place, GELU: a dot-product tile", _linear(1, 384, 256, activation="gelu"),
         "avx2", replayed(["plan_dot_1x8"], found_by="dots")),
    Case("linear64-twin-avx512", "a 64-row linear layer's transposed twin (what tune stores for it): packed register tile",
         _twin_of(LINEAR_64), "avx512", replayed(["plan_14x2_pack"])),
    Case("linear64-carried-avx512", "the same answer carried back to the layer as given (the weight re-laid)", LINEAR_64, "avx512",
         replayed(["plan_14x2_pack"], replays_on="transposed twin")),
    Case("attention-relaid-avx2", "attention-like bmk,bnk->bmn through its re-laid twin (the AVX2 policy's answer)", ATTENTION,
         "avx2", policy_path(replays_on="re-laid twin")),
    Case("attention-given-avx512", "attention-like bmk,bnk->bmn as given: a dot-product tile", ATTENTION, "avx512",
         replayed(["plan_dot_2x8"], found_by="dots")),
    Case("linear64-bf16-twin-avx512", "bfloat16 register tile pairing the weight (generic AVX-512: pairs split into FMAs)",
         _twin_of(LINEAR_64_BF16), "avx512", replayed(["plan_14x2"])),
    Case("linear64-bf16-twin-host", "bfloat16 register tile pairing the weight with vdpbf16ps (this host's target)",
         _twin_of(LINEAR_64_BF16), "host", replayed(["plan_14x2"])),
    Case("linear4-bf16-dot-host", "bfloat16 dot-product tile read in place with vdpbf16ps (this host's target)",
         _linear(4, 512, 256, dtype="bfloat16"), "host", replayed(["plan_dot_4x6"], found_by="dots")),
    Case("linear4-bf16-dot-avx512", "bfloat16 dot-product tile, widened to float32 (generic AVX-512)",
         _linear(4, 512, 256, dtype="bfloat16"), "avx512", replayed(["plan_dot_4x6"], found_by="dots")),
    Case("mm32x64x48-bf16-avx2-policy", "bfloat16 without a weight (widened), the AVX2 policy's answer",
         _mm(32, 64, 48, dtype="bfloat16"), "avx2", policy_path()),
    Case("mk-nk-layout-start-avx2", "no action path: a re-laid layout start, then a register tile",
         _contraction("mk,nk->mn", m=24, n=40, k=56), "avx2", layout_start(_tile(4, 16))),
    Case("cold-linear8-avx512-panel", "a cold weight (read from memory every call): a packed panel schedule", COLD_LINEAR, "avx512",
         steps_path(_panel(64), pack=True)),
)

# The problems whose greedy actions are recorded for each named target.
POLICY_PROBLEMS = (
    _mm(64, 64, 64), _mm(96, 80, 112), _mm(50, 70, 90), _mm(4, 1024, 512), _linear(4, 256, 512), _twin_of(_linear(4, 256, 512)),
    _twin_of(LINEAR_64), ATTENTION, _contraction("bmk,bkn->bmn", b=2, m=32, n=48, k=64), _linear(4, 512, 256, dtype="bfloat16"),
    _twin_of(LINEAR_64_BF16),
)
POLICY_TARGETS = ("avx2", "avx512")


def target_of(name: str):
    from looprl.target import Target

    return Target.named(name)


def target_entry(name: str, target) -> str | dict:
    """How the file names a record's target: a named target by its name, the host's by its
    description (:meth:`Target.to_dict`: LLVM CPU name and features)."""
    return target.to_dict() if name == "host" else name


def generate() -> dict:
    import looprl
    from looprl import defaults
    from looprl.measurement.cache import MeasurementCache
    from looprl.measurement.schedule_record import ScheduleRecord
    try:
        from looprl.tune.store import TUNER  # the package looprl.tune (after the restructuring)
    except ImportError:
        from looprl.policy.tuner import TUNER  # a56e7ac, where the fixture was written

    cache = MeasurementCache(":memory:")
    checks = []
    seen = set()
    for case in CASES:
        problem = case.problem()
        target = target_of(case.target)
        if (problem.name, target.key, case.threads) in seen:
            raise SystemExit(f"{case.name}: a second record of {problem.name} on {case.target} ({case.threads} threads) would replace the first")
        seen.add((problem.name, target.key, case.threads))
        actions, nest, replays_on, found_by = case.build(problem, target)
        record = ScheduleRecord(nest, PLACEHOLDER_GFLOPS, actions, found_by, target, case.threads, SEARCH_BUDGET_S, TUNER, replays_on)
        cache.put_tuned(record, defaults.STATE_BUDGET_S)
        checks.append({"case": case.name, "covers": case.covers, "problem": problem.name, "target": target_entry(case.target, target),
                       "threads": case.threads, "timing_budget_s": defaults.STATE_BUDGET_S, "tuner": TUNER,
                       "inputs_sha256": digest(seeded_inputs(problem)), **kernel_facts(nest, target, case.threads)})
        print(f"{case.name:34} {problem.name:60} {nest.key}")
    records = cache.export_tuned()
    if [entry["problem"] for entry in records] != [check["problem"] for check in checks]:
        raise SystemExit("the exported records are not in the order they were stored")
    policy = []
    for make in POLICY_PROBLEMS:
        problem = make()
        for name in POLICY_TARGETS:
            rollout = greedy(problem, target_of(name))
            policy.append({"problem": problem.name, "target": name, "weights": "in1" in problem.constant, "actions": list(rollout.actions),
                           "final_actions": list(rollout.final_actions), "final_schedule": rollout.final_nest.key,
                           "inputs_sha256": digest(seeded_inputs(problem)), **kernel_facts(rollout.final_nest, target_of(name), 1)})
            print(f"policy {name:7} {problem.name:60} {' '.join(rollout.final_actions)}")
    return {"records": records, "replay": {
        "looprl": _looprl_commit(Path(looprl.__file__).resolve().parent),
        "inputs": {"seed": SEED, "recipe": "numpy.random.default_rng(seed).standard_normal(shape, dtype=float32) per input in call "
                   "order (in0, in1, bias, residual), stored in the problem's dtype (looprl.ir.dtypes.storage); digest: sha256 of "
                   "the arrays' bytes one after another"},
        "gflops": f"placeholder ({PLACEHOLDER_GFLOPS}): nothing was timed",
        "records": checks, "policy": policy}}


def _looprl_commit(package: Path) -> str:
    """The commit of the checkout ``package`` (looprl's folder) comes from, '+' if it has changes."""
    try:
        head = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty.strip() else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help=f"the file to write (default: {OUT})")
    args = parser.parse_args(argv)
    import looprl
    from looprl.measurement.tuned_records import write_tuned_records

    print(f"looprl from {Path(looprl.__file__).resolve().parent}", file=sys.stderr)
    found = generate()
    path = write_tuned_records(args.out, found["records"])  # the project's own file form: format, version, cpu, records
    document = json.loads(path.read_text(encoding="utf-8"))
    document["replay"] = found["replay"]
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(found['records'])} records, {len(found['replay']['policy'])} rollouts)")


if __name__ == "__main__":
    main()
