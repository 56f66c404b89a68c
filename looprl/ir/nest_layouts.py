"""The layout transforms of a schedule (:class:`LayoutSteps`, a part of
:class:`~looprl.ir.nest.LoopNest`): ALT's primitives on one tensor's layout (``layout_split``,
``layout_reorder``, ``layout_fuse``, ``layout_pad``, ``layout_pack``) and the layout steps
(:mod:`looprl.ir.step`) that name them at a loop: ``pack``, ``pad``, ``pair``, ``innermost``,
``stage``, ``prefetch``, each with its ``why_not_<op>``; and the layouts of a schedule's stage
buffers in a kernel (:func:`stage_buffers`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping

from looprl import checks, defaults
from looprl.ir.layout import Layout

if TYPE_CHECKING:
    from looprl.ir.nest import Loop, LoopNest

# The largest buffer a stage step copies a block into: a fixed bound, the same on every host (a
# B panel of 256 x 4096 floats, BLIS's k-block by an n-block sized for a shared last-level cache).
STAGE_MAX_BYTES = 4 << 20
# A prefetch step: one prefetch per cache line of LINE_BYTES (64 on every x86 core looprl
# targets), a distance of whole lines up to PREFETCH_MAX_BYTES ahead (a quarter of a 64 KB L1,
# far past any distance that pays: libraries prefetch a few hundred bytes to a few KB ahead),
# and at most PREFETCH_MAX_LINES prefetches per iteration of the loop that carries it (a block
# of up to 4 KB: more would be a burst of prefetches, not a stream kept ahead).
LINE_BYTES = 64
PREFETCH_MAX_BYTES = 16 << 10
PREFETCH_MAX_LINES = 64


def prefetch_refusal(ahead) -> str | None:
    """Why ``ahead`` is no prefetch distance (bytes: a positive multiple of :data:`LINE_BYTES`
    up to :data:`PREFETCH_MAX_BYTES`), or None."""
    if type(ahead) is not int or not 0 < ahead <= PREFETCH_MAX_BYTES or ahead % LINE_BYTES:
        return f"a prefetch distance is a positive multiple of {LINE_BYTES} bytes up to {PREFETCH_MAX_BYTES}, got {ahead!r:.40}"
    return None


def block_lines(offsets_by_dim, element_bytes: int, most: int = PREFETCH_MAX_LINES) -> tuple[int, ...] | None:
    """The cache lines (byte offsets of 64-byte spans, from the block's first element's
    address, ascending) that a block of a tensor covers: its elements lie at every sum of one
    offset (in elements) from each list of ``offsets_by_dim`` (a layout's offset is a sum of one
    part per dimension: :meth:`Layout.offset`); None where they would be more than ``most``."""
    count = 1
    for offsets in offsets_by_dim:
        count *= len(offsets)
    if count * element_bytes > most * LINE_BYTES:  # more elements than that many lines hold
        return None
    sums = {0}
    for offsets in offsets_by_dim:
        sums = {a + b for a in sums for b in offsets}
    lines = sorted({offset * element_bytes // LINE_BYTES for offset in sums})
    return tuple(line * LINE_BYTES for line in lines) if len(lines) <= most else None


def stage_buffers(nest: "LoopNest", layouts: Mapping[str, Layout]) -> dict[tuple[int, str], Layout]:
    """The layout of each stage step's buffer in ``nest``, by (compute loop, tensor): the
    tensor's layout in ``layouts`` (a kernel's; row-major where it has none) for the block one
    full iteration of the loop reads (:meth:`LayoutSteps.stage_block`, :meth:`Layout.block`)."""
    found = {}
    for level, loop in enumerate(nest.compute):
        for tensor in loop.staged:
            index = nest.tensor_index(tensor)
            layout = layouts.get(tensor) or Layout.row_major(index, nest.problem.shape(index))
            found[level, tensor] = layout.block(nest.stage_block(level, tensor))
    return found


class LayoutSteps:
    """The layout transforms of :class:`~looprl.ir.nest.LoopNest` (which supplies ``problem``,
    ``loops``, ``tensor_index``, ``layout`` and ``with_layout``)."""

    def layout_split(self, tensor: str, dim: int, factor: int) -> "LoopNest":
        return self.with_layout(tensor, self.layout(tensor).split(dim, factor))

    def layout_reorder(self, tensor: str, perm) -> "LoopNest":
        return self.with_layout(tensor, self.layout(tensor).reorder(perm))

    def layout_fuse(self, tensor: str, dim: int) -> "LoopNest":
        return self.with_layout(tensor, self.layout(tensor).fuse(dim))

    def layout_pad(self, tensor: str, dim: int, multiple: int) -> "LoopNest":
        return self.with_layout(tensor, self.layout(tensor).pad(dim, multiple))

    def layout_pack(self, tensor: str, var: str, step: int) -> "LoopNest":
        return self.with_layout(tensor, self.layout(tensor).pack(var, step))

    def why_not_layout(self, tensor: str, layout: Layout) -> str | None:
        """Why :meth:`with_layout` refuses ``layout`` for ``tensor`` (a layout of it), or None."""
        if layout.elements * self.problem.dtype.accumulator.element_bytes > defaults.MAX_BUFFER_BYTES:  # a layout's copy is workspace
            return (f"layout {layout.key!r} of {tensor} takes {layout.elements} floats, more than "
                    f"looprl.defaults.MAX_BUFFER_BYTES = {defaults.MAX_BUFFER_BYTES} bytes")
        return None

    def why_not_layout_pack(self, tensor: str, var: str, step: int) -> str | None:
        """Why :meth:`layout_pack` refuses, or None if it applies."""
        layout = self.layout(tensor)
        why = layout.why_not_pack(var, step)
        return why if why is not None else self.why_not_layout(tensor, layout.pack(var, step))

    def why_not_layout_pad(self, tensor: str, dim: int, multiple: int) -> str | None:
        """Why :meth:`layout_pad` refuses, or None if it applies."""
        layout = self.layout(tensor)
        why = layout.why_not_pad(dim, multiple)
        return why if why is not None else self.why_not_layout(tensor, layout.pad(dim, multiple))

    # -- layout steps (looprl.ir.step: pack, pad, pair, innermost at a loop) --------
    def pack(self, index: int, tensor: str, elements: int) -> "LoopNest":
        """Tile input ``tensor`` along compute loop ``index``'s dimension by ``elements``
        (:meth:`Layout.pack`: the new outer piece outermost, the tile innermost)."""
        why = self.why_not_pack(index, tensor, elements)
        if why is not None:
            raise ValueError(why)
        return self.layout_pack(tensor, self.loops[index].var, elements)

    def why_not_pack(self, index: int, tensor: str, elements: int) -> str | None:
        """Why :meth:`pack` refuses, or None if it applies."""
        loop = self._layout_loop(index, tensor, compute_only=True)
        if isinstance(loop, str):
            return loop
        return self.why_not_layout_pack(tensor, loop.var, checks.integer(elements, "pack tile"))

    def pad(self, index: int, tensor: str, multiple: int) -> "LoopNest":
        """Pad the physical dimension of ``tensor`` that holds loop ``index``'s dimension whole
        (its outer piece alone) to a multiple of ``multiple`` places."""
        why = self.why_not_pad(index, tensor, multiple)
        if why is not None:
            raise ValueError(why)
        return self.layout_pad(tensor, self.layout(tensor).outer_dim(self.loops[index].var), multiple)

    def why_not_pad(self, index: int, tensor: str, multiple: int) -> str | None:
        """Why :meth:`pad` refuses, or None: also where the dimension is the outermost one
        (padding it would change no stride) or fused with another."""
        loop = self._layout_loop(index, tensor, compute_only=False)
        if isinstance(loop, str):
            return loop
        dim = self.layout(tensor).outer_dim(loop.var)
        if not dim:
            where = "outermost" if dim == 0 else "fused with another"
            return f"cannot pad {loop.var!r} of {tensor}: its dimension is {where} in layout {self.layout(tensor).key!r}"
        return self.why_not_layout_pad(tensor, dim, checks.integer(multiple, "pad multiple"))

    def pair(self, index: int, tensor: str = "in1") -> "LoopNest":
        """Store the second input with the indices of compute loop ``index``'s reduction
        dimension two by two side by side (:meth:`Layout.paired`): what a bfloat16 kernel that
        takes that reduction in pairs loads (:mod:`looprl.backend.pairs`)."""
        why = self.why_not_pair(index, tensor)
        if why is not None:
            raise ValueError(why)
        return self.with_layout(tensor, self.layout(tensor).paired(self.loops[index].var))

    def why_not_pair(self, index: int, tensor: str = "in1") -> str | None:
        """Why :meth:`pair` refuses, or None: the problem's dtype must take products in pairs
        (bfloat16), the loop must walk a reduction dimension of the second input."""
        if tensor != "in1":
            return f"only the second input is paired, not {tensor!r}"
        loop = self._layout_loop(index, tensor, compute_only=True)
        if isinstance(loop, str):
            return loop
        if not self.problem.dtype.dot_pairs:
            return f"{self.problem.dtype.name} products are not taken in pairs"
        if loop.var not in self.problem.reduction_dims:
            return f"loop {index} walks {loop.var!r}, not a reduction dimension"
        paired = self.layout(tensor).paired(loop.var)
        if paired is None:
            return (f"the unit of {loop.var!r} in layout {self.layout(tensor).key!r} of {tensor} cannot be paired "
                    "(odd, padded or paired already)")
        return self.why_not_layout(tensor, paired)

    def innermost(self, index: int, tensor: str) -> "LoopNest":
        """Store input ``tensor`` (row-major) with loop ``index``'s dimension innermost."""
        why = self.why_not_innermost(index, tensor)
        if why is not None:
            raise ValueError(why)
        return self.with_layout(tensor, self.layout(tensor).innermost(self.loops[index].var))

    def why_not_innermost(self, index: int, tensor: str) -> str | None:
        """Why :meth:`innermost` refuses, or None if it applies."""
        loop = self._layout_loop(index, tensor, compute_only=True)
        if isinstance(loop, str):
            return loop
        why = self.layout(tensor).why_not_innermost(loop.var)
        return why if why is not None else self.why_not_layout(tensor, self.layout(tensor).innermost(loop.var))

    def _layout_loop(self, index: int, tensor: str, compute_only: bool) -> Loop | str:
        """Loop ``index``, which a layout step of ``tensor`` names, or why it cannot."""
        index = checks.integer(index, "loop index")
        if not 0 <= index < len(self):
            return f"loop index {index} out of range: the nest has {len(self)} loops"
        loop = self.loops[index]
        if compute_only and loop.is_write_back:
            return f"loop {index} ({loop.describe()}) is a write-back loop; a layout step names a compute loop"
        if loop.var not in self.tensor_index(tensor):
            return f"loop {index} walks {loop.var!r}, not a dimension of {tensor} ({self.tensor_index(tensor)})"
        return loop

    # -- stage: a block copied at a loop (looprl.ir.step) ---------------------------------
    def stage(self, index: int, tensor: str) -> "LoopNest":
        """Copy, at each iteration of compute loop ``index``, the block of input ``tensor`` the
        loops inside it read into a buffer (in the tensor's layout restricted to the block:
        :meth:`Layout.block`), which those loops read instead of the tensor. The loop carries
        the mark (``stage in1`` in the printed nest, ``+in1`` in the key); a split leaves it on
        the inner loop (the same blocks), a swap moves it with its loop."""
        why = self.why_not_stage(index, tensor)
        if why is not None:
            raise ValueError(why)
        loop = self.loops[index]
        return self._replace_range(index, index + 1, (replace(loop, staged=loop.staged + (tensor,)),))

    def why_not_stage(self, index: int, tensor: str) -> str | None:
        """Why :meth:`stage` refuses, or None. Refused: the output or a constant input (a
        constant weight is converted once when bound already); an input staged at some loop
        already; a write-back loop; a loop inside which no loop walks a dimension the tensor
        lacks (each copied element would be read once: nothing reuses the buffer); a block of
        more than :data:`STAGE_MAX_BYTES`. A parallel loop at or outside it is no reason: each
        thread of its team stages into a buffer of its own."""
        index = checks.integer(index, "loop index")
        if tensor not in ("in0", "in1"):
            return f"only an input is staged, not {tensor!r}"
        if not 0 <= index < len(self):
            return f"loop index {index} out of range: the nest has {len(self)} loops"
        loop = self.loops[index]
        if loop.is_write_back:
            return f"loop {index} ({loop.describe()}) is a write-back loop; a stage names a compute loop"
        if tensor in self.problem.constant:
            return f"{tensor} is constant: it is converted once when bound, not per call"
        if any(tensor in lp.staged for lp in self.compute):
            return f"{tensor} is staged already"
        if self.prefetched_at(tensor) is not None:
            return f"{tensor} is prefetched: a staged input's loops read its buffer"
        index_letters = self.tensor_index(tensor)
        if not any(lp.var not in index_letters for lp in self.compute[index + 1:]):
            return f"no loop inside loop {index} walks a dimension {tensor} ({index_letters}) lacks: nothing would reuse the copy"
        block = self.layout(tensor).block(self.stage_block(index, tensor))
        size = block.elements * self.problem.element_bytes
        if size > STAGE_MAX_BYTES:
            return f"the block of {tensor} at loop {index} takes {size} bytes, more than STAGE_MAX_BYTES = {STAGE_MAX_BYTES}"
        return None

    def stage_block(self, index: int, tensor: str) -> tuple[int, ...]:
        """Extents of the block of ``tensor`` that one (full) iteration of compute loop
        ``index`` reads, in the tensor's index order: along each dimension the step of the
        innermost loop of it at or outside ``index``, else the whole extent."""
        sizes = []
        for var in self.tensor_index(tensor):
            steps = [lp.step for lp in self.compute[: index + 1] if lp.var == var]
            sizes.append(steps[-1] if steps else self.problem.size(var))
        return tuple(sizes)

    def staged_at(self, tensor: str) -> int | None:
        """The compute loop that stages ``tensor``, or None."""
        return next((i for i, lp in enumerate(self.compute) if tensor in lp.staged), None)

    # -- prefetch: lines read ahead at a loop (looprl.ir.step) -------------------------------
    def prefetch(self, index: int, tensor: str, ahead: int) -> "LoopNest":
        """At each iteration of compute loop ``index``, prefetch every cache line of input
        ``tensor`` the iteration reads (its block: :meth:`stage_block`, in the tensor's layout)
        ``ahead`` bytes further along the tensor's memory (one ``llvm.prefetch`` per line: a read
        into every cache level). A prefetch never faults, so one past the end of the tensor (the
        last lines' ahead) is harmless. The loop carries the mark (``prefetch in1 +1024`` in the
        printed nest, ``>in1:1024`` in the key); a split leaves it on the inner loop (the same
        blocks), a swap moves it with its loop."""
        why = self.why_not_prefetch(index, tensor, ahead)
        if why is not None:
            raise ValueError(why)
        loop = self.loops[index]
        return self._replace_range(index, index + 1, (replace(loop, prefetched=loop.prefetched + ((tensor, ahead),)),))

    def why_not_prefetch(self, index: int, tensor: str, ahead: int) -> str | None:
        """Why :meth:`prefetch` refuses, or None. Refused: the output; a distance that is not a
        positive multiple of :data:`LINE_BYTES` up to :data:`PREFETCH_MAX_BYTES`; a write-back
        loop, the innermost compute loop (its iterations are vector lanes or single elements:
        prefetch at a loop around it) or a loop that walks no dimension of the tensor (each
        iteration would read the same block); an input prefetched at some loop already, or
        staged (its loops read the buffer); a block of more than :data:`PREFETCH_MAX_LINES`
        cache lines."""
        if tensor not in ("in0", "in1"):
            return f"only an input is prefetched, not {tensor!r}"
        why = prefetch_refusal(ahead)
        if why is not None:
            return why
        loop = self._layout_loop(index, tensor, compute_only=True)
        if isinstance(loop, str):
            return loop
        if index == len(self.compute) - 1:
            return f"loop {index} is the innermost compute loop (its iterations are vector lanes); prefetch at a loop around it"
        if self.prefetched_at(tensor) is not None:
            return f"{tensor} is prefetched already"
        if self.staged_at(tensor) is not None:
            return f"{tensor} is staged: its loops read the buffer"
        layout = self.layout(tensor)
        block = self.stage_block(index, tensor)
        offsets = [[layout.offset(var, x) for x in range(extent)] for var, extent in zip(self.tensor_index(tensor), block)]
        if block_lines(offsets, self.problem.element_bytes) is None:
            return (f"an iteration of loop {index} reads a block {block} of {tensor}, more than PREFETCH_MAX_LINES = "
                    f"{PREFETCH_MAX_LINES} cache lines: prefetch at a loop inside it")
        return None

    def prefetched_at(self, tensor: str) -> int | None:
        """The compute loop that prefetches ``tensor``, or None."""
        return next((i for i, lp in enumerate(self.compute) if any(t == tensor for t, _ in lp.prefetched)), None)
