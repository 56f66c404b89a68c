"""Packing functions: ``looprl_pack_<tensor>(src, dst)`` copies a row-major input into its
data layout (:mod:`looprl.ir.layout`), the innermost dimension in unrolled chunks of vectors.

A layout whose innermost (contiguous) dimension is not the input's innermost one is a
transposition (B[n, k] stored as [k, n], or in n-panels): element by element it costs a scalar
load and store each, which a kernel that converts a changing input on every call pays in full.
Such a pack moves square blocks of :data:`TRANSPOSE_BLOCK` x :data:`TRANSPOSE_BLOCK` elements
instead: one vector load per source row, an in-register transpose (shuffles), one vector store
per destination row; the edges the blocks do not cover are copied element by element.

A layout that keeps the source's innermost dimension innermost but sends a row's chunks to
places apart (``kn`` in 16-column panels) is copied :data:`PACK_ROW_GROUP` rows at a time,
chunk by chunk, so that each destination place is written a group's rows in a run: row by row,
every chunk would write one cache line to another panel (and page) in turn: on a Zen 3 (AVX2,
one thread) that packed a 4096 x 4096 right operand into 16-column panels at 2.7 GB/s, about
half the rate of numpy's plain copy of it (``experiments/pack_speed.py``, its files in
``experiments/results/issue61/session14_znver3/``). Grouped, 64 and 16 MiB operands packed in
0.7x and 0.5-0.6x the time; 8 MiB ones, which the last-level cache holds, as fast as row by
row, or slower where their panels were few (a 1024-column B: 1.23 against 0.71 ms).

A bfloat16 tensor is packed as bfloat16 (its values go through float32 registers, which
widening and rounding back leave as they were)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from looprl.backend.llvm_text import Conditional, Function, load, store, vector_type
from looprl.backend.loops import KernelModule
from looprl.backend.register_plan import vector_chunks
from looprl.ir.layout import Layout

PACK_CHUNK = 256  # elements of the innermost dimension copied by one unrolled block
TRANSPOSE_BLOCK = 8  # rows and columns of one in-register transpose (at most the vector width)
PACK_ROW_GROUP = 8  # rows copied together where a row's chunks go to places apart (_row_group)
PACK_GROUP_CHUNK = 64  # the longest chunk copied a group of rows at a time (the copy is unrolled)


@dataclass(frozen=True)
class PackFacts:
    """What a pack asks of its layout, read from it once (:func:`pack_facts`) before any IR is
    emitted: the transposition blocks do (:func:`transposed_pair`), else the elements the
    innermost dimension is copied in per chunk; the destination offsets the pack's static
    places take."""

    pair: tuple[str, str, int] | None  # (a, b, block) of a blocked transposition, or None
    chunk: int  # elements of the innermost dimension per copied chunk (without ``pair``)
    offsets: Mapping[tuple[str, int], int]  # (var, index) -> g_var(index), at the indices the pack places statically
    group: int = 1  # rows of the next-to-innermost dimension copied chunk by chunk together (1: row by row)
    row_step: int = 0  # with a group: the destination distance between two of its rows


def pack_facts(index: str, sizes: tuple[int, ...], layout: Layout, width: int) -> PackFacts:
    """The facts of packing a row-major tensor of ``index`` and extents ``sizes`` into ``layout``
    on vectors of ``width`` lanes (see :class:`PackFacts`)."""
    pair = transposed_pair(index, sizes, layout, width)
    size = dict(zip(index, sizes))
    if pair is not None:
        a, b, block = pair
        wanted = [(b, 0), (b, 1)] + [(b, j) for j in range(size[b] // block * block, size[b])]
        wanted += [(a, x) for x in range(size[a] // block * block, size[a])]
        return PackFacts(pair, 0, MappingProxyType({key: layout.offset(*key) for key in wanted}))
    var = index[-1]
    points = layout.breakpoints(var)
    if points:
        chunk = max(d for d in range(1, min(points[0], PACK_CHUNK) + 1) if points[0] % d == 0)
    else:
        chunk = min(size[var], PACK_CHUNK)
    wanted = ([(var, 1)] if chunk > 1 else []) + [(var, size[var] // chunk * chunk)]
    group = _row_group(index, sizes, layout, chunk)
    row_step = 0
    if group > 1:
        outer = index[-2]
        row_step = layout.offset(outer, 1) - layout.offset(outer, 0)
        wanted += [(outer, r) for r in range(size[outer] // group * group, size[outer])]
    return PackFacts(None, chunk, MappingProxyType({key: layout.offset(*key) for key in wanted}), group, row_step)


def _row_group(index: str, sizes: tuple[int, ...], layout: Layout, chunk: int) -> int:
    """How many rows (of the next-to-innermost dimension) a pack copies together, chunk by
    chunk: :data:`PACK_ROW_GROUP` where the layout sends a row's consecutive chunks to places
    apart (``kn`` in 16-column panels: each chunk to another panel, so a row by row copy
    writes one cache line per panel and page in turn, at about half a plain copy's rate) and
    those rows' chunks side by side (the group's rows affine in the layout); else 1. Only
    where a chunk is copied in vectors (contiguous on both sides) and is a few of them."""
    if len(index) < 2 or chunk > PACK_GROUP_CHUNK:
        return 1
    var, outer = index[-1], index[-2]
    size = dict(zip(index, sizes))
    contiguous = layout.offset(var, 1) - layout.offset(var, 0) == 1 if size[var] > 1 else False
    scattered = size[var] > chunk and layout.offset(var, chunk) - layout.offset(var, 0) != chunk
    if not contiguous or not scattered or size[outer] < PACK_ROW_GROUP:
        return 1
    if any(point % PACK_ROW_GROUP for point in layout.breakpoints(outer)):
        return 1
    return PACK_ROW_GROUP


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


def _enter_outer_loops(fn: Function, layout: Layout, dims: list[tuple[str, int]], row: dict[str, int], last_step: int = 1,
                       first: tuple[str, str] | None = None):
    """Open a runtime loop over each of ``dims`` ((var, size), outermost first; the last loop's
    index counts ``last_step`` elements of its dimension; ``first``: the first loop's (start,
    trips) as i64 SSA values instead of all its size, trips at least 1); ``(src, dst, loops)``:
    the source and destination pointers at the loops' indices, and the open loops (close them
    innermost first)."""
    src, dst = "%src", "%dst"
    loops = []
    for place, (var, size) in enumerate(dims):
        lp = fn.loop(first[1] if first is not None and place == 0 else size)
        lp.__enter__()
        loops.append(lp)
        index = fn.value(f"add i64 {first[0]}, {lp.iv}", "i") if first is not None and place == 0 else lp.iv
        step = last_step if place == len(dims) - 1 else 1
        x = index if step == 1 else fn.value(f"mul i64 {index}, {step}", "x")
        src = fn.advance(src, x, row[var])
        dst = fn.index(dst, runtime_offset(fn, layout, var, x))
    return src, dst, loops


def transposed_pair(index: str, sizes: tuple[int, ...], layout: Layout, width: int) -> tuple[str, str, int] | None:
    """``(a, b, block)`` when packing into ``layout`` is a transposition that blocks can do:
    ``b``, the source's innermost dimension, is not the layout's innermost one ``a``; ``a`` is
    contiguous in the layout and ``b`` at a constant stride within aligned blocks of ``block``
    elements of each (every breakpoint a multiple of it), both at least a block long. Else None."""
    block = min(TRANSPOSE_BLOCK, width)
    a, b = layout.dims[-1][-1].var, index[-1]
    if block < 2 or a == b:
        return None
    size = dict(zip(index, sizes))
    if size[a] < block or size[b] < block or layout.offset(a, 1) - layout.offset(a, 0) != 1:
        return None
    if any(point % block for var in (a, b) for point in layout.breakpoints(var)):
        return None
    return a, b, block


def _transpose(fn: Function, rows: list[str], block: int) -> list[str]:
    """The columns of the ``block`` x ``block`` matrix whose rows are the vectors ``rows``: for
    each bit of the index, the off-diagonal halves of every 2s x 2s sub-block change places."""
    typ = vector_type(block)
    span = 1
    while span < block:
        following = list(rows)
        for i in range(block):
            if i & span:
                continue
            low = [j if not j & span else block + j - span for j in range(block)]
            high = [j + span if not j & span else block + j for j in range(block)]
            for target, picks in ((i, low), (i + span, high)):
                lanes = ", ".join(f"i32 {p}" for p in picks)
                following[target] = fn.value(f"shufflevector {typ} {rows[i]}, {typ} {rows[i + span]}, <{block} x i32> <{lanes}>", "tr")
        rows = following
        span *= 2
    return rows


def _emit_transposing_pack(module: KernelModule, fn: Function, index: str, sizes: tuple[int, ...], layout: Layout,
                           row: dict[str, int], facts: PackFacts) -> None:
    """The body of a pack that :func:`transposed_pair` accepts (see the module docstring)."""
    a, b, block = facts.pair
    offsets = facts.offsets
    size = dict(zip(index, sizes))
    src, dst, loops = _enter_outer_loops(fn, layout, [(v, size[v]) for v in index if v not in (a, b)], row)
    full_a, rem_a = divmod(size[a], block)
    full_b, rem_b = divmod(size[b], block)
    stride_b = offsets[b, 1] - offsets[b, 0]

    def scalar(src_ptr: str, dst_ptr: str) -> None:
        store(module, fn, dst_ptr, 0, 1, 1, load(module, fn, src_ptr, 0, 1, 1, 0, cache=False))

    if full_a:
        with fn.loop(full_a) as la:
            first_a = fn.value(f"mul i64 {la.iv}, {block}", "x")
            src_a = fn.advance(src, la.iv, block * row[a])
            dst_a = fn.index(dst, runtime_offset(fn, layout, a, first_a))
            if full_b:
                with fn.loop(full_b) as lb:
                    first_b = fn.value(f"mul i64 {lb.iv}, {block}", "x")
                    src_ab = fn.advance(src_a, lb.iv, block)  # b is the source's innermost dimension
                    dst_ab = fn.index(dst_a, runtime_offset(fn, layout, b, first_b))
                    rows = [load(module, fn, src_ab, i * row[a], block, block, 1, cache=False) for i in range(block)]
                    for j, column in enumerate(_transpose(fn, rows, block)):
                        store(module, fn, dst_ab, j * stride_b, block, block, column)
            for j in range(full_b * block, size[b]):  # the columns no block covers
                for i in range(block):
                    scalar(fn.offset(src_a, i * row[a] + j), fn.offset(dst_a, offsets[b, j] + i))
    if rem_a:  # the rows no block covers
        with fn.loop(size[b]) as lb:
            src_b = fn.advance(src, lb.iv, 1)
            dst_b = fn.index(dst, runtime_offset(fn, layout, b, lb.iv))
            for x in range(full_a * block, size[a]):
                scalar(fn.offset(src_b, x * row[a]), fn.offset(dst_b, offsets[a, x]))
    for lp in reversed(loops):
        lp.__exit__(None, None, None)


def splits_in_parts(index: str, sizes: tuple[int, ...], layout: Layout, width: int) -> bool:
    """Whether :func:`emit_pack` can copy a tensor of ``index`` and ``sizes`` into ``layout`` in
    parts (``parted``): a two-dimensional tensor whose pack is no transposition."""
    return len(index) == 2 and pack_facts(index, sizes, layout, width).pair is None


def emit_pack(module: KernelModule, name: str, index: str, sizes: tuple[int, ...], layout: Layout, element: str = "float",
              source: tuple[int, ...] | None = None, internal: bool = False, parted: bool = False) -> None:
    """``void name(src, dst)``: copy a row-major tensor of ``element`` (``"float"``, or ``"i16"``
    for bfloat16) into ``layout`` (places that hold no element are left as they are: no loop
    ever reads them). With ``source`` (the shape of the row-major tensor ``src`` points into)
    only the block of extents ``sizes`` at ``src`` is copied (a stage's block). ``internal``:
    the function is not an entry point. ``parted`` (where :func:`splits_in_parts`): ``void
    name(src, dst, i64 part, i64 parts)`` copies part ``part`` of ``parts`` (its share of the
    outer rows, or of their groups; the rows no group covers in the last part), so that a team
    copies the tensor together."""
    linkage = "internal " if internal else ""
    extra = ", i64 %part, i64 %parts" if parted else ""
    fn = Function(f"define {linkage}void @{name}(ptr noalias %src, ptr noalias %dst{extra}) nounwind {{")
    fn.point("%src", element)
    fn.point("%dst", element)
    module.functions.append(fn)
    row = {}
    stride = 1
    for var, size in zip(reversed(index), reversed(source or sizes)):
        row[var] = stride
        stride *= size
    facts = pack_facts(index, sizes, layout, module.target.vector_width)
    if parted and (len(index) != 2 or facts.pair is not None):  # splits_in_parts, on the facts at hand
        raise ValueError(f"a pack of {index} {sizes} into {layout.key} is not copied in parts")
    if facts.pair is not None:
        _emit_transposing_pack(module, fn, index, sizes, layout, row, facts)
        fn.close()
        return
    var, size, chunk = index[-1], sizes[-1], facts.chunk
    group = facts.group
    outer = list(zip(index[:-1], sizes[:-1]))
    if group > 1:  # the last of them walked group by group: see PackFacts.group
        outer[-1] = (outer[-1][0], outer[-1][1] // group)
    first = None
    if parted:  # this part's outer rows (groups): [part * n / parts, (part + 1) * n / parts)
        count = outer[0][1]
        start = fn.value(f"udiv i64 {fn.value(f'mul i64 %part, {count}', 'x')}, %parts", "lo")
        following = fn.value("add i64 %part, 1", "x")
        end = fn.value(f"udiv i64 {fn.value(f'mul i64 {following}, {count}', 'x')}, %parts", "hi")
        first = (start, fn.value(f"sub i64 {end}, {start}", "n"))
        share = Conditional(fn, f"icmp ugt i64 {first[1]}, 0")
        share.__enter__()
    src, dst, loops = _enter_outer_loops(fn, layout, outer, row, group, first)
    step = facts.offsets[var, 1] if chunk > 1 else 1  # the dst stride inside a chunk
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

    def rows(src_ptr: str, dst_ptr: str, count: int, ahead: int) -> None:
        """``count`` elements of each of the group's rows: ``ahead`` rows from the first."""
        block(src_ptr, dst_ptr, count)
        for r in range(1, ahead):
            block(fn.offset(src_ptr, r * row[index[-2]]), fn.offset(dst_ptr, r * facts.row_step), count)

    def copy_rows(src_row: str, dst_row: str, ahead: int) -> None:
        """The innermost dimension of ``ahead`` consecutive rows, chunk by chunk: every row's
        chunk before the next chunk (a group's chunks go to one destination place in turn)."""
        full, rem = divmod(size, chunk)
        if full:
            with fn.loop(full) as lp:
                start = fn.value(f"mul i64 {lp.iv}, {chunk}", "x")
                chunk_src = fn.advance(src_row, lp.iv, chunk * row[var])
                chunk_dst = fn.index(dst_row, runtime_offset(fn, layout, var, start))
                rows(chunk_src, chunk_dst, chunk, ahead)
        if rem:
            rows(fn.offset(src_row, full * chunk * row[var]), fn.offset(dst_row, facts.offsets[var, full * chunk]), rem, ahead)

    copy_rows(src, dst, group)
    for lp in reversed(loops):
        lp.__exit__(None, None, None)
    if parted:
        share.__exit__(None, None, None)
    if group > 1 and sizes[-2] % group:  # the rows no group covers, one by one (in the last part)
        last_part = Conditional(fn, "icmp eq i64 %part, " + fn.value("sub i64 %parts, 1", "x")) if parted else None
        if last_part is not None:
            last_part.__enter__()
        last = sizes[-2] // group * group
        src, dst, loops = _enter_outer_loops(fn, layout, list(zip(index[:-2], sizes[:-2])), row)
        for r in range(last, sizes[-2]):
            copy_rows(fn.offset(src, r * row[index[-2]]), fn.offset(dst, facts.offsets[index[-2], r]), 1)
        for lp in reversed(loops):
            lp.__exit__(None, None, None)
        if last_part is not None:
            last_part.__exit__(None, None, None)
    fn.close()

