"""A linear layer as looprl tunes it: its problem for each row count, the tunes, the module.

:func:`tune_layer` is the one tune loop of a linear layer (a problem per row count of
:func:`~looprl.torch.rows.tuned_row_counts`, few rows with the model's other weights read between calls), used by
:func:`~looprl.torch.tune_module` and by the ``torch.compile`` backend (:mod:`looprl.dynamo`);
:class:`TunedLinear` is the ``nn.Linear`` that :func:`~looprl.torch.tune_module` puts in a model.
"""

from __future__ import annotations

import torch.nn.functional as functional
from torch import nn

from looprl import defaults
from looprl.backend.host import cache_sizes
from looprl.ir.layers import linear
from looprl.tune.api import TuneResult, tune
from looprl.torch.activations import activation_of_module
from looprl.torch.routes import LinearKernels, Route
from looprl.torch.rows import tuned_row_counts


COLD_ROWS = defaults.COLD_ROWS  # few rows are tuned cold (see looprl.defaults)
# The fallback reason of a fused layer called apart from its activation (directly, or by a
# sequence whose next module is no longer that activation, or with hooks to run), when no example
# called it so: its kernels apply the activation, so torch computes the linear layer alone.
ALONE = "called apart from its fused activation (tuned only with it)"


def weight_bytes(weights) -> int:
    """Bytes of the tensors ``weights``, each counted once (a tied weight is read once)."""
    sizes = {w.data_ptr(): w.numel() * w.element_size() for w in weights}
    return sum(sizes.values())


def layer_problem(count: int, in_features: int, out_features: int, bias: bool, activation: str | None, model_bytes: int,
                  dtype: str = "float32"):
    """The problem tuned for ``count`` rows of a linear layer in a model whose layers' weights
    hold ``model_bytes``: with few rows (:data:`COLD_ROWS`), the other layers' bytes read
    between two of its calls (named cold, shared by every model, where they reach twice this
    host's last-level cache: past that every call reads the weight from memory)."""
    problem = linear(count, in_features, out_features, bias=bias, activation=activation, dtype=dtype)
    between = max(0, int(model_bytes) - problem.element_bytes * in_features * out_features)
    if count > COLD_ROWS or not between:
        return problem
    return problem.with_cold() if between >= 2 * cache_sizes()[1] else problem.with_between(between)


def tune_layer(in_features: int, out_features: int, bias: bool, activation: str | None, rows: set[int], max_rows: int | None,
               model_bytes: int, results: dict[str, TuneResult], tuning: dict, dtype: str = "float32") -> dict[int, TuneResult]:
    """A linear layer's tuned results by row count, for the row counts of
    :func:`~looprl.torch.rows.tuned_row_counts` (``rows``: those seen, ``max_rows``), each the
    :func:`looprl.tune` (with ``tuning``: its keyword arguments) of :func:`layer_problem` in a
    model of ``model_bytes`` of weights. ``results`` (problem name -> result) is shared by the
    layers of a model: a problem already in it is not tuned again, one tuned here is added.
    ``dtype``: the layer's (``"float32"`` or ``"bfloat16"``)."""
    per_rows = {}
    for count in tuned_row_counts(rows, max_rows):
        problem = layer_problem(count, in_features, out_features, bias, activation, model_bytes, dtype)
        if problem.name not in results:
            results[problem.name] = tune(problem, **tuning)
        per_rows[count] = results[problem.name]
    return per_rows


def layer_shape(per_rows: dict[int, TuneResult]) -> tuple:
    """What makes two tuned layers one shape: the problems tuned for them, by row count."""
    return tuple(sorted((count, result.problem.name) for count, result in per_rows.items()))


class TunedLinear(nn.Module):
    """An ``nn.Linear`` that runs looprl kernels on any number of rows (:class:`LinearKernels`)
    and is the original layer where a kernel would not compute the layer's function (see
    :mod:`looprl.torch`). It holds the original's ``weight`` and ``bias`` parameters
    themselves, so its ``state_dict`` has the original's keys. ``results`` maps a row count to
    its :class:`~looprl.tune.results.TuneResult` (1 must be one of them); ``records``, their
    answers as the cache exported them (:func:`save_records`).

    With an ``activation`` (the module that follows the layer in an ``nn.Sequential``),
    ``kernels`` compute ``activation(linear(x))``, for that sequence only (:meth:`fused`, called
    by :class:`~looprl.torch.module.FusedSequential`); the layer called itself (``forward``)
    still computes the linear layer alone, as the original did: by ``alone`` (the layer's
    kernels without the activation, where an example called it so) or else by torch."""

    def __init__(self, original: nn.Linear, activation: nn.Module | None, results: dict[int, TuneResult], records=(),
                 routes: dict[int, Route] | None = None, frozen: bool = False, alone: LinearKernels | None = None):
        super().__init__()
        self.in_features, self.out_features = original.in_features, original.out_features
        self.weight = original.weight
        self.bias = original.bias  # None registers no parameter, as in nn.Linear(bias=False)
        self.activation = activation  # the fused activation module, or None
        self.kernels = LinearKernels(self.in_features, self.out_features, None if activation is None else activation_of_module(activation),
                                     results, records, routes, frozen)
        self.alone = alone if activation is not None else None  # the linear layer's own kernels, where it is also called alone

    @property
    def results(self) -> dict[int, TuneResult]:
        return self.kernels.results

    @property
    def records(self) -> list[dict]:
        return self.kernels.records + (self.alone.records if self.alone is not None else [])

    def all_kernels(self) -> list[LinearKernels]:
        """``kernels`` and, where there are, the kernels of the layer alone."""
        return [self.kernels] + ([self.alone] if self.alone is not None else [])

    def counted(self) -> dict[str, int]:
        """Calls by outcome (``"looprl"`` or a fallback's reason), the fused and the lone ones together."""
        total: dict[str, int] = {}
        for kernels in self.all_kernels():
            for why, count in kernels.counted().items():
                total[why] = total.get(why, 0) + count
        return total

    def extra_repr(self) -> str:
        fused = f", activation={self.kernels.activation}" if self.activation is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{fused}, rows={sorted(self.results)}"

    def why_not(self, x) -> str | None:
        """Why a call on ``x`` falls back to the original layer (a short reason, the key of
        :func:`stats`' ``fallbacks``), or None if a looprl kernel computes it."""
        return self.kernels.why_not(x, self.weight, self.bias)

    def forward(self, x):
        """The linear layer's own function, ``x @ weight.T + bias`` (never the fused activation)."""
        kernels = self.kernels
        weight, bias = self._parameters_now()
        if kernels.activation is None:  # the kernels' own attribute: ``self.activation``, a submodule, is a slower lookup
            return kernels.call(x, weight, bias)
        if self.alone is not None:
            return self.alone.call(x, weight, bias)
        kernels._count(ALONE)
        return functional.linear(x, weight, bias)

    def fused(self, x):
        """``activation(linear(x))``: the layer and the activation that follows it in its sequence."""
        return self.kernels.call(x, *self._parameters_now())

    def _parameters_now(self) -> tuple:
        """``(self.weight, self.bias)`` as they are now, read from the parameters' table where they
        are registered there (``nn.Module.__getattr__``, which ``self.weight`` goes through, reads
        the same table after a failed lookup: about a microsecond a call on a decode step), and
        by ``self.weight`` otherwise (a parametrization's property, pruning's plain attribute)."""
        table = self._parameters
        weight = table["weight"] if "weight" in table else self.weight
        bias = table["bias"] if "bias" in table else self.bias
        return weight, bias
