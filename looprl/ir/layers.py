"""Problems of neural-network layers, with their weights as the frameworks store them."""

from __future__ import annotations

from looprl import checks
from looprl.ir.dtypes import DEFAULT_DTYPE
from looprl.ir.epilogue import Epilogue
from looprl.ir.problem import Problem, contraction

LINEAR_SPEC = "mk,nk->mn"


def linear(batch: int, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
           residual: bool = False, scale: float = 1.0, dtype=DEFAULT_DTYPE) -> Problem:
    """``torch.nn.Linear`` and what follows it: ``y = activation(scale * x @ W.T + b) + r``.

    ``x`` is ``[batch, in_features]``, ``W`` is ``[out_features, in_features]`` (stored as
    PyTorch stores it: the spec is ``mk,nk->mn``), ``b`` is ``[out_features]`` (when ``bias``),
    ``r`` is ``[batch, out_features]`` (when ``residual``); ``activation``: None, ``"relu"``,
    ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``. ``W`` is declared constant (a weight): a
    schedule that packs it converts it once, when the kernel is bound to it. A kernel of this
    problem is called ``kernel(x, W, b)`` (and ``r`` last when ``residual``). ``dtype``: of every
    tensor (a :class:`~looprl.ir.dtypes.DType`, ``"float32"`` or ``"bfloat16"``, see :class:`~looprl.ir.problem.Problem`)."""
    sizes = {}
    for name, value in (("batch", batch), ("in_features", in_features), ("out_features", out_features)):
        sizes[name] = checks.positive_int(value, name)
    epilogue = Epilogue(scale=scale, bias=bias, activation=activation, residual=residual)
    return contraction(LINEAR_SPEC, m=sizes["batch"], n=sizes["out_features"], k=sizes["in_features"], constant="in1", epilogue=epilogue,
                       dtype=dtype)
