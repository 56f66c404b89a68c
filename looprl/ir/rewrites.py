"""Equivalent forms of a problem ``looprl.tune`` searches, as values.

* :data:`FUSED_VIEW` (:class:`Rewrite`, :func:`plan_rewrites`): two dimensions that always go
  together (a 1x1 convolution's h and w over NCHW) become one (:func:`fused_view`). The
  view's schedule is the answer as it is; its kernel is called through reshapes
  (``looprl.backend.kernel.ReshapedKernel``), without a copy. Exact: the view's speed is the
  original's. A view is another problem (fewer dimensions), not another layout.
* :class:`Relaid` (:func:`relaid`): a right operand stored across the output's columns (a
  linear layer's ``W[out, in]`` in ``mk,nk->mn``, attention's keys in ``bmk,bnk->bmn``) reads
  lane by lane in every schedule that keeps it as it is. The same problem is also searched from
  its untuned nest with that operand re-laid, the output's last dimension innermost
  (:attr:`Relaid.start`: a layout of the problem's nest, :mod:`looprl.ir.layout`), so one
  problem's search space holds both the re-laid and the as-stored kernels and one winner rule
  (:mod:`looprl.tune.winner`) picks. A constant operand is re-laid once, when the kernel is
  bound to it; one that changes per call is re-laid inside every call (the kernel's timing
  includes it: :attr:`Relaid.exact` is False).

The search engines (the policy's episodes, the register tiles, the plans) build schedules from a
problem's row-major untuned nest. The re-laid start is the row-major untuned nest of one
problem, :attr:`Relaid.coordinates` (the operand's letters listed in its re-laid order, e.g.
``mk,kn->mn``: what the policies were trained on), whose schedules are the problem's with the
same loops and each tensor's physical layout (:meth:`~looprl.ir.nest.LoopNest.on_problem`): the
policy sees the same observation either way (``tests/tune/test_in_place_layouts.py``), so the
engines search the re-laid start in those coordinates and every schedule found there is turned
into the problem's at once (:meth:`Relaid.schedule`), before it is compared, remembered or
returned. A record whose actions replay from the re-laid start says so with ``replays_on`` =
:data:`RELAID` (replayed by :func:`looprl.tune.results.replayed`); the names a56e7ac's records
and tune-v9's cache gave it are read as that, here only (:func:`replays_on`). Starting the
engines from :attr:`Relaid.start` itself, without the coordinates, waits for plans and tiles
that keep a start's layouts (they build from the row-major untuned nest today).
"""

from __future__ import annotations

from dataclasses import dataclass

from looprl.ir.layout import Layout
from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem

FUSED_VIEW = "fused view"
KINDS = (FUSED_VIEW,)
# ``replays_on`` of a record whose actions replay from the re-laid start (in its coordinates).
RELAID = "re-laid start"
# What records written at a56e7ac and tune-v9's cache call the re-laid start: the searched
# "twin" problem of a constant or of a per-call right operand. Read as RELAID (replays_on).
FORMER_RELAID_NAMES = ("transposed twin", "re-laid twin")


def replays_on(name: str | None) -> str | None:
    """A record's ``replays_on`` as this looprl names it: None (its actions replay from the
    untuned nest) or :data:`RELAID`, also given by a former name (:data:`FORMER_RELAID_NAMES`);
    anything else is a ValueError."""
    if name is None or name == RELAID:
        return name
    if name in FORMER_RELAID_NAMES:
        return RELAID
    raise ValueError(f"unknown replays_on {name!r}; expected None, {RELAID!r} or one of {', '.join(map(repr, FORMER_RELAID_NAMES))}")


@dataclass(frozen=True)
class Rewrite:
    """``searched`` is tuned in place of ``original``; ``kind`` (:data:`FUSED_VIEW`) says how:
    a view's schedule is the answer as it is, its kernel called through reshapes."""

    kind: str
    original: Problem
    searched: Problem

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown rewrite kind {self.kind!r}; expected one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class RewriteChain:
    """``original`` tuned as :attr:`searched`, through its fused view (if ``chain`` holds it)."""

    original: Problem
    chain: tuple[Rewrite, ...] = ()

    @property
    def searched(self) -> Problem:
        return self.chain[-1].searched if self.chain else self.original

    @property
    def through_fused_view(self) -> bool:
        """Whether the answer's kernel is called through reshapes (:data:`FUSED_VIEW`)."""
        return bool(self.chain) and self.chain[0].kind == FUSED_VIEW


def plan_rewrites(problem: Problem) -> RewriteChain:
    """The rewrites ``tune`` applies: the fused view, if any."""
    view = fused_view(problem)
    return RewriteChain(problem, () if view is None else (Rewrite(FUSED_VIEW, problem, view),))


