"""What an agent sees of a schedule: the LoopTune state graph and the per-loop feature vector.

The graph (LoopTune, Fig. 4) has three kinds of nodes and three kinds of edges:

* nodes: ``("loop", i)`` for loop ``i`` of :attr:`LoopNest.loops` (depth-first order),
  ``("tensor", name)`` for ``in0``, ``in1``, ``acc`` and ``out`` (each with its ``dtype``, a
  :class:`~looprl.ir.dtypes.DType`: the problem's, the accumulator's float32), and the two statements
  ``("stmt", "compute")`` (``acc += in0 * in1``) and ``("stmt", "write_back")``
  (``out = acc``);
  (a loop node's ``parallel`` attribute says whether it is a parallel loop);
* ``kind="nest"`` edges from each loop to the loop (or statement) directly inside it;
* ``kind="data"`` edges from the tensors a statement reads to the statement and from the
  statement to the tensor it writes;
* ``kind="stride"`` edges from a loop to every tensor its statement accesses with a
  non-zero stride, carrying ``stride`` (elements between the addresses touched by two
  consecutive iterations: the coefficient of the loop's variable in the tensor's row-major
  flattened index times the loop's step; for a tensor the kernel stores in another data
  layout, the offset that one step moves in that layout) and ``weight`` (how often that step happens: the
  product of the trip counts of the loop and all loops outside it).

Each loop's 16-bin stride histogram sums the weights of its stride edges into bin
``ceil(log2(stride))``; strides of 2^16 elements or more are dropped and strides in
(2^15, 2^16) join the last bin; the histogram is normalised to sum to 1. Accesses that do not
move with a loop (stride 0: the loop's variable is not in the tensor's index) get no edge,
as the paper counts only strides larger than zero.
"""

from __future__ import annotations

import functools
import math

import networkx as nx
import numpy as np

from looprl.backend.layout_plan import layouts_applied
from looprl.ir.dtypes import FLOAT32
from looprl.ir.nest import COMPUTE, WRITE_BACK, LoopNest

HISTOGRAM_BINS = 16
MAX_STRIDE = 1 << 16  # strides at or above this are dropped
FEATURES_PER_LOOP = 4 + HISTOGRAM_BINS  # cursor, trip count, tail, compute flag, histogram
OBSERVATION_LAYOUT_VERSION = 1
# Scale of the normalised observation: log2(1 + x) / LOG_SCALE, so 255 maps to 1.0.
LOG_SCALE = 8.0

COMPUTE_STMT = ("stmt", COMPUTE)
WRITE_BACK_STMT = ("stmt", WRITE_BACK)


def _row_major_coefficients(index: str, shape: tuple[int, ...]) -> dict[str, int]:
    """Coefficient of each index letter in the flattened row-major offset."""
    coefficients, running = {}, 1
    for letter, extent in zip(reversed(index), reversed(shape)):
        coefficients[letter] = running
        running *= extent
    return coefficients


def _tensors(nest: LoopNest) -> dict[str, str]:
    """Tensor node name -> its index letters."""
    problem = nest.problem
    in0, in1 = problem.operands
    return {"in0": in0, "in1": in1, "acc": problem.output, "out": problem.output}


# Which tensors each statement reads and writes (acc is read and written by compute).
_READS = {COMPUTE: ("in0", "in1", "acc"), WRITE_BACK: ("acc",)}
_WRITES = {COMPUTE: ("acc",), WRITE_BACK: ("out",)}


