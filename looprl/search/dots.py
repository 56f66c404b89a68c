"""Tune's in-place proposals: the target's dot-product tiles (:func:`~looprl.ir.schedules.dot_steps`)
of a problem whose inputs both store the reduction contiguously, measured as the problem is
given (``nn.Linear``'s ``mk,nk->mn``, its weight read where it lies).

:func:`dot_proposals` measures every dot-product plan (a handful: each is one action of the
plan actions) through a search context; which of them wins, and whether a team of one does,
is tune's to decide (``looprl.tune``). The records' actions are plan actions of
:func:`in_place_actions`: they replay from the untuned nest.
"""

from __future__ import annotations

from looprl.actions import ActionSet
from looprl.ir.plans import plan_catalogue
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.context import SearchContext


def in_place_actions(target, parallel: bool = False) -> ActionSet:
    """The actions the in-place search's records replay with: the dot-product plans of
    ``target`` (and ``parallel``)."""
    return ActionSet.for_target(target, parallel=parallel, plans=tuple(p.name for p in plan_catalogue(target) if p.dot))


def dot_proposals(context: SearchContext, actions: ActionSet) -> list[ScheduleRecord]:
    """Each dot-product plan of ``actions`` (:func:`in_place_actions`) applied to the untuned
    nest and measured through ``context`` (all of them, whatever the budget), as records found
    "in place" on one thread; plans that do not apply or compile are left out."""
    root = context.root()
    found = []
    for action, name in enumerate(actions.names):
        if name.startswith("plan_dot_"):
            node = context.child(root, action)
            if node is not None:
                found.append(ScheduleRecord(node.state.nest, node.gflops, actions.named(node.path), "in place",
                                            context.target, 1))
    return found
