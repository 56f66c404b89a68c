"""Hand-written schedules expressed with split/swap: expert baselines for benchmarks."""

from __future__ import annotations

from looprl.ir.nest import LoopNest, initial_nest
from looprl.ir.problem import Problem


def reorder_compute(nest: LoopNest, order: list[int]) -> LoopNest:
    """Permute the compute loops with adjacent swaps so that new position i holds old loop
    ``order[i]``. Loops of the same dimension must keep their relative order."""
    count = len(nest.compute)
    if sorted(order) != list(range(count)):
        raise ValueError(f"order must be a permutation of 0..{count - 1}, got {order}")
    rank = {old: new for new, old in enumerate(order)}
    current = list(range(count))  # current[i] = original index of the loop at position i
    changed = True
    while changed:
        changed = False
        for i in range(count - 1):
            if rank[current[i]] > rank[current[i + 1]]:
                nest = nest.swap(i)
                current[i], current[i + 1] = current[i + 1], current[i]
                changed = True
    return nest


def expert_matmul(problem: Problem, m_tile: int, n_tile: int, k_unroll: int | None = None) -> LoopNest:
    """The classic register-blocked order ``n/n_tile, m/m_tile, k, m_tile, n_tile`` (with the k
    loop split by ``k_unroll`` when given) for ``mk,kn->mn``."""
    if problem.spec != "mk,kn->mn":
        raise ValueError(f"expert_matmul needs a 'mk,kn->mn' problem, got {problem.spec!r}")
    nest = initial_nest(problem)  # m, k, n
    m, n, k = problem.size("m"), problem.size("n"), problem.size("k")
    if not (1 <= m_tile <= m and 1 <= n_tile <= n):
        raise ValueError(f"tiles {m_tile}x{n_tile} do not fit the problem {problem.name}")
    m_split = m_tile < m and m_tile > 1
    n_split = n_tile < n and n_tile > 1
    k_split = k_unroll is not None and 1 < k_unroll <= k
    if n_split:
        nest = nest.split(2, n_tile)
    if k_split:
        nest = nest.split(1, k_unroll)
    if m_split:
        nest = nest.split(0, m_tile)
    # Loops now: m[, m_in], k[, k_in], n[, n_in]; name their positions.
    names = []
    names += ["m", "m_in"] if m_split else ["m"]
    names += ["k", "k_in"] if k_split else ["k"]
    names += ["n", "n_in"] if n_split else ["n"]
    wanted = ["n"] + (["m"] if m_split else []) + ["k"] + (["k_in"] if k_split else []) + (["m_in"] if m_split else ["m"]) + (["n_in"] if n_split else [])
    if not n_split:
        wanted.remove("n")
        wanted.append("n")
    return reorder_compute(nest, [names.index(w) for w in wanted])


def expert_candidates(problem: Problem, vector_width: int = 16) -> list[LoopNest]:
    """A handful of register-blocked schedules; benchmarks keep the fastest."""
    n_tiles = [4 * vector_width, 3 * vector_width, 2 * vector_width]
    shapes = [(4, n_tiles[0]), (6, n_tiles[0]), (8, n_tiles[1]), (12, n_tiles[2]), (14, n_tiles[2])]
    result = []
    for m_tile, n_tile in shapes:
        m_tile = min(m_tile, problem.size("m"))
        n_tile = min(n_tile, problem.size("n"))
        for k_unroll in (None, 4):
            try:
                nest = expert_matmul(problem, m_tile, n_tile, k_unroll)
            except ValueError:
                continue
            if nest not in result:
                result.append(nest)
    return result


def random_schedule(problem: Problem, rng, steps: int = 10, factors=(4, 8, 16), max_loops: int = 10) -> LoopNest:
    """A random walk of ``steps`` split/swap transforms (those that do not apply are
    skipped): a stand-in for states an agent visits. ``rng`` is a ``random.Random``."""
    nest = initial_nest(problem)
    for _ in range(steps):
        index = rng.randrange(len(nest))
        try:
            if rng.random() < 0.5:
                if len(nest) < max_loops:
                    nest = nest.split(index, rng.choice(factors))
            else:
                nest = nest.swap(index)
        except ValueError:
            pass
    return nest
