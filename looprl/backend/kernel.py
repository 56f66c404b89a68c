"""Compiled kernels: ``looprl.compile(nest)`` and the callable it returns."""

from __future__ import annotations

import ctypes
import math
import time

import numpy as np

from looprl import checks
from looprl.backend import abi, codegen, jit
from looprl.backend.buffers import aligned_empty
from looprl.backend.weight_memory import weight_empty
from looprl.backend.jit import CompiledModule
from looprl.backend.kernel_plan import KernelPlan, plan_kernel
from looprl.backend.placement import hold_team, release_team
from looprl.backend.threads import available_cores, before_parallel_call, check_threads, ensure_openmp_runtime
from looprl.ir.nest import LoopNest
from looprl.target import Target

MAX_REPS = 2**31 - 1  # reps reach the kernel as an i64 loop count; keep far from any wrap-around

_PACK_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_INPUT_NAMES = {"a": "in0", "b": "in1", "in0": "in0", "in1": "in1", "bias": "bias"}
_WHAT = {"in0": "first input", "in1": "second input", "bias": "bias", "residual": "residual"}


def _signature(pointers: int, threaded: bool = False, runtime_rows: bool = False):
    """The C type of an entry point taking ``pointers`` buffer addresses, then ``reps`` (then
    the row count, for a kernel of runtime rows; then the thread count, for a schedule with a
    parallel loop)."""
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * pointers), ctypes.c_int64, *([ctypes.c_int64] if runtime_rows else []),
                            *([ctypes.c_int32] if threaded else []))


