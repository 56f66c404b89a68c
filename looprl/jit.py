"""llvmlite plumbing: host description, IR text -> native function address.

One target machine per execution engine (sharing one between MCJIT engines crashes on
close), no IR pass pipeline (the IR arrives vectorised; the O3 pipeline leaks memory).
"""

from __future__ import annotations

import functools
import hashlib
import platform

import llvmlite
import llvmlite.binding as llvm


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


class CompiledModule:
    """A JIT-compiled module; keeps its engine alive for as long as code may run."""

    def __init__(self, ir_text: str, function: str):
        _initialise()
        module = llvm.parse_assembly(ir_text)
        module.verify()
        cpu, features = host_cpu()
        target = llvm.Target.from_default_triple()
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault")
        self._engine = llvm.create_mcjit_compiler(module, machine)
        self._engine.finalize_object()
        self.address = self._engine.get_function_address(function)
        if not self.address:
            raise RuntimeError(f"JIT produced no code for {function!r}")

    def assembly(self, ir_text: str) -> str:
        """Native assembly of ``ir_text`` for this host (for inspection)."""
        module = llvm.parse_assembly(ir_text)
        cpu, features = host_cpu()
        machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features, opt=3)
        return machine.emit_assembly(module)
