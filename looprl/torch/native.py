"""The linear operator without Python on its path: ``looprl_native::linear``, built from
``native_linear.cpp`` with the host's C++ compiler against torch's headers, once per source,
torch and compiler (about 7 s), and kept in ``$LOOPRL_NATIVE_DIR`` (default: the per-user cache
directory's ``looprl/native``, not ``$LOOPRL_CACHE_DIR``'s measurements).

A decode step calls each linear layer once per token with one row. Through the Python operator
(``looprl::linear``: the dispatcher into Python, the layer's lookup, :meth:`LinearKernels.__call__
<looprl.torch.routes.LinearKernels.__call__>`' checks and row plan, ctypes) a call cost about
15 us more than its kernel (a 512x512 layer: 27.3 us against 12.5, Zen 4, torch 2.13); the native
operator runs the same kernels about 1 us above them. It keeps a table, per layer of a compiled
graph, of the row counts whose looprl plan it can run itself (:meth:`NativeLayer.offer`, called
by the Python operator after it computed such a call with looprl's kernels): serial kernels, each
reading the input's rows in place (no padded block) and the weight either in place or from copies
bound once (frozen layers, for that weight tensor only); a team's kernels where looprl does not
place its teams (:func:`looprl.backend.placement.places_teams`: on torch's OpenMP runtime, as in
a process that loaded torch first, or with ``LOOPRL_PLACE_TEAMS=0``), the process that made the
plan only (a forked child's calls are Python's, which refuses what would hang). Every other call, and any call whose
tensors are not plain CPU tensors as the plan expects (another dtype, autograd, autocast, a
transform's wrapper, a strided view, another weight tensor than a frozen plan's), goes to the
Python operator, which decides as before (and counts its fallbacks); the native operator's own
calls are added to the layer's ``"looprl"`` count (:meth:`NativeLayer.take_calls`).

A row count the layer routes to torch is torch's call made by the native operator itself
(``aten::linear``, what ``functional.linear`` calls), where the layer has no activation
(:meth:`NativeLayer.route_to_torch`, offered by the Python operator on such a call), not the
dispatcher's way into Python and back: on a Zen 3, one row, a routed call through the Python
operator cost 7-30 us more than torch's own call, through the native one -3 to +11 (the host's
noise; 64 -> 64: +0.9 us; ``experiments/results/routed_calls_znver3.txt``). Those calls are added
to the layer's count of calls routed to torch.

``LOOPRL_NATIVE=0`` turns it off (the backend then puts ``looprl::linear`` in its graphs); where
no compiler or headers are found, or the build fails, the same happens, with a warning once per
process naming why (:func:`unavailable`).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
import weakref
from pathlib import Path

import torch

from looprl.backend import threads
from looprl.backend.kernel import BoundKernel, Kernel
from looprl.backend.placement import places_teams

SOURCE = Path(__file__).with_name("native_linear.cpp")
MAX_POINTERS = 6  # as kMaxPointers in the source
FIXED, INPUT, OUTPUT, WORKSPACE, WEIGHT, BIAS = range(6)  # a pointer argument's source, as the source's Source
BUILD_TIMEOUT_S = 600


class Part(ctypes.Structure):
    """One kernel call of a native plan, as the source's ``Part``."""

    _fields_ = [("function", ctypes.c_void_p), ("start", ctypes.c_int64), ("length", ctypes.c_int64), ("takes_rows", ctypes.c_int64),
                ("threads", ctypes.c_int64), ("pointers", ctypes.c_int64), ("sources", ctypes.c_int64 * MAX_POINTERS), ("fixed", ctypes.c_int64 * MAX_POINTERS)]


