"""llvmlite plumbing: host description, IR text -> native function address.

One target machine per execution engine (sharing one between MCJIT engines crashes on
close), several modules per engine (see :class:`_Engine`), no IR pass pipeline (the IR
arrives vectorised; the O3 pipeline leaks memory).
"""

from __future__ import annotations

import functools
import hashlib
import platform
import threading

import llvmlite
import llvmlite.binding as llvm

from looprl.errors import CompileError


@functools.cache
def _initialise() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # Our IR already addresses memory with per-loop pointer offsets; loop strength reduction
    # only costs compile time here and, measured, made the register-tiled loops slower.
    # (This is an LLVM-wide option: it also applies to other llvmlite users in the process.)
    llvm.set_option("", "--disable-lsr")


@functools.cache
def host_cpu() -> tuple[str, str]:
    """(LLVM CPU name, LLVM feature string) of this machine."""
    _initialise()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@functools.cache
def host_fingerprint() -> str:
    """Identifies measurements that are comparable: same CPU, features and LLVM."""
    name, features = host_cpu()
    digest = hashlib.sha256(features.encode()).hexdigest()[:12]
    return f"{_cpu_model_name()}|{name}|{digest}|{platform.machine()}|llvmlite-{llvmlite.__version__}"


class _Engine:
    """An MCJIT engine with its own target machine, shared by up to ``capacity`` modules.

    A fresh engine and target machine per module cost ~2 ms of fixed work per compile (a
    sixth of a typical compile), so modules are added to a shared engine instead; after
    ``capacity`` modules the next compile starts a new one. An engine, and the machine code of
    all its modules, is freed when the last :class:`CompiledModule` using it is gone, which
    bounds the memory pinned by one long-lived kernel to ``capacity`` modules' code.
    """

    capacity = 32

    def __init__(self):
        cpu, features = host_cpu()
        target = llvm.Target.from_default_triple()
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        self.modules = 0

    def add(self, module, function: str) -> tuple[str, int]:
        """Compile ``module`` into this engine; the unique name and address of its ``function``."""
        try:
            entry = module.get_function(function)
        except NameError:
            raise CompileError(f"the module defines no function {function!r}") from None
        self.modules += 1
        # Every module of an engine shares one symbol table: give the entry point a unique name.
        unique = f"{function}.{self.modules}"
        entry.name = unique
        self._engine.add_module(module)
        self._engine.finalize_object()
        return unique, self._engine.get_function_address(unique)

    def address_of(self, name: str) -> int:
        return self._engine.get_function_address(name)


_engine_lock = threading.Lock()
_current_engine: list[_Engine] = []  # the engine that takes the next module (at most one)


class CompiledModule:
    """A JIT-compiled module; keeps its engine alive for as long as code may run."""

    def __init__(self, ir_text: str, function: str):
        _initialise()
        try:
            module = llvm.parse_assembly(ir_text)
            module.verify()
        except RuntimeError as error:
            raise CompileError(f"LLVM rejected the generated IR: {error}") from error
        with _engine_lock:  # llvmlite serialises its calls anyway; this guards our counter
            if not _current_engine or _current_engine[0].modules >= _Engine.capacity:
                _current_engine[:] = [_Engine()]
            self._engine = _current_engine[0]
            self.entry, self.address = self._engine.add(module, function)
        if not self.address:
            raise CompileError(f"JIT produced no code for {function!r}")

    @staticmethod
    def assembly(ir_text: str) -> str:
        """Native assembly of ``ir_text`` for this host (for inspection)."""
        module = llvm.parse_assembly(ir_text)
        cpu, features = host_cpu()
        machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
        return machine.emit_assembly(module)
