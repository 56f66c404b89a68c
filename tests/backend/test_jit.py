"""Kernels share JIT engines: many compiles, several engines, kernels outliving their peers."""

import gc

import numpy as np
import pytest

import looprl
from looprl.backend import jit
from looprl.errors import CompileError


def _check(kernel, m, n, k, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_kernels_spanning_several_engines_stay_correct(monkeypatch):
    monkeypatch.setattr(jit._Engine, "capacity", 6)  # several engines from few compiles
    count = 2 * jit._Engine.capacity + 5
    problems = [looprl.matmul(8 + i % 7, 16 + i % 5, 4 + i % 3) for i in range(count)]
    kept = []
    engines = set()
    for i, problem in enumerate(problems):
        nest = looprl.initial_nest(problem)
        if i % 2:
            nest = nest.split(2, 2)  # other code under the same entry-point name
        kernel = looprl.compile(nest)
        engines.add(id(kernel._module._engine))
        if i % 3 == 0:
            kept.append((kernel, problem))  # the others are dropped at once (freed by their count)
        if i % jit._Engine.capacity == jit._Engine.capacity - 1:
            gc.collect()  # as each engine fills: whatever a cycle held is freed before the next one starts
    assert len(engines) >= 3
    for kernel, _ in kept:  # each entry point keeps its own name in its shared engine
        assert kernel._module._engine.address_of(kernel._module.entry) == kernel._module.address
    for index, (kernel, problem) in enumerate(kept):
        _check(kernel, problem.size("m"), problem.size("n"), problem.size("k"), index)


def test_the_same_ir_again_shares_the_code_while_its_engine_lives_and_is_compiled_again_after(monkeypatch):
    """IR compiled again for a target is the code compiled before (no LLVM run) while the
    engine holding it lives; each kernel keeps that engine alive, so dropping one never frees
    the other's code; once every module of the engine is gone, its entry goes and the same IR
    is compiled anew. The code is shared by target only."""
    monkeypatch.setattr(jit._Engine, "capacity", 2)  # the second module fills the engine: the next compile starts another
    monkeypatch.setattr(jit, "_current_engines", {})  # the first compile starts an engine (not one an earlier test half filled)
    runs = []
    real_add = jit._Engine.add
    monkeypatch.setattr(jit._Engine, "add", lambda self, *args: runs.append(args[1]) or real_add(self, *args))
    nest = looprl.initial_nest(looprl.matmul(9, 24, 5))
    first = looprl.compile(nest)
    second = looprl.compile(nest)
    assert len(runs) == 1 and first._module.address == second._module.address
    assert first._module._engine is second._module._engine
    _check(first, 9, 24, 5, 0)
    del first
    gc.collect()
    _check(second, 9, 24, 5, 1)  # the code outlives the kernel that compiled it
    other = looprl.compile(looprl.initial_nest(looprl.matmul(9, 24, 6)))  # fills the engine
    third = looprl.compile(looprl.initial_nest(looprl.matmul(9, 24, 7)))  # in a new engine
    assert len(runs) == 3 and third._module._engine is not other._module._engine
    sse4 = looprl.compile(nest, target="sse4")  # another target: its own code
    assert len(runs) == 4 and sse4._module.address != second._module.address
    entries = len(jit._compiled)
    del second, other
    gc.collect()
    assert len(jit._compiled) == entries - 2  # the freed engine's entries are gone
    again = looprl.compile(nest)
    assert len(runs) == 5  # compiled anew
    _check(again, 9, 24, 5, 2)


def test_module_without_the_entry_point_is_an_error():
    with pytest.raises(CompileError, match="no function"):
        jit.CompiledModule("define void @other() {\n ret void\n}\n", "looprl_kernel", looprl.Target.host())