def native_dir() -> Path:
    """``$LOOPRL_NATIVE_DIR``, or ``$XDG_CACHE_HOME/looprl/native`` (``~/.cache/looprl/native``)."""
    explicit = os.environ.get("LOOPRL_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "looprl" / "native"


def enabled() -> bool:
    """``LOOPRL_NATIVE`` (read at each call): ``1`` (the default) or ``0``; anything else is a
    ``ValueError`` naming it."""
    value = os.environ.get("LOOPRL_NATIVE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"LOOPRL_NATIVE must be 0 or 1, not {value!r}")
    return value == "1"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _command(compiler: str, source: Path, output: Path) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = [f"-I{path}" for path in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [compiler, "-O2", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *includes, str(source),
            "-o", str(output), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lc10", "-ltorch_cpu"]


def _version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def build(directory: Path | None = None) -> Path:
    """The built library's path (built if not there: under a lock, so that processes building
    at once build it once). Raises ``RuntimeError`` naming what failed."""
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    directory = native_dir() if directory is None else directory
    source = SOURCE.read_bytes()
    command = _command(compiler, Path("SOURCE"), Path("OUTPUT"))
    key = hashlib.sha256(b"\0".join([source, torch.__version__.encode(), _version(compiler).encode(), " ".join(command).encode(),
                                     sys.version.encode()])).hexdigest()[:20]
    library = directory / f"native_linear-{key}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():  # another process built it while this one waited
            return library
        with tempfile.TemporaryDirectory(dir=directory) as scratch:
            built = Path(scratch) / library.name
            try:
                done = subprocess.run(_command(compiler, SOURCE, built), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as error:
                raise RuntimeError(f"building {SOURCE.name} failed: {error}") from None
            if done.returncode != 0:
                raise RuntimeError(f"building {SOURCE.name} failed ({compiler}, exit {done.returncode}): {done.stderr.strip()[-2000:]}")
            os.replace(built, library)
    return library


_state_lock = threading.Lock()
_state: dict = {}  # "library": the ctypes handle, or "why": why there is none


def library() -> ctypes.CDLL | None:
    """The native library, loaded (and built if needed) once per process, its operator
    registered with torch; None where ``LOOPRL_NATIVE=0`` or it could not be built or loaded
    (:func:`unavailable` says why; a warning says so once)."""
    if not enabled():
        return None
    with _state_lock:
        if "library" not in _state and "why" not in _state:
            try:
                path = build()
                torch.ops.load_library(str(path))
                handle = ctypes.CDLL(str(path))
            except (RuntimeError, OSError) as error:
                _state["why"] = str(error)
                warnings.warn(f"looprl's native linear operator is not available, the Python one serves every call: {error}",
                              RuntimeWarning, stacklevel=2)
            else:
                _declare(handle)
                torch.library.register_fake("looprl_native::linear", linear_fake)
                torch.library.register_fake("looprl_native::try_linear", linear_fake)
                threads.register_parallel_probe(handle.looprl_native_used_parallel)
                _state["library"] = handle
        return _state.get("library")


def unavailable() -> str | None:
    """Why the native operator is not in use (None: it is, or was not asked for yet)."""
    if not enabled():
        return "LOOPRL_NATIVE=0"
    return _state.get("why")


def _declare(handle: ctypes.CDLL) -> None:
    i64 = ctypes.c_int64
    handle.looprl_native_layer.argtypes = [i64] * 5
    handle.looprl_native_layer.restype = None
    handle.looprl_native_plan.argtypes = [i64, i64, ctypes.POINTER(Part), i64, i64, i64, i64, ctypes.POINTER(i64)]
    handle.looprl_native_plan.restype = i64
    handle.looprl_native_clear.argtypes = [i64]
    for name in ("looprl_native_forget", "looprl_native_take_calls"):
        getattr(handle, name).argtypes = [i64, ctypes.POINTER(i64)]
    handle.looprl_native_torch_route.argtypes = [i64, i64]
    handle.looprl_native_torch_route.restype = i64
    handle.looprl_native_clear.restype = None
    handle.looprl_native_forget.restype = i64
    handle.looprl_native_take_calls.restype = i64
    handle.looprl_native_used_parallel.argtypes = []
    handle.looprl_native_used_parallel.restype = i64


def linear_fake(x, weight, bias, layer):
    """What a call of a linear operator (``looprl::linear``, ``looprl_native::linear`` and
    ``try_linear``) returns, for fake tensors: the output's shape and dtype."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class NativeLayer:
    """A layer's entry in the native operator's table (the index its calls pass): the plans it
    was offered, and what they read kept alive until they are dropped. Made by the backend for
    each :class:`~looprl.torch.routes.LinearKernels` it puts in a graph, and by
    :func:`attach_module` for a module's (the kernels' ``native``); freed with them, its table
    entry forgotten (the calls it had computed handed to ``on_forget``)."""

    def __init__(self, handle: ctypes.CDLL, index: int, in_features: int, out_features: int, bfloat16: bool, has_bias: bool,
                 on_forget=None):
        self._handle, self.index = handle, index
        self._lock = threading.Lock()
        self._kept: dict[int, object] = {}  # row count -> what its plan points at (bound copies, the weight they were bound for)
        self.offered: set[int] = set()  # row counts offered since the plans were last dropped (given a plan or not)
        self.planned: frozenset[int] = frozenset()  # row counts the table has a plan for (read without the lock)
        self._derived: dict[int, object] = {}  # row count -> the bound value its plan was made from (None: in place)
        handle.looprl_native_layer(index, in_features, out_features, int(bfloat16), int(has_bias))
        weakref.finalize(self, _forget, handle, index, on_forget)

    def offer(self, rows: int, parts: list[tuple], weight_bound: tuple[int, int] | None, workspace_bytes: int, keep,
              kept: tuple[int, int, int, int] = (0, 0, 0, 0), derived=None) -> None:
        """Give the table a plan for ``rows`` rows: ``parts``, one ``(function address, start,
        length, takes_rows, threads, sources, fixed)`` per kernel call (``threads``: 0 for a serial
        kernel, else the thread count its entry point takes; ``sources``: per pointer argument
        one of :data:`FIXED`, :data:`INPUT`, ..., ``fixed``: the addresses of the fixed ones);
        ``weight_bound``: the weight's and bias's data pointers a plan with bound copies holds
        for (None: it reads them in place); ``keep``: what the plan points at, kept alive here
        until the plan is dropped; ``kept``: for a layer that follows its weights, the addresses and
        sizes of the weight's and bias's contents its copies were bound from (the plan holds while
        the tensors hold those bytes); ``derived``: the bound value the plan was made from (a
        later one means the plan is stale: :meth:`stale`)."""
        array = (Part * len(parts))()
        for part, (function, start, length, takes_rows, threads_, sources, fixed) in zip(array, parts):
            part.function, part.start, part.length, part.takes_rows = function, start, length, int(takes_rows)
            part.threads, part.pointers = threads_, len(sources)
            part.sources[:len(sources)] = sources
            part.fixed[:len(fixed)] = fixed
        weight, bias = weight_bound or (0, 0)
        with self._lock:
            # The plan replaces any earlier one for these rows under the table's lock: what the earlier one pointed at
            # is let go only after that (the caller holds ``keep`` until then).
            self._handle.looprl_native_plan(self.index, rows, array, len(parts), weight, bias, workspace_bytes, (ctypes.c_int64 * 4)(*kept))
            self._kept[rows] = keep
            self._derived[rows] = derived
            self.offered.add(rows)
            self.planned = frozenset(self._kept)

    def offer_plan(self, kernels, rows: int, x, weight, bias) -> None:
        """Offer the table the plan of ``rows`` rows that ``kernels`` (the layer's
        :class:`~looprl.torch.routes.LinearKernels`) just computed with looprl's kernels
        on these tensors, where it can run it: each kernel reading its rows of the input in
        place (none padded), serial or a team's where looprl does not place teams (the native
        operator calls a team's kernel as :meth:`Kernel._call
        <looprl.backend.kernel.Kernel._call>` does then), the weight read in place or from
        copies bound once (frozen: the plan then holds for this weight tensor only; following
        the weights: while the weight and bias hold the bytes the copies were bound from, which
        the native operator compares on each call as :class:`~looprl.torch.weights.ContentCache` does), input, weight
        and bias contiguous. Else noted as refused (its calls stay
        the Python operator's)."""
        plan, counts, bound = kernels._plan_of(rows)
        if not (x.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())):
            return  # this call's tensors: offered again on the next call of these rows
        kept = (0, 0, 0, 0)  # a followed layer's bound copies: the contents they were bound from, compared on each call
        if bound and not kernels.frozen:
            entry = kernels._bound.kept
            weight_copy, bias_copy = entry[0]
            copies = entry[1]
            kept = (weight_copy[1].ctypes.data, 0 if bias_copy is None else bias_copy[1].ctypes.data, weight_copy[1].nbytes,
                    0 if bias_copy is None else bias_copy[1].nbytes)
        else:
            copies = kernels._frozen.get(weight, bias) if bound else {}
        roles = {"in0": INPUT, "in1": WEIGHT, "out": OUTPUT, "acc": WORKSPACE, "bias": BIAS}
        parts, workspace = [], 0
        for start, length, count in plan:
            kernel = kernels._kernels[count]
            if not isinstance(kernel, Kernel) or (kernel.plan.threaded and places_teams()) or (length != count and not kernel.runtime_rows):
                self.refuse(rows)
                return
            team = 0
            if kernel.plan.threaded:  # the thread count Kernel._call gives it
                team = kernel.threads if kernel._team_limit is None else min(kernel.threads, kernel._team_limit)
            if count in kernels.in_place:
                function, sources, fixed = kernel._function, [roles[t] for t in kernel.tensors], [0] * len(kernel.tensors)
            else:
                copy_ = copies[count]
                if not isinstance(copy_, BoundKernel) or copy_.free != ("in0",):
                    self.refuse(rows)
                    return
                given = {0: OUTPUT, 1: WORKSPACE, 2: INPUT}  # address_call's slots
                function = copy_._function
                sources = [given[a] if g else FIXED for a, g in zip(copy_._arguments, copy_._given)]
                fixed = [0 if g else a for a, g in zip(copy_._arguments, copy_._given)]
            address = ctypes.cast(function, ctypes.c_void_p).value
            parts.append((address, start, length, kernel.runtime_rows, team, sources, fixed))
            workspace = max(workspace, kernel.workspace_elements * 4)
        weight_bound = (weight.data_ptr(), 0 if bias is None else bias.data_ptr()) if bound and kernels.frozen else None
        keep = (weight.detach(), None if bias is None else bias.detach(), copies, kernels._bound.kept if not kernels.frozen else None) if bound else None
        self.offer(rows, parts, weight_bound, workspace, keep, kept, copies if bound else None)

    def stale(self, rows: int, derived) -> bool:
        """Whether the plan of ``rows`` was made from other bound copies than ``derived`` (the
        layer bound again: another weight tensor, or other contents): offer it again."""
        made = self._derived.get(rows)
        return made is not None and made is not derived

    def route_to_torch(self, rows: int) -> None:
        """Have the native operator make torch's call (``aten::linear``) itself for ``rows``
        rows: for a layer without an activation whose routes give those rows to torch (the
        Python operator's call there is ``functional.linear``, this same call)."""
        with self._lock:
            self._handle.looprl_native_torch_route(self.index, rows)
            self._kept[rows] = None
            self._derived[rows] = None
            self.offered.add(rows)
            self.planned = frozenset(self._kept)

    def refuse(self, rows: int) -> None:
        """Note that ``rows`` has no plan the native operator can run (not offered again)."""
        with self._lock:
            self.offered.add(rows)

    def clear(self) -> None:
        """Drop every plan (the routes or the weight changed): returns once no call runs one."""
        with self._lock:
            self.planned = frozenset()
            self._handle.looprl_native_clear(self.index)
            self._kept.clear()
            self._derived.clear()
            self.offered.clear()

    def take_calls(self) -> tuple[int, int]:
        """The calls the native operator computed for this layer since last asked with
        looprl's kernels, and with torch's call (the rows routed to torch)."""
        routed = ctypes.c_int64(0)
        calls = self._handle.looprl_native_take_calls(self.index, ctypes.byref(routed))
        return calls, routed.value


def _forget(handle: ctypes.CDLL, index: int, on_forget) -> None:
    routed = ctypes.c_int64(0)
    calls = handle.looprl_native_forget(index, ctypes.byref(routed))
    if on_forget is not None and (calls or routed.value):
        on_forget(calls, routed.value)



_module_indices = itertools.count(1 << 62)  # far above the backend's indices: the two never meet in the table


def layer_entry(kernels, index: int, on_forget=None) -> NativeLayer | None:
    """An entry in the native table under ``index`` for ``kernels`` (a
    :class:`~looprl.torch.routes.LinearKernels`: its shape, dtype and bias), or None where the
    native operator is not available."""
    handle = library()
    if handle is None:
        return None
    return NativeLayer(handle, index, kernels.in_features, kernels.out_features, kernels.dtype.name == "bfloat16",
                       "bias" in kernels.results[1].problem.epilogue.inputs, on_forget)


def attach_module(kernels) -> NativeLayer | None:
    """An entry in the native table for ``kernels`` that a module calls, not a compiled graph
    (``looprl_native::try_linear``, which gives back None where it has no plan, for the module
    to call the kernels from Python), or None where the native operator is not available."""
    return layer_entry(kernels, next(_module_indices))


_try_linear: list = []  # looprl_native::try_linear, looked up on first use (it exists once the library is loaded)


def try_linear(x, weight, bias, index: int):
    """A module layer's call by its plan in the table (``index``: its :class:`NativeLayer`'s),
    or None where the table has none for it."""
    if not _try_linear:
        _try_linear.append(torch.ops.looprl_native.try_linear.default)
    return _try_linear[0](x, weight, bias, index)