class Kernel:
    """Native code for one schedule. ``kernel(a, b)`` returns a new output array;
    :meth:`run` writes into a given one (and can repeat the computation, for timing).

    Inputs must be C-contiguous arrays of the problem's shapes, float32, or for a bfloat16
    problem ``uint16`` arrays of bfloat16 bits (:func:`looprl.ir.dtypes.to_bfloat16`; the output
    too). ``target`` is the
    :class:`~looprl.target.Target` the code was generated and compiled for.

    When the schedule stores inputs in other layouts (:attr:`packed_inputs`), every call
    converts them into the workspace first: the conversion is part of the kernel and of its
    timed cost. :meth:`bind` converts a constant input (a weight) once instead.

    A problem with an epilogue takes its extra inputs (:attr:`inputs` lists every input in
    call order) after the two operands: ``kernel(a, b, bias)``, ``kernel(a, b, residual)`` or
    ``kernel(a, b, bias, residual)``; the bias is float32 of shape ``(n,)`` (the output's last
    extent), the residual float32 of the output's shape, both C-contiguous.

    ``threads`` is how many threads the schedule's parallel loops use unless a call says
    otherwise (:meth:`run`); a schedule without a parallel loop runs on the calling thread
    whatever the count. The kernel may be called from several threads at once. Where the
    threads of a team stage blocks of an input into buffers of their own
    (:attr:`KernelPlan.thread_stride <looprl.backend.kernel_plan.KernelPlan.thread_stride>`),
    :attr:`workspace_elements` holds one set per core this process may use (at most one per
    iteration of the parallel loop), and a call on more threads (:meth:`raw_call` skips the
    core check) runs on that many.

    A kernel compiled with ``runtime_rows=True`` (:func:`compile`) takes any number of rows
    (the problem's :attr:`~looprl.ir.problem.Problem.row_dim`) from 1 to the problem's in one
    call: its first input, output and residual may have fewer leading rows (:meth:`run` reads
    the count from the first input; :meth:`raw_call` and :meth:`BoundKernel.address_call`
    take ``rows=``), and only those rows are read and written.
    """

    def __init__(self, nest: LoopNest, plan: KernelPlan, ir: str, module: CompiledModule, compile_seconds: float, threads: int = 1):
        self.nest = nest
        self.plan = plan  # what the code generator decided (looprl.backend.kernel_plan)
        self.problem = plan.problem
        self.target: Target = module.target
        self.ir = ir
        self.compile_seconds = compile_seconds
        self.threads = check_threads(threads)
        self.runtime_rows = plan.rows is not None
        self.max_rows = self.problem.size(plan.rows) if self.runtime_rows else None
        self._module = module  # keeps the machine code alive
        self.tensors = plan.tensors  # the entry points' pointer arguments
        self.storage = self.problem.dtype.storage  # numpy dtype of the inputs and the output
        signature = _signature(len(self.tensors), plan.threaded, self.runtime_rows)
        self._function = signature(module.address)
        self.layouts = dict(plan.layouts)  # tensor -> Layout the code stores it in
        self.packed_inputs = plan.packed
        # Threads that stage blocks into buffers of their own (kernel_plan.Stage.private) get them
        # in the workspace: room for as many threads as this process may use, and no call runs more.
        self._team_limit = available_cores() if plan.thread_stride else None
        self.workspace_elements = plan.workspace_for(self._team_limit) if plan.thread_stride else plan.workspace_elements
        self._entries = {name: signature(address) for name, address in module.addresses.items() if "_bound_" in name}
        self._packers = {name: _PACK_SIGNATURE(address) for name, address in module.addresses.items() if "_pack_" in name}
        shapes = dict(zip(("in0", "in1"), self.problem.input_shapes))
        shapes.update(self.problem.epilogue_shapes)
        self.input_shapes: dict[str, tuple[int, ...]] = shapes  # every input, in call order

    @property
    def inputs(self) -> tuple[str, ...]:
        """The inputs in call order: ``in0``, ``in1``, then ``bias`` and ``residual`` if the
        problem's epilogue has them."""
        return tuple(self.input_shapes)

    def __call__(self, a: np.ndarray, b: np.ndarray, *epilogue: np.ndarray) -> np.ndarray:
        out = aligned_empty(self._shape("out", self._rows_of(a)), self.storage)
        self.run(a, b, out, **self._epilogue_arguments(epilogue))
        return out

    def _epilogue_arguments(self, arrays: tuple) -> dict[str, np.ndarray]:
        """The epilogue's inputs given positionally after the operands, by name."""
        names = self.problem.epilogue.inputs
        if len(arrays) != len(names):
            wanted = ", ".join(names) or "none"
            raise ValueError(f"{self.problem.name} takes 2 operands and {len(names)} epilogue input(s) ({wanted}), got {2 + len(arrays)} arrays")
        return dict(zip(names, arrays))

    def run(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, reps: int = 1, workspace: np.ndarray | None = None, *,
            bias: np.ndarray | None = None, residual: np.ndarray | None = None, threads: int | None = None) -> None:
        """Compute into ``out`` ``reps`` times (1 to ``2**31 - 1``, a Python or numpy integer).
        ``workspace`` (float32, C-contiguous, at least output-sized, overlapping neither input
        nor the output) is the accumulator; pass one to avoid an allocation per call.
        ``bias`` and ``residual``: the epilogue's inputs, exactly those the problem has.
        ``threads``: threads for the parallel loops (None: the kernel's :attr:`threads`; at
        most the cores this process may use)."""
        reps = checks.positive_int(reps, "reps", MAX_REPS)
        threads = self.threads if threads is None else check_threads(threads)
        arrays = {"in0": a, "in1": b, **self._given_epilogue(bias, residual)}
        rows = self._rows_of(a)
        self._check_call(arrays, out, workspace, rows)
        if workspace is None:
            workspace = aligned_empty(self.workspace_elements)
        self._call(self._function, self._pointers(arrays, out, workspace), reps, threads, rows)

    def _rows_of(self, a) -> int | None:
        """The row count of a call whose first input is ``a`` (runtime rows only: its leading
        extent where that is between 1 and the problem's)."""
        if not self.runtime_rows or not isinstance(a, np.ndarray) or a.ndim == 0:
            return None
        rows = a.shape[0]
        if not 1 <= rows <= self.max_rows:
            raise ValueError(f"first input has {rows} rows; this kernel takes 1 to {self.max_rows}")
        return rows

    def _call(self, function, pointers, reps: int, threads: int, rows: int | None = None) -> None:
        """Call an entry point of this kernel (the row count and the thread count only where the
        code takes them; rows default to the problem's)."""
        extra = (self.max_rows if rows is None else rows,) if self.runtime_rows else ()
        if self._team_limit is not None:  # the workspace holds this many threads' stage buffers
            threads = min(threads, self._team_limit)
        if self.plan.threaded:
            before_parallel_call(threads)
            held = hold_team(threads)
            try:
                function(*pointers, reps, *extra, threads)
            finally:
                release_team(held)
        else:
            function(*pointers, reps, *extra)

    def _given_epilogue(self, bias, residual) -> dict[str, np.ndarray]:
        given = {name: array for name, array in (("bias", bias), ("residual", residual)) if array is not None}
        wanted = self.problem.epilogue.inputs
        for name in wanted:
            if name not in given:
                raise ValueError(f"{self.problem.name} needs its epilogue's {name} ({name}=...)")
        for name in given:
            if name not in wanted:
                raise ValueError(f"{self.problem.name} has no {name} in its epilogue, but {name}= was given")
        return given

    def _check_call(self, arrays: dict[str, np.ndarray], out: np.ndarray, workspace: np.ndarray | None, rows: int | None = None) -> None:
        """Validate every input in ``arrays`` (by name), the output and the workspace (of a call
        on ``rows`` rows: None, the problem's)."""
        for name, array in arrays.items():
            self._check(array, _WHAT[name], self._shape(name, rows), self.storage)
        self._check(out, "output", self._shape("out", rows), self.storage)
        if not out.flags.writeable:
            raise ValueError("output array is read-only")
        for name, array in arrays.items():
            if np.shares_memory(out, array):
                raise ValueError(f"output array overlaps the {_WHAT[name]}")
        if workspace is not None:
            self._check(workspace, "workspace", None)
            if workspace.size < self.workspace_elements:
                raise ValueError(f"workspace has {workspace.size} elements; this kernel needs {self.workspace_elements}")
            if not workspace.flags.writeable:
                raise ValueError("workspace array is read-only")
            for name, array in (*arrays.items(), ("output", out)):
                if np.shares_memory(workspace, array):
                    raise ValueError(f"workspace overlaps the {_WHAT.get(name, name)}; the kernel overwrites its workspace")

    def _shape(self, tensor: str, rows: int | None) -> tuple[int, ...]:
        """The shape of ``tensor`` (an input's name or ``out``) in a call on ``rows`` rows (None:
        the problem's); the second input and the bias have no rows."""
        shape = tuple(self.problem.output_shape if tensor == "out" else self.input_shapes[tensor])
        if rows is None or tensor in ("in1", "bias"):
            return shape
        return (rows, *shape[1:])

    def _pointers(self, arrays: dict[str, np.ndarray], out: np.ndarray, workspace: np.ndarray) -> tuple[int, ...]:
        """Addresses in the order of :attr:`tensors`."""
        places = {"out": out, "acc": workspace, **arrays}
        return tuple(places[t].ctypes.data for t in self.tensors)

    def bind(self, *, shared: dict | None = None, **inputs: np.ndarray) -> "BoundKernel":
        """Fix constant inputs (``a=`` / ``in0=`` the first, ``b=`` / ``in1=`` the second,
        ``bias=`` the epilogue's bias): each operand is converted to its layout once, now; the
        returned callable takes only the remaining inputs (positionally, in the order of
        :attr:`inputs`) and does not convert the bound ones again. The arrays are copied:
        changing them afterwards does not change the bound kernel.

        ``shared``: a dict that several kernels bound to the same arrays pass in turn (the
        kernels of one layer at its row counts): a converted or copied operand is kept there
        under its array, layout and storage, and a later kernel that stores it alike reads that
        buffer instead of a copy of its own (read-only for every kernel: one copy of a weight
        per layout, not per kernel)."""
        if shared is not None and not isinstance(shared, dict):
            raise ValueError(f"bind() expects shared to be a dict or None, got {type(shared).__name__}")
        if not inputs:
            raise ValueError("bind() needs at least one input: a= (the first), b= (the second) or bias=")
        bound: dict[str, np.ndarray] = {}
        for name, array in inputs.items():
            tensor = _INPUT_NAMES.get(name)
            if tensor is None:
                raise ValueError(f"bind() got an unknown input {name!r}; expected a/in0 (first input), b/in1 (second) or bias")
            if tensor not in self.input_shapes:
                raise ValueError(f"bind() got {name}=, but {self.problem.name} has no {_WHAT[tensor]}")
            if tensor in bound:
                raise ValueError(f"bind() got the {_WHAT[tensor]} twice")
            self._check(array, _WHAT[tensor], self.input_shapes[tensor], self.storage)
            bound[tensor] = array
        return BoundKernel(self, bound, shared)

    def raw_call(self, pointers: tuple[int, ...], reps: int, threads: int | None = None, rows: int | None = None) -> None:
        """Call with pre-validated buffer addresses in the order of :attr:`tensors` (in0, in1,
        out, acc, then the epilogue's inputs), a checked thread count (None: the kernel's) and,
        for runtime rows, a checked row count (None: the problem's): for timing loops."""
        self._call(self._function, pointers, reps, self.threads if threads is None else threads, rows)

    @staticmethod
    def _check(array, what: str, shape, storage=np.float32) -> None:
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{what} must be a numpy array, got {type(array).__name__}")
        if array.dtype != storage:
            wanted = "uint16 (the bits of bfloat16 values: looprl.ir.dtypes.to_bfloat16)" if storage == np.uint16 else np.dtype(storage).name
            raise ValueError(f"{what} must have dtype {wanted}, got {array.dtype}")
        if shape is not None and array.shape != tuple(shape):
            raise ValueError(f"{what} has shape {array.shape}; expected {tuple(shape)}")
        if not array.flags.c_contiguous:
            raise ValueError(f"{what} must be C-contiguous (use np.ascontiguousarray)")

    def assembly(self) -> str:
        """The native assembly of this kernel for its own target (for inspection)."""
        return jit.assembly(self.ir, self.target)

    def with_threads(self, threads: int) -> "Kernel":
        """This kernel's code (the same compiled module) with ``threads`` as its calls' default
        thread count: the count is not part of the code (:func:`compile` generates the same
        module whatever it is given)."""
        threads = check_threads(threads)
        if threads == self.threads:
            return self
        return Kernel(self.nest, self.plan, self.ir, self._module, self.compile_seconds, threads)

    def __repr__(self) -> str:
        threads = f" on {self.threads} threads" if self.nest.is_parallel and self.threads > 1 else ""
        return f"<Kernel {self.problem.name} [{self.nest.key}] for {self.target.isa}{threads} compiled in {self.compile_seconds * 1e3:.2f} ms>"


