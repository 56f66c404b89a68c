"""Equivalent problems that ``looprl.tune`` searches instead of the one it is given, as values.

A :class:`Rewrite` holds the problem given (``original``), the problem searched instead
(``searched``) and, as data (its ``kind``), how a schedule of the searched problem serves the
original (:meth:`Rewrite.carry_back`). Three kinds:

* :data:`FUSED_VIEW`: two dimensions that always go together (a 1x1 convolution's h and w
  over NCHW) become one (:func:`fused_view`). The view's schedule is the
  answer as it is; its kernel is called through reshapes (``looprl.backend.kernel.
  ReshapedKernel``), without a copy. Exact: the view's speed is the original's.
* :data:`TRANSPOSED_TWIN`: a constant right operand stored across the output's columns (a
  linear layer's ``W[out, in]`` in ``mk,nk->mn``) reads lane by lane in every schedule that
  keeps it as it is. Its twin lists B's letters with the output's last dimension last
  (``mk,kn->mn``, what the policies were trained on). The twin's loops are the original's
  loops (both specs list the dimensions in the same order), and each tensor keeps the twin's
  physical layout (:meth:`looprl.ir.nest.LoopNest.on_problem`): B is re-laid once, when the
  kernel is bound to the constant, never inside a call. Exact.
* :data:`RELAID_TWIN`: the same twin for a right operand that changes per call (attention's
  keys in ``bmk,bnk->bmn``): the carried-back kernel re-lays B inside every call, so the
  twin's figures are not the original's (:attr:`Rewrite.exact` is False): the carried-back
  schedule must be measured on the original, conversion included, and compared with a search
  of the original as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from looprl.ir.nest import LoopNest
from looprl.ir.problem import Problem

FUSED_VIEW = "fused view"
TRANSPOSED_TWIN = "transposed twin"
RELAID_TWIN = "re-laid twin"
KINDS = (FUSED_VIEW, TRANSPOSED_TWIN, RELAID_TWIN)


@dataclass(frozen=True)
class Rewrite:
    """``searched`` is tuned in place of ``original``; ``kind`` says how its schedule carries back."""

    kind: str
    original: Problem
    searched: Problem

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown rewrite kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    @property
    def exact(self) -> bool:
        """Whether a schedule's speed on ``searched`` is its speed on ``original``."""
        return self.kind != RELAID_TWIN

    @property
    def keeps_nest(self) -> bool:
        """Whether the answer's schedule stays the searched problem's (a fused view: its kernel
        is called through reshapes) rather than becoming one of ``original``."""
        return self.kind == FUSED_VIEW

    def carry_back(self, nest: LoopNest) -> LoopNest:
        """The schedule that serves ``original``, from ``nest``, a schedule of ``searched``."""
        if not isinstance(nest, LoopNest) or nest.problem != self.searched:
            raise ValueError(f"expected a schedule of {self.searched.name}, got {nest!r:.200}")
        return nest if self.keeps_nest else nest.on_problem(self.original)


def transposed_twin(problem: Problem, constant_only: bool = True) -> Problem | None:
    """The twin of ``problem`` (B's letters with the output's last dimension last), or None:
    the right operand must be constant (unless ``constant_only`` is False), hold the output's
    last dimension but not last, and the twin must list the dimensions in the same order."""
    if constant_only and "in1" not in problem.constant:
        return None
    left, right = problem.operands
    column = problem.output[-1]
    if column not in right or right[-1] == column:
        return None
    spec = f"{left},{right.replace(column, '')}{column}->{problem.output}"
    twin = Problem(spec, problem.sizes, problem.constant, problem.epilogue, problem.between, problem.dtype)
    return twin if twin.dims == problem.dims else None


@dataclass(frozen=True)
class RewriteChain:
    """``original`` tuned through a chain of exact rewrites (each one's ``original`` the
    previous one's ``searched``): :attr:`searched` is what is searched, :meth:`carry_back`
    brings its schedule back."""

    original: Problem
    chain: tuple[Rewrite, ...] = ()

    @property
    def searched(self) -> Problem:
        return self.chain[-1].searched if self.chain else self.original

    @property
    def through_fused_view(self) -> bool:
        """Whether the answer's kernel is called through reshapes (:data:`FUSED_VIEW`)."""
        return bool(self.chain) and self.chain[0].kind == FUSED_VIEW

    def as_given(self) -> "RewriteChain | None":
        """This chain without its last rewrite when that is a :data:`TRANSPOSED_TWIN` (what
        tune searches in place: the right operand read as it is stored), else None."""
        if not self.chain or self.chain[-1].kind != TRANSPOSED_TWIN:
            return None
        return RewriteChain(self.original, self.chain[:-1])

    def carry_back(self, nest: LoopNest) -> LoopNest:
        """``nest`` (a schedule of :attr:`searched`) carried back through the chain."""
        for rewrite in reversed(self.chain):
            nest = rewrite.carry_back(nest)
        return nest


def plan_rewrites(problem: Problem) -> RewriteChain:
    """The exact rewrites ``tune`` applies, in order: the fused view (if any), then the
    transposed twin of what it leads to (if its right operand is constant)."""
    chain: list[Rewrite] = []
    searched = problem
    view = fused_view(searched)
    if view is not None:
        chain.append(Rewrite(FUSED_VIEW, searched, view))
        searched = view
    twin = transposed_twin(searched)
    if twin is not None:
        chain.append(Rewrite(TRANSPOSED_TWIN, searched, twin))
    return RewriteChain(problem, tuple(chain))


def relaid_twin(problem: Problem) -> Rewrite | None:
    """The :data:`RELAID_TWIN` rewrite of a problem whose right operand changes per call and
    is stored across the output's columns, or None."""
    if "in1" in problem.constant:
        return None
    twin = transposed_twin(problem, constant_only=False)
    return None if twin is None else Rewrite(RELAID_TWIN, problem, twin)


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
