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

The pairs are a layout, so the schedule says it: a ``pair`` step (:mod:`looprl.ir.step`) stores
the second input paired, and the kernel reads the nest's layouts as they are
(:func:`~looprl.backend.layout_plan.layouts_applied`): the code generator decides no layout.
:func:`pair_step` says where a kernel can pair (the rule needs the register plan, so it is
asked here); the producers of schedules add that step, in one place
(:func:`looprl.measurement.pair_steps.with_pairs`), and every
:class:`~looprl.measurement.schedule_record.ScheduleRecord` made for a target carries it, so a
record of before pairs were steps still gives the same kernel. A nest of a bfloat16 weight
without a pair step is compiled as it says: its kernel widens each value (correct, slower).

A kernel *pairs* (:func:`pairing`) when its problem is bfloat16, its second input
a weight (constant: the conversion is paid once, not per call, where an element-by-element
interleave would cost about as much as the product), its second input paired on the reduction
and its schedule lends itself:
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
(:func:`reads_dot_pairs`); elsewhere each value is widened, as in any other kernel.

Where the target has no AVX512_BF16 (AVX2, or a generic AVX-512 target) a paired kernel still
loads pairs, and splits each 32-bit lane into its two float32 values (a shift and a mask) for
two FMAs: the same layout and loop structure, the float32 rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from looprl.backend.layout_plan import layouts_applied
from looprl.backend.register_plan import ComputePlan, RegisterScope
from looprl.ir.layout import PAIR, Layout
from looprl.ir.nest import LoopNest
from looprl.ir.step import PAIR as PAIR_OP, Step
from looprl.target import Target


@dataclass(frozen=True)
class Pairing:
    """How a kernel takes its reduction in pairs (see the module docstring)."""

    var: str  # the reduction dimension taken two indices at a time
    level: int  # the compute loop (step 1, inside the register scope) that walks it by pairs
    dot: bool  # vdpbf16ps (the target has AVX512_BF16), else each pair split into two FMAs
    layout: Layout  # the second input's layout in the kernel (pairs innermost)


def paired_layout(layout: Layout, var: str) -> Layout | None:
    """``layout`` with the unit of ``var`` split off into a new innermost dimension of
    :data:`PAIR` (:meth:`Layout.paired <looprl.ir.layout.Layout.paired>`), or None where it
    cannot be."""
    return layout.paired(var)


def pairs_a_weight(problem) -> bool:
    """Whether kernels of ``problem`` may take its reduction in pairs over a re-laid weight: a
    bfloat16 problem whose second input is constant (the rule of :func:`pair_step`'s first test;
    the search measures such a problem's tiles with the weight packed into panels)."""
    return problem.dtype.dot_pairs and "in1" in problem.constant


def _is_paired(nest: LoopNest) -> bool:
    """Whether ``nest``'s second input stores a reduction two by two (a pair step's layout)."""
    layout = nest.layout("in1")
    return any(layout.is_paired(var) for var in nest.problem.reduction_dims)


def _rule(nest: LoopNest, target: Target) -> Pairing | None:
    """How the kernel of ``nest`` (a nest without pairs) for ``target`` can take its reduction
    in pairs over a paired weight, or None (the conditions of the module docstring)."""
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
    paired = layout.paired(var)
    return None if paired is None else Pairing(var, level, target.bfloat16_dot, paired)


@lru_cache(maxsize=4096)
def pair_step(nest: LoopNest, target: Target) -> Step | None:
    """The step that pairs the weight of ``nest`` (a nest without pairs) where its kernel for
    ``target`` can take the reduction in pairs (a bfloat16 problem whose second input is
    constant, a schedule the module docstring's conditions admit), or None: what the kernel
    can do, asked by the producers of schedules (:func:`looprl.measurement.pair_steps.with_pairs`),
    never by the code generator."""
    if _is_paired(nest):
        return None
    found = _rule(nest, target)
    if found is None:
        return None
    step = Step(PAIR_OP, found.level, tensor="in1")
    return step if nest.why_not(step) is None else None


@lru_cache(maxsize=4096)  # asked by the kernel plan (kernel_pairing) of every kernel compiled: once per schedule
def pairing(nest: LoopNest, target: Target) -> Pairing | None:
    """How the kernel of ``nest`` for ``target`` takes its reduction in pairs, or None where it
    does not: only where the nest's second input is paired (a pair step) and the module
    docstring's conditions admit it on ``target`` (else its pairs are a layout like any other,
    and a nest without them widens each value)."""
    if not pairs_a_weight(nest.problem):
        return None
    found = _rule(nest.without_pairs("in1"), target)  # the rule, on the nest before its pair step
    return found if found is not None and nest.layout("in1").is_paired(found.var) else None


def reads_dot_pairs(dtype, target: Target, plan: ComputePlan) -> bool:
    """Whether a dot-product kernel of ``dtype`` whose register plan is ``plan`` reads its
    reduction in pairs on ``target``: a bfloat16 problem whose register tile keeps partial sums
    along a reduction, on a target with AVX512_BF16."""
    return dtype.pairs_on(target) and plan.reduces_vector and not plan.streaming


def kernel_pairing(nest: LoopNest, target: Target) -> tuple[dict, Pairing | None]:
    """The layouts the kernel of ``nest`` for ``target`` stores tensors in, as the schedule says:
    its applied ones (:func:`~looprl.backend.layout_plan.layouts_applied`) and, where the kernel
    takes the reduction in pairs (:func:`pairing`: the nest's second input paired by a pair
    step), the second input's pairs as the kernel walks them (its applied layout, or row-major
    where that is inert, paired: the loops walk a pair at a time, not affinely). A nest without
    a pair step has exactly its applied layouts: nothing is added here. And the :func:`pairing`
    (None where the kernel takes no pairs), read together once by the kernel plan."""
    applied = layouts_applied(nest)
    paired = pairing(nest, target)
    if paired is not None:
        applied["in1"] = paired.layout
    return applied, paired
