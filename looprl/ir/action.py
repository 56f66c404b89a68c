"""An env action as data (:class:`Action`), a name for schedule steps relative to a cursor:
the one place that writes and reads action names (:attr:`Action.name`, :meth:`Action.parse`)
and says which :class:`~looprl.ir.step.Step` values an action takes (:meth:`Action.step`,
:meth:`Action.layout_steps`; a plan action its plan's, :func:`~looprl.ir.plans.plan_steps`). :func:`action_steps` turns a path of action names from the untuned
nest into the steps it takes (what a record written as action names replays as, without an
:class:`~looprl.actions.ActionSet`). What the actions mean is told in :mod:`looprl.actions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from looprl import checks
from looprl.ir.nest import LAYOUT_TENSORS, LoopNest, initial_nest
from looprl.ir.plans import Plan, plan_steps
from looprl.ir.problem import Problem
from looprl.ir.step import KSPLIT, MIN_FACTOR, PACK, PAD, PARALLEL, PREFETCH, SPILL, SPLIT, STAGE, SWAP, Step

DEFAULT_PAD_MULTIPLE = 16  # what ``pad`` pads to in an action set made for no target

MOVES = ("up", "down")
SWAPS = ("swap_up", "swap_down")
LAYOUT_ACTIONS = (PACK, PAD)
PLAN = "plan"
KINDS = MOVES + SWAPS + (SPLIT,) + LAYOUT_ACTIONS + (PARALLEL, PLAN, STAGE, PREFETCH, KSPLIT, SPILL)
STAGED_TENSOR = "in1"  # what the stage action stages: the right operand, block by block (issue 61)
PREFETCHED_TENSOR = "in1"  # what a prefetch_<bytes> action prefetches: the right operand, the weight a few-row kernel streams
# The actions that take an IR step (looprl.ir.step), relative to the cursor c: kind -> (the
# step's op, its loop minus c, where the cursor goes minus c). The cursor follows a swapped loop.
# swap_down comes first: where both swaps reach a step at the same distance, paths take it.
STEP_ACTIONS = {"swap_down": (SWAP, 0, 1), "swap_up": (SWAP, -1, -1), SPLIT: (SPLIT, 0, 0), PARALLEL: (PARALLEL, 0, 0),
                STAGE: (STAGE, 0, 0), PREFETCH: (PREFETCH, 0, 0), KSPLIT: (KSPLIT, 0, 0), SPILL: (SPILL, 0, 0)}
_TENSOR_OF = {STAGE: STAGED_TENSOR, PREFETCH: PREFETCHED_TENSOR}  # the tensor a step action's step names
_SPLIT_PREFIX = SPLIT + "_"
_PREFETCH_PREFIX = PREFETCH + "_"
_WITH_NUMBER = {SPLIT: _SPLIT_PREFIX, PREFETCH: _PREFETCH_PREFIX}  # the kinds whose name ends in a number: its factor


@dataclass(frozen=True)
class Action:
    """One action as data: its kind and, for a split, its factor (for a prefetch, its distance in
    bytes: ``prefetch_1024``, the right operand prefetched at the cursor's loop); for a plan
    action, the plan.

    :attr:`name` and :meth:`parse` are the one pair that turns actions into names and back
    (``"split_16"``, ``"swap_up"``, a plan's name: :class:`~looprl.ir.plans.Plan`); an action
    that changes the loops names an IR step relative to the cursor (:meth:`step`), a layout
    action the layout steps it takes there (:meth:`layout_steps`)."""

    kind: str
    factor: int = 0  # split factor (splits), bytes ahead (prefetches)
    plan: Plan | None = None  # the plan (plan actions only)

    def __post_init__(self):
        checks.one_of(self.kind, "action kind", KINDS)
        if (self.kind in _WITH_NUMBER) != (self.factor != 0):
            raise ValueError(f"only a split or a prefetch has a factor: {self.kind!r} with factor {self.factor}")
        if (self.kind == PLAN) != (self.plan is not None):
            raise ValueError(f"only a plan action has a plan: {self.kind!r} with plan {self.plan}")

    @property
    def name(self) -> str:
        if self.kind == PLAN:
            return self.plan.name
        return f"{_WITH_NUMBER[self.kind]}{self.factor}" if self.kind in _WITH_NUMBER else self.kind

    def step(self, cursor: int) -> Step | None:
        """The IR step this action takes with the cursor on loop ``cursor`` (a swap, a split,
        a parallel mark, a split-k, a spill, the right operand staged or prefetched at the loop), or None
        for an action that takes none (a cursor move, a layout action, a plan)."""
        found = STEP_ACTIONS.get(self.kind)
        if found is None:
            return None
        op, offset, _ = found
        return Step(op, cursor + offset, self.factor, tensor=_TENSOR_OF.get(op, ""))

    def cursor_after(self, cursor: int) -> int:
        """Where the cursor goes when this action applies with the cursor on loop ``cursor``."""
        if self.kind in MOVES:
            return cursor - 1 if self.kind == "up" else cursor + 1
        if self.kind == PLAN:
            return 0
        return cursor + STEP_ACTIONS.get(self.kind, (None, 0, 0))[2]

    @classmethod
    def taking(cls, step: Step) -> "list[tuple[Action, int]]":
        """The actions that take IR ``step``, each with the loop the cursor must be on (a swap
        of loops i and i + 1: ``swap_down`` from i, ``swap_up`` from i + 1); none for a merge."""
        return [(cls(kind, step.arg), step.loop - offset) for kind, (op, offset, _) in STEP_ACTIONS.items()
                if op == step.op and step.tensor == _TENSOR_OF.get(op, "")]

    @property
    def is_move(self) -> bool:
        """Whether the action only moves the cursor (it changes no schedule, measures nothing)."""
        return self.kind in MOVES

    @classmethod
    def parse(cls, name: str) -> "Action | None":
        """The action named ``name`` (``"split_16"``, ``"up"``, ...), or None for no such name."""
        if not isinstance(name, str):
            return None
        for kind, prefix in _WITH_NUMBER.items():
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                factor = int(name[len(prefix):])
                return cls(kind, factor) if factor > 0 else None
        plan = Plan.parse(name)
        if plan is not None:
            return cls(PLAN, plan=plan)
        return cls(name) if name in KINDS and name not in (SPLIT, PLAN, PREFETCH) else None

    def layout_steps(self, nest: LoopNest, cursor: int, pad_multiple: int) -> tuple[Step, ...]:
        """The layout steps a ``pack`` or ``pad`` action takes with the cursor on loop
        ``cursor`` (none where it changes no tensor: the action is then invalid).

        ``pack`` tiles every input the cursor's compute loop walks by that loop's step (for a
        loop of step 1: by the step of the enclosing loop of its dimension, the tile it walks);
        ``pad`` pads the cursor loop's dimension, in every tensor where it is a physical
        dimension of its own other than the outermost, to a multiple of ``pad_multiple``."""
        loop = nest.loops[cursor]
        steps: list[Step] = []
        if self.kind == PACK:
            tile = loop.step
            if tile == 1:
                around = [lp for lp in nest.compute[:cursor] if lp.var == loop.var]
                tile = around[-1].step if around else 1
            if loop.is_write_back or tile < 2:
                return ()
            candidates = [Step(PACK, cursor, tile, tensor) for tensor in ("in0", "in1") if loop.var in nest.tensor_index(tensor)]
        elif self.kind == PAD:
            candidates = [Step(PAD, cursor, pad_multiple, tensor) for tensor in LAYOUT_TENSORS if loop.var in nest.tensor_index(tensor)]
        else:
            return ()
        for step in candidates:
            if nest.why_not(step) is None:
                nest = nest.apply((step,))
                steps.append(step)
        return tuple(steps)


def pad_multiple(target) -> int:
    """What the ``pad`` action pads to on ``target`` (its vector width; None: no target)."""
    return DEFAULT_PAD_MULTIPLE if target is None else max(target.vector_width, MIN_FACTOR)


@lru_cache(maxsize=4096)
def action_steps(problem: Problem, names: tuple[str, ...], target=None, pad_to: int | None = None) -> tuple[Step, ...] | None:
    """The steps the action path ``names`` takes from ``problem``'s untuned nest, the cursor on
    its first loop (``pad`` padding to ``pad_to``, by default :func:`pad_multiple` of
    ``target``; plan actions need ``target``): a plan action replaces the steps before it by
    its own. None where the path does not replay exactly (a name that is no action, an action
    that does not apply where it is taken, a plan without a target)."""
    pad_to = pad_multiple(target) if pad_to is None else pad_to
    nest, cursor, steps = initial_nest(problem), 0, []
    for name in names:
        act = Action.parse(name)
        if act is None:
            return None
        if act.kind in MOVES:
            cursor = act.cursor_after(cursor)
            if not 0 <= cursor < len(nest):
                return None
            continue
        if act.kind == PLAN:
            if target is None:
                return None
            taken = plan_steps(problem, target, act.plan)
            if isinstance(taken, str):
                return None
            nest, cursor, steps = initial_nest(problem).apply(taken), 0, list(taken)
            continue
        step = act.step(cursor)
        taken = (step,) if step is not None else act.layout_steps(nest, cursor, pad_to)
        if not taken or (step is not None and nest.why_not(step) is not None):
            return None
        nest = nest.apply(taken)
        steps += taken
        cursor = act.cursor_after(cursor)
    return tuple(steps)
