"""llvmlite plumbing: IR text -> native function address, for a target.

One target machine per execution engine (sharing one between MCJIT engines crashes on
close), created with the :class:`~looprl.target.Target`'s LLVM CPU and feature
string; several modules per engine (see :class:`_Engine`), one pool of engines per target;
no IR pass pipeline (the IR arrives vectorised; the O3 pipeline leaks memory). The same IR
compiled again for a target while the engine holding its code lives is that code again, not
another LLVM run (:data:`_compiled`).
"""

from __future__ import annotations

import hashlib
import threading
import weakref

import llvmlite.binding as llvm

from looprl.backend.host import initialise_llvm
from looprl.errors import CompileError
from looprl.target import Target


class _Engine:
    """An MCJIT engine with its own target machine, shared by up to ``capacity`` modules.

    A fresh engine and target machine per module cost ~2 ms of fixed work per compile (a
    sixth of a typical compile), so modules are added to a shared engine instead; after
    ``capacity`` modules the next compile starts a new one. An engine, and the machine code of
    all its modules, is freed when the last :class:`CompiledModule` using it is gone, which
    bounds the memory pinned by one long-lived kernel to ``capacity`` modules' code.
    """

    capacity = 32

    def __init__(self, target: "Target"):
        machine = _target_machine(target, codemodel="jitdefault")
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        self.modules = 0
        self.compiled: list[tuple] = []  # the keys of its modules' code in :data:`_compiled`
        self.reference: "weakref.ref | None" = None  # its watched weak reference (:func:`_watch`), set as it becomes the current engine

    def add(self, module, function: str, extra: tuple[str, ...] = ()) -> tuple[str, int, dict[str, int]]:
        """Compile ``module`` into this engine; the unique name and address of its ``function``
        and the addresses of its ``extra`` external functions (by their names in the IR)."""
        entries = {}
        for name in (function, *extra):
            try:
                entries[name] = module.get_function(name)
            except NameError:
                raise CompileError(f"the module defines no function {name!r}") from None
        self.modules += 1
        # Every module of an engine shares one symbol table: give the entry points unique names.
        for name, entry in entries.items():
            entry.name = f"{name}.{self.modules}"
        self._engine.add_module(module)
        self._engine.finalize_object()
        unique = f"{function}.{self.modules}"
        others = {name: self._engine.get_function_address(f"{name}.{self.modules}") for name in extra}
        return unique, self._engine.get_function_address(unique), others

    def address_of(self, name: str) -> int:
        return self._engine.get_function_address(name)


def _target_machine(target: "Target", **options):
    """A new LLVM target machine for ``target`` (never shared between engines)."""
    initialise_llvm()
    return llvm.Target.from_default_triple().create_target_machine(cpu=target.cpu, features=target.features, opt=3, **options)


_engine_lock = threading.RLock()  # re-entered where a freed engine's entries are dropped (:func:`_watch`)
_current_engines: dict[str, _Engine] = {}  # per target key: the engine that takes its next module
# Code already compiled, by (target key, entry point, extra entry points, digest of the IR): the engine that holds it
# (weakly: an entry goes when its engine is freed) and its entry's unique name, address and the extra addresses. LLVM's
# code generation is ~90% of a compile (~23 of 26 ms for a typical kernel on a Zen 3) and the same IR comes back often:
# a tune's answer compiled after its timing, a layer's row counts sharing a schedule, a re-laid start whose code is
# another nest's. Holding nothing alive, it costs no memory beyond the engines' own lives.
_compiled: dict[tuple, tuple[weakref.ref, str, int, dict[str, int]]] = {}
_engine_references: set[weakref.ref] = set()  # one per live engine, whose callback drops its entries


def _watch(engine: _Engine) -> weakref.ref:
    """A weak reference to ``engine`` that drops its entries from :data:`_compiled` when it is freed."""
    keys = engine.compiled

    # The module's objects bound now: at the interpreter's exit its globals may be gone before the last engine.
    def forget(reference, lock=_engine_lock, compiled=_compiled, references=_engine_references):
        with lock:
            references.discard(reference)
            for key in keys:
                if key in compiled and compiled[key][0] is reference:
                    del compiled[key]

    reference = weakref.ref(engine, forget)
    _engine_references.add(reference)
    return reference


class CompiledModule:
    """A JIT-compiled module for ``target``; keeps its engine alive for as long as code may
    run. Code for a target is compiled by that target's own engines."""

    def __init__(self, ir_text: str, function: str, target: Target, extra: tuple[str, ...] = ()):
        initialise_llvm()
        self.target = target
        key = (target.key, function, tuple(extra), hashlib.blake2b(ir_text.encode(), digest_size=20).digest())
        with _engine_lock:
            found = _compiled.get(key)
            engine = found[0]() if found is not None else None
            if engine is not None:  # this IR's code, in an engine still alive: shared, not compiled again
                self._engine = engine
                self.entry, self.address, self.addresses = found[1], found[2], dict(found[3])
                return
        try:
            module = llvm.parse_assembly(ir_text)
            module.verify()
        except RuntimeError as error:
            raise CompileError(f"LLVM rejected the generated IR: {error}") from error
        with _engine_lock:  # llvmlite serialises its calls anyway; this guards our counters
            engine = _current_engines.get(self.target.key)
            if engine is None or engine.modules >= _Engine.capacity:
                engine = _current_engines[self.target.key] = _Engine(self.target)
                engine.reference = _watch(engine)
            self._engine = engine
            self.entry, self.address, self.addresses = engine.add(module, function, tuple(extra))
            if self.address:
                engine.compiled.append(key)
                _compiled[key] = (engine.reference, self.entry, self.address, dict(self.addresses))
        if not self.address:
            raise CompileError(f"JIT produced no code for {function!r}")


def assembly(ir_text: str, target: Target) -> str:
    """Native assembly of ``ir_text`` for ``target``, for inspection."""
    machine = _target_machine(target)
    return machine.emit_assembly(llvm.parse_assembly(ir_text))
