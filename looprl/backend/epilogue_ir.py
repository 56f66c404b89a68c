"""LLVM IR of a problem's epilogue (:class:`~looprl.ir.epilogue.Epilogue`), applied by the
write-back nest to each value it copies from the accumulator to the output.

The write-back emitter loads the accumulator (and the bias and residual, when the epilogue has
them) as vectors of the target's width, or as scalars where the write-back loop does not walk
the output's last dimension, and :meth:`EpilogueIR.apply` turns them into the output value
with the same vector operations whatever the width, so every target gets vector code:

* relu is a compare and a select (a NaN stays NaN, as in PyTorch);
* exp (for silu and gelu_tanh) is a range reduction ``x = n ln 2 + r`` (n rounded by
  ``llvm.rint``; ln 2 in two parts so that ``n * ln2_hi`` is exact), a polynomial of degree 6
  in ``r`` and ``2^n`` built in the exponent bits; its argument is clamped to where the
  result is a normal float32 (silu's and gelu_tanh's ``x / (1 + exp(-y))`` only need that);
* erf (for gelu) is a rational function ``x P(x^2) / Q(x^2)`` of degrees 11 / 10 fitted on
  ``0 <= x <= 4``, its argument clamped to +-4 (where erf is 1 to float32 precision) and its
  result to +-1;
* silu is ``x / (1 + exp(-x))`` and gelu_tanh ``x / (1 + exp(-2u))`` with
  ``u = sqrt(2/pi) (x + 0.044715 x^3)`` (the same function as ``(1 + tanh u) / 2``, without
  its cancellation for negative u); gelu is ``x (1 + erf(x / sqrt 2)) / 2``.

The coefficients were fitted by ``experiments/fit_epilogue_polynomials.py`` (a minimax fit by
reweighted least squares) and rounded to float32; their error in float32 is tested against
``math.erf`` and ``math.exp``. Multiply-adds are ``llvm.fma`` on targets with FMA, a multiply
and an add elsewhere (as in the compute nest).
"""

from __future__ import annotations

import math
import struct
from typing import Callable

from looprl import checks
from looprl.backend.llvm_text import int_splat
from looprl.ir.epilogue import Epilogue

# erf(x) ~ x * P(x^2) / Q(x^2) on |x| <= ERF_LIMIT (max error 2e-8 in float64, ~4e-7 in float32).
ERF_P = (1.128378987312317, 0.19623462855815887, 0.05346572399139404, 0.004003072157502174, 0.0002880356914829463, 1.9750318642763887e-06)
ERF_Q = (1.0, 0.507239580154419, 0.11647062003612518, 0.01544326450675726, 0.0012162344064563513, 3.748265953618102e-05)
ERF_LIMIT = 4.0
# exp(r) ~ EXP_P(r) on |r| <= ln(2) / 2 (max relative error 2e-9 in float64).
EXP_P = (1.0, 1.0, 0.49999991059303284, 0.16666410863399506, 0.04166828840970993, 0.008375619538128376, 0.0013835689751431346)
# exp's argument is clamped to [EXP_LOW, EXP_HIGH]: 2^n stays a normal float32 (n in -126..127).
EXP_LOW, EXP_HIGH = -87.0, 88.0
LOG2_E = 1.4426950408889634
LN2_HI = 0.693359375  # 355/512: n * LN2_HI is exact for |n| < 2^15
LN2_LO = math.log(2.0) - LN2_HI
SQRT_HALF = math.sqrt(0.5)
GELU_TANH_C = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBE = 0.044715


def float_literal(value: float) -> str:
    """``value`` rounded to float32, as an LLVM float constant (the hex of its double, which
    LLVM requires to be exact in float32)."""
    single = struct.unpack("<f", struct.pack("<f", value))[0]
    return "0x" + struct.pack(">d", single).hex().upper()


