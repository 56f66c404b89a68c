"""Which data layouts a kernel uses: a tensor's layout applies when every loop that addresses it
walks the layout affinely (else the tensor stays row-major). No IR is emitted here."""

from __future__ import annotations

from looprl.ir.layout import Layout
from looprl.ir.nest import Loop, LoopNest


def _walks_affinely(loops: tuple[Loop, ...], size: int, var: str, breakpoints: tuple[int, ...]) -> bool:
    """Whether every loop of ``var`` moves through ``g_var`` affinely: for each breakpoint b,
    the loop's step is a multiple of b, or the range the loop covers (its parent's step, or
    the whole extent for the outermost loop) lies inside one block of b elements."""
    parent = None
    for loop in (lp for lp in loops if lp.var == var):
        for point in breakpoints:
            if loop.step % point == 0:
                continue
            if (size > point) if parent is None else (point % parent.step):
                return False
        parent = loop
    return True


def layout_applies(nest: LoopNest, tensor: str) -> bool:
    """Whether the kernel stores ``tensor`` (``in0``, ``in1`` or ``out``, whose layout is the
    accumulator's) in its layout: the loops that address it (compute loops; for ``out`` the
    write-back loops too) must walk the layout affinely. Otherwise the layout is inert: the
    tensor is used row-major, as if it had no layout. Always False for row-major tensors."""
    layouts = dict(nest.layouts)
    if tensor not in layouts:
        return False
    layout = layouts[tensor]
    problem = nest.problem
    nests = (nest.compute, nest.write_back) if tensor == "out" else (nest.compute,)
    return all(
        _walks_affinely(loops, problem.size(var), var, layout.breakpoints(var)) for loops in nests for var in layout.index
    )


def layouts_applied(nest: LoopNest) -> dict[str, Layout]:
    """The layouts the kernel of ``nest`` uses (see :func:`layout_applies`)."""
    return {t: layout for t, layout in nest.layouts if layout_applies(nest, t)}


def conversions(nest: LoopNest) -> dict[str, list[str]]:
    """What a measured figure of ``nest`` includes: ``per_call``, the inputs the timed kernel
    converts to their layouts on every call; ``once``, the constant inputs (declared by the
    problem) converted once when bound, outside the timing; ``output``, ["out"] when the
    accumulator's layout is unpacked by the write-back nest (always timed)."""
    applied = layouts_applied(nest)
    inputs = [t for t in ("in0", "in1") if t in applied]
    return {
        "per_call": [t for t in inputs if t not in nest.problem.constant],
        "once": [t for t in inputs if t in nest.problem.constant],
        "output": ["out"] if "out" in applied else [],
    }