class BoundKernel:
    """A :class:`Kernel` with some inputs fixed and already in their layouts (see
    :meth:`Kernel.bind`): ``bound(x)`` returns the output for the remaining input ``x`` (and
    any other remaining inputs, in the kernel's order)."""

    def __init__(self, kernel: Kernel, bound: dict[str, np.ndarray], shared: dict | None = None):
        self.kernel = kernel
        self.bound = tuple(sorted(bound))
        self.free = tuple(t for t in kernel.inputs if t not in bound)
        self._buffers: dict[str, np.ndarray] = {}
        shared = {} if shared is None else shared
        converted = []
        for tensor, array in bound.items():
            packs = tensor in kernel.packed_inputs
            # The array (its memory, shape and strides: the caller keeps it alive while it binds), how it is stored, in what dtype.
            key = (array.ctypes.data, array.shape, array.strides, tensor, kernel.layouts[tensor].key if packs else "as given",
                   np.dtype(kernel.storage).str)
            buffer = shared.get(key)
            if buffer is None:
                # Converted once, read on every call: on huge pages (looprl.backend.weight_memory).
                if packs:
                    buffer = weight_empty(kernel.layouts[tensor].elements, kernel.storage)
                    kernel._packers[abi.pack_function_name(tensor)](array.ctypes.data, buffer.ctypes.data)
                else:  # used as given: a private copy
                    buffer = weight_empty(array.shape, kernel.storage)
                    buffer[...] = array
                shared[key] = buffer
            self._buffers[tensor] = buffer
            if packs:
                converted.append(tensor)
        self.converted = tuple(sorted(converted))  # bound inputs converted once, here
        self._function = kernel._entries[abi.bound_kernel_name(self.converted)] if self.converted else kernel._function
        # For address_call: each kernel argument is a bound buffer's address, or which given address it takes.
        slots = {"out": 0, "acc": 1, **{tensor: 2 + i for i, tensor in enumerate(self.free)}}
        self._arguments = tuple(self._buffers[t].ctypes.data if t in self._buffers else slots[t] for t in kernel.tensors)
        self._given = tuple(t not in self._buffers for t in kernel.tensors)

    def __call__(self, *inputs: np.ndarray) -> np.ndarray:
        out = aligned_empty(self.kernel._shape("out", self._rows(dict(zip(self.free, inputs)))), self.kernel.storage)
        self.run(*inputs, out=out)
        return out

    def run(self, *inputs: np.ndarray, out: np.ndarray, reps: int = 1, workspace: np.ndarray | None = None, threads: int | None = None) -> None:
        """Compute into ``out`` (as :meth:`Kernel.run`, the bound inputs left out)."""
        kernel = self.kernel
        if len(inputs) != len(self.free):
            names = " and ".join(f"the {_WHAT[t]}" for t in self.free) or "no inputs"
            raise ValueError(f"this bound kernel takes {names} ({len(self.free)} array(s)), got {len(inputs)}")
        reps = checks.positive_int(reps, "reps", MAX_REPS)
        threads = kernel.threads if threads is None else check_threads(threads)
        given = dict(zip(self.free, inputs))
        rows = self._rows(given)
        kernel._check_call(given, out, workspace, rows)
        if workspace is None:
            workspace = aligned_empty(kernel.workspace_elements)
        kernel._call(self._function, kernel._pointers({**self._buffers, **given}, out, workspace), reps, threads, rows)

    def _rows(self, given: dict) -> int | None:
        """The row count of a call on the free inputs ``given`` (by name): the first input's, when
        it is free and the kernel takes runtime rows."""
        return self.kernel._rows_of(given["in0"]) if "in0" in given else None

    def address_call(self, out: int, workspace: int, *free: int, rows: int | None = None) -> None:
        """One call on addresses the caller has checked: the output's, the workspace's and the
        free inputs' (in :attr:`free`'s order), each float32, C-contiguous, of the problem's
        shape (the workspace at least :attr:`Kernel.workspace_elements`), not overlapping; for
        a kernel of runtime rows, ``rows`` (1 to the problem's, checked by the caller; None: the
        problem's) rows of the first input, output and residual. The path of a caller that
        calls many times on buffers it manages (``looprl.torch``): what :meth:`run` checks on
        every call costs more than a small kernel."""
        given = (out, workspace, *free)
        pointers = tuple(given[a] if g else a for a, g in zip(self._arguments, self._given))
        self.kernel._call(self._function, pointers, 1, self.kernel.threads, rows)

    def raw_call(self, pointers: tuple[int, ...], reps: int, threads: int | None = None, rows: int | None = None) -> None:
        """As :meth:`Kernel.raw_call`, with the bound inputs' buffers among ``pointers``."""
        self.kernel._call(self._function, pointers, reps, self.kernel.threads if threads is None else threads, rows)

    def __repr__(self) -> str:
        return f"<BoundKernel {self.kernel.problem.name} [{self.kernel.nest.key}] bound {', '.join(self.bound)}>"


