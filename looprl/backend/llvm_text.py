"""A builder of LLVM IR as text: functions with SSA names and blocks, bottom-tested runtime
loops with carried values, a module of functions and intrinsic declarations, and the vector
memory operations (full, masked, broadcast, gathered loads; full and masked stores; one float32
buffer added into another) every part of the code generator emits. Knows nothing of loop nests
or targets.

Values are float32. A pointer addresses elements of one type: ``float``, or ``i16`` for
bfloat16 tensors (:attr:`looprl.ir.dtypes.DType.llvm_element`); a function knows each pointer's
element type (:meth:`Function.point`; pointers computed from one keep it), so loads widen
bfloat16 to float32 (exact: the bits moved to the high half) and stores round float32 to
bfloat16 (to nearest, ties to even, NaN kept a NaN: integer operations, the same on every
target)."""

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
        self.elements: dict[str, str] = {}  # pointer SSA name -> element type, where not "float"

    def point(self, ptr: str, element: str) -> str:
        """Record that ``ptr`` addresses elements of ``element`` (``"float"`` or ``"i16"``)."""
        if element != "float":
            self.elements[ptr] = element
        return ptr

    def element(self, ptr: str) -> str:
        """The element type ``ptr`` addresses (``"float"`` unless :meth:`point` said otherwise)."""
        return self.elements.get(ptr, "float")

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
        return self.index(ptr, off)

    def offset(self, ptr: str, elements: int) -> str:
        if elements == 0:
            return ptr
        return self.index(ptr, elements)

    def index(self, ptr: str, elements) -> str:
        """``ptr`` moved by ``elements`` (an i64 constant or SSA value) of its element type."""
        element = self.element(ptr)
        return self.point(self.value(f"getelementptr inbounds {element}, ptr {ptr}, i64 {elements}", "p"), element)

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

    def bfloat16_dot(self, lanes: int) -> str:
        """``vdpbf16ps`` on ``lanes`` float32 lanes (4, 8 or 16): ``acc + a.even * b.even + a.odd * b.odd``
        per lane, ``a`` and ``b`` of ``2 * lanes`` bfloat16."""
        name = f"llvm.x86.avx512bf16.dpbf16ps.{32 * lanes}"
        typ, pairs = vector_type(lanes), f"<{2 * lanes} x bfloat>"
        self.declarations[name] = f"declare {typ} @{name}({typ}, {pairs}, {pairs})"
        return name

    def masked(self, kind: str, lanes: int, element: str = "float") -> str:
        name = f"llvm.masked.{kind}.v{lanes}{'f32' if element == 'float' else element}.p0"
        typ = f"<{lanes} x {element}>"
        if kind == "load":
            self.declarations[name] = f"declare {typ} @{name}(ptr, <{lanes} x i1>, {typ})"
        else:
            self.declarations[name] = f"declare void @{name}({typ}, ptr, <{lanes} x i1>)"
        return name

    def prefetch(self) -> str:
        """``llvm.prefetch`` (a read of the cache line at its address into every level: a hint
        that never faults, so it may point past a buffer's end)."""
        name = "llvm.prefetch.p0"
        self.declarations[name] = f"declare void @{name}(ptr, i32, i32, i32)"
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
    """float32 values from ``ptr`` (+ ``offset`` elements): one scalar (``lanes`` 1), one scalar
    broadcast (``stride`` 0), ``active`` of ``lanes`` consecutive elements (``stride`` 1, the
    rest zeros) or gathered at ``stride``; bfloat16 elements widened."""
    key = (ptr, offset, lanes, active, stride)
    if cache and key in fn.loads:
        return fn.loads[key]
    if fn.element(ptr) == "i16":
        value = _load_bfloat16(module, fn, ptr, offset, lanes, active, stride)
    elif lanes == 1 or stride == 0:
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


def _load_bfloat16(module: Module, fn: Function, ptr: str, offset: int, lanes: int, active: int, stride: int) -> str:
    """:func:`load` of bfloat16 elements: their bits loaded as ``i16``, widened to float32."""
    if lanes == 1 or stride == 0:
        bits = fn.value(f"load i16, ptr {fn.offset(ptr, offset)}, align 2", "s")
        scalar = widen_bfloat16(fn, bits, 1)
        return scalar if lanes == 1 else splat(fn, scalar, lanes)
    typ = f"<{lanes} x i16>"
    if stride == 1:
        addr = fn.offset(ptr, offset)
        if active == lanes:
            bits = fn.value(f"load {typ}, ptr {addr}, align 2", "v")
        else:
            name = module.masked("load", lanes, "i16")
            bits = fn.value(f"call {typ} @{name}(ptr align 2 {addr}, {mask(lanes, active)}, {typ} zeroinitializer)", "v")
    else:
        bits = "zeroinitializer"
        for lane in range(active):
            scalar = fn.value(f"load i16, ptr {fn.offset(ptr, offset + lane * stride)}, align 2", "s")
            bits = fn.value(f"insertelement {typ} {bits}, i16 {scalar}, i64 {lane}", "g")
    return widen_bfloat16(fn, bits, lanes)


