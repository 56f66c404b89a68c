"""LLVM set-up and what this machine is, as the OS sees it, for reports and cache keys (its
LLVM CPU name and features are :func:`looprl.target.host_cpu`)."""

from __future__ import annotations

import functools
import hashlib
import os
import platform

import llvmlite
import llvmlite.binding as llvm

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


@functools.cache
def cache_sizes() -> tuple[int, int]:
    """(L2 bytes per core, last-level cache bytes) as the OS reports them (sysfs, else
    ``sysconf``); 0 for a level it does not report."""
    found: dict[int, int] = {}
    try:
        for index in sorted(os.listdir("/sys/devices/system/cpu/cpu0/cache")):
            folder = os.path.join("/sys/devices/system/cpu/cpu0/cache", index)
            if not index.startswith("index"):
                continue
            with open(os.path.join(folder, "type")) as handle:
                if handle.read().strip() == "Instruction":
                    continue
            with open(os.path.join(folder, "level")) as handle:
                level = int(handle.read())
            with open(os.path.join(folder, "size")) as handle:
                text = handle.read().strip()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            found[level] = int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        for level, name in ((2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
            try:
                found[level] = max(0, int(os.sysconf(name)))
            except (OSError, ValueError):
                pass
    l2 = found.get(2, 0)
    return l2, max([size for level, size in found.items() if level >= 2] or [0])
