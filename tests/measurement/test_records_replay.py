"""Schedule records written at a56e7ac replay to the same kernels (issue 59, "behaviour unchanged").

``tests/data/records_a56e7ac.json`` is a tuned-records file written by looprl at a56e7ac, the
code before schedules became lists of steps (``experiments/structure_fixture.py`` made it: 22
records of compute-bound tiles, cursor paths with tails, plans with packed operands, pack and
pad, streaming and dot-product tiles of few-row linear layers read in place, a linear layer's
transposed twin and its answer carried back, attention through its re-laid twin and as given,
bfloat16 register and dot-product tiles, two-thread teams, a layout start, a cold panel). Its
``replay`` section says, for each record, what its kernel is (loops, the layout of each tensor
it stores re-laid) and the sha256 of the kernel's output on seeded inputs; and for eleven
problems, the greedy actions of the default policies for the named targets ``avx2`` and
``avx512``.

Here every record is read as this looprl reads tune's answers (the file, upgraded to today's
form; the cache that remembers it; the answer asked for as tune asks) and must compile to a
kernel with the same loops and layouts whose outputs hash the same, bit for bit; its action
path must reach that kernel too; and the policies must act as they did. A record whose target
this CPU cannot run (a feature of its target missing here, or fewer cores than its threads) is
skipped with the reason: the bfloat16 records compiled for the generating host's own target
(``vdpbf16ps``) run only on a CPU with every feature of that target.

The pieces that name a56e7ac's ways of reading a schedule are :func:`read_back` (the record
from the file) and :func:`actions_nest` (its action path replayed): where the restructuring
changes those ways, those two change, and the expectations stay.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from looprl import MeasurementCache, compile, parse_problem
from looprl.actions import ActionSet
from looprl.backend.threads import available_cores
from looprl.ir.dtypes import storage
from looprl.measurement.keys import measurement_key
from looprl.measurement.tuned_records import read_tuned_records
from looprl.policy.loading import load_policy
from looprl.policy.retarget import retargeted
from looprl.policy.rollout import greedy_rollout
from looprl.target import Target, host_cpu
from looprl.tune.results import replayed

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "records_a56e7ac.json"
CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
DOCUMENT = json.loads(FIXTURE.read_text(encoding="utf-8"))
REPLAY = DOCUMENT["replay"]
CHECKS = REPLAY["records"]
ROLLOUTS = REPLAY["policy"]
# the records with an action path, as the file stores them (collection does not go through the reading path under test)
WITH_ACTIONS = [index for index, entry in enumerate(DOCUMENT["records"]) if entry["actions"] is not None]


# -- the fixture's recipe: inputs, digests, what a kernel is --------------------------------------
def seeded_inputs(problem) -> list[np.ndarray]:
    """The problem's inputs in call order (in0, in1, bias, residual), drawn as the fixture's
    ``replay.inputs.recipe`` says: standard normal float32 from one seeded generator, stored in
    the problem's dtype."""
    rng = np.random.default_rng(REPLAY["inputs"]["seed"])
    shapes = [*problem.input_shapes, *(shape for _, shape in problem.epilogue_shapes)]
    return [np.ascontiguousarray(storage(rng.standard_normal(shape, dtype=np.float32), problem.dtype)) for shape in shapes]


def digest(arrays) -> str:
    """sha256 of the arrays' bytes, one after another."""
    hasher = hashlib.sha256()
    for array in arrays:
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()


def kernel_facts(nest, target: Target, threads: int) -> dict:
    """What the fixture says of a kernel: its loops (compute, then write-back), the layouts it
    stores tensors in (where not row-major), the digest of its output on the seeded inputs and,
    where the problem has constant inputs, of the output of the kernel bound to them."""
    kernel = compile(nest, target=target, threads=threads)
    inputs = seeded_inputs(nest.problem)
    facts = {"inputs_sha256": digest(inputs),
             "loops": [[[lp.var, lp.size, lp.step, lp.tail, lp.parallel] for lp in loops] for loops in (nest.compute, nest.write_back)],
             "layouts": {tensor: layout.key for tensor, layout in sorted(kernel.layouts.items())},
             "output_sha256": digest([kernel(*inputs)])}
    constant = [name for name in ("in0", "in1") if name in nest.problem.constant]
    if constant:
        given = dict(zip(("in0", "in1", *(name for name, _ in nest.problem.epilogue_shapes)), inputs))
        bound = kernel.bind(**{name: given.pop(name) for name in constant})
        facts["bound_output_sha256"] = digest([bound(*given.values())])
    return facts


def expected_facts(entry: dict) -> dict:
    return {key: entry[key] for key in ("inputs_sha256", "loops", "layouts", "output_sha256", "bound_output_sha256") if key in entry}


def target_of(entry) -> Target:
    """A record's target: a named one by its name, the generating host's by its description."""
    return Target.named(entry) if isinstance(entry, str) else Target.from_dict(entry)


def skip_unless_runnable(target: Target, threads: int = 1) -> None:
    """Skip (saying why) where this CPU lacks a feature the target's code is compiled with, or
    the cores for its threads."""
    enabled = {item[1:] for item in host_cpu()[1].split(",") if item.startswith("+")}
    missing = sorted({item[1:] for item in target.features.split(",") if item.startswith("+")} - enabled)
    if missing:
        pytest.skip(f"this CPU ({host_cpu()[0]}) cannot run code for {target.isa} on {target.cpu}: it lacks {', '.join(missing[:6])}")
    if available_cores() < threads:
        pytest.skip(f"the record's kernel runs on {threads} threads; this process may use {available_cores()} cores")