def nest_graph(nest: LoopNest, cursor: int | None = None) -> nx.DiGraph:
    """The state graph of ``nest`` (see the module docstring); ``cursor`` marks one loop."""
    problem = nest.problem
    graph = nx.DiGraph(problem=problem.name, schedule=nest.key)
    tensors = _tensors(nest)
    coefficients = {}
    for name, index in tensors.items():
        shape = problem.shape(index)
        dtype = problem.dtype.accumulator if name == "acc" else problem.dtype
        graph.add_node(("tensor", name), kind="tensor", index=index, shape=shape, dtype=dtype)
        coefficients[name] = _row_major_coefficients(index, shape)
    for which, stmt in ((COMPUTE, COMPUTE_STMT), (WRITE_BACK, WRITE_BACK_STMT)):
        graph.add_node(stmt, kind="stmt", nest=which)
        for name in _READS[which]:
            graph.add_edge(("tensor", name), stmt, kind="data")
        for name in _WRITES[which]:
            graph.add_edge(stmt, ("tensor", name), kind="data")

    applied = layouts_applied(nest) if nest.layouts else {}
    layouts = {t: applied[t] for t in ("in0", "in1") if t in applied}
    if "out" in applied:
        layouts["acc"] = applied["out"]  # the output's layout is the accumulator's
    for which, stmt in ((COMPUTE, COMPUTE_STMT), (WRITE_BACK, WRITE_BACK_STMT)):
        loops = [(i, lp) for i, lp in enumerate(nest.loops) if lp.nest == which]
        accessed = sorted(set(_READS[which]) | set(_WRITES[which]))
        outer_trips = 1
        previous = None
        for index, loop in loops:
            node = ("loop", index)
            outer_trips *= loop.size
            graph.add_node(
                node,
                kind="loop",
                var=loop.var,
                size=loop.size,
                step=loop.step,
                tail=loop.tail,
                nest=loop.nest,
                cursor=index == cursor,
                parallel=loop.parallel,
            )
            if previous is not None:
                graph.add_edge(previous, node, kind="nest")
            previous = node
            for name in accessed:
                coefficient = coefficients[name].get(loop.var, 0)
                if coefficient:
                    layout = layouts.get(name)
                    stride = coefficient * loop.step if layout is None else layout.offset(loop.var, loop.step)
                    graph.add_edge(node, ("tensor", name), kind="stride", stride=stride, weight=outer_trips)
        graph.add_edge(previous, stmt, kind="nest")
    return graph


def stride_bin(stride: int) -> int | None:
    """Histogram bin of a positive stride, or None when it is dropped."""
    if stride < 1:
        raise ValueError(f"stride must be positive, got {stride}")
    if stride >= MAX_STRIDE:
        return None
    return min(math.ceil(math.log2(stride)), HISTOGRAM_BINS - 1)


def stride_histograms(graph: nx.DiGraph) -> np.ndarray:
    """(number of loops, 16) normalised stride histograms read off a state graph."""
    loops = sorted(n for n, data in graph.nodes(data=True) if data["kind"] == "loop")
    histograms = np.zeros((len(loops), HISTOGRAM_BINS), dtype=np.float64)
    for row, node in enumerate(loops):
        for _, _, edge in graph.out_edges(node, data=True):
            if edge["kind"] != "stride":
                continue
            bin_index = stride_bin(edge["stride"])
            if bin_index is not None:
                histograms[row, bin_index] += edge["weight"]
        total = histograms[row].sum()
        if total > 0:
            histograms[row] /= total
    return histograms


@functools.lru_cache(maxsize=4096)
def _nest_histograms(nest: LoopNest) -> np.ndarray:
    """Histograms depend on the schedule only, not on the cursor: cursor moves (most steps)
    reuse them instead of rebuilding the graph. Read-only, since it is shared."""
    histograms = stride_histograms(nest_graph(nest))
    histograms.setflags(write=False)
    return histograms


def observation(nest: LoopNest, cursor: int, max_loops: int, normalized: bool = False) -> np.ndarray:
    """The ``(max_loops, 20)`` float32 feature matrix of ``nest`` (rows past the last loop are 0).

    Columns: cursor flag, trip count, tail (elements), the compute flag (0 for a write-back
    loop; for a compute loop the inputs' element size in float32 words: 1 for float32, 0.5 for
    bfloat16, so a float32 problem's observation is the paper's and a bfloat16 one says its
    dtype where every policy reads it), then the 16-bin stride histogram. ``normalized``
    replaces the trip count and tail by ``log2(1 + x) / 8``."""
    if len(nest) > max_loops:
        raise ValueError(f"the nest has {len(nest)} loops, more than max_loops={max_loops}")
    features = np.zeros((max_loops, FEATURES_PER_LOOP), dtype=np.float32)
    histograms = _nest_histograms(nest)
    compute = nest.problem.element_bytes / FLOAT32.element_bytes
    for row, loop in enumerate(nest.loops):
        size, tail = float(loop.size), float(loop.tail)
        if normalized:
            size, tail = math.log2(1.0 + size) / LOG_SCALE, math.log2(1.0 + tail) / LOG_SCALE
        features[row, 0] = 1.0 if row == cursor else 0.0
        features[row, 1] = size
        features[row, 2] = tail
        features[row, 3] = compute if loop.nest == COMPUTE else 0.0
        features[row, 4:] = histograms[row]
    return features
