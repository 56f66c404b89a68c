"""Threads: how many a kernel may use, and the OpenMP runtime its parallel loops call.

The code generator outlines the body of a parallel loop into a function and the kernel calls
``GOMP_parallel(body, context, threads, 0)``, the entry point GCC's own OpenMP code calls, in
**libgomp** (GCC's OpenMP runtime). Why libgomp: it is on the machines users have (Debian and
Ubuntu's ``libgomp1`` comes with gcc and with numpy/scipy/torch stacks; PyTorch's Linux wheels
and many others bundle a copy), it keeps a pool of threads per calling thread (so a parallel
region costs a few microseconds, not a thread start, and a kernel called from several Python
threads at once gets one team per caller), and its threads run native code only: the GIL is
released by ctypes for the whole call, nothing of Python runs in the pool. Each thread takes a
static share of the loop's iterations from ``omp_get_thread_num()`` / ``omp_get_num_threads()``
(the team the runtime actually formed, so a smaller team still covers every iteration).

The thread count is always an explicit value (never ``OMP_NUM_THREADS``): 1 by default, at
most the cores this process may run on (``os.sched_getaffinity``), so looprl never
oversubscribes the machine. A kernel run on one thread calls the outlined body directly
(libgomp is not involved).

**Sharing the machine.** libgomp's threads spin for a while after a region before they sleep
(300,000 spins by default), and so do OpenBLAS's after a BLAS call: in a program that calls
numpy's matmul and a looprl kernel in turn on two cores, each runtime's spinning threads take
the cores the other's team needs (measured on a 2-vCPU Zen 4: a 0.12 ms two-thread kernel took
5.2 ms when each call followed a two-thread numpy matmul). looprl therefore loads a private
instance of libgomp (a copy of the library file, opened locally, so no other user of libgomp
in the process is affected) with ``GOMP_SPINCOUNT=1000`` (libgomp's own spin count for a
machine with more threads than cores), unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is set:
its threads sleep soon after a region, and the same kernel then took 0.32 ms (alone: 0.12 ms,
unchanged). ``looprl-bench mixed`` measures this.

**Inside torch** the opposite holds. torch runs its own parallel operators on the libgomp it
ships; after each one its threads spin (libgomp's default), so a kernel run on a private
runtime right after a LayerNorm finds its second core taken. When a libgomp is already loaded
in the process as looprl first needs one (``looprl.torch`` and ``looprl.dynamo`` import torch
first), looprl's kernels use that one: its thread pool is shared, and the threads spinning
after torch's operator are the ones that pick up the kernel's region. Measured on the 2-vCPU
Zen 4, GPT-2-small-shaped generation with ``tune_module(threads=2)``: prefill 265 ms and 19.7
decoded tokens/s with the private runtime, 131.5 ms and 42.4 tokens/s sharing torch's (torch
eager: 193 ms, 23-24 tokens/s).

libgomp cannot run parallel regions in a child forked after the forking thread has run one
(its pool's threads do not exist in the child, and the first region would wait for them
forever): in such a child a parallel kernel on more than one thread is refused with a
:class:`~looprl.errors.KernelError` instead of hanging (use threads=1 there, or start child
processes with the ``spawn`` or ``forkserver`` method).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import tempfile
import threading

from looprl import checks
from looprl.errors import CompileError, KernelError

# The symbols the generated code calls (resolved in the JIT from the libgomp found below).
OPENMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")

_runtime_lock = threading.Lock()
_runtime: list[str] = []  # the library path, once its symbols are registered with LLVM
_private: list[ctypes.CDLL] = []  # looprl's private copy of the runtime, where that is the one loaded
_used = threading.local()  # .parallel: this thread has run a parallel region
_forked_after_use = [False]
_parallel_probes: list = []  # functions saying whether the calling thread ran parallel kernels by other paths (register_parallel_probe)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), the most threads a kernel gets."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity on this OS
        return os.cpu_count() or 1


def check_threads(threads, what: str = "threads") -> int:
    """``threads`` as an int in 1..:func:`available_cores` (a Python or numpy integer, not a
    bool), or a ValueError naming ``what`` and the limit."""
    count = checks.positive_int(threads, what)
    cores = available_cores()
    if count > cores:
        raise ValueError(f"{what}={count} is more than the {cores} core(s) this process may use (os.sched_getaffinity)")
    return count


def find_openmp() -> str | None:
    """The path or soname of libgomp on this machine, or None."""
    return ctypes.util.find_library("gomp")


def ensure_openmp_runtime() -> str:
    """Load libgomp and register the symbols generated code calls with LLVM (once per
    process); its path. A machine without libgomp gets a CompileError saying what to install."""
    with _runtime_lock:
        if _runtime:
            return _runtime[0]
        import llvmlite.binding as llvm

        from looprl.backend.host import initialise_llvm

        path = find_openmp()
        if path is None:
            raise CompileError(
                "a parallel loop needs libgomp (GCC's OpenMP runtime), which is not installed: "
                "install it (Debian/Ubuntu: apt install libgomp1) or keep every loop serial"
            )
        try:
            library, path, private = _private_runtime(path)
            addresses = {name: ctypes.cast(getattr(library, name), ctypes.c_void_p).value for name in OPENMP_SYMBOLS}
        except (OSError, AttributeError) as error:
            raise CompileError(f"cannot use the OpenMP runtime {path}: {error}") from None
        initialise_llvm()
        for name, address in addresses.items():
            llvm.add_symbol(name, address)
        _runtime.append(path)
        if private:
            _private.append(library)
        return path


def private_runtime() -> ctypes.CDLL | None:
    """looprl's private copy of libgomp, where the kernels run on it (see the module
    docstring); None before the runtime is loaded, or where it is one another library loaded."""
    return _private[0] if _private else None


SPIN_COUNT = "1000"  # libgomp's own spin count when threads outnumber cores
PRIVATE_NAME = "libgomp-looprl.so.1"  # the private copy's file name
_WAIT_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def _private_runtime(name: str) -> tuple[ctypes.CDLL, str, bool]:
    """The libgomp looprl's kernels call: the one already loaded in this process if another
    library loaded it (torch's: see the module docstring), else a libgomp of looprl's own,
    whose threads spin briefly: a copy of the library ``name`` resolves to, opened with
    ``RTLD_LOCAL`` while the spin count is set in the environment (restored right after:
    libgomp reads it once, when it loads). Where the file cannot be found or copied (no /proc),
    the shared library as it is. ``(library, its description, whether it is the private copy)``."""
    try:  # a libgomp another library of this process already uses (torch's): share its pool
        already = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except (OSError, AttributeError):  # not loaded (or no RTLD_NOLOAD on this OS)
        already = None
    if already is not None:
        return already, f"{_mapped_file('libgomp') or name} (already loaded in this process: its thread pool is shared)", False
    shared = ctypes.CDLL(name)
    source = _mapped_file("libgomp")
    if source is None or any(setting in os.environ for setting in _WAIT_SETTINGS):
        return shared, name, False
    with tempfile.TemporaryDirectory(prefix="looprl-gomp-") as folder:
        private = os.path.join(folder, PRIVATE_NAME)
        shutil.copyfile(source, private)
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        try:
            library = ctypes.CDLL(private, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        finally:
            del os.environ["GOMP_SPINCOUNT"]
    return library, f"{source} (a private copy, GOMP_SPINCOUNT={SPIN_COUNT})", True


def _mapped_file(fragment: str) -> str | None:
    """The path of a loaded library whose file name contains ``fragment`` (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                name = os.path.basename(path)
                if fragment in name and name != PRIVATE_NAME and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def before_parallel_call(threads: int) -> None:
    """Called before a parallel kernel runs on ``threads`` threads: refuses what would hang
    (see the module docstring) and records that this thread has used the runtime."""
    if threads <= 1:
        return
    if _forked_after_use[0]:
        raise KernelError(
            "this process was forked from a thread that had run parallel kernels: libgomp cannot run "
            "parallel regions here (run with threads=1, or start processes with 'spawn' or 'forkserver')"
        )
    _used.parallel = True


def register_parallel_probe(probe) -> None:
    """Have ``probe()`` (true or false for the calling thread) asked after a fork too: a caller
    that runs parallel kernels without :func:`before_parallel_call` (the native linear operator,
    :mod:`looprl.torch.native`) says so through it."""
    _parallel_probes.append(probe)


def _after_fork_in_child() -> None:
    if getattr(_used, "parallel", False) or any(probe() for probe in _parallel_probes):
        _forked_after_use[0] = True


os.register_at_fork(after_in_child=_after_fork_in_child)
