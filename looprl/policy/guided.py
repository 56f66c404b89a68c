"""A policy-guided beam search: the policy proposes, measurement decides.

A policy trained on one machine knows which actions usually help, not what this machine's
caches and registers make of them. :func:`guided_search` therefore measures instead of
trusting: from each state of a small beam it takes the policy's ``top_k`` valid actions (by
its scores: Q-values, advantages or logits), measures the schedules they lead to, and keeps
the ``beam`` fastest states (ties broken by the policy's preference), until the deadline.
Cursor moves change no schedule, so a proposed move is followed by the policy's own greedy
choices until they change the schedule: every successor is a new schedule, and the time goes
to measuring them. A split alone rarely pays: it pays once its inner loop moves inside the
next loop (a tile, e.g. ``m/4, k, m4, n``: four rows of the output kept in registers). A beam
that measures one action at a time drops the split before the move that makes it pay, so
*tiles* are proposed as one step: at each loop the policy's favourite split, with the inner
loop sunk one level, and, at the output-row loop the policy most wants to split, the target's
register-tile rows (which the policy may never have been trained with, e.g. 6 on AVX2). The
search is a strategy over a :class:`~looprl.search.context.SearchContext`: it proposes, the
context measures (its memo: never twice; its budget: the deadline and predicted costs), and
a schedule that fails leaves no successor, as in the env.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from looprl.actions import Action, State, replay
from looprl.ir.nest import initial_nest
from looprl.ir.step import SPLIT
from looprl.policy.numpy_policy import Policy
from looprl.policy.rollout import policy_actions
from looprl.measurement.schedule_record import BestOf, ScheduleRecord
from looprl.search.context import BudgetExhausted, Node, SearchContext


@dataclass(frozen=True)
class GuidedResult(BestOf):
    best: ScheduleRecord  # found by "guided"
    measured: int  # schedules this search had timed (not final in the cache)
    expanded: int  # states whose successors were considered
    stopped: str  # "deadline", "depth" or "exhausted" (no new state left)


def guided_search(
    policy: Policy,
    context: SearchContext,
    *,
    top_k: int = 3,
    beam: int = 3,
    depth: int = 20,
    start: tuple[tuple[str, ...], float] | None = None,
    tile_rows: tuple[int, ...] = (),
) -> GuidedResult:
    """Search from the context problem's untiled nest until the context's budget is spent
    or ``depth`` levels are done. ``start`` (actions, GFLOPS) seeds the beam with a known good
    path as well, e.g. the policy's greedy rollout, so the search refines what it found."""
    # Splits the policy was not trained with come after its own (scores map by name).
    actions = policy_actions(policy, context.target).with_splits(tile_rows)
    if start is not None:  # e.g. a register tile's wide splits, or pack
        actions = actions.extended(start[0])
    before = context.new_measurements
    root_state = State(initial_nest(context.problem), 0)
    root = Node(root_state, (), context.measure(root_state.nest, force=True).gflops)
    best = root
    frontier = [root]  # nodes, each with the policy's score of the action that led there (``preference``)
    preference = {root.state.key: 0.0}
    expanded = 0
    stopped = "depth"
    try:
        if start is not None:
            node = root
            for transition, index in zip(replay(actions, root.state, root.gflops, start[0], context.measure), start[0]):
                if transition.applied:  # replay the path (values come from the memo or the cache)
                    node = Node(transition.state, node.path + (actions.index(index),), transition.gflops)
                    preference[node.state.key] = 0.0
                    if node.gflops > best.gflops:
                        best = node
            if node is not root:
                frontier.append(node)
        seen = {node.state.key for node in frontier}
        for _ in range(depth):
            children: list[Node] = []
            for node in frontier:
                reason = context.exhausted()
                if reason is not None:
                    raise BudgetExhausted(reason)
                expanded += 1
                for score, path, following in _proposals(policy, actions, node.state, top_k, tile_rows):
                    if following is None or following.key in seen:
                        continue
                    seen.add(following.key)
                    measurement = context.measure(following.nest)
                    if not measurement.ok:
                        continue  # failed to compile or run: no successor, as in the env
                    child = Node(following, node.path + path, measurement.gflops)
                    preference[child.state.key] = score
                    children.append(child)
                    if child.gflops > best.gflops:
                        best = child
            if not children:
                stopped = "exhausted"
                break
            children.sort(key=lambda child: (-child.gflops, -preference[child.state.key]))
            frontier = children[:beam]
    except BudgetExhausted:
        stopped = "deadline"
    found = ScheduleRecord(best.state.nest, best.gflops, actions.named(best.path), "guided", context.target,
                           context.threads)
    return GuidedResult(
        best=found,
        measured=context.new_measurements - before,
        expanded=expanded,
        stopped=stopped,
    )


def _ranked(policy: Policy, actions, state: State, scores: np.ndarray | None = None) -> tuple[np.ndarray, list[int]]:
    """The policy's scores in ``state`` (given, or computed) and its valid actions, best first."""
    if scores is None:
        scores = _scores(policy, actions, [state])[0]
    mask = actions.mask(state).astype(bool)
    return scores, [int(a) for a in np.argsort(-np.where(mask, scores, -np.inf), kind="stable") if mask[a]]


