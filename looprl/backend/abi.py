"""The kernel's calling convention: its entry points' names and pointer arguments.

``void looprl_kernel(in0, in1, out, acc[, bias][, residual], i64 reps[, i32 nthreads])``: the
epilogue's inputs follow the accumulator when the problem has them (:func:`kernel_tensors`);
``nthreads`` follows ``reps`` when the schedule has a parallel loop. ``acc`` is scratch space
(the accumulator, then the packed inputs: :attr:`KernelPlan.workspace
<looprl.backend.kernel_plan.KernelPlan.workspace>`); ``reps`` >= 1 repeats the whole
computation (for timing), packing included. A kernel compiled with runtime rows takes
``i64 rows`` after ``reps`` (:func:`looprl.backend.codegen.generate_ir`). When inputs have
layouts the kernel's body is an internal function, and the module also defines
``looprl_pack_<in0|in1>(src, dst)`` and one ``looprl_kernel_bound_<inputs>`` entry per
non-empty set of packed inputs, which takes those inputs already packed (emitted by
:func:`looprl.backend.codegen.emit_entry_points`)."""

from __future__ import annotations

from looprl.ir.problem import Problem

KERNEL_NAME = "looprl_kernel"
BODY_NAME = "looprl_body"  # the kernel's body when its entry points pack inputs first
TENSORS = ("in0", "in1", "out", "acc")
EPILOGUE_TENSORS = {"bias": "bias", "residual": "residual"}  # epilogue input -> IR pointer name


def kernel_tensors(problem: Problem) -> tuple[str, ...]:
    """The kernel's pointer arguments in order: :data:`TENSORS`, then the epilogue's inputs
    (``bias``, ``residual``) when the problem has them."""
    return TENSORS + tuple(EPILOGUE_TENSORS[name] for name in problem.epilogue.inputs)


def bound_subsets(packed: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The non-empty sets of ``packed`` inputs that have an entry point taking them packed."""
    return [(t,) for t in packed] + ([tuple(packed)] if len(packed) == 2 else [])


def bound_kernel_name(tensors) -> str:
    """Entry point of the kernel whose inputs ``tensors`` arrive already packed."""
    return KERNEL_NAME + "_bound_" + "_".join(sorted(tensors))


def pack_function_name(tensor: str) -> str:
    return f"looprl_pack_{tensor}"
