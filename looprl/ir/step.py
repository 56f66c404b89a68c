"""One schedule step as data: :class:`Step` (``op``, ``loop``, ``arg``, ``tensor``), what
:meth:`LoopNest.apply <looprl.ir.nest.LoopNest.apply>` applies. A schedule is a problem and a
tuple of steps from its untuned nest: applying them gives the kernel's nest, every loop and
every data layout of it.

Every change of a schedule is one of these ops, each a transform of
:class:`~looprl.ir.nest.LoopNest` of the same name, whose ``why_not_<op>`` says why it refuses.
The loop ops:

* ``split``: loop ``loop`` (size s) becomes an outer loop of ``s // arg`` iterations plus a
  tail and an inner loop of ``arg`` iterations;
* ``swap``: loop ``loop`` and the next loop of its nest change places;
* ``merge``: loop ``loop`` and the next loop, a split of one dimension, become one loop again
  (the inverse of a split);
* ``parallel``: loop ``loop``, over an output dimension, is marked parallel;
* ``ksplit``: loop ``loop``, over a reduction dimension of the compute nest, is marked
  parallel: each thread sums its share of the loop's iterations into a partial output of its
  own, and the partials are added into the output before the epilogue (a split-k: where the
  output is too small to share out, :mod:`looprl.ir.nest_threads`);
* ``spill``: loop ``loop``, over a reduction dimension of the compute nest, stores the output
  tile and reloads it at each of its iterations, so that the code generator's register scope
  lies inside it (:mod:`looprl.ir.nest_spill`).

The layout ops (each changes how one input ``tensor``, ``in0`` or ``in1``, or the accumulator
``out`` is stored: :mod:`looprl.ir.layout`):

* ``pack``: ``tensor`` is tiled along loop ``loop``'s dimension by ``arg`` elements, the new
  outer piece outermost and the tile innermost (:meth:`Layout.pack <looprl.ir.layout.Layout.pack>`);
* ``pad``: the physical dimension of ``tensor`` that holds loop ``loop``'s dimension whole is
  padded to a multiple of ``arg`` places;
* ``pair``: the second input's reduction indices of loop ``loop``'s dimension are stored two
  by two side by side (:meth:`Layout.paired <looprl.ir.layout.Layout.paired>`), so a bfloat16
  kernel loads each pair as one 32-bit lane;
* ``innermost``: ``tensor`` (row-major) is stored with loop ``loop``'s dimension innermost, its
  other dimensions in their order (``B[n, k]`` of ``mk,nk->mn`` stored as ``[k, n]``);
* ``stage``: at each iteration of compute loop ``loop``, the block of input ``tensor`` that the
  loops inside it read is copied into a buffer, in the tensor's layout restricted to that block
  (:meth:`Layout.block <looprl.ir.layout.Layout.block>`), and those loops read the buffer: the
  tensor is no longer converted whole (:meth:`LoopNest.stage <looprl.ir.nest.LoopNest.stage>`);
* ``prefetch``: at each iteration of compute loop ``loop``, every cache line of input
  ``tensor`` that the iteration reads is also prefetched ``arg`` bytes further along the
  tensor's memory (:meth:`LoopNest.prefetch <looprl.ir.nest.LoopNest.prefetch>`). It changes no
  layout: like ``stage`` it is a mark a loop carries for one input, so it is a layout op here
  (a step that names a tensor), and it takes an argument, the distance.

``loop`` indexes :attr:`LoopNest.loops <looprl.ir.nest.LoopNest.loops>` (compute loops, then
write-back loops); a split, a pack, a pad and a prefetch have an ``arg``; the layout ops name
their ``tensor``. A step is legal where its transform does not refuse it
(:meth:`LoopNest.why_not <looprl.ir.nest.LoopNest.why_not>`). ``str(step)`` (``split(3, 16)``,
``pack(4, in1, 16)``, ``prefetch(1, in1, 1024)``) and :meth:`Step.parse` are the one pair that writes and reads a step's
name. An env action names steps relative to the cursor (:meth:`looprl.actions.ActionSet.steps`);
the searches, the hand-written schedules and the plans build steps; AutoTVM's annealing
proposes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from looprl import checks

SPLIT, SWAP, MERGE, PARALLEL, KSPLIT, SPILL = "split", "swap", "merge", "parallel", "ksplit", "spill"
PACK, PAD, PAIR, INNERMOST, STAGE, PREFETCH = "pack", "pad", "pair", "innermost", "stage", "prefetch"
OPS = (SPLIT, SWAP, MERGE, PARALLEL, KSPLIT, SPILL)  # the loop ops
LAYOUT_OPS = (PACK, PAD, PAIR, INNERMOST, STAGE, PREFETCH)  # the ops that name a tensor
ALL_OPS = OPS + LAYOUT_OPS
TENSORS = ("in0", "in1", "out")
_WITH_ARG = (SPLIT, PACK, PAD, PREFETCH)  # the ops that take an argument
_TENSORS_OF = {PACK: ("in0", "in1"), PAD: TENSORS, PAIR: ("in1",), INNERMOST: ("in0", "in1"), STAGE: ("in0", "in1"),
               PREFETCH: ("in0", "in1")}
# The split factors an action or a search may name (the IR itself takes any factor from 2):
# wide enough for cache blocks (k blocks of 256, n blocks of 512).
MIN_FACTOR, MAX_FACTOR = 2, 512
_TEXT = re.compile(r"([a-z]+)\(([^()]*)\)", re.ASCII)


@dataclass(frozen=True)
class Step:
    """One transform of a schedule: ``op`` (one of :data:`ALL_OPS`: the loop ops :data:`OPS`,
    the layout ops :data:`LAYOUT_OPS`) at loop ``loop``; ``arg`` is a
    split's factor, a pack's tile, a pad's multiple or a prefetch's distance in bytes (0 for
    the other ops); ``tensor`` the
    tensor a layout op changes ("" for the loop ops). Python and numpy integers are taken alike."""

    op: str
    loop: int
    arg: int = 0
    tensor: str = ""

    def __post_init__(self):
        if self.op not in ALL_OPS:
            raise ValueError(f"unknown transform {self.op!r}; expected one of {', '.join(ALL_OPS)}")
        # Plain ints (what the actions and searches pass, on env.step's path) are taken as they
        # are; anything else (numpy integers, bools) goes through the one integer check.
        if type(self.op) is not str:
            object.__setattr__(self, "op", str(self.op))
        if type(self.loop) is not int:
            object.__setattr__(self, "loop", checks.integer(self.loop, "loop index"))
        if type(self.arg) is not int:
            object.__setattr__(self, "arg", checks.integer(self.arg, "split factor" if self.op == SPLIT else "step argument"))
        if self.op not in _WITH_ARG and self.arg != 0:
            raise ValueError(f"only a split, a pack, a pad or a prefetch takes an argument: {self.op} of loop {self.loop} with {self.arg}")
        if self.op in LAYOUT_OPS:
            if self.tensor not in _TENSORS_OF[self.op]:
                raise ValueError(f"a {self.op} step changes one of {', '.join(_TENSORS_OF[self.op])}, got tensor {self.tensor!r:.80}")
        elif self.tensor != "":
            raise ValueError(f"a {self.op} step changes loops, not a tensor: got tensor {self.tensor!r:.80}")

    @property
    def args(self) -> tuple:
        """The transform's arguments, as :class:`~looprl.ir.nest.LoopNest`'s method of the op
        takes them: ``(loop,)``, then the tensor (layout ops), then the argument (a split's
        factor, a pack's tile, a pad's multiple, a prefetch's distance)."""
        return (self.loop,) + ((self.tensor,) if self.tensor else ()) + ((self.arg,) if self.op in _WITH_ARG else ())

    @property
    def is_layout(self) -> bool:
        """Whether the step changes a tensor's layout (else the loops)."""
        return self.op in LAYOUT_OPS

    def __str__(self) -> str:
        return f"{self.op}({', '.join(map(str, self.args))})"

    @classmethod
    def parse(cls, text: str) -> "Step":
        """The step written ``text`` (``str(step)``: ``split(3, 16)``, ``pack(4, in1, 16)``);
        a ValueError naming the text where it is not one."""
        match = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if match is None or match[1] not in ALL_OPS:
            raise ValueError(f"bad step {text!r:.120}: expected <op>(<loop>[, <tensor>][, <arg>]) with op one of {', '.join(ALL_OPS)}")
        op, parts = match[1], [part.strip() for part in match[2].split(",")]
        expected = 1 + (op in LAYOUT_OPS) + (op in _WITH_ARG)
        numbers = [parts[0]] + ([parts[-1]] if op in _WITH_ARG and len(parts) == expected else [])
        if len(parts) != expected or not all(n.isdigit() for n in numbers):
            form = f"{op}(<loop>" + (", <tensor>" if op in LAYOUT_OPS else "") + (", <arg>" if op in _WITH_ARG else "") + ")"
            raise ValueError(f"bad step {text!r:.120}: expected {form}")
        step = cls(op, int(parts[0]), int(parts[-1]) if op in _WITH_ARG else 0, parts[1] if op in LAYOUT_OPS else "")
        if str(step) != text:
            raise ValueError(f"bad step {text!r:.120}: not written as {str(step)!r}")
        return step


def steps_text(steps) -> list[str]:
    """``steps`` as their names (``str``), the one form records store them in."""
    return [str(step) for step in steps]


def parse_steps(texts) -> tuple[Step, ...]:
    """The steps named ``texts`` (a list of :meth:`Step.parse` names); ValueError naming the
    first that is not one."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        raise ValueError(f"steps must be a list of step names, got {texts!r:.200}")
    return tuple(Step.parse(text) for text in texts)
