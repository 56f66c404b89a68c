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
* a parallel loop over a reduction dimension (a split-k: :meth:`~looprl.ir.nest.LoopNest.ksplit`)
  is emitted the same way, each thread of its team summing into a partial accumulator of its own
  (a private buffer of the workspace); the calling thread zeroes the partials first and adds them
  into the accumulator once the teams have joined, and the write-back nest applies the epilogue
  to that sum (:mod:`looprl.backend.partials`);
* a *stage* (:meth:`~looprl.ir.nest.LoopNest.stage`) of an input at a runtime loop copies, on
  entry to each of its iterations, the block of the input the loops inside read into a
  workspace buffer (in the input's layout restricted to the block; a tail iteration copies
  only its valid extent), and those loops read the buffer: :class:`~looprl.backend.kernel_plan.Stage`.

The write-back nest copies the accumulator to the output and applies the problem's epilogue
(scale, bias, activation, residual: :mod:`looprl.backend.epilogue_ir`) on the way, vectorised
like the copy; the bias and the residual are extra pointer arguments of the kernel after the
accumulator (:func:`~looprl.backend.abi.kernel_tensors`).

Every number that depends on the CPU (lanes, registers, FMA) and what fits the register file
come from the :class:`~looprl.target.Target`.

Every decision about the kernel is taken first, once, in its plan (:mod:`looprl.backend.kernel_plan`:
the layouts, the pairs, the register plan, the stages, the workspace, the calling convention's
facts); the emitters read the plan: ``loops`` (runtime loops, tails, parallel regions, stage
copies), ``compute`` (the register scope's code), ``write_back``, ``packing`` (conversions to
layouts), all writing through ``llvm_text`` (the text-IR builder). This module puts them
together and emits the entry points (:mod:`looprl.backend.abi`).