def _scores(policy: Policy, actions, states: list[State]) -> np.ndarray:
    """The policy's scores of ``actions`` in each of ``states`` (one batch through the network);
    -inf for splits it was not trained with."""
    observations = np.stack([policy.observe(s.nest, s.cursor, actions.max_loops) for s in states])
    trained = policy.scores(observations)
    scores = np.full((len(states), len(actions)), -np.inf, dtype=trained.dtype)
    scores[:, [actions.index(name) for name in policy.action_names]] = trained
    return scores


def _proposals(policy: Policy, actions, state: State, top_k: int, tile_rows: tuple[int, ...] = ()):
    """The policy's ``top_k`` schedule changes from ``state``: its best valid actions, with a
    proposed cursor move followed by its greedy choices until the schedule changes; the
    target's register tiles; so that a policy fond of one part of the nest still gets the others
    tried, its best structural action at each other compute loop (reached by moves), ranked by
    score; and its ``top_k`` best tiles (:func:`_tiles`)."""
    everywhere = [State(state.nest, cursor) for cursor in range(len(state.nest))]
    scores_at = _scores(policy, actions, everywhere)  # row per cursor position
    scores, ranked = _ranked(policy, actions, state, scores_at[state.cursor])
    proposals = []
    for action in ranked[:top_k]:
        path, following = _until_structural(policy, actions, state, action)
        proposals.append((float(scores[action]), path, following))
    elsewhere = []
    for there in everywhere:
        if there.cursor == state.cursor or state.nest.loops[there.cursor].is_write_back:
            continue  # the write-back copy costs little: its loops are left to the policy's top_k
        there_scores, there_ranked = _ranked(policy, actions, there, scores_at[there.cursor])
        structural = [a for a in there_ranked if actions.is_structural(a)]
        if structural:
            best = structural[0]
            elsewhere.append((float(there_scores[best]), actions.moves(state.cursor, there.cursor) + (best,), actions.apply(there, best)))
    elsewhere.sort(key=lambda item: -item[0])
    policy_tiles, register_tiles = _tiles(actions, state, scores_at, top_k, tile_rows)
    # Measured in this order until the deadline: register tiles pay most often, so they go early.
    return proposals + register_tiles + elsewhere[:top_k] + policy_tiles


def _tiles(actions, state: State, scores_at: np.ndarray, top_k: int, tile_rows: tuple[int, ...] = ()):
    """The policy's tiles and the register tiles, two lists. The policy's: at each compute
    loop, its best-scored split there (``scores_at``: its scores with the cursor at each loop)
    followed by sinking the inner loop below the next loop (``down``, ``swap_down``); the
    ``top_k`` best by the split's score. The register tiles:
    at the loop over output rows (an output dimension other than the contiguous last one) where
    the policy most wants to split, one tile for each of the target's register-tile rows
    ``tile_rows`` (e.g. 4 and 6 on AVX2), whether or not the policy was trained with that split:
    the policy knows where to tile, the target how many rows fit. Sizes the factor does not
    divide are fine: the split leaves a tail."""
    splits = [a for a in range(len(actions)) if actions.actions[a].kind == SPLIT]
    policy_tiles, row_loops = [], []
    row_dims = set(state.nest.problem.output[:-1])
    for cursor, loop in enumerate(state.nest.loops):
        if loop.is_write_back:
            continue
        there, scores = State(state.nest, cursor), scores_at[cursor]
        trained = [a for a in splits if np.isfinite(scores[a]) and actions.can_apply(there, a)]
        if not trained:
            continue
        split = max(trained, key=lambda a: scores[a])
        tile = _tile(actions, state, cursor, split)
        if tile is not None:  # else no loop below to sink under
            policy_tiles.append((float(scores[split]), *tile))
            if loop.var in row_dims:
                row_loops.append((float(scores[split]), cursor))
    policy_tiles.sort(key=lambda item: -item[0])
    register_tiles = []
    if row_loops:
        score, cursor = max(row_loops)
        for rows in dict.fromkeys(tile_rows):
            name = Action(SPLIT, rows).name
            tile = _tile(actions, state, cursor, actions.index(name)) if name in actions.names else None
            if tile is not None:
                register_tiles.append((score, *tile))
    return policy_tiles[:top_k], register_tiles


def _tile(actions, state: State, cursor: int, split: int) -> tuple[tuple[int, ...], State] | None:
    """Split the loop at ``cursor`` by ``split`` and sink the new inner loop below the next
    loop: the path from ``state``'s cursor and the state reached, or None if it cannot."""
    sunk = actions.apply(State(state.nest, cursor), split)
    for move in ("down", "swap_down"):
        sunk = actions.apply(sunk, actions.index(move)) if sunk is not None else None
    if sunk is None:
        return None
    return actions.moves(state.cursor, cursor) + (split, actions.index("down"), actions.index("swap_down")), sunk


def _until_structural(policy: Policy, actions, state: State, action: int) -> tuple[tuple[int, ...], State | None]:
    """Apply ``action``; if it only moves the cursor, follow the policy's best valid actions
    until one changes the schedule. Returns the actions taken and the state reached (None if
    the moves cycle without a schedule change)."""
    path = (action,)
    following = actions.apply(state, action)
    visited = {state.cursor}
    while following is not None and following.nest is state.nest:
        if following.cursor in visited or len(path) > 2 * actions.max_loops:
            return path, None
        visited.add(following.cursor)
        _, ranked = _ranked(policy, actions, following)
        if not ranked:
            return path, None
        path += (ranked[0],)
        following = actions.apply(following, ranked[0])
    return path, following
