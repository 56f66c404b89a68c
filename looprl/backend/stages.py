"""Which stage steps (:meth:`LoopNest.stage <looprl.ir.nest.LoopNest.stage>`) a kernel carries
out, and the buffers they copy into. No IR is emitted here.

A stage of input ``tensor`` at compute loop ``level`` copies, on entry to each iteration of that
loop (the full ones and the tail one), the block of the tensor the loops inside read into a
buffer in the workspace, laid out as the tensor's kernel layout restricted to a full block
(:meth:`Layout.block <looprl.ir.layout.Layout.block>`: a tail iteration copies only its valid
extent and keeps the full block's strides); the loops inside address the buffer at block-local
indices, the loops outside the tensor itself, row-major. The tensor is then not converted whole.

The kernel carries out a stage only where the loop is outside the register scope (the block is
copied between runtime loops, never inside the unrolled tile) and no parallel loop is at or
outside it (one buffer, one thread); elsewhere the stage is inert and the tensor is treated as
without it (converted whole where its layout applies). The register plan is the one of the same
schedule without the stage: the block's layout has the tensor layout's unit strides.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from looprl.backend.pairs import kernel_layouts
from looprl.backend.register_plan import RegisterScope
from looprl.ir.layout import Layout
from looprl.ir.nest import LoopNest
from looprl.target import Target


@dataclass(frozen=True)
class Stage:
    """A stage the kernel carries out: ``tensor``'s blocks copied at compute loop ``level``
    into a buffer of layout ``block`` (the full block's extents)."""

    tensor: str
    level: int
    block: Layout

    @property
    def pointer(self) -> str:
        """The name of the buffer's pointer among the kernel's internal pointers."""
        return f"stage_{self.tensor}"


@lru_cache(maxsize=4096)
def kernel_stages(nest: LoopNest, target: Target) -> dict[str, Stage]:
    """The stages the kernel of ``nest`` for ``target`` carries out (see the module docstring),
    by tensor. Do not mutate the result (it is cached)."""
    found = {}
    marked = [(t, i) for i, lp in enumerate(nest.compute) for t in lp.staged]
    if not marked:
        return found
    layouts = kernel_layouts(nest, target)
    start = RegisterScope(nest, target, layouts).plan.scope_start
    for tensor, level in marked:
        if level >= start or any(lp.parallel for lp in nest.compute[: level + 1]):
            continue
        index = nest.tensor_index(tensor)
        layout = layouts.get(tensor) or Layout.row_major(index, nest.problem.shape(index))
        found[tensor] = Stage(tensor, level, layout.block(nest.stage_block(level, tensor)))
    return found


def staged_layouts(nest: LoopNest, target: Target) -> dict[str, Layout]:
    """tensor -> the layout of its stage's buffer, for the stages the kernel carries out."""
    return {t: stage.block for t, stage in kernel_stages(nest, target).items()}
