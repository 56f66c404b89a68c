"""LLVM IR for a :class:`~looprl.nest.LoopNest`, emitted as text, LoopNest-style.

The loop order is taken as given. In the compute nest:

* the innermost loop is vectorised when it walks the output's last (unit-stride) dimension:
  its elements become vectors of the target's width, the last one masked;
* a *register scope* is the largest suffix of the nest whose output tile (in vectors, or
  scalars when nothing vectorises) fits in the target's register file; the tile is loaded
  once before the scope, kept in SSA values (phis across runtime loops) and stored once
  after it;
* when the tile that would keep a reduction loop in registers just misses the register
  file, the scope still reaches out to that reduction loop and the tile is *register-blocked*:
  split into rows x vectors blocks that each fit (with their live inputs) and give enough
  independent accumulators to hide the multiply-add latency; each block runs the scope's
  reduction loops with its accumulators in registers (the other output elements' order of
  accumulation is unchanged, so the results are the same);
* inside the scope, loops over output dimensions are unrolled (register indices must be
  static) and reduction loops are unrolled while the unrolled body stays under a bound;
* outside the scope every loop is a runtime loop; tail iterations call small internal
  functions specialised on the remaining sizes (memoised, so tails never multiply the code);
* when even the innermost vectorised loop does not fit and no reduction loop can be brought
  into a blocked scope, it streams vector by vector through memory;
* targets without FMA instructions multiply, then add (``llvm.fma`` would become a libcall);
* a *parallel* loop (at most one per nest: :meth:`~looprl.ir.nest.LoopNest.parallel`) is a
  runtime loop outside the register scope (the scope starts below it): its body is outlined
  into a function that the OpenMP runtime runs on every thread of a team
  (``GOMP_parallel``, see :mod:`looprl.backend.threads`), each thread taking a contiguous
  share of the iterations, the tail iteration included, balanced by elements. Each output
  element is still summed in the serial order, so results are bit-identical to the serial
  kernel's (except for a dot-product scope cut by a parallel loop inside a reduction loop: its
  partial sums are added across per iteration of that loop, within float32 rounding). A kernel with a parallel loop takes the thread count as an extra ``i32``
  argument; on one thread it calls the outlined body directly;
* a *stage* (:meth:`~looprl.ir.nest.LoopNest.stage`) of an input at a runtime loop copies, on
  entry to each of its iterations, the block of the input the loops inside read into a
  workspace buffer (in the input's layout restricted to the block; a tail iteration copies
  only its valid extent), and those loops read the buffer: :mod:`looprl.backend.stages`.

The write-back nest copies the accumulator to the output and applies the problem's epilogue
(scale, bias, activation, residual: :mod:`looprl.backend.epilogue_ir`) on the way, vectorised
like the copy; the bias and the residual are extra pointer arguments of the kernel after the
accumulator (:func:`kernel_tensors`).

Every number that depends on the CPU (lanes, registers, FMA) and what fits the register file
come from the :class:`~looprl.target.Target`.

The parts, each a module of :mod:`looprl.backend`: ``llvm_text`` (the text-IR builder),
``register_plan`` (the register scope and blocks), ``loops`` (runtime loops, tails, parallel
regions, stage copies), ``compute`` (the register scope's code), ``write_back``, ``layouts`` (which layouts
apply, the workspace), ``stages`` (which stages the kernel carries out), ``packing`` and ``abi`` (entry points). This module puts them together.

No LLVM IR passes run: the IR is already vectorised and in SSA form, so only the backend's
code generation is needed (fast, and it avoids the O3 pipeline's memory leak).
"""

from __future__ import annotations

from looprl.backend.abi import KERNEL_NAME, body_function, emit_packing_entry_points, entry_function, kernel_tensors
from looprl.backend.compute import ComputeEmitter
from looprl.backend.layout_plan import layouts_applied, workspace_layout
from looprl.backend.loops import Dynamic, KernelModule, RuntimeRowsUnsupported
from looprl.backend.pairs import kernel_layouts, pairing
from looprl.backend.stages import kernel_stages
from looprl.backend.write_back import WriteBackEmitter
from looprl.ir.nest import LoopNest
from looprl.target import Target

