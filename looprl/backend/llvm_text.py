"""A builder of LLVM IR as text: functions with SSA names and blocks, bottom-tested runtime
loops with carried values, a module of functions and intrinsic declarations, and the vector
memory operations (full, masked, broadcast, gathered loads; full and masked stores) every part of
the code generator emits. Knows nothing of loop nests or targets."""

from __future__ import annotations


def vector_type(lanes: int) -> str:
    return "float" if lanes == 1 else f"<{lanes} x float>"


def mask(lanes: int, active: int) -> str:
    bits = ", ".join("i1 true" if i < active else "i1 false" for i in range(lanes))
    return f"<{lanes} x i1> <{bits}>"



class Function:
    """Text of one LLVM function under construction: SSA names, blocks, lines."""

    def __init__(self, header: str):
        self.lines: list[str] = [header, "entry:"]
        self.allocas: list[str] = []  # stack slots, emitted at the top of the entry block
        self.block = "entry"
        self._counter = 0
        self.loads: dict[tuple, str] = {}  # CSE of loads of read-only inputs within a block

    def alloca(self, typ: str, hint: str = "ctx") -> str:
        """A stack slot of ``typ`` allocated once on entry (never inside a loop)."""
        name = self.tmp(hint)
        self.allocas.append(f"  {name} = alloca {typ}, align 8")
        return name

    def text(self) -> str:
        return "\n".join(self.lines[:2] + self.allocas + self.lines[2:])

    def close(self) -> None:
        """End the function: return, closing brace."""
        self.emit("ret void")
        self.lines.append("}")

    def tmp(self, hint: str = "t") -> str:
        self._counter += 1
        return f"%{hint}{self._counter}"

    def label(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}{self._counter}"

    def emit(self, text: str) -> None:
        self.lines.append("  " + text)

    def start_block(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name
        self.loads = {}

    def value(self, text: str, hint: str = "t") -> str:
        name = self.tmp(hint)
        self.emit(f"{name} = {text}")
        return name

    def advance(self, ptr: str, iv: str, stride: int) -> str:
        if stride == 0:
            return ptr
        off = iv if stride == 1 else self.value(f"mul i64 {iv}, {stride}", "o")
        return self.value(f"getelementptr inbounds float, ptr {ptr}, i64 {off}", "p")

    def offset(self, ptr: str, elements: int) -> str:
        if elements == 0:
            return ptr
        return self.value(f"getelementptr inbounds float, ptr {ptr}, i64 {elements}", "p")

    def loop(self, trips: "int | str", carried: dict | None = None):
        """Context manager for a runtime loop of ``trips`` >= 1 iterations (a constant or an
        i64 SSA value); see :class:`RuntimeLoop`."""
        return RuntimeLoop(self, trips, carried or {})

    def when(self, condition: str) -> "Conditional":
        """Context manager: the body runs only where the i1 ``condition`` (an instruction's
        text, e.g. ``icmp ne i64 %n, 0``) holds; code after it runs either way."""
        return Conditional(self, condition)


class Conditional:
    """The block of :meth:`Function.when`."""

    def __init__(self, fn: Function, condition: str):
        self.fn, self.condition = fn, condition

    def __enter__(self) -> None:
        fn = self.fn
        holds = fn.value(self.condition, "if")
        self.then, self.after = fn.label("then"), fn.label("endif")
        fn.emit(f"br i1 {holds}, label %{self.then}, label %{self.after}")
        fn.start_block(self.then)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.fn.emit(f"br label %{self.after}")
            self.fn.start_block(self.after)


class RuntimeLoop:
    """``for iv in range(trips)`` as a bottom-tested loop. ``carried`` maps keys to
    (type, SSA value); inside the body the phi values are in ``loop.values``; assign the
    updated values there before leaving, and read the results there afterwards."""

    def __init__(self, fn: Function, trips: "int | str", carried: dict):
        self.fn, self.trips, self.carried = fn, trips, carried
        self.values: dict = {}

    def __enter__(self) -> "RuntimeLoop":
        fn = self.fn
        self.pre = fn.block
        self.head = fn.label("loop")
        self.exit = fn.label("after")
        fn.emit(f"br label %{self.head}")
        fn.start_block(self.head)
        self.iv = fn.tmp("i")
        self.ivnext = fn.tmp("inext")
        self.iv_line = len(fn.lines)
        fn.emit("")  # placeholder: the latch is known only after the body
        self.phi_lines = {}
        for key, (typ, init) in self.carried.items():
            name = fn.tmp("c")
            self.phi_lines[key] = (len(fn.lines), name, typ, init)
            fn.emit("")
            self.values[key] = name
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            return
        fn = self.fn
        latch = fn.block
        fn.lines[self.iv_line] = f"  {self.iv} = phi i64 [0, %{self.pre}], [{self.ivnext}, %{latch}]"
        for key, (line, name, typ, init) in self.phi_lines.items():
            fn.lines[line] = f"  {name} = phi {typ} [{init}, %{self.pre}], [{self.values[key]}, %{latch}]"
        fn.emit(f"{self.ivnext} = add nuw nsw i64 {self.iv}, 1")
        more = fn.value(f"icmp ult i64 {self.ivnext}, {self.trips}", "more")
        fn.emit(f"br i1 {more}, label %{self.head}, label %{self.exit}")
        fn.start_block(self.exit)
        # After the loop the carried values are the phis' last updates.



class Module:
    """Functions and the declarations of the intrinsics and runtime functions they call."""

    def __init__(self):
        self.functions: list[Function] = []
        self.declarations: dict[str, str] = {}

    def fma(self, lanes: int) -> str:
        suffix = "f32" if lanes == 1 else f"v{lanes}f32"
        name = f"llvm.fma.{suffix}"
        typ = vector_type(lanes)
        self.declarations[name] = f"declare {typ} @{name}({typ}, {typ}, {typ})"
        return name

    def masked(self, kind: str, lanes: int) -> str:
        name = f"llvm.masked.{kind}.v{lanes}f32.p0"
        typ = vector_type(lanes)
        if kind == "load":
            self.declarations[name] = f"declare {typ} @{name}(ptr, <{lanes} x i1>, {typ})"
        else:
            self.declarations[name] = f"declare void @{name}({typ}, ptr, <{lanes} x i1>)"
        return name

    def declare_openmp(self) -> None:
        """The OpenMP runtime functions parallel code calls (libgomp's)."""
        self.declarations["GOMP_parallel"] = "declare void @GOMP_parallel(ptr, ptr, i32, i32)"
        self.declarations["omp_get_thread_num"] = "declare i32 @omp_get_thread_num() nounwind"
        self.declarations["omp_get_num_threads"] = "declare i32 @omp_get_num_threads() nounwind"

    def text(self) -> str:
        parts = list(self.declarations.values())
        for fn in self.functions:
            parts.append(fn.text())
        return "\n\n".join(parts) + "\n"


def load(module: Module, fn: Function, ptr: str, offset: int, lanes: int, active: int, stride: int, cache: bool = True) -> str:
    key = (ptr, offset, lanes, active, stride)
    if cache and key in fn.loads:
        return fn.loads[key]
    if lanes == 1 or stride == 0:
        addr = fn.offset(ptr, offset)
        scalar = fn.value(f"load float, ptr {addr}, align 4", "s")
        value = scalar if lanes == 1 else splat(fn, scalar, lanes)
    elif stride == 1:
        addr = fn.offset(ptr, offset)
        if active == lanes:
            value = fn.value(f"load {vector_type(lanes)}, ptr {addr}, align 4", "v")
        else:
            name = module.masked("load", lanes)
            value = fn.value(
                f"call {vector_type(lanes)} @{name}(ptr align 4 {addr}, {mask(lanes, active)}, {vector_type(lanes)} zeroinitializer)",
                "v",
            )
    else:  # gather: one scalar load per active lane
        value = "zeroinitializer"
        for lane in range(active):
            addr = fn.offset(ptr, offset + lane * stride)
            scalar = fn.value(f"load float, ptr {addr}, align 4", "s")
            value = fn.value(f"insertelement {vector_type(lanes)} {value}, float {scalar}, i64 {lane}", "g")
    if cache:
        fn.loads[key] = value
    return value


def splat(fn: Function, scalar: str, lanes: int) -> str:
    one = fn.value(f"insertelement <{lanes} x float> poison, float {scalar}, i64 0", "b")
    return fn.value(f"shufflevector <{lanes} x float> {one}, <{lanes} x float> poison, <{lanes} x i32> zeroinitializer", "b")


def emit_team(module: "Module", name: str, serial: str, params: list[tuple[str, str]], shares) -> None:
    """Emit ``void @<name>(<params>, i32 %nthreads)``, which runs ``@<serial>`` on every thread
    of an OpenMP team (``GOMP_parallel``): the parameters (``(type, name)`` pairs, each 8 bytes)
    travel to the threads in a context, and ``shares(body, args, thread)`` returns the serial
    call's argument list for the thread numbered by the i64 SSA value ``thread`` (``args``: the
    parameters' SSA values by name)."""
    module.declare_openmp()
    body = Function(f"define internal void @{name}_body(ptr %ctx) nounwind {{")
    module.functions.append(body)
    args = {}
    for slot, (kind, param) in enumerate(params):
        place = body.value(f"getelementptr inbounds i64, ptr %ctx, i64 {slot}", "f")
        args[param] = body.value(f"load {kind}, ptr {place}, align 8", param)
    number = body.value("call i32 @omp_get_thread_num()", "tid")
    thread = body.value(f"zext i32 {number} to i64", "t")
    body.emit(f"call void @{serial}({', '.join(shares(body, args, thread))})")
    body.close()
    entry = Function(f"define void @{name}({', '.join(f'{kind} %{param}' for kind, param in params)}, i32 %nthreads) nounwind {{")
    module.functions.append(entry)
    context = entry.alloca(f"[{len(params)} x i64]")
    for slot, (kind, param) in enumerate(params):
        place = entry.value(f"getelementptr inbounds i64, ptr {context}, i64 {slot}", "f")
        entry.emit(f"store {kind} %{param}, ptr {place}, align 8")
    entry.emit(f"call void @GOMP_parallel(ptr @{name}_body, ptr {context}, i32 %nthreads, i32 0)")
    entry.close()


def vector_sum(fn: Function, values: list[str], typ: str) -> str:
    """The sum of ``values`` (SSA vectors of ``typ``), added in order."""
    total = values[0]
    for value in values[1:]:
        total = fn.value(f"fadd {typ} {total}, {value}", "s")
    return total


def horizontal_sum(fn: Function, value: str, lanes: int) -> str:
    """The sum of the ``lanes`` floats of the vector ``value`` (a power of two), as a float:
    the upper half added to the lower half until two lanes are left, then those two (a fixed
    order, so the same kernel always gives the same bits)."""
    if lanes == 1:
        return value
    while lanes > 2:
        half = lanes // 2
        typ = vector_type(lanes)
        low = ", ".join(f"i32 {i}" for i in range(half))
        high = ", ".join(f"i32 {i}" for i in range(half, lanes))
        lower = fn.value(f"shufflevector {typ} {value}, {typ} poison, <{half} x i32> <{low}>", "h")
        upper = fn.value(f"shufflevector {typ} {value}, {typ} poison, <{half} x i32> <{high}>", "h")
        value, lanes = fn.value(f"fadd {vector_type(half)} {lower}, {upper}", "h"), half
    first = fn.value(f"extractelement <2 x float> {value}, i64 0", "h")
    second = fn.value(f"extractelement <2 x float> {value}, i64 1", "h")
    return fn.value(f"fadd float {first}, {second}", "h")


def multiply_add(module: Module, fn: Function, a: str, b: str, c: str, lanes: int, fma: bool) -> str:
    """``a * b + c`` on ``lanes`` floats: ``llvm.fma`` where the target has FMA instructions,
    else a multiply, then an add (there ``llvm.fma`` would be a call to ``fmaf`` per lane)."""
    typ = vector_type(lanes)
    if fma:
        return fn.value(f"call {typ} @{module.fma(lanes)}({typ} {a}, {typ} {b}, {typ} {c})", "f")
    product = fn.value(f"fmul {typ} {a}, {b}", "m")
    return fn.value(f"fadd {typ} {c}, {product}", "f")


def store(module: Module, fn: Function, ptr: str, offset: int, lanes: int, active: int, value: str) -> None:
    addr = fn.offset(ptr, offset)
    if active == lanes:
        fn.emit(f"store {vector_type(lanes)} {value}, ptr {addr}, align 4")
    else:
        name = module.masked("store", lanes)
        fn.emit(f"call void @{name}({vector_type(lanes)} {value}, ptr align 4 {addr}, {mask(lanes, active)})")

