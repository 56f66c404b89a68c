"""The runtime loops of a nest, outside its register scope: counted loops, tail iterations as
internal functions specialised on the remaining sizes (memoised, so tails never multiply the
code), and a parallel loop's body outlined into a function that every thread of an OpenMP team
runs on its share of the iterations (:mod:`looprl.backend.threads`). The module these functions
go into takes the kernel's pointers (and the thread count when the schedule has a parallel
loop)."""

from __future__ import annotations

from dataclasses import dataclass

from looprl.backend.llvm_text import Function, Module
from looprl.backend.register_plan import entry_budgets, offset_along
from looprl.ir.layout import Layout
from looprl.ir.nest import Loop
from looprl.ir.nest_layouts import block_lines
from looprl.target import Target


class KernelModule(Module):
    """The kernel's module: its functions take the kernel's pointer arguments (``tensors``) and,
    when the schedule has a parallel loop, ``i32 %nthreads``; tail functions and parallel
    regions are memoised here.

    In a kernel of *runtime rows* (``runtime_rows``) one dimension's extent is an argument: its
    budget is a :class:`Dynamic` value, and every internal function takes the dynamic budget of
    its context as ``i64 %dyn`` (unused where its context is static)."""

    def __init__(self, target: Target, tensors: tuple[str, ...], threaded: bool = False, runtime_rows: bool = False,
                 elements: dict[str, str] | None = None, buffers: tuple[str, ...] = ()):
        super().__init__()
        self.target = target
        self.tensors = tensors  # pointer parameters of the kernel's entry points
        # pointer parameters of its internal functions: the tensors, then workspace buffers
        # (stage buffers: looprl.backend.kernel_plan.Stage) that the entry points place
        self.carried = tensors + tuple(buffers)
        # tensor -> the element type its pointer in the kernel's body addresses, where not "float"
        self.elements: dict[str, str] = dict(elements or {})
        self.threaded = threaded  # the schedule has a parallel loop: functions take %nthreads
        self.runtime_rows = runtime_rows  # internal functions take the dynamic budget, i64 %dyn
        self.tails: dict[tuple, str] = {}
        self.regions: dict[tuple, str] = {}

    def function(self, header: str, append: bool = True) -> Function:
        """A new function (added to the module unless ``append`` is False) whose pointer
        parameters named after :attr:`tensors` address those tensors' elements."""
        fn = Function(header)
        for tensor in self.carried:
            fn.point(f"%{tensor}", self.elements.get(tensor, "float"))
        if append:
            self.functions.append(fn)
        return fn

    def parameters(self) -> str:
        """Parameters of the kernel's internal functions."""
        return (", ".join(f"ptr noalias %{t}" for t in self.carried) + (", i64 %dyn" if self.runtime_rows else "")
                + (", i32 %nthreads" if self.threaded else ""))

    def arguments(self, ptrs: dict[str, str], dynamic: str = "0") -> str:
        """Arguments of a call to an internal function taking :meth:`parameters`; ``dynamic``:
        the value of the callee's dynamic budget (an i64 SSA value or constant)."""
        return (", ".join(f"ptr {ptrs.get(t, 'null')}" for t in self.carried) + (f", i64 {dynamic}" if self.runtime_rows else "")
                + (", i32 %nthreads" if self.threaded else ""))


# A dynamic budget is turned into static ones by a switch over its values; more cases than this
# (each a specialised copy of the nest below) and the kernel is not given runtime rows.
SWITCH_LIMIT = 32


class RuntimeRowsUnsupported(ValueError):
    """The schedule cannot take its row count at run time (see :data:`SWITCH_LIMIT`)."""


@dataclass(frozen=True)
class Dynamic:
    """A budget known only at run time: the i64 SSA value ``value``, between 1 and ``most``."""

    value: str
    most: int


def dynamic_of(budgets: dict) -> tuple[str, Dynamic] | None:
    """The var whose budget is :class:`Dynamic` in ``budgets`` and that budget, if any."""
    for var, budget in budgets.items():
        if isinstance(budget, Dynamic):
            return var, budget
    return None


