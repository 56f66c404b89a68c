"""Element-wise epilogues of a contraction's output: scale, bias, activation, residual.

An :class:`Epilogue` is part of a :class:`~looprl.ir.problem.Problem`: the problem computes

    out = activation(scale * contraction + bias) + residual

where ``bias`` is a vector over the output's last dimension (a layer's output features: one
value per output column, broadcast over the other dimensions) and ``residual`` an input of the
output's shape, each present only when the epilogue says so. Every part is optional; the
identity epilogue (scale 1, nothing else) is a plain contraction. The epilogue runs in the
schedule's write-back nest, so it changes neither the loop nests a schedule may have nor the
actions that build them.

Activations are the functions PyTorch computes by these names (float32):

* ``relu``: max(x, 0) (``torch.nn.ReLU``);
* ``gelu``: x * (1 + erf(x / sqrt 2)) / 2, exact (``torch.nn.GELU()``);
* ``gelu_tanh``: x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2
  (``torch.nn.GELU(approximate="tanh")``);
* ``silu``: x / (1 + exp(-x)) (``torch.nn.SiLU``).

:attr:`Epilogue.key` names an epilogue in a problem's name (``...;epilogue=bias+gelu``); its
parts come in the order they are applied. ``scale`` is kept as the float32 it is applied as.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from looprl import checks

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[-+]?[0-9]+)?", re.ASCII | re.IGNORECASE)


def as_float32_scale(value) -> float:
    """``value`` (a real number) rounded to float32, as a Python float; a ValueError if it is
    not a finite real number or overflows float32."""
    value = checks.finite_float(value, "epilogue scale")
    with np.errstate(over="ignore"):
        rounded = np.float32(value)
    if not np.isfinite(rounded):
        raise ValueError(f"epilogue scale {value!r} overflows float32")
    return float(rounded)


@dataclass(frozen=True)
class Epilogue:
    """``activation(scale * x + bias) + residual`` on every output element ``x``.

    ``scale``: a finite real number (stored as its float32 value); ``bias``: a per-column
    (output's last dimension) vector is added; ``activation``: None or one of
    :data:`ACTIVATIONS`; ``residual``: an output-shaped input is added last."""

    scale: float = 1.0
    bias: bool = False
    activation: str | None = None
    residual: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", as_float32_scale(self.scale))
        for name in ("bias", "residual"):
            object.__setattr__(self, name, checks.flag(getattr(self, name), f"epilogue {name}"))
        object.__setattr__(self, "activation", checks.one_of(self.activation, "activation", ACTIVATIONS, allow_none=True))

    @property
    def is_identity(self) -> bool:
        """Whether the epilogue leaves the contraction's output as it is."""
        return self.scale == 1.0 and not self.bias and self.activation is None and not self.residual

    @property
    def inputs(self) -> tuple[str, ...]:
        """The extra inputs a kernel of this epilogue takes, in call order: ``"bias"``,
        ``"residual"``."""
        return (("bias",) if self.bias else ()) + (("residual",) if self.residual else ())

    @property
    def key(self) -> str:
        """Canonical text, parts joined by ``+`` in the order applied (``""`` for the
        identity): ``scale<float32>``, ``bias``, the activation, ``residual``."""
        parts = []
        if self.scale != 1.0:
            parts.append("scale" + _scale_text(self.scale))
        if self.bias:
            parts.append("bias")
        if self.activation is not None:
            parts.append(self.activation)
        if self.residual:
            parts.append("residual")
        return "+".join(parts)

    @staticmethod
    def from_key(text: str) -> "Epilogue":
        """The epilogue whose :attr:`key` is ``text`` (parts in the canonical order)."""
        if not isinstance(text, str):
            raise ValueError(f"expected an epilogue key like 'bias+gelu', got {type(text).__name__}")
        fields: dict = {}
        order = ("scale", "bias", "activation", "residual")
        last = -1
        for part in text.split("+") if text.strip() else ():
            part = part.strip()
            if part == "bias":
                name, value = "bias", True
            elif part == "residual":
                name, value = "residual", True
            elif part in ACTIVATIONS:
                name, value = "activation", part
            elif part.startswith("scale") and _NUMBER_RE.fullmatch(part[5:]):
                name, value = "scale", float(part[5:])
            else:
                raise ValueError(
                    f"bad epilogue part {part!r} in {text!r}; expected scale<number>, bias, one of {', '.join(ACTIVATIONS)}, residual"
                )
            position = order.index(name)
            if name in fields:
                raise ValueError(f"epilogue {text!r} gives its {name} twice")
            if position < last:
                raise ValueError(f"epilogue {text!r}: parts must come in the order applied (scale, bias, activation, residual)")
            last = position
            fields[name] = value
        return Epilogue(**fields)

    def describe(self, index: str) -> str:
        """The output element ``index`` (the output's letters) as an expression, e.g.
        ``gelu(acc[mn] + bias[n]) + residual[mn]``."""
        text = f"acc[{index}]"
        if self.scale != 1.0:
            text = f"{_scale_text(self.scale)} * {text}"
        if self.bias:
            text = f"{text} + bias[{index[-1]}]"
        if self.activation is not None:
            text = f"{self.activation}({text})"
        if self.residual:
            text = f"{text} + residual[{index}]"
        return text


def _scale_text(scale: float) -> str:
    """The shortest text that reads back as the float32 ``scale`` (no ``+``: it joins parts)."""
    return str(np.float32(scale)).replace("e+", "e")


IDENTITY = Epilogue()


def as_epilogue(value) -> Epilogue:
    """An :class:`Epilogue` from itself, None (the identity) or its key text."""
    if value is None:
        return IDENTITY
    if isinstance(value, Epilogue):
        return value
    if isinstance(value, str):
        return Epilogue.from_key(value)
    raise ValueError(f"epilogue must be an Epilogue, its key (e.g. 'bias+gelu') or None, got {type(value).__name__}")
