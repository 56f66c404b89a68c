"""The kernel plan: what the code generator decides about one schedule's kernel for one target,
decided once, before any IR is emitted, from the nest and the target. Every emitter (the
compute and write-back nests, the entry points, the packing functions) and the compiled
:class:`~looprl.backend.kernel.Kernel` read the plan; none of them sees the nest.

What it holds:

* the layouts the kernel stores tensors in: those of the nest its loops walk affinely
  (:func:`~looprl.backend.layout_plan.layouts_applied`) and the second input's pairs where the
  kernel takes the reduction two indices at a time (:mod:`looprl.backend.pairs`);
* the register plan of the compute nest (:class:`~looprl.backend.register_plan.RegisterScope`:
  the vectorised loop, the register scope, its blocks);
* the stages the kernel carries out (:class:`Stage`): a stage step of input ``tensor`` at
  compute loop ``level`` copies, on entry to each iteration of that loop (the full ones and
  the tail one), the block of the tensor the loops inside read into a buffer in the workspace,
  laid out as the tensor's kernel layout restricted to a full block
  (:meth:`Layout.block <looprl.ir.layout.Layout.block>`: a tail iteration copies only its valid
  extent and keeps the full block's strides); the loops inside address the buffer at
  block-local indices, the loops outside the tensor itself, row-major, and the tensor is not
  converted whole. The kernel carries out a stage only where the loop is outside the register
  scope (the block is copied between runtime loops, never inside the unrolled tile); elsewhere
  the stage is inert. A stage at or inside the compute nest's parallel loop is *private*
  (:attr:`Stage.private`): every thread of the team copies the blocks its own iterations read
  into its own buffer and reads only that one; a stage outside the parallel loop is copied by
  the calling thread between teams, whose threads only read it;
* the prefetches the kernel issues (:class:`Prefetch`): a prefetch step of input ``tensor``
  at compute loop ``level`` prefetches, on entry to each iteration of that loop (full or tail,
  in a runtime loop or unrolled inside the register scope), every 64-byte span of the block of
  the tensor that the iteration reads (as the kernel addresses it: through its kernel layout,
  from the iteration's first element) ``ahead`` bytes further on; a block with a dynamic extent
  (runtime rows) is prefetched at its largest. A kernel without prefetch steps is the kernel it
  was before they existed, to the byte;
* the split reduction (:attr:`KernelPlan.ksplit`): where the compute nest's parallel loop walks
  a reduction dimension (:meth:`LoopNest.ksplit <looprl.ir.nest.LoopNest.ksplit>`), each thread
  of its team sums into a partial accumulator of its own (``partial`` in the workspace, a private
  buffer: :mod:`looprl.backend.partials` zeroes them first and adds them into the accumulator
  after the compute nest, before the write-back nest applies the epilogue); such a kernel never
  stores the output from its register scope (:attr:`KernelPlan.direct`);
* the workspace: the accumulator, then each input packed whole or staged block by block (the
  shared buffers first, then the private ones: the partial accumulator, then the private stage
  buffers), at 64-byte aligned offsets; the private buffers of thread ``t`` lie
  ``t * thread_stride`` floats after thread 0's (:meth:`KernelPlan.workspace_for`: the workspace
  of a team);
* the calling convention's facts: the pointer arguments (:func:`~looprl.backend.abi.kernel_tensors`),
  the inputs packed on entry, the dimension whose extent is an argument (runtime rows), whether
  the kernel takes a thread count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from looprl.backend.abi import bound_kernel_name, bound_subsets, kernel_tensors, pack_function_name
from looprl.backend.loops import RuntimeRowsUnsupported
from looprl.backend.pairs import Pairing, kernel_pairing, reads_dot_pairs
from looprl.backend.register_plan import RegisterScope
from looprl.ir.layout import Layout
from looprl.ir.nest import Loop, LoopNest
from looprl.ir.nest_layouts import stage_buffers
from looprl.ir.problem import Problem
from looprl.target import Target


@dataclass(frozen=True)
class Stage:
    """A stage the kernel carries out: ``tensor``'s blocks copied at compute loop ``level``
    into a buffer of layout ``block`` (the full block's extents); ``private``: the loop is at or
    inside the parallel loop, and each thread of its team copies into a buffer of its own
    (:attr:`KernelPlan.thread_stride` floats after the previous thread's)."""

    tensor: str
    level: int
    block: Layout
    private: bool = False

    @property
    def pointer(self) -> str:
        """The name of the buffer's pointer among the kernel's internal pointers."""
        return f"stage_{self.tensor}"


@dataclass(frozen=True)
class Prefetch:
    """A prefetch the kernel issues: at each iteration of compute loop ``level``, the lines of
    ``tensor``'s block that the iteration reads, prefetched ``ahead`` bytes further on."""

    tensor: str
    level: int
    ahead: int


@dataclass(frozen=True, eq=False)
class KernelPlan:
    """The code generator's decisions for one kernel (see the module docstring); made by
    :func:`plan_kernel`."""

    problem: Problem
    target: Target
    compute: tuple[Loop, ...]  # the compute nest's loops, outermost first
    write_back: tuple[Loop, ...]  # the write-back nest's loops
    layouts: Mapping[str, Layout]  # tensor -> the layout the kernel stores it in (``out``: the accumulator's)
    pairing: Pairing | None  # how the compute nest takes a bfloat16 reduction in pairs, if it does
    dot_pairs: bool  # a dot-product tile reads pairs of bfloat16 values per lane (vdpbf16ps)
    registers: RegisterScope  # the compute nest's register plan
    stages: Mapping[str, Stage]  # input -> the stage the kernel carries out
    # acc and each packed or staged input -> (offset, float32 elements); a private stage's: thread 0's buffer
    workspace: Mapping[str, tuple[int, int]]
    thread_stride: int  # float32 elements between two threads' private buffers (0: none)
    stage_team: int  # the most threads with private buffers at once: the parallel loop's iterations (1: no private buffer)
    tensors: tuple[str, ...]  # the entry points' pointer arguments in order
    packed: tuple[str, ...]  # the inputs converted whole to their layouts on entry
    elements: Mapping[str, str]  # pointer -> the LLVM element type it addresses (tensors and stage buffers)
    rows: str | None  # the dimension whose extent is an argument (runtime rows), if any
    threaded: bool  # a loop is parallel: the entry points take the thread count
    prefetches: tuple[Prefetch, ...] = ()  # the prefetch steps, outermost loop first
    ksplit: int | None = None  # the compute loop (over a reduction) whose threads sum into partial accumulators, if any

    @property
    def direct(self) -> bool:
        """Whether the compute nest stores the output itself, its epilogue applied in registers:
        every reduction loop inside the register scope (each output element summed in registers
        and stored once), a row-major output and no split reduction; else a write-back nest copies
        the accumulator."""
        return self.registers.plan.zero_init and "out" not in self.layouts and self.ksplit is None

    @property
    def has_body(self) -> bool:
        """Whether the kernel's body is an internal function that entry points call after
        converting inputs (a kernel with layouts or stages), rather than the entry point itself."""
        return bool(self.layouts or self.stages)

    @property
    def buffers(self) -> tuple[str, ...]:
        """The stage buffers' pointers, which the kernel's internal functions take after its tensors."""
        return tuple(stage.pointer for stage in self.stages.values())

    @property
    def workspace_elements(self) -> int:
        """float32 elements of workspace the kernel needs on one thread."""
        return max(offset + count for offset, count in self.workspace.values())

    def workspace_for(self, threads: int) -> int:
        """float32 elements of workspace the kernel needs on a team of ``threads`` (a team never
        outnumbers the parallel loop's iterations: :attr:`stage_team`): one thread's, plus a
        copy of the private stage buffers per further thread."""
        return self.workspace_elements + (min(threads, self.stage_team) - 1) * self.thread_stride

    @property
    def private_strides(self) -> dict[str, int]:
        """Each private buffer's pointer -> elements (of its own type) between two threads'
        copies: the private stage buffers', and the accumulator's where the threads sum into
        partial ones (the compute nest then addresses thread 0's as ``acc``)."""
        per_float = 4 // self.problem.element_bytes
        strides = {"acc": self.thread_stride} if self.ksplit is not None else {}
        return {**strides, **{stage.pointer: self.thread_stride * per_float for stage in self.stages.values() if stage.private}}

    @property
    def extra_entry_points(self) -> tuple[str, ...]:
        """The functions besides the kernel a caller looks up: the packing functions and the
        entries that take packed inputs."""
        return tuple(pack_function_name(t) for t in self.packed) + tuple(bound_kernel_name(s) for s in bound_subsets(self.packed))


def tensor_elements(nest: LoopNest) -> dict[str, str]:
    """The LLVM element type of each of the kernel body's pointer arguments: the problem's
    dtype's for its tensors (an input converted to a layout keeps it), its accumulation type's
    (float32) for the workspace (the accumulator)."""
    dtype = nest.problem.dtype
    return {t: dtype.accumulator.llvm_element if t == "acc" else dtype.llvm_element for t in kernel_tensors(nest.problem)}


def plan_kernel(nest: LoopNest, target: Target, runtime_rows: bool = False) -> KernelPlan:
    """The plan of the kernel of ``nest`` for ``target``. With ``runtime_rows`` the kernel takes
    the extent of the problem's :attr:`~looprl.ir.problem.Problem.row_dim` as an argument: a
    ValueError where there is none, :class:`~looprl.backend.loops.RuntimeRowsUnsupported` where
    the first input is converted to a layout (its conversion covers every row) or a stage step
    is present.

    The nest's facts are read first, in one descent to the IR (the pointers' element types, the
    layouts and the pairing: :func:`~looprl.backend.pairs.kernel_pairing`, the stage buffers'
    layouts: :func:`~looprl.ir.nest_layouts.stage_buffers`); the register plan, runtime rows,
    stages and workspace are then decided from them, and no emitter goes back to the nest."""
    problem = nest.problem
    elements = tensor_elements(nest)
    layouts, paired = kernel_pairing(nest, target)
    buffers = stage_buffers(nest, layouts)
    registers = RegisterScope(nest, target, layouts)
    rows = _runtime_rows(nest, layouts) if runtime_rows else None
    stages = _stages(nest, buffers, registers.plan.scope_start)
    packed = tuple(t for t in ("in0", "in1") if t in layouts and t not in stages)
    private = tuple(t for t, stage in stages.items() if stage.private)
    ksplit = nest.split_reduction
    workspace, thread_stride = _workspace(problem, {**layouts, **{t: stage.block for t, stage in stages.items()}}, private,
                                          partial=ksplit is not None)
    team = next((lp.iterations for lp in nest.compute if lp.parallel), 1) if thread_stride else 1
    dot = reads_dot_pairs(problem.dtype, target, registers.plan)
    elements.update({stage.pointer: problem.dtype.llvm_element for stage in stages.values()})
    return KernelPlan(problem, target, nest.compute, nest.write_back, MappingProxyType(layouts), paired, dot,
                      registers, MappingProxyType(stages), MappingProxyType(workspace), thread_stride, team, kernel_tensors(problem),
                      packed, MappingProxyType(elements), rows, nest.is_parallel,
                      tuple(Prefetch(t, level, ahead) for level, lp in enumerate(nest.compute) for t, ahead in lp.prefetched), ksplit)


def _runtime_rows(nest: LoopNest, layouts: Mapping[str, Layout]) -> str:
    """The dimension a runtime-rows kernel of ``nest`` whose layouts are ``layouts`` takes the
    extent of (see :func:`plan_kernel`)."""
    rows = nest.problem.row_dim
    if rows is None:
        raise ValueError(f"{nest.problem.name}: runtime rows need the output's leading dimension to lead the first input "
                         "and not be in the second")
    if "in0" in layouts:
        raise RuntimeRowsUnsupported(f"{nest.problem.name}: runtime rows need the first input in its own layout, "
                                     "but this schedule converts it")
    if any(lp.staged for lp in nest.compute):
        raise RuntimeRowsUnsupported(f"{nest.problem.name}: runtime rows are not given to a schedule with a stage step")
    return rows


def _stages(nest: LoopNest, buffers: Mapping[tuple[int, str], Layout], scope_start: int) -> dict[str, Stage]:
    """The stages the kernel carries out (see the module docstring), by tensor, given the
    layouts of the stage steps' ``buffers`` (by compute loop and tensor) and the first loop of
    its register scope."""
    found = {}
    for (level, tensor), block in buffers.items():
        if level < scope_start:
            private = any(lp.parallel for lp in nest.compute[: level + 1])
            found[tensor] = Stage(tensor, level, block, private)
    return found


def _round_up(count: int, multiple: int = 16) -> int:  # 16 floats: 64-byte alignment
    return -(-count // multiple) * multiple


def _workspace(problem: Problem, layouts: dict[str, Layout], private: tuple[str, ...] = (),
               partial: bool = False) -> tuple[dict[str, tuple[int, int]], int]:
    """Where the kernel's scratch buffers sit in its (float32) workspace: tensor -> (offset,
    float32 elements) for the accumulator ``acc`` (float32) and each input in ``layouts`` (the
    kernel's layouts, a staged input's being its buffer's; in the problem's dtype: a bfloat16
    input takes half as many), the private buffers last (thread 0's: with ``partial``, its
    partial accumulator ``partial``, the accumulator's size, then the inputs in ``private``, the
    private stages); and the float32 elements from thread 0's private buffers to thread 1's (0
    without any). Offsets are 64-byte aligned."""
    acc = layouts["out"].elements if "out" in layouts else math.prod(problem.output_shape)
    result, offset = {"acc": (0, acc)}, _round_up(acc)
    shared = [t for t in ("in0", "in1") if t in layouts and t not in private]
    for tensor in shared:
        floats = -(-layouts[tensor].elements * problem.element_bytes // 4)
        result[tensor] = (offset, floats)
        offset = _round_up(offset + floats)
    start = offset
    if partial:
        result["partial"] = (offset, acc)
        offset = _round_up(offset + acc)
    for tensor in (t for t in ("in0", "in1") if t in private):
        floats = -(-layouts[tensor].elements * problem.element_bytes // 4)
        result[tensor] = (offset, floats)
        offset = _round_up(offset + floats)
    return result, offset - start
