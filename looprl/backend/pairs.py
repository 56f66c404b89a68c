"""bfloat16 products two at a time: which kernels take the reduction in pairs, and the layout of
the second input that makes each pair of it one 32-bit load per lane.

``vdpbf16ps`` (AVX512_BF16: AMD Zen 4 and later, Intel Cooper Lake and later) multiplies, per
float32 lane, two pairs of bfloat16 values and adds both products to the lane: two multiply-adds
per lane per instruction, twice the float32 FMA rate. Its operands hold, in each 32-bit lane,
the pair ``(x[r], x[r + 1])`` of consecutive reduction indices ``r`` (even). For a register
tile ``acc[m, v...] += in0[m, r] * in1[r, v...]`` (vectors along the output dimension ``v``):

* the first input's pair is two neighbours in memory (the reduction is its innermost
  dimension): one 32-bit load, broadcast to every lane;
* the second input's pairs are not neighbours in a row-major (or panel) layout; the kernel
  stores it in :func:`paired_layout`: its layout with the reduction's unit split off into an
  innermost dimension of 2, so ``in1[r, v]`` and ``in1[r + 1, v]`` sit side by side and a
  vector of lanes along ``v`` is one load of twice as many bfloat16 values. A weight (constant
  input) is converted once, when the kernel is bound to it; a changing second input on every
  call, as any other layout.

A kernel *pairs* (:func:`pairing`) when its problem is bfloat16, its second input a weight
(constant: the conversion is paid once, not per call, where an element-by-element interleave
would cost about as much as the product) and its schedule lends itself:
the register tile vectorises along an output dimension the second input stores contiguously;
the first input is row-major, its innermost dimension the reduction; the innermost loop over
that reduction (its deepest loop) is inside the register scope with step 1 and every other
loop over it has an even step (so every pair starts at an even index, as the layout groups
them). The last index of an odd extent is a *half* pair: the first input's partner is zero and
the second's (a place no element fills) is cleared before the product. Other schedules widen
each bfloat16 value to float32 and multiply-add one index at a time.

A *dot-product* kernel (the innermost loop over a reduction both inputs store contiguously:
vectors of partial sums, as few-row layers read a weight as stored) needs no layout: both
inputs' pairs are neighbours. Where the target has AVX512_BF16 it reads twice as many
bfloat16 values per vector and ``vdpbf16ps`` adds their products into the partial sums
(:func:`dot_pairs`); elsewhere each value is widened, as in any other kernel.

Where the target has no AVX512_BF16 (AVX2, or a generic AVX-512 target) a paired kernel still
loads pairs, and splits each 32-bit lane into its two float32 values (a shift and a mask) for
two FMAs: the same layout and loop structure, the float32 rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from looprl.backend.layout_plan import layouts_applied
from looprl.backend.register_plan import RegisterScope
from looprl.ir.layout import Atom, Layout
from looprl.ir.nest import LoopNest
from looprl.target import Target

PAIR = 2  # reduction indices per 32-bit lane


@dataclass(frozen=True)
class Pairing:
    """How a kernel takes its reduction in pairs (see the module docstring)."""

    var: str  # the reduction dimension taken two indices at a time
    level: int  # the compute loop (step 1, inside the register scope) that walks it by pairs
    dot: bool  # vdpbf16ps (the target has AVX512_BF16), else each pair split into two FMAs
    layout: Layout  # the second input's layout in the kernel (pairs innermost)


def paired_layout(layout: Layout, var: str) -> Layout | None:
    """``layout`` with the unit of ``var`` split off into a new innermost dimension of
    :data:`PAIR` (``...k1...`` becomes ``...k2....k1%2``), or None where that unit is a padded
    or odd-sized piece of a split."""
    unit = next((a for a in layout.atoms if a.var == var and a.step == 1), None)
    if unit is None:
        return None
    if unit.outer:
        pairs = -(-layout.sizes[layout.index.index(var)] // PAIR)
        replaced = Atom(var, PAIR, pairs, pairs, True)
    elif unit.count % PAIR == 0 and unit.extent == unit.count:
        replaced = Atom(var, PAIR, unit.count // PAIR, unit.count // PAIR, False)
    else:
        return None
    dims = tuple(tuple(replaced if a is unit else a for a in dim) for dim in layout.dims)
    return Layout(layout.index, layout.sizes, (*dims, (Atom(var, 1, PAIR, PAIR, False),)))


def pairs_a_weight(problem) -> bool:
    """Whether kernels of ``problem`` may take its reduction in pairs over a re-laid weight: a
    bfloat16 problem whose second input is constant (the rule of :func:`pairing`'s first test;
    the search measures such a problem's tiles with the weight packed into panels)."""
    return problem.dtype.dot_pairs and "in1" in problem.constant


@lru_cache(maxsize=4096)  # asked by the code generator, the packing entry points and the kernel: once per schedule
def pairing(nest: LoopNest, target: Target) -> Pairing | None:
    """How the kernel of ``nest`` for ``target`` takes its reduction in pairs, or None where it
    does not (a float32 problem, or a schedule the module docstring's conditions exclude)."""
    problem = nest.problem
    if not pairs_a_weight(problem):
        return None
    applied = layouts_applied(nest)
    if "in0" in applied:
        return None
    plan = RegisterScope(nest, target, applied).plan
    vector = plan.vector_var
    if vector is None or plan.streaming or plan.reduces_vector or vector not in problem.output:
        return None
    loops = nest.compute
    levels = [i for i, lp in enumerate(loops) if lp.var in problem.reduction_dims]
    if not levels:
        return None
    level = levels[-1]
    var = loops[level].var
    if level < plan.scope_start or loops[level].step != 1:
        return None
    if any(lp.var == var and lp.step % PAIR for i, lp in enumerate(loops) if i != level):
        return None
    first, second = problem.operands
    if first[-1] != var or vector in first or var not in second or vector not in second:
        return None
    layout = applied.get("in1") or Layout.row_major(second, problem.shape(second))
    if layout.offset(vector, 1) - layout.offset(vector, 0) != 1:
        return None
    paired = paired_layout(layout, var)
    if paired is None:
        return None
    return Pairing(var, level, target.bfloat16_dot, paired)


@lru_cache(maxsize=4096)
def dot_pairs(nest: LoopNest, target: Target) -> bool:
    """Whether the dot-product kernel of ``nest`` for ``target`` reads its reduction in pairs
    (a bfloat16 problem whose register tile keeps partial sums along a reduction, on a target
    with AVX512_BF16)."""
    if not nest.problem.dtype.pairs_on(target):
        return False
    plan = RegisterScope(nest, target, layouts_applied(nest)).plan
    return plan.reduces_vector and not plan.streaming


def kernel_layouts(nest: LoopNest, target: Target) -> dict:
    """The layouts the kernel of ``nest`` for ``target`` stores tensors in: the schedule's
    applied ones (:func:`~looprl.backend.layout_plan.layouts_applied`), the second input's
    paired where the kernel pairs (:func:`pairing`)."""
    applied = layouts_applied(nest)
    paired = pairing(nest, target)
    if paired is not None:
        applied["in1"] = paired.layout
    return applied
