"""LLVM set-up and what this machine is, as the OS sees it, for reports and cache keys (its
LLVM CPU name and features are :func:`looprl.target.host_cpu`)."""

from __future__ import annotations

import functools
import hashlib
import platform

import llvmlite
import llvmlite.binding as llvm

from looprl.ir.cache_blocks import host_caches
from looprl.target import host_cpu


@functools.cache
def initialise_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # Our IR already addresses memory with per-loop pointer offsets; loop strength reduction
    # only costs compile time here and, measured, made the register-tiled loops slower.
    # (This is an LLVM-wide option: it also applies to other llvmlite users in the process.)
    llvm.set_option("", "--disable-lsr")


@functools.cache
def cpu_model_name() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), for reports."""
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
    return f"{cpu_model_name()}|{name}|{digest}|{platform.machine()}|llvmlite-{llvmlite.__version__}"


def cache_sizes() -> tuple[int, int]:
    """(L2 bytes per core, last-level cache bytes) as the OS reports them
    (:func:`looprl.ir.cache_blocks.host_caches`); 0 for a level it does not report."""
    caches = host_caches()
    return caches.l2, caches.l3