@dataclass(frozen=True)
class Relaid:
    """``problem`` searched from its untuned nest with its right operand re-laid, the output's
    last dimension innermost (:attr:`start`). Build with :func:`relaid`."""

    problem: Problem

    def __post_init__(self):
        if not isinstance(self.problem, Problem) or _coordinates(self.problem) is None:
            raise ValueError(f"{self.problem!r:.200} has no re-laid start: its right operand must hold the output's last "
                             f"dimension, not last, and re-laying it must keep the order of the dimensions")

    @property
    def exact(self) -> bool:
        """Whether the operand is re-laid once (a constant, at bind), not inside every call."""
        return "in1" in self.problem.constant

    @property
    def coordinates(self) -> Problem:
        """The problem whose row-major untuned nest is :attr:`start` (see the module docstring)."""
        return _coordinates(self.problem)

    @property
    def layout(self) -> Layout:
        """The right operand's re-laid layout: its dimensions in the order :attr:`coordinates` lists them."""
        index = self.coordinates.operands[1]
        return Layout.row_major(index, self.problem.shape(index)).reindexed(self.problem.operands[1], self.problem.input_shapes[1])

    @property
    def start(self) -> LoopNest:
        """The problem's untuned nest with the right operand re-laid."""
        return initial_nest(self.problem).with_layout("in1", self.layout)

    def schedule(self, nest: LoopNest) -> LoopNest:
        """The problem's schedule that ``nest``, one of :attr:`coordinates`, stands for: the same
        loops, each tensor in the same physical layout."""
        if not isinstance(nest, LoopNest) or nest.problem != self.coordinates:
            raise ValueError(f"expected a schedule of {self.coordinates.name}, got {nest!r:.200}")
        return nest.on_problem(self.problem)

    def in_coordinates(self, nest: LoopNest) -> LoopNest:
        """``nest``, a schedule of the problem, as one of :attr:`coordinates` (the inverse of
        :meth:`schedule`)."""
        if not isinstance(nest, LoopNest) or nest.problem != self.problem:
            raise ValueError(f"expected a schedule of {self.problem.name}, got {nest!r:.200}")
        return nest.on_problem(self.coordinates)


def relaid(problem: Problem) -> Relaid | None:
    """The re-laid start of ``problem`` (:class:`Relaid`), or None: its right operand must hold
    the output's last dimension but not last, and re-laying it must keep the order in which
    the problem lists its dimensions."""
    return Relaid(problem) if _coordinates(problem) is not None else None


def _coordinates(problem: Problem) -> Problem | None:
    """``problem`` with its right operand's letters re-ordered, the output's last one last, or
    None where that does not apply (see :func:`relaid`)."""
    left, right = problem.operands
    column = problem.output[-1]
    if column not in right or right[-1] == column:
        return None
    spec = f"{left},{right.replace(column, '')}{column}->{problem.output}"
    twin = Problem(spec, problem.sizes, problem.constant, problem.epilogue, problem.between, problem.dtype)
    return twin if twin.dims == problem.dims else None


def fused_view(problem: Problem) -> Problem | None:
    """The same contraction over the same memory with fewer dimensions, or None when there is
    none: two dimensions that every tensor holding either holds both of, the second right
    after the first, become one (a 1x1 convolution over NCHW, ``nchw,oc->nohw``, is
    ``nch,oc->noh`` over h·w pixels; over NHWC, ``nhwc,oc->nhwo`` is ``nc,oc->no`` over n·h·w).
    Each tensor's elements keep their order, so a C-contiguous array of the problem is one of
    the view by a reshape, without a copy. Problems with an epilogue are left as they are."""
    if not problem.epilogue.is_identity:
        return None
    tensors = [*problem.operands, problem.output]
    sizes = dict(problem.sizes)
    while (pair := _fusable_pair(tensors)) is not None:
        first, second = pair
        tensors = [t.replace(first + second, first) for t in tensors]
        sizes[first] *= sizes.pop(second)
    spec = f"{tensors[0]},{tensors[1]}->{tensors[2]}"
    if spec == problem.spec:
        return None
    return Problem(spec, tuple(sizes.items()), problem.constant, between=problem.between, dtype=problem.dtype)  # Problem orders the sizes


def _fusable_pair(tensors: list[str]) -> tuple[str, str] | None:
    """The first two neighbouring dimensions that every tensor holding either holds both of,
    in that order and side by side; None if there are none."""
    for tensor in tensors:
        for first, second in zip(tensor, tensor[1:]):
            if all(first + second in t for t in tensors if first in t or second in t):
                return first, second
    return None
