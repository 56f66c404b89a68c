"""The search algorithms of LoopTune's comparison (section "Search" of the paper).

All walk the environment's actions (:class:`~looprl.actions.ActionSet`) from the untiled
nest, at most ``depth`` actions deep, and rank states by measured GFLOPS (never by action
name). Each is a function ``(context, depth, rng) -> None`` that explores until it is done or
the context raises :class:`~looprl.search.context.BudgetExhausted`; the context keeps the
best state found.
"""

from __future__ import annotations

import inspect
import re

import numpy as np

from looprl.search.context import BudgetExhausted, Node, SearchContext, node_id


def _ranked(nodes: list[Node]) -> list[Node]:
    """Best first; ties keep action order (the sort is stable)."""
    return sorted(nodes, key=lambda node: -node.gflops)


def greedy(context: SearchContext, depth: int, rng, lookahead: int) -> None:
    """At each step, evaluate every action sequence of up to ``lookahead`` actions and take
    the first action towards the best state found; stop when none beats the current state
    (so lookahead 2 can cross one step that is no better) or after ``depth`` actions."""
    current = context.root()
    for _ in range(depth):
        best_first, best_value = None, current.gflops
        frontier = [(current, None)]
        for _level in range(min(lookahead, depth - len(current.path))):
            following = []
            for node, first in frontier:
                for child in context.children(node):
                    start = first if first is not None else child
                    if child.gflops > best_value:
                        best_first, best_value = start, child.gflops
                    following.append((child, start))
            frontier = following
        if best_first is None:
            return
        current = best_first


def beam_dfs(context: SearchContext, depth: int, rng, width: int) -> None:
    """Depth-first: evaluate all children of a state, recurse into the ``width`` best in
    order, down to ``depth`` actions. A state already expanded with at least as many
    actions left is not expanded again (its subtree would be the same)."""
    expanded: dict[str, int] = {}

    def visit(node: Node) -> None:
        left = depth - len(node.path)
        key = node_id(node.state)
        if left <= 0 or expanded.get(key, -1) >= left:
            return
        expanded[key] = left
        for child in _ranked(context.children(node))[:width]:
            visit(child)

    visit(context.root())


def beam_bfs(context: SearchContext, depth: int, rng, width: int) -> None:
    """Breadth-first: layer by layer, every state of the layer contributes its ``width``
    best children to the next layer (states already in an earlier layer are dropped)."""
    layer = [context.root()]
    seen = {node_id(layer[0].state)}
    for _ in range(depth):
        following = []
        for node in layer:
            for child in _ranked(context.children(node))[:width]:
                key = node_id(child.state)
                if key not in seen:
                    seen.add(key)
                    following.append(child)
        if not following:
            return
        layer = following


def random_walks(context: SearchContext, depth: int, rng: np.random.Generator) -> None:
    """Repeated walks of ``depth`` actions from the initial nest, each action drawn uniformly
    among the valid ones, every state evaluated; until the budget is spent. Without a time or
    evaluation budget, stops after 1000 walks."""
    root = context.root()
    walks = 0
    unbounded = context.deadline is None and context.max_evaluations is None
    while not (unbounded and walks >= 1000):
        node = root
        for _ in range(depth):
            valid = np.flatnonzero(context.actions.mask(node.state))
            if valid.size == 0:
                break
            node = context.child(node, int(rng.choice(valid))) or node  # a failed schedule: the walk stays
        walks += 1
        reason = context.exhausted()
        if reason is not None:
            raise BudgetExhausted(reason)


_PATTERN = re.compile(
    r"^(?:greedy(?P<lookahead>\d+)|beam(?P<width>\d+)(?P<order>dfs|bfs)|(?P<random>random)|(?P<autotvm>autotvm)(?:-(?P<objective>rank|regression))?)$"
)
PAPER_ALGORITHMS = ("greedy1", "greedy2", "beam2dfs", "beam2bfs", "beam4dfs", "beam4bfs", "random")


def parse_algorithm(name: str):
    """``greedy<L>``, ``beam<W>dfs``, ``beam<W>bfs``, ``random``, ``autotvm`` or
    ``autotvm-regression`` -> ``(function, kwargs)``."""
    match = _PATTERN.match(name.strip().lower()) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"unknown search algorithm {name!r}; expected greedy<L>, beam<W>dfs, beam<W>bfs, random, autotvm "
            f"or autotvm-regression (e.g. {', '.join(PAPER_ALGORITHMS)})"
        )
    if match["autotvm"]:
        from looprl.search.autotvm import autotvm  # the cost model (and XGBoost) only when asked for

        return autotvm, {"objective": match["objective"] or "rank"}
    if match["lookahead"]:
        lookahead = int(match["lookahead"])
        if not 1 <= lookahead <= 4:
            raise ValueError(f"greedy lookahead must be in 1..4 (the cost grows as actions^lookahead), got {lookahead}")
        return greedy, {"lookahead": lookahead}
    if match["width"]:
        width = int(match["width"])
        if width < 1:
            raise ValueError(f"beam width must be at least 1, got {width}")
        return (beam_dfs if match["order"] == "dfs" else beam_bfs), {"width": width}
    return random_walks, {}


def check_options(function, name: str, options: dict) -> dict:
    """``options`` for the algorithm ``function`` (``name`` in messages): only the keyword-only
    parameters it declares (the autotvm search's, say); every other algorithm takes none."""
    accepted = [p.name for p in inspect.signature(function).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for search algorithm {name!r}: {takes}")
    return dict(options)