def _id(entry: dict) -> str:
    return entry["case"] if "case" in entry else f"{entry['target']}:{entry['problem']}"


# -- a56e7ac's ways of reading a record (what the restructuring may change) ------------------------
@functools.cache
def stored_entries() -> tuple:
    """The file's records as this looprl reads tuned-records files (older versions upgraded)."""
    return tuple(read_tuned_records(FIXTURE))


def read_back(index: int):
    """Record ``index`` as tune gets it back: imported into a cache and asked for by its problem,
    target, timing budget, tuner and threads. A stored record answers only on the host it was
    measured on (its ``host`` key names the CPU); the fixture's come from another machine, so
    each is keyed to this host's measurement key before it is imported: what is under test is
    the schedule it holds, not that check."""
    check = CHECKS[index]
    target = target_of(check["target"])
    entry = dict(stored_entries()[index], host=measurement_key(target, check["timing_budget_s"], check["threads"]))
    with MeasurementCache(":memory:") as cache:
        assert cache.import_tuned([entry]) == 1
        return cache.get_tuned(parse_problem(check["problem"]), target, check["timing_budget_s"], tuner=check["tuner"],
                               threads=check["threads"])


def actions_nest(record, target: Target):
    """The schedule ``record``'s action path reaches from the untuned nest of its problem, or
    from its re-laid start where its ``replays_on`` says so (a56e7ac's names for that start,
    its "twins", read as this looprl reads them)."""
    names = list(record.actions)
    nest = replayed(record.problem, names, ActionSet.covering(names, target=target), record.replays_on)
    assert nest is not None, f"the actions {names} no longer replay exactly on {record.problem.name}"
    return nest


# -- the tests -------------------------------------------------------------------------------------
def test_the_fixture_reads_as_a_tuned_records_file_of_its_records():
    """Every record of the file is read (none refused or lost by an upgrade), in its order."""
    entries = stored_entries()
    assert len(entries) == len(CHECKS) == 22
    assert [entry["problem"] for entry in entries] == [check["problem"] for check in CHECKS]


@pytest.mark.parametrize("index", range(len(CHECKS)), ids=[_id(check) for check in CHECKS])
def test_a_record_replays_to_the_same_kernel_with_bit_identical_outputs(index):
    check = CHECKS[index]
    target = target_of(check["target"])
    skip_unless_runnable(target, check["threads"])
    record = read_back(index)
    assert record is not None, f"{check['case']}: the record of {check['problem']} was not read back"
    assert record.problem.name == check["problem"]
    assert kernel_facts(record.nest, target, check["threads"]) == expected_facts(check)


@pytest.mark.parametrize("index", WITH_ACTIONS, ids=[_id(CHECKS[index]) for index in WITH_ACTIONS])
def test_a_records_action_path_reaches_the_same_kernel(index):
    """Tune reuses a remembered answer by its action path (one without a path is tuned again):
    the path must reach the kernel the record's schedule is."""
    check = CHECKS[index]
    target = target_of(check["target"])
    skip_unless_runnable(target, check["threads"])
    record = read_back(index)
    assert record is not None and record.actions is not None, f"{check['case']}: the record or its action path was not read back"
    assert kernel_facts(actions_nest(record, target), target, check["threads"]) == expected_facts(check)


# The default policies at a56e7ac, when the records were written (checkpoints/default_policies.json
# then): AVX2 has had a weights policy of its own since (clone-called-avx2), so the fixture's
# AVX2 weight rollouts are replayed with the policy that made them.
A56E7AC_DEFAULTS = {"avx512": "clone-plans", "avx2": "clone-plans-avx2", "avx512/weights": "clone-called"}


@functools.cache
def default_policy(target_name: str, weights: bool):
    """The default policy tune acted with at a56e7ac on ``target_name`` (the weights policy where
    the right operand is constant and the ISA had one), retargeted as tune retargets it."""
    target = Target.named(target_name)
    name = A56E7AC_DEFAULTS.get(f"{target.isa}/weights" if weights else target.isa, A56E7AC_DEFAULTS[target.isa])
    return retargeted(load_policy(str(CHECKPOINTS / name / "policy"), target), target)


@pytest.mark.parametrize("entry", ROLLOUTS, ids=_id)
def test_the_policy_alone_takes_the_same_greedy_actions(entry):
    """Nothing compiled or measured: the same on every host."""
    problem = parse_problem(entry["problem"])
    assert ("in1" in problem.constant) == entry["weights"]
    rollout = greedy_rollout(default_policy(entry["target"], entry["weights"]), problem, None)
    assert list(rollout.actions) == entry["actions"]
    assert list(rollout.final_actions) == entry["final_actions"]


@pytest.mark.parametrize("entry", ROLLOUTS, ids=_id)
def test_the_policys_answer_is_the_same_kernel(entry):
    target = Target.named(entry["target"])
    skip_unless_runnable(target)
    rollout = greedy_rollout(default_policy(entry["target"], entry["weights"]), parse_problem(entry["problem"]), None)
    assert kernel_facts(rollout.final_nest, target, 1) == expected_facts(entry)