# Bump whenever the code generated for an existing schedule key may change speed: it is part of
# the measurement cache key. (Data layouts did not bump it: a schedule without layouts has the
# same key and byte-identical IR as before, and schedules with layouts have new keys.)
CODEGEN_VERSION = 7  # 7: an innermost loop over a reduction both inputs store contiguously vectorises (dot products: partial sums added across at the store); 6: a register scope over the whole reduction stores the output directly, epilogue applied (no write-back pass); 5: packs that transpose move 8x8 blocks through registers; 4: the register-blocking bound counts floats (AVX2 and SSE4 code changed); 3 was an earlier layouts commit


def check_runtime_rows(nest: LoopNest) -> str:
    """The dimension a runtime-rows kernel of ``nest`` takes the extent of as an argument (the
    problem's :attr:`~looprl.ir.problem.Problem.row_dim`); a ValueError where there is none or
    the first input is converted to a layout (its conversion covers every row)."""
    rows = nest.problem.row_dim
    if rows is None:
        raise ValueError(f"{nest.problem.name}: runtime rows need the output's leading dimension to lead the first input "
                         "and not be in the second")
    if "in0" in layouts_applied(nest):
        raise RuntimeRowsUnsupported(f"{nest.problem.name}: runtime rows need the first input in its own layout, "
                                     "but this schedule converts it")
    if any(lp.staged for lp in nest.compute):
        raise RuntimeRowsUnsupported(f"{nest.problem.name}: runtime rows are not given to a schedule with a stage step")
    return rows


def tensor_elements(nest: LoopNest) -> dict[str, str]:
    """The LLVM element type of each of the kernel body's pointer arguments: the problem's
    dtype's for its tensors (an input converted to a layout keeps it), its accumulation type's
    (float32) for the workspace (the accumulator)."""
    dtype = nest.problem.dtype
    return {t: dtype.accumulator.llvm_element if t == "acc" else dtype.llvm_element for t in kernel_tensors(nest.problem)}


def generate_ir(nest: LoopNest, target: Target, runtime_rows: bool = False) -> str:
    """LLVM IR text of the kernel of ``nest`` for ``target``, with the entry points of
    :mod:`looprl.backend.abi`. With ``runtime_rows`` the entry points take the row count
    (1 to the problem's; :func:`check_runtime_rows`) after ``reps``: the kernel reads and writes
    only that many leading rows, the loops over them specialised by their remainders
    (:class:`~looprl.backend.loops.Dynamic`); :class:`~looprl.backend.loops.RuntimeRowsUnsupported`
    where that would take too many specialised copies."""
    rows = check_runtime_rows(nest) if runtime_rows else None
    applied = kernel_layouts(nest, target)
    stages = kernel_stages(nest, target)
    buffers = tuple(stage.pointer for stage in stages.values())
    elements = {**tensor_elements(nest), **{b: nest.problem.dtype.llvm_element for b in buffers}}
    module = KernelModule(target, kernel_tensors(nest.problem), threaded=nest.is_parallel, runtime_rows=runtime_rows,
                          elements=elements, buffers=buffers)
    compute = ComputeEmitter(module, nest, applied, pairing(nest, target), stages)
    write_back = WriteBackEmitter(module, nest, applied)
    fn = body_function(module) if applied or stages else entry_function(module, KERNEL_NAME)
    output_bytes = 4 * workspace_layout(nest, applied)["acc"][1]
    if rows is not None and "out" not in applied:  # a row-major accumulator: only the rows computed
        row_bytes = output_bytes // nest.problem.size(rows)
        output_bytes = None

    def budgets(emitter) -> dict:
        found = dict(emitter.entry_budgets(0))
        if rows is not None and rows in found:
            found[rows] = Dynamic("%dyn", found[rows])
        return found

    def body() -> None:
        if not compute.plan.zero_init:
            module.declarations["llvm.memset"] = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
            size = output_bytes if output_bytes is not None else fn.value(f"mul i64 %dyn, {row_bytes}", "bytes")
            fn.emit(f"call void @llvm.memset.p0.i64(ptr align 4 %acc, i8 0, i64 {size}, i1 false)")
        compute.emit_outer(fn, 0, budgets(compute), {t: f"%{t}" for t in compute.coefs})
        if not compute.direct:  # else the compute nest stored the output itself
            write_back.emit_outer(fn, 0, budgets(write_back), {t: f"%{t}" for t in write_back.coefs})

    if applied or stages:
        body()
        fn.close()
        emit_packing_entry_points(module, nest)
    else:
        with fn.loop("%reps"):
            body()
        fn.close()
    return module.text()
