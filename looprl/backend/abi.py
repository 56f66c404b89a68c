"""The kernel's calling convention: its entry points, their names and pointer arguments.

``void looprl_kernel(in0, in1, out, acc[, bias][, residual], i64 reps[, i32 nthreads])``: the
epilogue's inputs follow the accumulator when the problem has them (:func:`kernel_tensors`);
``nthreads`` follows ``reps`` when the schedule has a parallel loop. ``acc`` is scratch space
(the accumulator, then the packed inputs: :func:`looprl.backend.layout_plan.workspace_layout`);
``reps`` >= 1 repeats the whole computation (for timing), packing included. A kernel compiled
with runtime rows takes ``i64 rows`` after ``reps`` (:func:`looprl.backend.codegen.generate_ir`). When inputs have
layouts the kernel's body is an internal function, and the module also defines
``looprl_pack_<in0|in1>(src, dst)`` and one ``looprl_kernel_bound_<inputs>`` entry per
non-empty set of packed inputs, which takes those inputs already packed."""

from __future__ import annotations

from looprl.backend.layout_plan import workspace_layout
from looprl.backend.pairs import kernel_layouts
from looprl.backend.llvm_text import Function
from looprl.backend.loops import KernelModule
from looprl.backend.packing import emit_pack
from looprl.backend.stages import kernel_stages, staged_layouts
from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem
from looprl.target import Target

KERNEL_NAME = "looprl_kernel"
BODY_NAME = "looprl_body"  # the kernel's body when its entry points pack inputs first
TENSORS = ("in0", "in1", "out", "acc")
EPILOGUE_TENSORS = {"bias": "bias", "residual": "residual"}  # epilogue input -> IR pointer name


def kernel_tensors(problem: Problem) -> tuple[str, ...]:
    """The kernel's pointer arguments in order: :data:`TENSORS`, then the epilogue's inputs
    (``bias``, ``residual``) when the problem has them."""
    return TENSORS + tuple(EPILOGUE_TENSORS[name] for name in problem.epilogue.inputs)


def packed_inputs(nest: LoopNest, target: Target) -> tuple[str, ...]:
    """The inputs the kernel of ``nest`` for ``target`` stores in their layouts (packs on entry):
    those it stages block by block instead (:func:`looprl.backend.stages.kernel_stages`) are not."""
    applied = kernel_layouts(nest, target)
    staged = kernel_stages(nest, target)
    return tuple(t for t in ("in0", "in1") if t in applied and t not in staged)


def bound_subsets(packed: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The non-empty sets of ``packed`` inputs that have an entry point taking them packed."""
    return [(t,) for t in packed] + ([tuple(packed)] if len(packed) == 2 else [])


def bound_kernel_name(tensors) -> str:
    """Entry point of the kernel whose inputs ``tensors`` arrive already packed."""
    return KERNEL_NAME + "_bound_" + "_".join(sorted(tensors))


def pack_function_name(tensor: str) -> str:
    return f"looprl_pack_{tensor}"


def extra_entry_points(nest: LoopNest, target: Target) -> tuple[str, ...]:
    """The functions besides :data:`KERNEL_NAME` a caller looks up: packing functions and the
    entries that take packed inputs."""
    packed = packed_inputs(nest, target)
    return tuple(pack_function_name(t) for t in packed) + tuple(bound_kernel_name(s) for s in bound_subsets(packed))


def entry_function(module: KernelModule, name: str) -> Function:
    """A new entry point ``name`` taking the kernel's arguments (added to ``module``)."""
    params = ", ".join(f"ptr noalias %{t}" for t in module.tensors)
    rows = ", i64 %dyn" if module.runtime_rows else ""
    threads = ", i32 %nthreads" if module.threaded else ""
    return module.function(f"define void @{name}({params}, i64 %reps{rows}{threads}) nounwind {{")


def body_function(module: KernelModule) -> Function:
    """The kernel's body as an internal function that the entry points call (added to ``module``)."""
    return module.function(f"define internal void @{BODY_NAME}({module.parameters()}) nounwind {{")


def emit_packing_entry_points(module: KernelModule, nest: LoopNest) -> None:
    """The packing functions and the entry points of a kernel whose body is :data:`BODY_NAME`:
    each packs the inputs it does not take packed into the workspace, then runs the body, ``reps``
    times, handing it the places of the stage buffers in the workspace too."""
    applied = kernel_layouts(nest, module.target)
    packed = packed_inputs(nest, module.target)
    places = workspace_layout(nest, applied, staged_layouts(nest, module.target))
    for tensor in packed:
        index = nest.tensor_index(tensor)
        emit_pack(module, pack_function_name(tensor), index, nest.problem.shape(index), applied[tensor],
                  nest.problem.dtype.llvm_element)
    for bound in [()] + bound_subsets(packed):
        entry = entry_function(module, bound_kernel_name(bound) if bound else KERNEL_NAME)
        pointers = {t: f"%{t}" for t in module.tensors}
        for stage in kernel_stages(nest, module.target).values():  # the stage buffers
            pointers[stage.pointer] = entry.offset("%acc", places[stage.tensor][0])
        for tensor in packed:
            if tensor not in bound:
                pointers[tensor] = entry.offset("%acc", places[tensor][0])
        with entry.loop("%reps"):
            for tensor in packed:
                if tensor not in bound:
                    entry.emit(f"call void @{pack_function_name(tensor)}(ptr %{tensor}, ptr {pointers[tensor]})")
            entry.emit(f"call void @{BODY_NAME}({module.arguments(pointers, '%dyn')})")
        entry.close()