def _budget_key(budget) -> object:
    """A budget as a memo key: a dynamic one by its bound (its SSA name differs per function)."""
    return ("dynamic", budget.most) if isinstance(budget, Dynamic) else budget


def _renamed(budgets: dict, value: str) -> dict:
    """``budgets`` with the dynamic budget's value named ``value`` (inside a callee)."""
    return {v: Dynamic(value, b.most) if isinstance(b, Dynamic) else b for v, b in budgets.items()}


class NestEmitter:
    """Shared machinery of both nests: budgets, runtime loops, memoised tail functions and
    parallel regions. Subclasses emit the part of the nest from :attr:`inner_start` down."""

    def __init__(self, module: KernelModule, loops: tuple[Loop, ...], coefs: dict[str, dict[str, int]], name: str, layouts=None):
        self.module, self.loops, self.coefs, self.name = module, loops, coefs, name
        self.layouts: dict[str, Layout] = dict(layouts or {})  # tensors addressed through a layout
        self.depth = len(loops)
        self.width = module.target.vector_width
        self.stage_entries: dict[int, list] = {}  # level -> the stages (looprl.backend.kernel_plan.Stage) copied on entry to it
        self._staging: set[int] = set()  # levels whose stages the code being emitted has copied
        # private stage buffers' pointers -> elements between two threads' copies (each thread of
        # the parallel loop's team stages into its own: looprl.backend.kernel_plan.Stage.private)
        self.private: dict[str, int] = {}
        # level -> the prefetches (looprl.backend.kernel_plan.Prefetch) issued on entry to it (an
        # iteration of loop level - 1 starts), and the index letters and element bytes of each tensor
        self.prefetch_entries: dict[int, list] = {}
        self.indices: dict[str, str] = {}
        self.element_bytes = 4
        self._lines: dict[tuple, tuple[int, ...]] = {}

    def entry_budgets(self, level: int) -> tuple[tuple[str, int], ...]:
        """Budgets (full context) of the vars that still have loops at ``level`` or below."""
        return entry_budgets(self.loops, level)

    def delta(self, tensor: str, var: str, elements: int) -> int:
        """Offset in ``tensor`` of moving ``elements`` along ``var``."""
        return offset_along(self.coefs.get(tensor, {}), self.layouts.get(tensor), var, elements)

    def emit_outer(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str]) -> None:
        entering = self.stage_entries.get(level)
        if entering and level not in self._staging:
            self.emit_staged(fn, level, budgets, ptrs, entering)
            return
        dynamic = dynamic_of(budgets)
        below = dynamic is not None and any(lp.var == dynamic[0] for lp in self.loops[level:self.inner_start])
        if dynamic is None or below:  # (a switch calls the loops from here, which prefetch)
            self.emit_prefetches(fn, level, budgets, ptrs)
        if dynamic is not None:
            var, budget = dynamic
            if not below:  # the register scope below needs static extents
                self.emit_switch(fn, level, budgets, ptrs)
                return
            if self.loops[level].var == var:
                if self.loops[level].parallel and budget.most > self.loops[level].step:
                    self.emit_parallel(fn, level, budgets, ptrs)
                else:
                    self.emit_dynamic_loop(fn, level, budgets, ptrs)
                return
        if level >= self.inner_start:
            self.emit_inner_part(fn, level, budgets, ptrs)
            return
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], loop.step)
        child = dict(budgets, **{loop.var: loop.step})
        if loop.parallel and full + (rem > 0) > 1:
            self.emit_parallel(fn, level, budgets, ptrs)
            return
        if full == 1:
            self.emit_outer(fn, level + 1, child, ptrs)
        elif full > 1:
            with fn.loop(full) as lp:
                moved = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                self.emit_outer(fn, level + 1, child, moved)
        if rem:
            self.emit_tail_call(fn, level, budgets, ptrs)

    def emit_staged(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str], stages: list) -> None:
        """Copy the blocks of ``stages`` (an iteration of loop ``level - 1`` starts), then emit
        the loops from ``level`` reading each staged tensor from its buffer, through the
        buffer's layout."""
        saved = {stage.tensor: self.layouts.get(stage.tensor) for stage in stages}
        moved = dict(ptrs)
        for stage in stages:
            self.emit_stage_copy(fn, stage, budgets, ptrs[stage.tensor], ptrs[stage.pointer])
            moved[stage.tensor] = ptrs[stage.pointer]
            self.layouts[stage.tensor] = stage.block
        self._staging.add(level)
        try:
            self.emit_outer(fn, level, budgets, moved)
        finally:
            self._staging.discard(level)
            for tensor, layout in saved.items():
                if layout is None:
                    self.layouts.pop(tensor, None)
                else:
                    self.layouts[tensor] = layout

    def emit_stage_copy(self, fn: Function, stage, budgets: dict, src: str, dst: str) -> None:
        raise NotImplementedError  # only the compute nest stages

    def emit_prefetches(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str], consts: dict | None = None) -> None:
        """The prefetches issued on entry to ``level`` (none where no prefetch step is there):
        each line of its tensor's block (extents ``budgets``, a dynamic one at its largest) from
        ``ptrs[tensor]`` moved by ``consts[tensor]`` elements, ``ahead`` bytes further on. The
        address is a ``getelementptr`` without ``inbounds``: ahead of the last lines it points
        past the tensor, which a prefetch (a hint that never faults) may."""
        for prefetch in self.prefetch_entries.get(level, ()):
            extents = tuple(budgets[var].most if isinstance(budgets[var], Dynamic) else budgets[var]
                            for var in self.indices[prefetch.tensor])
            key = (prefetch.tensor, self.layouts.get(prefetch.tensor), extents)
            lines = self._lines.get(key)
            if lines is None:
                offsets = [[self.delta(prefetch.tensor, var, x) for x in range(extent)]
                           for var, extent in zip(self.indices[prefetch.tensor], extents)]
                # (no more elements than the nest's full block, which why_not_prefetch bounds)
                lines = self._lines[key] = block_lines(offsets, self.element_bytes, most=1 << 16) or ()
            start = (consts or {}).get(prefetch.tensor, 0) * self.element_bytes + prefetch.ahead
            name = self.module.prefetch()
            for line in lines:
                ahead = fn.value(f"getelementptr i8, ptr {ptrs[prefetch.tensor]}, i64 {start + line}", "pf")
                fn.emit(f"call void @{name}(ptr {ahead}, i32 0, i32 3, i32 1)")

    def emit_tail_call(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str]) -> None:
        """Call the function that runs the tail iteration of loop ``level``."""
        loop = self.loops[level]
        full, rem = divmod(budgets[loop.var], loop.step)
        tail_ptrs = {t: fn.offset(p, self.delta(t, loop.var, loop.step * full)) for t, p in ptrs.items()}
        self.call_tail(fn, level + 1, dict(budgets, **{loop.var: rem}), tail_ptrs)

    def call_tail(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str]) -> None:
        """Call the function that runs the loops from ``level`` in a context of ``budgets``."""
        callee = self.tail_function(level, budgets)
        dynamic = dynamic_of(budgets)
        fn.emit(f"call void @{callee}({self.module.arguments(ptrs, dynamic[1].value if dynamic else '0')})")

    def emit_dynamic_loop(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str]) -> None:
        """Loop ``level`` over the dimension whose budget is only known at run time: its whole
        steps as a runtime loop (none when the budget is smaller), then, when the step does not
        divide the budget, the rest as a dynamic budget below (at most ``step - 1``)."""
        loop = self.loops[level]
        budget: Dynamic = budgets[loop.var]
        if budget.most < loop.step:  # never a whole step: the rest is all of it
            self.emit_outer(fn, level + 1, budgets, ptrs)
            return
        full = fn.value(f"udiv i64 {budget.value}, {loop.step}", "full")
        child = dict(budgets, **{loop.var: loop.step})
        with fn.when(f"icmp ne i64 {full}, 0"):
            if budget.most // loop.step == 1:
                self.emit_outer(fn, level + 1, child, ptrs)
            else:
                with fn.loop(full) as lp:
                    moved = {t: fn.advance(p, lp.iv, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                    self.emit_outer(fn, level + 1, child, moved)
        if loop.step == 1:
            return
        rem = fn.value(f"urem i64 {budget.value}, {loop.step}", "rem")
        with fn.when(f"icmp ne i64 {rem}, 0"):
            self.emit_rest(fn, level, budgets, ptrs, full, rem)

    def emit_rest(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str], full: str, rem: str) -> None:
        """The rows left after ``full`` whole steps of loop ``level`` (whose budget is dynamic):
        ``rem`` (1 to ``step - 1``, an SSA value) of them, through the loops below."""
        loop = self.loops[level]
        rest = Dynamic(rem, min(loop.step - 1, budgets[loop.var].most))
        tail_ptrs = {t: fn.advance(p, full, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
        self.emit_outer(fn, level + 1, dict(budgets, **{loop.var: rest}), tail_ptrs)

    def emit_switch(self, fn: Function, level: int, budgets: dict, ptrs: dict[str, str]) -> None:
        """The loops from ``level`` with the dynamic budget made static: one call per value it
        can take, to the nest specialised on that value."""
        var, budget = dynamic_of(budgets)
        if budget.most > SWITCH_LIMIT:
            raise RuntimeRowsUnsupported(
                f"{self.name} nest would need {budget.most} specialised copies for its runtime {var} extent (at most {SWITCH_LIMIT})")
        if budget.most == 1:
            self.call_tail(fn, level, dict(budgets, **{var: 1}), ptrs)
            return
        done = fn.label("switched")
        cases = [(value, fn.label("case")) for value in range(1, budget.most + 1)]
        fn.emit(f"switch i64 {budget.value}, label %{done} [" + " ".join(f"i64 {v}, label %{label}" for v, label in cases) + "]")
        for value, label in cases:
            fn.start_block(label)
            self.call_tail(fn, level, dict(budgets, **{var: value}), ptrs)
            fn.emit(f"br label %{done}")
        fn.start_block(done)

    def emit_parallel(self, fn: Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        """Run parallel loop ``level`` (two or more iterations here) on ``%nthreads`` threads:
        its pointers go into a context on the stack, and the outlined body runs once per thread
        of an OpenMP team (or directly, on one thread)."""
        loop = self.loops[level]
        budget = budgets[loop.var]
        body = self.region_function(level, budgets)
        tensors = self.module.carried
        slots = len(tensors) + self.module.runtime_rows  # the pointers, then any dynamic budget (an i64 in a pointer's slot)
        context = fn.alloca(f"[{slots} x ptr]")
        for slot, tensor in enumerate(tensors):
            place = fn.value(f"getelementptr inbounds [{slots} x ptr], ptr {context}, i64 0, i64 {slot}", "p")
            fn.emit(f"store ptr {ptrs.get(tensor, 'null')}, ptr {place}, align 8")
        dynamic = dynamic_of(budgets)
        if dynamic is not None:
            place = fn.value(f"getelementptr inbounds [{slots} x ptr], ptr {context}, i64 0, i64 {len(tensors)}", "p")
            fn.emit(f"store i64 {dynamic[1].value}, ptr {place}, align 8")
        if isinstance(budget, Dynamic):  # ceil(rows / step), as an i32
            rounded_up = fn.value(f"add nuw nsw i64 {budget.value}, {loop.step - 1}", "it")
            iterations = fn.value(f"trunc i64 {fn.value(f'udiv i64 {rounded_up}, {loop.step}', 'it')} to i32", "it")
        else:
            full, rem = divmod(budget, loop.step)
            iterations = full + (rem > 0)
        more = fn.value(f"icmp ugt i32 %nthreads, {iterations}", "more")
        team = fn.value(f"select i1 {more}, i32 {iterations}, i32 %nthreads", "team")  # no idle threads
        many = fn.value(f"icmp ugt i32 {team}, 1", "many")
        threaded, single, joined = fn.label("team"), fn.label("single"), fn.label("joined")
        fn.emit(f"br i1 {many}, label %{threaded}, label %{single}")
        fn.start_block(threaded)
        self.module.declare_openmp()
        fn.emit(f"call void @GOMP_parallel(ptr @{body}, ptr {context}, i32 {team}, i32 0)")
        fn.emit(f"br label %{joined}")
        fn.start_block(single)
        fn.emit(f"call void @{body}(ptr {context})")
        fn.emit(f"br label %{joined}")
        fn.start_block(joined)

    def emit_region(self, fn: Function, level: int, budgets: dict[str, int]) -> None:
        """The outlined body of parallel loop ``level``: this thread's share of its iterations
        (contiguous, balanced by elements, the last thread's ending with the tail iteration),
        staging into this thread's copies of the private stage buffers (:attr:`private`)."""
        loop = self.loops[level]
        ptrs = {}
        tensors = self.module.carried
        slots = len(tensors) + self.module.runtime_rows
        for slot, tensor in enumerate(tensors):
            place = fn.value(f"getelementptr inbounds [{slots} x ptr], ptr %ctx, i64 0, i64 {slot}", "p")
            loaded = fn.point(fn.value(f"load ptr, ptr {place}, align 8", "q"), self.module.elements.get(tensor, "float"))
            if tensor in self.coefs:
                ptrs[tensor] = loaded
        if dynamic_of(budgets) is not None:
            place = fn.value(f"getelementptr inbounds [{slots} x ptr], ptr %ctx, i64 0, i64 {len(tensors)}", "p")
            budgets = _renamed(budgets, fn.value(f"load i64, ptr {place}, align 8", "dyn"))
        budget = budgets[loop.var]
        if isinstance(budget, Dynamic):  # the rows' whole steps, the rest, the iterations (the rest's included)
            full = fn.value(f"udiv i64 {budget.value}, {loop.step}", "full")
            rem = fn.value(f"urem i64 {budget.value}, {loop.step}", "rem")
            has_rest = fn.value(f"icmp ne i64 {rem}, 0", "part")
            partial = fn.value(f"zext i1 {has_rest} to i64", "part")
            iterations = fn.value(f"add nuw nsw i64 {full}, {partial}", "it")
            twice = fn.value(f"mul nuw nsw i64 {budget.value}, 2", "x")
        else:
            full, rem = divmod(budget, loop.step)
            iterations = full + (rem > 0)
            twice = 2 * budget
        thread = fn.value("call i32 @omp_get_thread_num()", "tid")
        fn.emit("%nthreads = call i32 @omp_get_num_threads()")
        thread64 = fn.value(f"zext i32 {thread} to i64", "tid")
        team64 = fn.value("zext i32 %nthreads to i64", "team")
        for pointer, stride in self.private.items():  # this thread's own stage buffers
            if pointer in ptrs:
                ptrs[pointer] = fn.advance(ptrs[pointer], thread64, stride)
        # Thread t starts at iteration round(t * budget / team / step) (at most the last one).
        half = fn.value(f"mul nuw nsw i64 {team64}, {loop.step}", "h")
        denominator = fn.value(f"mul nuw nsw i64 {half}, 2", "d")

        def boundary(index: str) -> str:
            scaled = fn.value(f"mul nuw nsw i64 {index}, {twice}", "x")
            numerator = fn.value(f"add nuw nsw i64 {scaled}, {half}", "x")
            rounded = fn.value(f"udiv i64 {numerator}, {denominator}", "b")
            over = fn.value(f"icmp ugt i64 {rounded}, {iterations}", "b")
            return fn.value(f"select i1 {over}, i64 {iterations}, i64 {rounded}", "b")

        start = boundary(thread64)
        following = fn.value(f"add nuw nsw i64 {thread64}, 1", "next")
        last = fn.value(f"icmp uge i64 {following}, {team64}", "last")
        inner = boundary(following)
        stop = fn.value(f"select i1 {last}, i64 {iterations}, i64 {inner}", "stop")
        capped = fn.value(f"icmp ugt i64 {stop}, {full}", "cap")
        full_stop = fn.value(f"select i1 {capped}, i64 {full}, i64 {stop}", "stop")
        count = fn.value(f"sub nsw i64 {full_stop}, {start}", "count")
        if full:
            work, idle = fn.label("work"), fn.label("idle")
            busy = fn.value(f"icmp sgt i64 {count}, 0", "busy")
            fn.emit(f"br i1 {busy}, label %{work}, label %{idle}")
            fn.start_block(work)
            child = dict(budgets, **{loop.var: loop.step})
            with fn.loop(count) as lp:
                index = fn.value(f"add nuw nsw i64 {start}, {lp.iv}", "it")
                moved = {t: fn.advance(p, index, self.delta(t, loop.var, loop.step)) for t, p in ptrs.items()}
                self.emit_outer(fn, level + 1, child, moved)
            fn.emit(f"br label %{idle}")
            fn.start_block(idle)
        if rem:  # the thread whose share reaches the end runs the tail iteration
            owner = fn.value(f"icmp eq i64 {stop}, {iterations}", "own")
            started = fn.value(f"icmp ult i64 {start}, {iterations}", "own")
            owns = fn.value(f"and i1 {owner}, {started}", "own")
            if isinstance(budget, Dynamic):  # and only when there is a rest
                owns = fn.value(f"and i1 {owns}, {has_rest}", "own")
            tail, done = fn.label("tail"), fn.label("done")
            fn.emit(f"br i1 {owns}, label %{tail}, label %{done}")
            fn.start_block(tail)
            if isinstance(budget, Dynamic):
                self.emit_rest(fn, level, budgets, ptrs, full, rem)
            else:
                self.emit_tail_call(fn, level, budgets, ptrs)
            fn.emit(f"br label %{done}")
            fn.start_block(done)

    def context_key(self, level: int, budgets: dict[str, int]) -> tuple:
        """What code emitted from ``level`` in a context of ``budgets`` depends on."""
        relevant = {lp.var for lp in self.loops[level:]}
        for entry, stages in self.stage_entries.items():  # a block's extents matter where it is copied
            if level == entry:
                relevant |= {var for stage in stages for var in stage.block.index}
        for prefetch in self.prefetch_entries.get(level, ()):  # and where it is prefetched
            relevant |= set(self.indices[prefetch.tensor])
        return (self.name, level, tuple(sorted((v, _budget_key(b)) for v, b in budgets.items() if v in relevant)))

    def tail_function(self, level: int, budgets: dict[str, int]) -> str:
        """An internal function that runs the loops from ``level`` in a context of
        ``budgets`` (memoised per module)."""
        module = self.module
        key = self.context_key(level, budgets)
        if key not in module.tails:
            name = f"tail{len(module.tails)}_{self.name}_l{level}"
            module.tails[key] = name
            fn = module.function(f"define internal void @{name}({module.parameters()}) nounwind {{", append=False)
            self.emit_outer(fn, level, _renamed(budgets, "%dyn"), {t: f"%{t}" for t in self.coefs})
            fn.close()
            module.functions.append(fn)
        return module.tails[key]

    def region_function(self, level: int, budgets: dict[str, int]) -> str:
        """The outlined body of parallel loop ``level`` in a context of ``budgets`` (memoised)."""
        module = self.module
        key = self.context_key(level, budgets)
        if key not in module.regions:
            name = f"region{len(module.regions)}_{self.name}_l{level}"
            module.regions[key] = name
            module.declare_openmp()
            fn = Function(f"define internal void @{name}(ptr noalias %ctx) nounwind {{")
            module.functions.append(fn)
            self.emit_region(fn, level, budgets)
            fn.close()
        return module.regions[key]

    # Subclasses define inner_start and emit_inner_part (static budgets only).
    inner_start: int

    def emit_inner_part(self, fn: Function, level: int, budgets: dict[str, int], ptrs: dict[str, str]) -> None:
        raise NotImplementedError