def widen_bfloat16(fn: Function, bits: str, lanes: int) -> str:
    """float32 values of the bfloat16 ``bits`` (``lanes`` of ``i16``): the bits become the high
    half of a float32's."""
    shape = (lambda e: e) if lanes == 1 else (lambda e: f"<{lanes} x {e}>")
    wide = fn.value(f"zext {shape('i16')} {bits} to {shape('i32')}", "w")
    shifted = fn.value(f"shl {shape('i32')} {wide}, {int_splat(16, lanes)}", "w")
    return fn.value(f"bitcast {shape('i32')} {shifted} to {vector_type(lanes)}", "w")


def round_to_bfloat16(fn: Function, value: str, lanes: int) -> str:
    """The bfloat16 bits (``lanes`` of ``i16``) of float32 ``value``: to nearest, ties to even
    (add 0x7fff plus the lowest kept bit, keep the high half); a NaN keeps its high half with
    the quiet bit set (rounding could carry it into an infinity)."""
    shape = (lambda e: e) if lanes == 1 else (lambda e: f"<{lanes} x {e}>")
    i32 = shape("i32")
    bits = fn.value(f"bitcast {vector_type(lanes)} {value} to {i32}", "r")
    high = fn.value(f"lshr {i32} {bits}, {int_splat(16, lanes)}", "r")
    odd = fn.value(f"and {i32} {high}, {int_splat(1, lanes)}", "r")
    bias = fn.value(f"add {i32} {odd}, {int_splat(0x7FFF, lanes)}", "r")
    rounded = fn.value(f"lshr {i32} {fn.value(f'add {i32} {bits}, {bias}', 'r')}, {int_splat(16, lanes)}", "r")
    quiet = fn.value(f"or {i32} {high}, {int_splat(0x40, lanes)}", "r")
    nan = fn.value(f"fcmp uno {vector_type(lanes)} {value}, {value}", "r")
    chosen = fn.value(f"select {shape('i1')} {nan}, {i32} {quiet}, {i32} {rounded}", "r")
    return fn.value(f"trunc {i32} {chosen} to {shape('i16')}", "r")


def int_splat(value: int, lanes: int) -> str:
    """An i32 constant: ``value``, or ``lanes`` copies of it."""
    return str(value) if lanes == 1 else f"splat (i32 {value})"


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
    """Store float32 ``value`` (``active`` of its ``lanes``) at ``ptr`` + ``offset`` elements,
    rounded to bfloat16 where ``ptr`` addresses bfloat16."""
    addr = fn.offset(ptr, offset)
    if fn.element(ptr) == "i16":
        bits = round_to_bfloat16(fn, value, lanes)
        typ = "i16" if lanes == 1 else f"<{lanes} x i16>"
        if active == lanes:
            fn.emit(f"store {typ} {bits}, ptr {addr}, align 2")
        else:  # lane by lane: LLVM 22 emits a masked <N x i16> store of one lane as a 4-byte store (past the end)
            for lane in range(active):
                element = fn.value(f"extractelement {typ} {bits}, i64 {lane}", "e")
                fn.emit(f"store i16 {element}, ptr {fn.offset(addr, lane)}, align 2")
        return
    if active == lanes:
        fn.emit(f"store {vector_type(lanes)} {value}, ptr {addr}, align 4")
    else:
        name = module.masked("store", lanes)
        fn.emit(f"call void @{name}({vector_type(lanes)} {value}, ptr align 4 {addr}, {mask(lanes, active)})")


def add_into(module: Module, fn: Function, acc: str, other: str, floats: int, width: int) -> None:
    """``acc[i] += other[i]`` for the ``floats`` float32 elements of both (pointers to
    float32): whole vectors of ``width`` lanes in a runtime loop, then one masked vector for the
    rest."""
    full, rest = divmod(floats, width)
    if full:
        with fn.loop(full) as lp:
            into, read = fn.advance(acc, lp.iv, width), fn.advance(other, lp.iv, width)
            _add_vector(module, fn, into, read, width, width)
    if rest:
        into, read = fn.offset(acc, full * width), fn.offset(other, full * width)
        _add_vector(module, fn, into, read, width, rest)


def _add_vector(module: Module, fn: Function, into: str, read: str, lanes: int, active: int) -> None:
    total = fn.value(f"fadd <{lanes} x float> {load(module, fn, into, 0, lanes, active, 1, cache=False)}, "
                     f"{load(module, fn, read, 0, lanes, active, 1, cache=False)}", "sum")
    store(module, fn, into, 0, lanes, active, total)
