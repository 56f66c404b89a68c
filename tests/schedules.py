"""Random schedules for the property tests, built the way the agent builds them.

A schedule is drawn as the steps that build it, so that hypothesis shows (and shrinks) a
failing schedule as those steps:

* :func:`action_steps`: a strategy of lists of ``(loop, action name)`` steps. :func:`walk`
  follows them from the untuned nest through the package's one transition rule
  (:func:`looprl.actions.reach`): each step moves the cursor to loop ``loop`` (modulo the
  nest's length) with ``up``/``down`` actions, then takes the action. An action that cannot
  apply where it is taken (a swap across nests, a factor larger than the loop, a split past
  :data:`MAX_LOOPS`, a second parallel loop in a nest) leaves the state, as in the env: no
  exception is swallowed. The factors include 3, 5 and 7 and the tests' problems have sizes
  no factor divides, so walks reach loops with tails.
* :func:`layout_steps`: a strategy of lists of layout primitives (split, reorder, fuse, pad,
  pack) of the three tensors; :func:`with_layouts` applies those the nest accepts, asking the
  primitives' own checks (``why_not_*``) first; :func:`pack_every_tiled_loop` packs every
  tensor by every tile its loops make (layouts the kernel uses).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from looprl.actions import ActionSet, State, reach
from looprl.ir.nest import LAYOUT_TENSORS, LoopNest, initial_nest

FACTORS = (2, 3, 4, 5, 7, 8, 16, 32, 64)
MAX_LOOPS = 12
# Every action a walk may take; the strategies choose which kinds a test draws.
ACTIONS = ActionSet(FACTORS, MAX_LOOPS, layouts=True, parallel=True)
# A step's loop index is taken modulo the nest's length: 0..20 reaches every loop of any nest.
LOOP_INDICES = st.integers(0, 20)


def action_steps(kinds=("split", "swap_down", "swap_up"), max_size: int = 14):
    """Lists of ``(loop, action name)``: ``kinds`` are drawn with equal weight (a kind listed
    twice twice as often), ``"split"`` with one of :data:`FACTORS`. Kinds besides ``"split"``
    are action names of :data:`ACTIONS` (``"parallel"``, ``"pack"``, ``"pad"``, the swaps)."""
    for kind in kinds:
        if kind != "split" and kind not in ACTIONS.names:
            raise ValueError(f"unknown action kind {kind!r}; expected 'split' or one of {ACTIONS.names}")

    def named(drawn):
        loop, kind, factor = drawn
        return loop, f"split_{factor}" if kind == "split" else kind

    step = st.tuples(LOOP_INDICES, st.sampled_from(kinds), st.sampled_from(FACTORS)).map(named)
    return st.lists(step, max_size=max_size)


def walk(problem, steps) -> LoopNest:
    """The schedule ``steps`` (from :func:`action_steps`) reach from ``problem``'s untuned nest."""
    state = State(initial_nest(problem), 0)
    for loop, name in steps:
        at = loop % len(state.nest)
        state = reach(ACTIONS, state, (*ACTIONS.moves(state.cursor, at), name))
    return state.nest


LAYOUT_KINDS = ("split", "reorder", "fuse", "pad", "pack", "pack", "align")


def layout_steps(max_size: int = 8):
    """Lists of ``(tensor, kind, index, factor)`` layout primitives for :func:`with_layouts`."""
    factors = st.sampled_from([2, 3, 4, 5, 8, 16])
    step = st.tuples(st.sampled_from(LAYOUT_TENSORS), st.sampled_from(LAYOUT_KINDS), st.integers(0, 30), factors)
    return st.lists(step, max_size=max_size)


def with_layouts(nest: LoopNest, steps, seed: int = 0) -> LoopNest:
    """``nest`` with the layout primitives of ``steps`` that apply. ``split``/``fuse``/``pad``
    act on physical dimension ``index`` (modulo their count), ``reorder`` permutes them at
    random (``seed``), ``pack`` tiles the tensor by the step of one of the compute loops that
    walk it (``align``: for the output, of a write-back loop), so that the layout is often
    walked affinely and used by the kernel."""
    rng = np.random.default_rng(seed)
    for tensor, kind, index, factor in steps:
        layout = _layout_after(nest, tensor, kind, index, factor, rng)
        if layout is not None and nest.why_not_layout(tensor, layout) is None:
            nest = nest.with_layout(tensor, layout)
    return nest


def _layout_after(nest: LoopNest, tensor: str, kind: str, index: int, factor: int, rng):
    """The layout of ``tensor`` after one primitive, or None where the primitive refuses."""
    layout = nest.layout(tensor)
    dim = index % len(layout.dims)
    if kind == "split":
        return layout.split(dim, factor) if layout.why_not_split(dim, factor) is None else None
    if kind == "reorder":
        return layout.reorder(rng.permutation(len(layout.dims)))
    if kind == "fuse":
        return layout.fuse(dim) if dim + 1 < len(layout.dims) else None
    if kind == "pad":
        return layout.pad(dim, factor) if layout.why_not_pad(dim, factor) is None else None
    loops = nest.write_back if kind == "align" and tensor == "out" else nest.compute
    loops = [lp for lp in loops if lp.var in nest.tensor_index(tensor) and lp.step > 1]
    if not loops:
        return None
    loop = loops[index % len(loops)]
    return layout.pack(loop.var, loop.step) if layout.why_not_pack(loop.var, loop.step) is None else None


def pack_every_tiled_loop(nest: LoopNest, reorder_seed: int) -> LoopNest:
    """ALT's template everywhere: pack each tensor by every loop step that walks it (innermost
    loops first: nested tiles), then shuffle the output's physical dimensions: layouts the loops
    walk affinely, so the kernel uses them."""
    rng = np.random.default_rng(reorder_seed)
    for tensor in LAYOUT_TENSORS:
        loops = nest.write_back if tensor == "out" else nest.compute
        for loop in reversed(loops):
            walks = loop.step > 1 and loop.var in nest.tensor_index(tensor)
            if walks and nest.why_not_layout_pack(tensor, loop.var, loop.step) is None:
                nest = nest.layout_pack(tensor, loop.var, loop.step)
    out_dims = len(nest.layout("out").dims)
    return nest.layout_reorder("out", rng.permutation(out_dims))