class EpilogueIR:
    """Emits one epilogue's operations. ``emit(text, hint)`` appends ``%name = text`` to the
    function being built and returns ``%name``; ``declare(name, declaration)`` records an
    intrinsic the module must declare; ``fma``: the target has fused multiply-add."""

    def __init__(self, epilogue: Epilogue, emit: Callable[[str, str], str], declare: Callable[[str, str], None], fma: bool):
        self.epilogue, self.emit, self.declare, self.fma = epilogue, emit, declare, fma

    # -- types and constants -------------------------------------------------------------
    @staticmethod
    def _type(lanes: int, element: str = "float") -> str:
        return element if lanes == 1 else f"<{lanes} x {element}>"

    def _const(self, value: float, lanes: int) -> str:
        literal = float_literal(value)
        return literal if lanes == 1 else f"splat (float {literal})"

    def _intrinsic(self, base: str, lanes: int, arity: int) -> str:
        name = f"llvm.{base}.{'f32' if lanes == 1 else f'v{lanes}f32'}"
        typ = self._type(lanes)
        self.declare(name, f"declare {typ} @{name}({', '.join([typ] * arity)})")
        return name

    # -- arithmetic ----------------------------------------------------------------------
    def _op(self, op: str, a: str, b: str, lanes: int, hint: str = "e") -> str:
        return self.emit(f"{op} {self._type(lanes)} {a}, {b}", hint)

    def _mul_add(self, a: str, b: str, c: str, lanes: int) -> str:
        """a * b + c."""
        typ = self._type(lanes)
        if self.fma:
            return self.emit(f"call {typ} @{self._intrinsic('fma', lanes, 3)}({typ} {a}, {typ} {b}, {typ} {c})", "e")
        return self._op("fadd", self._op("fmul", a, b, lanes), c, lanes)

    def _polynomial(self, coefficients: tuple[float, ...], x: str, lanes: int) -> str:
        """sum(c_i x^i) by Horner's rule."""
        value = self._const(coefficients[-1], lanes)
        for coefficient in reversed(coefficients[:-1]):
            value = self._mul_add(value, x, self._const(coefficient, lanes), lanes)
        return value

    def _select(self, predicate: str, x: str, bound: float, lanes: int) -> str:
        """``bound`` where ``x <predicate> bound`` holds (ordered: a NaN keeps its value), else x."""
        constant = self._const(bound, lanes)
        test = self.emit(f"fcmp {predicate} {self._type(lanes)} {x}, {constant}", "c")
        return self.emit(f"select {self._type(lanes, 'i1')} {test}, {self._type(lanes)} {constant}, {self._type(lanes)} {x}", "e")

    def _clamp(self, x: str, low: float, high: float, lanes: int) -> str:
        return self._select("olt", self._select("ogt", x, high, lanes), low, lanes)

    # -- functions -----------------------------------------------------------------------
    def exp(self, x: str, lanes: int) -> str:
        typ, ityp = self._type(lanes), self._type(lanes, "i32")
        clamped = self._clamp(x, EXP_LOW, EXP_HIGH, lanes)
        nan = self.emit(f"fcmp uno {typ} {clamped}, {clamped}", "c")  # n from 0 for a NaN: no poison
        finite = self.emit(f"select {self._type(lanes, 'i1')} {nan}, {typ} {self._const(0.0, lanes)}, {typ} {clamped}", "e")
        scaled = self._op("fmul", finite, self._const(LOG2_E, lanes), lanes)
        n = self.emit(f"call {typ} @{self._intrinsic('rint', lanes, 1)}({typ} {scaled})", "e")
        minus_n = self.emit(f"fneg {typ} {n}", "e")
        r = self._mul_add(minus_n, self._const(LN2_HI, lanes), clamped, lanes)
        r = self._mul_add(minus_n, self._const(LN2_LO, lanes), r, lanes)
        p = self._polynomial(EXP_P, r, lanes)
        whole = self.emit(f"fptosi {typ} {n} to {ityp}", "e")
        biased = self.emit(f"add {ityp} {whole}, {int_splat(127, lanes)}", "e")
        bits = self.emit(f"shl {ityp} {biased}, {int_splat(23, lanes)}", "e")
        power = self.emit(f"bitcast {ityp} {bits} to {typ}", "e")
        return self._op("fmul", p, power, lanes)

    def erf(self, x: str, lanes: int) -> str:
        z = self._clamp(x, -ERF_LIMIT, ERF_LIMIT, lanes)
        t = self._op("fmul", z, z, lanes)
        p = self._polynomial(ERF_P, t, lanes)
        q = self._polynomial(ERF_Q, t, lanes)
        ratio = self._op("fdiv", self._op("fmul", z, p, lanes), q, lanes)
        return self._clamp(ratio, -1.0, 1.0, lanes)  # rounding may pass 1 by an ulp

    def _over_one_plus_exp(self, x: str, y: str, lanes: int) -> str:
        """x / (1 + exp(y))."""
        denominator = self._op("fadd", self.exp(y, lanes), self._const(1.0, lanes), lanes)
        return self._op("fdiv", x, denominator, lanes)

    def activation(self, name: str, x: str, lanes: int) -> str:
        typ = self._type(lanes)
        if name == "relu":
            return self._select("olt", x, 0.0, lanes)
        if name == "silu":
            return self._over_one_plus_exp(x, self.emit(f"fneg {typ} {x}", "e"), lanes)
        if name == "gelu_tanh":
            square = self._op("fmul", x, x, lanes)
            inner = self._mul_add(square, self._const(-2.0 * GELU_TANH_C * GELU_TANH_CUBE, lanes), self._const(-2.0 * GELU_TANH_C, lanes), lanes)
            return self._over_one_plus_exp(x, self._op("fmul", x, inner, lanes), lanes)  # exponent -2u
        if name == "gelu":
            erf = self.erf(self._op("fmul", x, self._const(SQRT_HALF, lanes), lanes), lanes)
            half = self._mul_add(erf, self._const(0.5, lanes), self._const(0.5, lanes), lanes)
            return self._op("fmul", x, half, lanes)
        raise ValueError(f"unknown activation {name!r}")

    def apply(self, value: str, lanes: int, bias: str | None, residual: str | None) -> str:
        """The output value from the accumulator's ``value`` (``lanes`` floats), and the bias
        and residual values at the same places (None where the epilogue has none)."""
        epilogue = self.epilogue
        if epilogue.scale != 1.0:
            value = self._op("fmul", value, self._const(epilogue.scale, lanes), lanes)
        if epilogue.bias:
            value = self._op("fadd", value, bias, lanes)
        if epilogue.activation is not None:
            value = self.activation(epilogue.activation, value, lanes)
        if epilogue.residual:
            value = self._op("fadd", value, residual, lanes)
        return value