No LLVM IR passes run: the IR is already vectorised and in SSA form, so only the backend's
code generation is needed (fast, and it avoids the O3 pipeline's memory leak).
"""

from __future__ import annotations

import math

from looprl.backend.abi import BODY_NAME, KERNEL_NAME, bound_kernel_name, bound_subsets, pack_function_name
from looprl.backend.compute import ComputeEmitter
from looprl.backend.kernel_plan import KernelPlan, plan_kernel
from looprl.backend.llvm_text import Function, emit_team
from looprl.backend.loops import Dynamic, KernelModule
from looprl.backend.packing import emit_pack, splits_in_parts
from looprl.backend.partials import partial_count, sum_partials, zero_partials
from looprl.backend.write_back import WriteBackEmitter
from looprl.ir.nest import LoopNest
from looprl.target import Target

# A threaded kernel packs a right operand of at least this many elements on its team, each thread
# a share of its rows (looprl.backend.packing, parted); a smaller one on the calling thread alone,
# where a parallel region's start (a few microseconds) would cost more than the share saves.
TEAM_PACK_ELEMENTS = 1 << 16

# Bump whenever the code generated for an existing schedule key may change speed: it is part of
# the measurement cache key. (Data layouts did not bump it: a schedule without layouts has the
# same key and byte-identical IR as before, and schedules with layouts have new keys.)
CODEGEN_VERSION = 9  # 9: a threaded kernel's team packs a large right operand together on entry; 8: a pack whose row sends its chunks to places apart (n-panels) copies 8 rows chunk by chunk; 7: an innermost loop over a reduction both inputs store contiguously vectorises (dot products: partial sums added across at the store); 6: a register scope over the whole reduction stores the output directly, epilogue applied (no write-back pass); 5: packs that transpose move 8x8 blocks through registers; 4: the register-blocking bound counts floats (AVX2 and SSE4 code changed); 3 was an earlier layouts commit


def generate_ir(nest: LoopNest, target: Target, runtime_rows: bool = False) -> str:
    """LLVM IR text of the kernel of ``nest`` for ``target`` (:func:`kernel_ir` of its
    :func:`~looprl.backend.kernel_plan.plan_kernel`). With ``runtime_rows`` the entry points take
    the row count (1 to the problem's) after ``reps``: the kernel reads and writes only that many
    leading rows, the loops over them specialised by their remainders
    (:class:`~looprl.backend.loops.Dynamic`); :class:`~looprl.backend.loops.RuntimeRowsUnsupported`
    where that would take too many specialised copies."""
    return kernel_ir(plan_kernel(nest, target, runtime_rows))


def kernel_ir(plan: KernelPlan) -> str:
    """LLVM IR text of the kernel ``plan`` describes, with the entry points of :mod:`looprl.backend.abi`."""
    rows = plan.rows
    module = KernelModule(plan.target, plan.tensors, threaded=plan.threaded, runtime_rows=rows is not None,
                          elements=dict(plan.elements), buffers=plan.buffers)
    compute = ComputeEmitter(module, plan)
    write_back = WriteBackEmitter(module, plan)
    fn = body_function(module) if plan.has_body else entry_function(module, KERNEL_NAME)
    output_bytes = 4 * plan.workspace["acc"][1]
    if rows is not None and "out" not in plan.layouts:  # a row-major accumulator: only the rows computed
        row_bytes = output_bytes // plan.problem.size(rows)
        output_bytes = None

    def budgets(emitter) -> dict:
        found = dict(emitter.entry_budgets(0))
        if rows is not None and rows in found:
            found[rows] = Dynamic("%dyn", found[rows])
        return found

    def body() -> None:
        pointers = {t: f"%{t}" for t in compute.coefs}
        if plan.ksplit is not None:  # the threads sum into partial accumulators, zeroed first
            partials = partial_count(fn, plan)
            pointers["acc"] = zero_partials(module, fn, plan, partials)
        elif not compute.plan.zero_init:
            module.declarations["llvm.memset"] = "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)"
            size = output_bytes if output_bytes is not None else fn.value(f"mul i64 %dyn, {row_bytes}", "bytes")
            fn.emit(f"call void @llvm.memset.p0.i64(ptr align 4 %acc, i8 0, i64 {size}, i1 false)")
        compute.emit_outer(fn, 0, budgets(compute), pointers)
        if plan.ksplit is not None:  # every team has joined: their sum, before the epilogue
            sum_partials(module, fn, plan, pointers["acc"], partials)
        if not plan.direct:  # else the compute nest stored the output itself
            write_back.emit_outer(fn, 0, budgets(write_back), {t: f"%{t}" for t in write_back.coefs})

    if plan.has_body:
        body()
        fn.close()
        emit_entry_points(module, plan)
    else:
        with fn.loop("%reps"):
            body()
        fn.close()
    return module.text()


def entry_function(module: KernelModule, name: str) -> Function:
    """A new entry point ``name`` taking the kernel's arguments (added to ``module``)."""
    params = ", ".join(f"ptr noalias %{t}" for t in module.tensors)
    rows = ", i64 %dyn" if module.runtime_rows else ""
    threads = ", i32 %nthreads" if module.threaded else ""
    return module.function(f"define void @{name}({params}, i64 %reps{rows}{threads}) nounwind {{")


def body_function(module: KernelModule) -> Function:
    """The kernel's body as an internal function that the entry points call (added to ``module``)."""
    return module.function(f"define internal void @{BODY_NAME}({module.parameters()}) nounwind {{")


def _pack_share(body, args: dict, thread: str) -> list[str]:
    """A team thread's call of a parted pack: its number among the team's threads."""
    team = body.value(f"zext i32 {body.value('call i32 @omp_get_num_threads()', 'n')} to i64", "n")
    return [f"ptr {args['src']}", f"ptr {args['dst']}", f"i64 {thread}", f"i64 {team}"]


def _call_pack_on_team(entry, name: str, src: str, dst: str) -> None:
    """Pack ``src`` into ``dst`` on the kernel's threads where it has more than one, else on
    this one."""
    many = entry.value("icmp ugt i32 %nthreads, 1", "many")
    team, alone, done = entry.label("packteam"), entry.label("packalone"), entry.label("packed")
    entry.emit(f"br i1 {many}, label %{team}, label %{alone}")
    entry.start_block(team)
    entry.emit(f"call void @{name}_team(ptr {src}, ptr {dst}, i32 %nthreads)")
    entry.emit(f"br label %{done}")
    entry.start_block(alone)
    entry.emit(f"call void @{name}(ptr {src}, ptr {dst})")
    entry.emit(f"br label %{done}")
    entry.start_block(done)


def emit_entry_points(module: KernelModule, plan: KernelPlan) -> None:
    """The packing functions and the entry points of a kernel whose body is :data:`BODY_NAME`:
    each packs the inputs it does not take packed into the workspace, then runs the body, ``reps``
    times, handing it the places of the stage buffers in the workspace too. A threaded kernel
    packs a right operand of :data:`TEAM_PACK_ELEMENTS` or more on its team (each thread a part,
    :func:`~looprl.backend.packing.emit_pack`'s ``parted``) when called on more than one thread:
    packed by the calling thread alone, it kept the team waiting (a 16 MiB operand, 3-5 ms of a
    two-thread call of about 29 ms on a Zen 3)."""
    problem, places = plan.problem, plan.workspace
    teams = set()  # the inputs a threaded kernel's team packs together
    for tensor, index in zip(("in0", "in1"), problem.operands):
        if tensor in plan.packed:
            name, shape, layout = pack_function_name(tensor), problem.shape(index), plan.layouts[tensor]
            emit_pack(module, name, index, shape, layout, problem.dtype.llvm_element)
            if (module.threaded and tensor == "in1" and math.prod(shape) >= TEAM_PACK_ELEMENTS
                    and splits_in_parts(index, shape, layout, module.target.vector_width)):
                emit_pack(module, f"{name}_part", index, shape, layout, problem.dtype.llvm_element, internal=True, parted=True)
                emit_team(module, f"{name}_team", f"{name}_part", [("ptr", "src"), ("ptr", "dst")], _pack_share)
                teams.add(tensor)
    for bound in [()] + bound_subsets(plan.packed):
        entry = entry_function(module, bound_kernel_name(bound) if bound else KERNEL_NAME)
        pointers = {t: f"%{t}" for t in module.tensors}
        for stage in plan.stages.values():  # the stage buffers
            pointers[stage.pointer] = entry.offset("%acc", places[stage.tensor][0])
        for tensor in plan.packed:
            if tensor not in bound:
                pointers[tensor] = entry.offset("%acc", places[tensor][0])
        with entry.loop("%reps"):
            for tensor in plan.packed:
                if tensor not in bound and tensor in teams:
                    _call_pack_on_team(entry, pack_function_name(tensor), f"%{tensor}", pointers[tensor])
                elif tensor not in bound:
                    entry.emit(f"call void @{pack_function_name(tensor)}(ptr %{tensor}, ptr {pointers[tensor]})")
            entry.emit(f"call void @{BODY_NAME}({module.arguments(pointers, '%dyn')})")
        entry.close()
