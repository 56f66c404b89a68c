"""AutoTVM's loop-context features of a schedule, and its transferable relation features.

For every loop of a :class:`~looprl.ir.nest.LoopNest` (depth-first: the compute loops, then
the write-back loops) a *context* row (AutoTVM, appendix A.2.1):

* ``length``: iterations of the loop, ``budget / step`` (a tail counts as a fraction);
* ``top_down`` / ``bottom_up``: products of the lengths of this loop and the loops outside /
  inside it in its nest (how often its body runs; how much work one iteration holds);
* per buffer (``in0``, ``in1`` and the output: the accumulator in the compute nest, the
  output in the write-back nest): ``touch`` (distinct elements one execution of the loop
  touches), ``reuse`` (``bottom_up / touch``: accesses per touched element) and ``stride``
  (elements between two consecutive iterations' accesses; 0 when the buffer does not move);
* ``tail`` (elements), then flags: ``vectorised``, ``register_scope``, ``reduction``,
  ``write_back`` and ``present`` (0 in padding rows).

Counts are scaled with ``log2(1 + x)``; the rows are padded (or cut) to ``max_levels`` rows and
flattened. Vectorisation and the register scope are the code generator's own decisions
(:func:`looprl.backend.register_plan.plan` for a target's vector width and register count): the
innermost loop of a nest is vectorised when it walks the output's last dimension; the loops
of the register scope keep the output tile in registers.

The *relation* features (AutoTVM, section 4) make the vector transferable across problem
shapes and contractions: with Z the compute nest's context matrix (one row per loop, the
first :data:`RELATION_AXES` columns) and thresholds beta_t, feature (i, j, t) is
``max {Z[k, i] : Z[k, j] < beta_t}`` (0 when no loop qualifies), for every ordered pair of
distinct axes. A few whole-schedule values close the vector.

The layout (:func:`feature_names`) has a fixed length for given ``max_levels``, whatever the
problem; bump :data:`FEATURE_VERSION` whenever a value may change. Saved cost models record
:data:`FEATURE_KEY` (it includes the code generator's version) and refuse other features.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np

from looprl import checks, defaults
from looprl.backend.codegen import CODEGEN_VERSION
from looprl.backend.register_plan import ComputePlan, plan, strides
from looprl.ir.nest import WRITE_BACK, Loop, LoopNest
from looprl.target import Target

FEATURE_VERSION = 1  # with the code generator's version: its register planning is a feature
FEATURE_KEY = f"{FEATURE_VERSION}.codegen{CODEGEN_VERSION}"
BUFFERS = ("in0", "in1", "out")
CONTEXT_NAMES = (
    "length", "top_down", "bottom_up",
    *(f"touch_{b}" for b in BUFFERS), *(f"reuse_{b}" for b in BUFFERS), *(f"stride_{b}" for b in BUFFERS),
    "tail", "vectorised", "register_scope", "reduction", "write_back", "present",
)  # fmt: skip
RELATION_AXES = 12  # length .. stride_out: the numeric columns related pairwise
# Thresholds on log2(1 + x): x below 1, 3, 7, 15, 63, 255, 1023, 4095, 32767, 262143.
RELATION_THRESHOLDS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 15.0, 18.0)
GLOBAL_NAMES = ("flops", "compute_loops", "write_back_loops", "tile_registers", "register_blocks", "vectorised", "streaming", "zero_init")
DEFAULT_TARGET = "avx512"
_PAIRS = tuple((i, j) for i in range(RELATION_AXES) for j in range(RELATION_AXES) if i != j)


def feature_names(max_levels: int = defaults.MAX_LOOPS) -> tuple[str, ...]:
    """Name of each entry of the vector :func:`features` returns."""
    names = [f"l{level}.{name}" for level in range(max_levels) for name in CONTEXT_NAMES]
    for i, j in _PAIRS:
        names += [f"max {CONTEXT_NAMES[i]} | {CONTEXT_NAMES[j]} < {t:g}" for t in RELATION_THRESHOLDS]
    return tuple(names + list(GLOBAL_NAMES))


def feature_length(max_levels: int = defaults.MAX_LOOPS) -> int:
    return max_levels * len(CONTEXT_NAMES) + len(_PAIRS) * len(RELATION_THRESHOLDS) + len(GLOBAL_NAMES)


_FEATURES_OF = "features (of one target's register planning)"


@functools.lru_cache(maxsize=8192)
def _register_plan(problem, compute: tuple[Loop, ...], target: Target) -> ComputePlan:
    """The code generator's plan of a compute nest (depends on nothing else)."""
    return plan(LoopNest(problem, compute, ()), target)


def register_plan(nest: LoopNest, target: Target) -> ComputePlan:
    """The code generator's register planning of ``nest``'s compute loops for ``target``
    (:func:`looprl.backend.register_plan.plan`), memoised."""
    return _register_plan(nest.problem, nest.compute, Target.required(target, _FEATURES_OF))


def _log(x: float) -> float:
    return math.log2(1.0 + x)


_FLAGS = 5  # vectorised .. present: the last columns, not log-scaled