ELEMENTWISE_NAME = "looprl_elementwise"
FUNCTIONS = ("exp", "erf") + ("relu", "gelu", "gelu_tanh", "silu")


def emit_epilogue(module, fn, epilogue: Epilogue, value: str, lanes: int, inputs: dict[str, str]) -> str:
    """``value`` (``lanes`` floats of the accumulator) through ``epilogue`` into function ``fn``
    of ``module`` (an :class:`~looprl.backend.llvm_text.Function` and its module, for the
    target's FMA): ``inputs`` are the values of its bias and residual at the same places, by name."""
    emitter = EpilogueIR(epilogue, fn.value, module.declarations.__setitem__, module.target.fma)
    return emitter.apply(value, lanes, inputs.get("bias"), inputs.get("residual"))


def elementwise_ir(function: str, lanes: int, fma: bool) -> str:
    """A module defining ``void looprl_elementwise(ptr src, ptr dst, i64 count)``:
    ``dst[i] = function(src[i])`` for ``count`` floats (a positive multiple of ``lanes``),
    ``lanes`` at a time, with exactly the operations an epilogue emits. ``function``: ``exp``,
    ``erf`` or an activation. (For testing the functions on their own, and for inspection.)"""
    function = checks.one_of(function, "function", FUNCTIONS)
    if lanes not in (1, 2, 4, 8, 16):
        raise ValueError(f"lanes must be 1, 2, 4, 8 or 16, got {lanes!r}")
    lines: list[str] = []
    declarations: dict[str, str] = {}
    counter = [0]

    def emit(text: str, hint: str) -> str:
        counter[0] += 1
        name = f"%{hint}{counter[0]}"
        lines.append(f"  {name} = {text}")
        return name

    builder = EpilogueIR(Epilogue(), emit, declarations.__setitem__, fma)
    typ = builder._type(lanes)
    lines += [
        f"define void @{ELEMENTWISE_NAME}(ptr noalias %src, ptr noalias %dst, i64 %count) nounwind {{",
        "entry:",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%next, %loop]",
        "  %from = getelementptr inbounds float, ptr %src, i64 %i",
        f"  %x = load {typ}, ptr %from, align 4",
    ]
    if function == "exp":
        result = builder.exp("%x", lanes)
    elif function == "erf":
        result = builder.erf("%x", lanes)
    else:
        result = builder.activation(function, "%x", lanes)
    lines += [
        "  %to = getelementptr inbounds float, ptr %dst, i64 %i",
        f"  store {typ} {result}, ptr %to, align 4",
        f"  %next = add nuw i64 %i, {lanes}",
        "  %more = icmp ult i64 %next, %count",
        "  br i1 %more, label %loop, label %done",
        "done:",
        "  ret void",
        "}",
    ]
    return "\n\n".join(list(declarations.values()) + ["\n".join(lines)]) + "\n"
