"""The loop-nest IR: immutable values and pure transforms (``split``, ``swap``, ``merge``,
``parallel``; the layout steps ``pack``, ``pad``, ``pair``, ``innermost``), applied one by one
or as :class:`~looprl.ir.step.Step` values (:meth:`LoopNest.apply`).

A schedule of a :class:`~looprl.problem.Problem` is two nests, run one after the other:

* the *compute* nest runs over every dimension and accumulates ``in0 * in1`` into an
  accumulator buffer shaped like the output;
* the *write-back* nest runs over the output dimensions and copies the accumulator to the
  output tensor.

Each loop walks one dimension (its ``var``). A loop with ``size`` n and ``step`` s covers a
*budget* of elements of its dimension: it runs ``budget // s`` full iterations of s elements,
then one tail iteration over the remaining ``budget % s`` elements (if any). The outermost
loop of a dimension has the whole extent as budget; every other loop gets the step of the
loop of the same dimension around it (or, inside a tail iteration, the smaller remainder).
``tail`` is the remainder in the full (non-tail) context, in elements.

A schedule also carries the data layout of each tensor (``in0``, ``in1``, ``out``: see
:mod:`looprl.ir.layout`); a tensor not listed in :attr:`LoopNest.layouts` is row-major. The
output's layout is the accumulator's (the write-back nest unpacks it into the row-major
output array). Layouts appear in :attr:`LoopNest.key` only when some tensor has one, so keys
of row-major schedules are unchanged.

A loop may be marked *parallel*: its iterations are divided among threads
(:mod:`looprl.ir.nest_threads`). A loop over an output dimension by :meth:`LoopNest.parallel`
(its iterations write disjoint output elements and each element's sum runs in the serial order,
so the results are bit-identical to the serial kernel's); a compute loop over a reduction
dimension by :meth:`LoopNest.ksplit` (each thread sums its share into a partial output of its
own, the partials added before the epilogue); at most one loop per nest (compute, write-back):
nested parallel loops are refused, not flattened. A split keeps the mark on the outer loop; a
swap moves the mark with its loop; a merge keeps it on the merged loop. The mark shows in the
printed nest (``parallel for``) and as a ``p`` after the loop in :attr:`LoopNest.key`; keys of
serial schedules are unchanged.

A compute loop may *stage* an input (:meth:`LoopNest.stage`): each of its iterations copies the
block of the input that the loops inside read into a buffer, which those loops read instead (the
input is then not converted whole). The mark shows in the printed nest (``stage in1``) and as
``+in1`` after the loop in :attr:`LoopNest.key`; a split leaves it on the inner loop, a swap
moves it with its loop, a merge keeps it. A stage and a parallel loop go in either order: at or
inside the parallel loop, every thread stages the blocks its own iterations read into a buffer
of its own; outside it, the calling thread stages each block before the team that reads it
starts (:mod:`looprl.backend.kernel_plan`).

A compute loop may *prefetch* an input (:meth:`LoopNest.prefetch`): each of its iterations
also prefetches every cache line of the input it reads a distance further along the input's
memory. The mark shows in the printed nest (``prefetch in1 +1024``) and as ``>in1:1024`` after
the loop in :attr:`LoopNest.key`; it moves with its loop as a stage's does.

A compute loop over a reduction dimension may *spill* the output tile (:meth:`LoopNest.spill`,
:mod:`looprl.ir.nest_spill`): the tile is stored and reloaded at each of its iterations, so the
code generator keeps the nest's order there (``~`` after the loop in :attr:`LoopNest.key`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from looprl import checks
from looprl.ir.layout import Layout
from looprl.ir.nest_layouts import LayoutSteps, prefetch_refusal
from looprl.ir.nest_spill import SpillSteps
from looprl.ir.nest_threads import ThreadSteps
from looprl.ir.problem import Problem
from looprl.ir.step import MIN_FACTOR, Step

COMPUTE = "compute"
WRITE_BACK = "write_back"
LAYOUT_TENSORS = ("in0", "in1", "out")
_KEY_LOOP_RE = re.compile(r"([a-z])([0-9]+)s([0-9]+)(?:t([0-9]+))?(p?)(~?)((?:\+in[01])*)((?:>in[01]:[0-9]+)*)", re.ASCII)


@dataclass(frozen=True)
class Loop:
    """One loop: ``for var in range(size) (step step)`` plus a tail of ``tail`` elements."""

    var: str
    size: int
    step: int
    tail: int
    nest: str  # COMPUTE or WRITE_BACK
    parallel: bool = False  # iterations divided among threads (LoopNest.parallel; over a reduction: LoopNest.ksplit)
    staged: tuple[str, ...] = ()  # inputs whose block this loop's body copies first (LoopNest.stage)
    prefetched: tuple[tuple[str, int], ...] = ()  # (input, bytes ahead) each iteration prefetches (LoopNest.prefetch)
    spilled: bool = False  # the output tile stored and reloaded at each iteration (LoopNest.spill)

    @property
    def budget(self) -> int:
        """Elements of ``var`` this loop covers in its full context."""
        return self.size * self.step + self.tail

    @property
    def is_write_back(self) -> bool:
        return self.nest == WRITE_BACK

    @property
    def iterations(self) -> int:
        """Iterations in its full context: ``size`` full ones plus the tail iteration, if any."""
        return self.size + (self.tail > 0)

    def describe(self) -> str:
        text = ("parallel " if self.parallel else "") + ("spill " if self.spilled else "") + f"for {self.var} in {self.size}"
        if self.step != 1:
            text += f" step {self.step}"
        if self.tail:
            text += f" tail {self.tail}"
        if self.staged:
            text += " stage " + " ".join(self.staged)
        for tensor, ahead in self.prefetched:
            text += f" prefetch {tensor} +{ahead}"
        return text


@dataclass(frozen=True)
class LoopNest(LayoutSteps, ThreadSteps, SpillSteps):
    """A schedule: the problem plus the compute and write-back loops, outermost first.

    Indices used by the transforms (:meth:`split`, :meth:`swap`, :meth:`merge`,
    :meth:`parallel`, and :meth:`apply`'s steps) run over :attr:`loops`, which lists the
    compute loops then the write-back loops (depth-first order).
    """

    problem: Problem
    compute: tuple[Loop, ...]
    write_back: tuple[Loop, ...]
    layouts: tuple[tuple[str, Layout], ...] = ()  # non-row-major tensors, in LAYOUT_TENSORS order

    @staticmethod
    def initial(problem: Problem) -> "LoopNest":
        compute = tuple(Loop(d, problem.size(d), 1, 0, COMPUTE) for d in problem.dims)
        write_back = tuple(Loop(d, problem.size(d), 1, 0, WRITE_BACK) for d in problem.output)
        return LoopNest(problem, compute, write_back)

    @staticmethod
    def from_key(problem: Problem, key: str) -> "LoopNest":
        """The schedule of ``problem`` whose :attr:`key` is ``key`` (the inverse of ``key``).

        The loops must form a schedule that splits and swaps could build: every dimension
        once in the compute nest, the output's in the write-back nest, each dimension's loops
        (outermost first) covering its extent, then the outer loop's step, down to step 1.
        Anything else is a :class:`ValueError` naming the key."""
        if not isinstance(problem, Problem):
            raise ValueError(f"expected a Problem, got {type(problem).__name__}")
        if not isinstance(key, str) or key.count("|") not in (1, 2):
            raise ValueError(f"bad schedule key {key!r}: expected 'compute loops|write-back loops', e.g. 'm8s1,n8s1|m8s1,n8s1'")
        parts = []
        texts = key.split("|")
        for text, which, dims in zip(texts[:2], (COMPUTE, WRITE_BACK), (problem.dims, tuple(problem.output))):
            loops = []
            for item in text.split(",") if text else ():
                match = _KEY_LOOP_RE.fullmatch(item)
                if match is None:
                    raise ValueError(f"bad loop {item!r} in schedule key {key!r}: expected <dim><size>s<step>[t<tail>][p][~]")
                var, size, step, tail, parallel, spilled, staged, prefetched = match.groups()
                if spilled and (which != COMPUTE or var in problem.output):
                    raise ValueError(f"bad loop {item!r} in schedule key {key!r}: only a compute loop over a reduction dimension spills")
                staged = tuple(staged.split("+")[1:])
                if staged and (which != COMPUTE or len(set(staged)) != len(staged)):
                    raise ValueError(f"bad loop {item!r} in schedule key {key!r}: only a compute loop stages, each input once")
                prefetched = tuple((t, int(ahead)) for t, ahead in (mark.split(":") for mark in prefetched.split(">")[1:]))
                why = next((prefetch_refusal(ahead) for _, ahead in prefetched if prefetch_refusal(ahead)), None)
                if prefetched and (which != COMPUTE or why):
                    raise ValueError(f"bad loop {item!r} in schedule key {key!r}: {why or 'only a compute loop prefetches'}")
                loops.append(Loop(var, int(size), int(step), int(tail or 0), which, parallel == "p", staged, prefetched, spilled == "~"))
            _check_chains(problem, loops, dims, which, key)
            _check_parallel(problem, loops, which, key)
            parts.append(tuple(loops))
        nest = LoopNest(problem, parts[0], parts[1])
        if sum(lp.spilled for lp in parts[0]) > 1:
            raise ValueError(f"schedule key {key!r} spills at two loops (at most one is)")
        staged = [t for lp in parts[0] for t in lp.staged]
        if len(set(staged)) != len(staged):
            raise ValueError(f"schedule key {key!r} stages an input at two loops")
        prefetched = [t for lp in parts[0] for t, _ in lp.prefetched]
        if len(set(prefetched)) != len(prefetched) or set(prefetched) & set(staged):
            raise ValueError(f"schedule key {key!r} prefetches an input at two loops, or one it stages")
        if len(texts) == 3:
            for item in texts[2].split(";"):
                tensor, equals, text = item.partition("=")
                if not equals or tensor not in LAYOUT_TENSORS:
                    raise ValueError(f"bad layout {item!r} in schedule key {key!r}: expected <in0|in1|out>=<layout>")
                if dict(nest.layouts).get(tensor) is not None:
                    raise ValueError(f"schedule key {key!r} gives the layout of {tensor} twice")
                index = nest.tensor_index(tensor)
                try:
                    layout = Layout.from_key(index, problem.shape(index), text)
                except ValueError as error:
                    raise ValueError(f"schedule key {key!r}: {error}") from None
                if layout.is_row_major:
                    raise ValueError(f"schedule key {key!r} lists the row-major layout of {tensor}; leave it out")
                nest = nest.with_layout(tensor, layout)
            if nest.key != key:
                raise ValueError(f"schedule key {key!r} is not canonical (expected {nest.key!r})")
        return nest

    # -- views -----------------------------------------------------------------
    @property
    def loops(self) -> tuple[Loop, ...]:
        return self.compute + self.write_back

    def __len__(self) -> int:
        return len(self.compute) + len(self.write_back)

    @property
    def parallel_loops(self) -> tuple[int, ...]:
        """Indices (into :attr:`loops`) of the parallel loops: at most one per nest."""
        return tuple(i for i, lp in enumerate(self.loops) if lp.parallel)

    @cached_property
    def is_parallel(self) -> bool:
        """Whether some loop is parallel (the kernel then runs on ``threads`` threads; read on
        every kernel call, so kept)."""
        return any(lp.parallel for lp in self.loops)

    @cached_property
    def key(self) -> str:
        """Canonical text of the schedule (the problem excluded): a cache key."""

        def part(loops: tuple[Loop, ...]) -> str:
            return ",".join(f"{lp.var}{lp.size}s{lp.step}" + (f"t{lp.tail}" if lp.tail else "") + ("p" if lp.parallel else "") + ("~" if lp.spilled else "")
                            + "".join(f"+{t}" for t in lp.staged) + "".join(f">{t}:{a}" for t, a in lp.prefetched) for lp in loops)

        text = part(self.compute) + "|" + part(self.write_back)
        if self.layouts:
            text += "|" + ";".join(f"{t}={layout.key}" for t, layout in self.layouts)
        return text

    # -- layouts -----------------------------------------------------------------
    def tensor_index(self, tensor: str) -> str:
        """Index letters of ``in0``, ``in1`` or ``out``."""
        if tensor == "in0":
            return self.problem.operands[0]
        if tensor == "in1":
            return self.problem.operands[1]
        if tensor == "out":
            return self.problem.output
        raise ValueError(f"unknown tensor {tensor!r}; expected one of {', '.join(LAYOUT_TENSORS)}")

    def layout(self, tensor: str) -> Layout:
        """The layout of ``tensor`` (row-major unless set)."""
        found = dict(self.layouts).get(tensor)
        if found is not None:
            return found
        index = self.tensor_index(tensor)
        return Layout.row_major(index, self.problem.shape(index))

    def with_layout(self, tensor: str, layout: Layout) -> "LoopNest":
        """This schedule with ``tensor`` stored in ``layout``."""
        index = self.tensor_index(tensor)
        if not isinstance(layout, Layout) or layout.index != index or layout.sizes != self.problem.shape(index):
            raise ValueError(f"{layout!r:.200} is not a layout of {tensor} ({index}, shape {self.problem.shape(index)})")
        why = self.why_not_layout(tensor, layout)
        if why is not None:
            raise ValueError(why)
        layouts = dict(self.layouts)
        layouts.pop(tensor, None)
        if not layout.is_row_major:
            layouts[tensor] = layout
        return replace(self, layouts=tuple((t, layouts[t]) for t in LAYOUT_TENSORS if t in layouts))

    def without_pairs(self, tensor: str = "in1") -> "LoopNest":
        """This schedule with ``tensor``'s pairs (a pair step's layout: :meth:`Layout.unpaired`)
        undone; itself where it has none."""
        layout = self.layout(tensor)
        plain = layout.unpaired()
        return self if plain is layout else self.with_layout(tensor, plain)

    def on_problem(self, problem: Problem) -> "LoopNest":
        """The same loops, as a schedule of ``problem``, an equivalent problem whose tensors hold
        the same dimensions of the same sizes, listed in the same order, possibly indexed in
        another order (a twin: :mod:`looprl.ir.rewrites`); each tensor keeps its physical
        layout (:meth:`Layout.reindexed`)."""
        if not isinstance(problem, Problem) or problem.dims != self.problem.dims or problem.sizes != self.problem.sizes:
            raise ValueError(f"a schedule of {self.problem.name} cannot be one of {problem!r:.200}: not the same dimensions and sizes")
        if problem.output != self.problem.output:
            raise ValueError(f"a schedule of {self.problem.name} cannot be one of {problem.name}: the outputs differ")
        result = LoopNest(problem, self.compute, self.write_back)
        for tensor in LAYOUT_TENSORS:
            index = result.tensor_index(tensor)
            result = result.with_layout(tensor, self.layout(tensor).reindexed(index, problem.shape(index)))
        return result

    def to_text(self, cursor: int | None = None) -> str:
        """Readable pseudo-code; ``cursor`` marks one loop index with ``<-``."""
        lines = [f"# {self.problem.name}"]
        (in0, in1), out = self.problem.operands, self.problem.output
        for depth, (index, loop) in enumerate(self._indexed(COMPUTE)):
            lines.append(self._line(depth, index, loop, cursor))
        depth, partial = len(self.compute), self.split_reduction is not None
        lines.append("  " * depth + f"acc{'_thread' * partial}[{out}] += in0[{in0}] * in1[{in1}]")
        if partial:
            lines.append(f"acc[{out}] = sum of acc_thread[{out}] over the threads")
        for depth, (index, loop) in enumerate(self._indexed(WRITE_BACK)):
            lines.append(self._line(depth, index, loop, cursor))
        lines.append("  " * len(self.write_back) + f"out[{out}] = {self.problem.epilogue.describe(out)}")
        for tensor, layout in self.layouts:
            lines.append(f"# layout {tensor}{'/acc' if tensor == 'out' else ''}: {layout.describe()}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _indexed(self, which: str):
        offset = 0 if which == COMPUTE else len(self.compute)
        loops = self.compute if which == COMPUTE else self.write_back
        return [(offset + i, lp) for i, lp in enumerate(loops)]

    @staticmethod
    def _line(depth: int, index: int, loop: Loop, cursor: int | None) -> str:
        mark = "  <-" if index == cursor else ""
        return "  " * depth + loop.describe() + ":" + mark

    # -- transforms ------------------------------------------------------------
    def split(self, index: int, factor: int) -> "LoopNest":
        """Split loop ``index`` (size s) into an outer loop of ``s // factor`` iterations
        (plus the tail) and an inner loop of ``factor`` iterations. ``index`` and ``factor``
        may be Python or numpy integers."""
        index = checks.integer(index, "loop index")
        loop = self._loop(index)
        factor = checks.integer(factor, "split factor")
        why = self.why_not_split(index, factor)
        if why is not None:
            raise ValueError(why)
        outer = Loop(loop.var, loop.size // factor, loop.step * factor, (loop.size % factor) * loop.step + loop.tail, loop.nest, loop.parallel,
                     spilled=loop.spilled)
        # A parallel loop's mark and a spill stay on the outer part; a stage or a prefetch stays on
        # the inner one, whose iterations read the same blocks.
        inner = Loop(loop.var, factor, loop.step, 0, loop.nest, staged=loop.staged, prefetched=loop.prefetched)
        return self._replace_range(index, index + 1, (outer, inner))

    def why_not_split(self, index: int, factor: int) -> str | None:
        """Why :meth:`split` refuses loop ``index`` by ``factor``, or None if it applies."""
        loop = self._loop(checks.integer(index, "loop index"))
        if factor < MIN_FACTOR:
            return f"split factor must be >= {MIN_FACTOR}, got {factor}"
        if factor > loop.size:
            return f"cannot split loop {index} ({loop.describe()}) by {factor}: factor exceeds its size"
        return None

    def swap(self, index: int) -> "LoopNest":
        """Exchange loop ``index`` with loop ``index + 1`` of the same nest."""
        index = checks.integer(index, "loop index")
        self._loop(index)
        why = self.why_not_swap(index)
        if why is not None:
            raise ValueError(why)
        return self._replace_range(index, index + 2, (self.loops[index + 1], self.loops[index]))  # marks move with their loops

    def why_not_swap(self, index: int) -> str | None:
        """Why :meth:`swap` refuses loop ``index`` (exchanging it with the next), or None.
        An index outside the nest is refused too (the cursor's neighbour may not exist)."""
        index = checks.integer(index, "loop index")
        if not 0 <= index < len(self):
            return f"loop index {index} out of range: the nest has {len(self)} loops"
        first = self.loops[index]
        if index + 1 >= len(self) or self.loops[index + 1].nest != first.nest:
            return f"cannot swap loop {index}: it is the innermost loop of the {first.nest} nest"
        if first.var == self.loops[index + 1].var:
            return f"cannot swap loops {index} and {index + 1}: both walk {first.var!r}, and the inner one covers the outer one's step"
        return None

    def merge(self, index: int) -> "LoopNest":
        """Merge loop ``index`` with loop ``index + 1``, the inner loop of a split of its
        dimension, into one loop (the inverse of :meth:`split`): an outer loop of ``a``
        iterations of step ``f * s`` with a tail of ``t`` elements over an inner one of ``f``
        iterations of step ``s`` becomes ``a * f + t // s`` iterations of step ``s`` with a tail
        of ``t % s``, the same elements in the same order. A parallel mark stays on the merged loop."""
        index = checks.integer(index, "loop index")
        self._loop(index)
        why = self.why_not_merge(index)
        if why is not None:
            raise ValueError(why)
        outer, inner = self.loops[index], self.loops[index + 1]
        size = outer.size * inner.size + outer.tail // inner.step
        merged = Loop(outer.var, size, inner.step, outer.tail % inner.step, outer.nest, outer.parallel or inner.parallel,
                      outer.staged + inner.staged, outer.prefetched + inner.prefetched, outer.spilled or inner.spilled)
        return self._replace_range(index, index + 2, (merged,))

    def why_not_merge(self, index: int) -> str | None:
        """Why :meth:`merge` refuses loop ``index`` (merging it with the next), or None."""
        index = checks.integer(index, "loop index")
        if not 0 <= index < len(self):
            return f"loop index {index} out of range: the nest has {len(self)} loops"
        outer = self.loops[index]
        if index + 1 >= len(self) or self.loops[index + 1].nest != outer.nest:
            return f"cannot merge loop {index}: it is the innermost loop of the {outer.nest} nest"
        inner = self.loops[index + 1]
        if inner.var != outer.var or inner.budget != outer.step:
            return f"cannot merge loops {index} and {index + 1}: they are not a split of one dimension ({outer.describe()}; {inner.describe()})"
        if inner.tail:
            return f"cannot merge loops {index} and {index + 1}: the inner one has a tail of its own (merge the loops inside it first)"
        return None

    def _loop(self, index: int) -> Loop:
        """Loop ``index``, a Python int (callers convert with :func:`looprl.checks.integer`)."""
        if not 0 <= index < len(self):
            raise ValueError(f"loop index {index} out of range: the nest has {len(self)} loops")
        return self.loops[index]

    def _replace_range(self, start: int, stop: int, new: tuple[Loop, ...]) -> "LoopNest":
        loops = self.loops[:start] + new + self.loops[stop:]
        compute = tuple(lp for lp in loops if lp.nest == COMPUTE)
        write_back = tuple(lp for lp in loops if lp.nest == WRITE_BACK)
        return replace(self, compute=compute, write_back=write_back)

    def apply(self, steps) -> "LoopNest":
        """This schedule after ``steps`` (:class:`~looprl.ir.step.Step` values), in order: each
        by the transform its op names; a step that does not apply raises that transform's
        ValueError."""
        nest = self
        for step in steps:
            if not isinstance(step, Step):
                raise ValueError(f"expected a Step (looprl.ir.step), got {step!r:.200}")
            nest = getattr(nest, step.op)(*step.args)
        return nest

    def why_not(self, step: Step) -> str | None:
        """Why ``step`` does not apply to this schedule (its transform's ``why_not_<op>``), or
        None if it applies (a split, swap, merge or parallel step; any layout step)."""
        if not isinstance(step, Step):
            raise ValueError(f"expected a Step (looprl.ir.step), got {step!r:.200}")
        if not 0 <= step.loop < len(self):
            return f"loop index {step.loop} out of range: the nest has {len(self)} loops"
        return getattr(self, f"why_not_{step.op}")(*step.args)


def _check_chains(problem: Problem, loops: list[Loop], dims: tuple[str, ...], which: str, key: str) -> None:
    """Refuse loops of one nest that splits and swaps of the untiled nest could not build."""
    found = tuple(dict.fromkeys(lp.var for lp in loops))
    if sorted(found) != sorted(dims):
        raise ValueError(f"schedule key {key!r} of {problem.name}: the {which} nest walks {found}, expected each of {tuple(dims)}")
    for var in found:
        covered = problem.size(var)  # elements the next loop of var must cover
        for loop in (lp for lp in loops if lp.var == var):
            if loop.size < 1 or loop.step < 1 or loop.tail >= loop.step or loop.budget != covered:
                raise ValueError(
                    f"schedule key {key!r} of {problem.name}: the {which} loop '{loop.describe()}' does not cover "
                    f"{covered} elements of {var!r} with a tail shorter than its step"
                )
            covered = loop.step
        if covered != 1:
            raise ValueError(f"schedule key {key!r} of {problem.name}: the innermost {which} loop of {var!r} has step {covered}, not 1")


def _check_parallel(problem: Problem, loops: list[Loop], which: str, key: str) -> None:
    """Refuse parallel marks that :meth:`LoopNest.parallel` would not have set."""
    marked = [lp for lp in loops if lp.parallel]  # (one over a reduction dimension: a ksplit)
    if len(marked) > 1:
        raise ValueError(f"schedule key {key!r} of {problem.name}: the {which} nest has {len(marked)} parallel loops; at most one is allowed")


def initial_nest(problem: Problem) -> LoopNest:
    """The untiled nest of ``problem`` in first-appearance order, plus the write-back nest."""
    if not isinstance(problem, Problem):
        raise ValueError(f"expected a Problem, got {type(problem).__name__}")
    return LoopNest.initial(problem)
