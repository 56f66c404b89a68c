"""Packing functions: ``looprl_pack_<tensor>(src, dst)`` copies a row-major input into its
data layout (:mod:`looprl.ir.layout`), the innermost dimension in unrolled chunks of vectors."""

from __future__ import annotations

from looprl.backend.llvm_text import Function, load, store
from looprl.backend.loops import KernelModule
from looprl.backend.register_plan import vector_chunks
from looprl.ir.layout import Layout

PACK_CHUNK = 256  # elements of the innermost dimension copied by one unrolled block


def runtime_offset(fn: Function, layout: Layout, var: str, x: str) -> str:
    """IR computing ``g_var(x)`` for a runtime index ``x`` (an i64 SSA value)."""
    total = None
    for atom, stride in zip(layout.atoms, layout.strides):
        if atom.var != var:
            continue
        value = x if atom.step == 1 else fn.value(f"udiv i64 {x}, {atom.step}", "q")
        if not atom.outer:
            value = fn.value(f"urem i64 {value}, {atom.count}", "r")
        if stride != 1:
            value = fn.value(f"mul i64 {value}, {stride}", "w")
        total = value if total is None else fn.value(f"add i64 {total}, {value}", "a")
    return total or "0"


def emit_pack(module: KernelModule, name: str, index: str, sizes: tuple[int, ...], layout: Layout) -> None:
    """``void name(src, dst)``: copy a row-major tensor into ``layout`` (places that hold no
    element are left as they are: no loop ever reads them)."""
    fn = Function(f"define void @{name}(ptr noalias %src, ptr noalias %dst) nounwind {{")
    module.functions.append(fn)
    row = {}
    stride = 1
    for var, size in zip(reversed(index), reversed(sizes)):
        row[var] = stride
        stride *= size
    src, dst = "%src", "%dst"
    loops = []
    for var, size in zip(index[:-1], sizes[:-1]):
        lp = fn.loop(size)
        lp.__enter__()
        loops.append(lp)
        src = fn.advance(src, lp.iv, row[var])
        dst = fn.value(f"getelementptr inbounds float, ptr {dst}, i64 {runtime_offset(fn, layout, var, lp.iv)}", "p")
    var, size = index[-1], sizes[-1]
    points = layout.breakpoints(var)
    if points:
        chunk = max(d for d in range(1, min(points[0], PACK_CHUNK) + 1) if points[0] % d == 0)
    else:
        chunk = min(size, PACK_CHUNK)
    step = layout.offset(var, 1) if chunk > 1 else 1  # the dst stride inside a chunk
    width = module.target.vector_width

    def block(src_ptr: str, dst_ptr: str, count: int) -> None:
        if step == 1 and row[var] == 1:
            for c, lanes, active in vector_chunks(count, width):
                value = load(module, fn, src_ptr, c, lanes, active, 1, cache=False)
                store(module, fn, dst_ptr, c, lanes, active, value)
        else:
            for c in range(count):
                value = load(module, fn, src_ptr, c * row[var], 1, 1, 0, cache=False)
                store(module, fn, dst_ptr, c * step, 1, 1, value)

    full, rem = divmod(size, chunk)
    if full:
        with fn.loop(full) as lp:
            start = fn.value(f"mul i64 {lp.iv}, {chunk}", "x")
            chunk_src = fn.advance(src, lp.iv, chunk * row[var])
            chunk_dst = fn.value(f"getelementptr inbounds float, ptr {dst}, i64 {runtime_offset(fn, layout, var, start)}", "p")
            block(chunk_src, chunk_dst, chunk)
    if rem:
        block(fn.offset(src, full * chunk * row[var]), fn.offset(dst, layout.offset(var, full * chunk)), rem)
    for lp in reversed(loops):
        lp.__exit__(None, None, None)
    fn.close()