def _context_rows(loops: tuple[Loop, ...], terms: dict[str, tuple[str, dict[str, int]]], output: str, scope: int | None, streaming: bool):
    """Raw (unscaled) context rows of one nest's loops; ``terms`` maps each buffer the nest
    accesses to its index and strides; ``scope`` is the register scope's first level
    (compute nest) or None (write-back)."""
    n = len(loops)
    lengths = [lp.budget / lp.step for lp in loops]
    top, bottom = [0.0] * n, [0.0] * n
    product = 1.0
    for k in range(n):
        product *= lengths[k]
        top[k] = product
    product = 1.0
    budgets: dict[str, int] = {}  # outermost budget of each var at level k or below
    rows: list[list[float]] = [[]] * n
    for k in range(n - 1, -1, -1):
        loop = loops[k]
        product *= lengths[k]
        bottom[k] = product
        budgets[loop.var] = loop.budget
        touches, reuses, strides = [0.0] * 3, [0.0] * 3, [0.0] * 3
        for b, buffer in enumerate(BUFFERS):
            accessed = terms.get(buffer)
            if accessed is None:  # not accessed by this nest
                continue
            index, coefs = accessed
            touch = 1
            for dim in index:
                touch *= budgets.get(dim, 1)
            touches[b] = touch
            reuses[b] = product / touch
            strides[b] = coefs.get(loop.var, 0) * loop.step
        rows[k] = [
            lengths[k], top[k], product, *touches, *reuses, *strides, loop.tail,
            float(k == n - 1 and loop.var == output[-1]),  # vectorised
            float(scope is not None and k >= scope and not streaming),  # in the register scope
            float(loop.var not in output), float(loop.nest == WRITE_BACK), 1.0,
        ]  # fmt: skip
    return rows


def context_matrix(nest: LoopNest, target: Target) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, globals)``: one log-scaled context row per loop (``len(nest)`` x
    ``len(CONTEXT_NAMES)``, compute loops first) and the whole-schedule values."""
    if not isinstance(nest, LoopNest):
        raise ValueError(f"expected a LoopNest, got {type(nest).__name__}")
    problem = nest.problem
    output = problem.output
    planned = register_plan(nest, target)
    scope, streaming = planned.scope_start, planned.streaming
    out = (output, strides(problem, output))
    in0, in1 = problem.operands
    compute_terms = {"in0": (in0, strides(problem, in0)), "in1": (in1, strides(problem, in1)), "out": out}
    rows = _context_rows(nest.compute, compute_terms, output, scope, streaming)
    rows += _context_rows(nest.write_back, {"out": out}, output, None, False)
    matrix = np.asarray(rows, dtype=np.float64)
    matrix[:, :-_FLAGS] = np.log2(1.0 + matrix[:, :-_FLAGS])
    globals_ = [
        _log(problem.flops), _log(len(nest.compute)), _log(len(nest.write_back)), _log(planned.tile_registers),
        _log(getattr(planned, "blocks", 1)), float(planned.vector_var is not None), float(streaming), float(planned.zero_init),
    ]  # fmt: skip
    return matrix, np.asarray(globals_, dtype=np.float64)


def features(nest: LoopNest, max_levels: int = defaults.MAX_LOOPS, *, target: Target) -> np.ndarray:
    """The float32 feature vector of ``nest`` (length :func:`feature_length`) for ``target``'s
    register planning."""
    return features_batch([nest], max_levels, target=target)[0]


def features_batch(nests: Iterable[LoopNest], max_levels: int = defaults.MAX_LOOPS, *, target: Target) -> np.ndarray:
    """``(len(nests), feature_length(max_levels))`` float32: one :func:`features` row each."""
    max_levels = checks.positive_int(max_levels, "max_levels")
    target = Target.required(target, _FEATURES_OF)
    nests = list(nests)
    width = len(CONTEXT_NAMES)
    count = len(nests)
    context = np.zeros((count, max_levels, width), dtype=np.float64)
    # The compute rows, padded with rows that never pass a threshold (and never win a max).
    compute = np.zeros((count, max_levels, RELATION_AXES), dtype=np.float64)
    present = np.zeros((count, max_levels), dtype=bool)
    globals_ = np.zeros((count, len(GLOBAL_NAMES)), dtype=np.float64)
    for row, nest in enumerate(nests):
        rows, extra = context_matrix(nest, target)
        kept = rows[:max_levels]
        context[row, : len(kept)] = kept
        loops = min(len(nest.compute), max_levels)
        compute[row, :loops] = rows[:loops, :RELATION_AXES]
        present[row, :loops] = True
        globals_[row] = extra
    relations = _relations(compute, present)
    return np.concatenate([context.reshape(count, -1), relations, globals_], axis=1).astype(np.float32)


def _relations(z: np.ndarray, present: np.ndarray) -> np.ndarray:
    """(N, pairs x thresholds): ``max {z[n, k, i] : z[n, k, j] < beta_t, loop k present}``."""
    count = z.shape[0]
    thresholds = np.asarray(RELATION_THRESHOLDS)
    result = np.zeros((count, RELATION_AXES, RELATION_AXES, len(thresholds)))
    for start in range(0, count, 256):
        block = z[start : start + 256]  # (n, k, axes)
        below = (block[:, :, :, None] < thresholds) & present[start : start + 256, :, None, None]  # (n, k, j, t)
        values = np.where(below[:, :, None, :, :], block[:, :, :, None, None], 0.0)  # (n, k, i, j, t)
        result[start : start + 256] = values.max(axis=1)
    i, j = np.array(_PAIRS).T
    return result[:, i, j, :].reshape(count, -1)
