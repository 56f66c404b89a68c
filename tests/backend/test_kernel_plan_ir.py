"""The code generator's output pinned over a broad corpus of schedules: the LLVM IR text (its
SHA-256) and the facts a compiled kernel keeps (the layouts it stores tensors in, the inputs it
packs on entry, its workspace, its extra entry points) for each schedule of
``kernel_ir_corpus.json``, on the named targets ``avx2`` and ``avx512`` and on a Zen 4
(AVX-512 with ``avx512_bf16``, the target stored in the file).

The corpus: the records of ``tests/data/records_a56e7ac.json`` as tune reads them back (and
their action paths replayed), the named plans of each problem, and random action walks (splits,
swaps, pack, pad, parallel, stage) with random and tiled data layouts, over matmuls, sizes no
split divides, few-row linear layers read as stored (dot products), bfloat16 weights with their
pair steps, batched and matrix-vector problems and epilogues; each kernel also with runtime rows
where its problem has rows. Nothing is compiled to machine code: any target's IR is made on any
host. A change here is a change of the generated code (and of the measurement cache's
``CODEGEN_VERSION`` where speed may change): for an intended one, recompute the pins with
``python -m tests.backend.test_kernel_plan_ir``."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import pytest

from looprl.backend.codegen import kernel_ir
from looprl.backend.kernel_plan import plan_kernel
from looprl.backend.loops import RuntimeRowsUnsupported
from looprl.ir.nest import LoopNest
from looprl.ir.problem import parse_problem
from looprl.target import Target

CORPUS = Path(__file__).resolve().parent / "kernel_ir_corpus.json"
# A Zen 4's target (the bfloat16 records' host): vdpbf16ps, which the named targets leave out.
BF16_TARGET = {"isa": "avx512", "vector_width": 16, "registers": 32, "fma": True, "cpu": "znver4",
               "features": "+avx,+avx2,+avx512bf16,+avx512bw,+avx512dq,+avx512f,+avx512vl,+f16c,+fma"}
TARGETS = {"avx2": Target.named("avx2"), "avx512": Target.named("avx512"), "znver4": Target.from_dict(BF16_TARGET)}
CHUNKS = 12


def facts(nest: LoopNest, target: Target, runtime_rows: bool) -> dict:
    """What the corpus pins of the kernel of ``nest`` for ``target``: its IR text (or the error
    that refuses it), its layouts, packed inputs, workspace and extra entry points."""
    try:
        plan = plan_kernel(nest, target, runtime_rows)
        ir = kernel_ir(plan)
    except RuntimeRowsUnsupported as error:
        return {"refused": type(error).__name__}
    return {"ir": ir,
            "layouts": {tensor: layout.key for tensor, layout in sorted(plan.layouts.items())},
            "packed": list(plan.packed),
            "workspace": plan.workspace_elements,
            "entries": list(plan.extra_entry_points)}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pinned(nest: LoopNest, target: Target, runtime_rows: bool) -> list[str]:
    """The corpus's columns for the kernel: the first 16 hex digits of the SHA-256 of its IR
    and of its other :func:`facts` (as sorted JSON), or ``["refused", the error's class]``."""
    found = facts(nest, target, runtime_rows)
    if "refused" in found:
        return ["refused", found["refused"]]
    ir = found.pop("ir")
    return [_digest(ir), _digest(json.dumps(found, sort_keys=True))]


@cache
def corpus() -> tuple[tuple, ...]:
    """The corpus's rows: (target name, problem, nest key, runtime rows, pinned columns)."""
    document = json.loads(CORPUS.read_text(encoding="utf-8"))
    assert document["bfloat16_target"] == BF16_TARGET
    problems = document["problems"]
    return tuple((target, problems[problem], key, rows, columns) for target, problem, key, rows, *columns in document["entries"])


def test_the_corpus_covers_the_kinds_of_kernel():
    entries = corpus()
    assert len(entries) > 2000
    assert {target for target, *_ in entries} == set(TARGETS)
    compute = [key.split("|")[0] for _, _, key, _, _ in entries]
    assert sum("p" in loops for loops in compute) > 100  # parallel loops
    assert sum("+in" in loops for loops in compute) > 300  # stage steps
    assert sum(len(key.split("|")) > 2 for _, _, key, _, _ in entries) > 500  # data layouts
    assert sum(rows for *_, rows, _ in entries) > 500
    assert sum("dtype=bfloat16" in problem and "k1%2" in key for _, problem, key, _, _ in entries) > 100  # pair steps
    assert sum(columns[0] == "refused" for *_, columns in entries) > 100


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_the_generated_ir_is_as_pinned(chunk):
    changed = []
    for target, problem, key, rows, columns in corpus()[chunk::CHUNKS]:
        nest = LoopNest.from_key(parse_problem(problem), key)
        found = pinned(nest, TARGETS[target], rows)
        if found != columns:
            changed.append(f"{target} {problem} [{key}] rows={rows}: {found} != {columns}")
    assert not changed, f"{len(changed)} kernels changed:\n" + "\n".join(changed[:10])


def repin() -> None:
    """Recompute every row's pinned columns in place (after an intended change of the code)."""
    document = json.loads(CORPUS.read_text(encoding="utf-8"))
    problems = document["problems"]
    rows = [[target, problem, key, rows, *pinned(LoopNest.from_key(parse_problem(problems[problem]), key), TARGETS[target], rows)]
            for target, problem, key, rows, *_ in document["entries"]]
    CORPUS.write_text('{"bfloat16_target": ' + json.dumps(BF16_TARGET) + ',\n"problems": ' + json.dumps(problems, indent=0)
                      + ',\n"entries": [\n' + ",\n".join(json.dumps(row, separators=(",", ":")) for row in rows) + "\n]}\n",
                      encoding="utf-8")


if __name__ == "__main__":  # python -m tests.backend.test_kernel_plan_ir
    repin()