class ReshapedKernel:
    """The kernel of a fused view (:func:`looprl.ir.rewrites.fused_view`) called with the arrays
    of ``problem``, the problem it is a view of: each C-contiguous input is reshaped to the
    view's shape (no copy), the output back to ``problem``'s. ``kernel`` is the view's."""

    def __init__(self, kernel: Kernel, problem):
        if problem.epilogue.inputs or [math.prod(s) for s in (*problem.input_shapes, problem.output_shape)] != [
                math.prod(s) for s in (*kernel.problem.input_shapes, kernel.problem.output_shape)]:
            raise ValueError(f"{kernel.problem.name} is not a view of {problem.name}")
        self.kernel, self.problem = kernel, problem
        self.nest, self.target, self.threads = kernel.nest, kernel.target, kernel.threads

    def _views(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for array, what, shape in zip((a, b), ("the first input", "the second input"), self.problem.input_shapes):
            Kernel._check(array, what, shape, self.kernel.storage)
        return a.reshape(self.kernel.problem.input_shapes[0]), b.reshape(self.kernel.problem.input_shapes[1])

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.kernel(*self._views(a, b)).reshape(self.problem.output_shape)

    def run(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, reps: int = 1, workspace: np.ndarray | None = None, *,
            threads: int | None = None) -> None:
        """:meth:`Kernel.run` with this problem's arrays."""
        Kernel._check(out, "out", self.problem.output_shape, self.kernel.storage)
        self.kernel.run(*self._views(a, b), out.reshape(self.kernel.problem.output_shape), reps, workspace, threads=threads)

    def bind(self, *, shared: dict | None = None, **inputs: np.ndarray):
        """:meth:`Kernel.bind` with this problem's arrays (``shared`` as there); the returned
        callable takes the remaining input as this problem shapes it."""
        shapes = dict(zip(("in0", "in1"), self.problem.input_shapes))
        views = dict(zip(("in0", "in1"), self.kernel.problem.input_shapes))
        given = {}
        for name, array in inputs.items():
            tensor = _INPUT_NAMES.get(name)
            if tensor not in shapes:
                raise ValueError(f"bind() got an unknown input {name!r}; expected a/in0 (first input) or b/in1 (second)")
            Kernel._check(array, _WHAT[tensor], shapes[tensor], self.kernel.storage)
            given[tensor] = array.reshape(views[tensor])
        return _ReshapedBound(self.kernel.bind(shared=shared, **given), self.problem, [t for t in ("in0", "in1") if t not in given])

    def __getattr__(self, name: str):
        """The view's kernel's other attributes (``raw_call``, ``tensors``, ``workspace_elements``,
        ``packed_inputs``, ...): its buffers hold as many elements as this problem's, in the
        same order, so addresses of this problem's buffers serve it as they are."""
        if name == "kernel":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"ReshapedKernel({self.problem.name} as {self.kernel!r})"


class _ReshapedBound:
    """A bound view kernel (:meth:`ReshapedKernel.bind`) called with ``problem``'s arrays; its
    other attributes (``raw_call``, ``address_call``, ...) are the view's bound kernel's."""

    def __init__(self, bound: BoundKernel, problem, free: list[str]):
        self.bound, self.problem, self.free = bound, problem, free

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        if len(arrays) != len(self.free):
            raise ValueError(f"the bound kernel takes {len(self.free)} input(s), got {len(arrays)}")
        shapes = dict(zip(("in0", "in1"), self.problem.input_shapes))
        views = dict(zip(("in0", "in1"), self.bound.kernel.problem.input_shapes))
        for array, tensor in zip(arrays, self.free):
            Kernel._check(array, _WHAT[tensor], shapes[tensor], self.bound.kernel.storage)
        return self.bound(*(a.reshape(views[t]) for a, t in zip(arrays, self.free))).reshape(self.problem.output_shape)

    def __getattr__(self, name: str):
        if name == "bound":
            raise AttributeError(name)
        return getattr(self.bound, name)


def compile(nest: LoopNest, target: Target | str | None = None, threads: int = 1, *,  # noqa: A001 - public API name
            runtime_rows: bool = False) -> Kernel:
    """Generate LLVM IR for ``nest`` and JIT-compile it for ``target``: a
    :class:`~looprl.target.Target`, a target name (``"avx512"``, ``"avx2"``,
    ``"sse4"``, ``"host"``) or None for the default target (this host's unless
    ``LOOPRL_TARGET`` names another, :meth:`~looprl.target.Target.default`). A target this host cannot run is refused
    with a ValueError naming the missing CPU features, before anything is compiled.
    ``threads`` (1 to the cores this process may use) is the kernel's default thread count
    for the schedule's parallel loops (:meth:`LoopNest.parallel`).

    ``runtime_rows=True``: one kernel for every row count from 1 to the problem's (see
    :class:`Kernel`); a ValueError where the problem has no rows to cut short
    (:attr:`~looprl.ir.problem.Problem.row_dim`), the schedule converts the first input to a
    layout, or the specialised copies of the nest would be too many
    (:data:`looprl.backend.loops.SWITCH_LIMIT`). IR compiled before for ``target`` whose code
    is still alive is not compiled again (:mod:`looprl.backend.jit`)."""
    if not isinstance(nest, LoopNest):
        raise ValueError(f"compile() expects a LoopNest, got {type(nest).__name__}")
    if not isinstance(runtime_rows, bool):
        raise ValueError(f"runtime_rows must be True or False, got {runtime_rows!r}")
    if target is not None and not isinstance(target, (Target, str)):
        raise ValueError(f"compile() expects target to be a looprl Target, a target name or None, got {type(target).__name__} {target!r}")
    threads = check_threads(threads)
    target = Target.resolve(target)
    target.check_runs_on_host()
    start = time.perf_counter()
    plan = plan_kernel(nest, target, runtime_rows)
    ir = codegen.kernel_ir(plan)
    if "@GOMP_parallel" in ir:
        ensure_openmp_runtime()
    module = CompiledModule(ir, abi.KERNEL_NAME, target, extra=plan.extra_entry_points)
    return Kernel(nest, plan, ir, module, time.perf_counter() - start, threads)
