"""AutoTVM's search (Chen et al., "Learning to Optimize Tensor Programs", Algorithm 1) over
looprl's schedules.

The schedule space is every nest the environment's transforms can build from the untiled
nest: splits of a loop by any factor from 2 to 64 (:data:`AUTOTVM_MAX_SPLIT`) that fits it,
swaps of neighbouring loops of one nest, at most ``max_loops`` loops (the action set's bound).
The annealing draws a split's factor from the action set's split factors half the time (the
factors random search and beam use), else from 2..64 (register tiles often need a 6, 12 or 48
those lack). Each round:

1. parallel simulated-annealing chains walk the space on the cost model's scores (the
   chains persist across rounds); a neighbour is one IR step (:class:`~looprl.ir.step.Step`)
   of the nest: it splits a loop, swaps two loops or merges two neighbouring loops of one
   dimension (undoing a split: :meth:`LoopNest.merge <looprl.ir.nest.LoopNest.merge>`);
2. a batch of ``batch_size`` schedules not yet measured is picked: ``(1 - epsilon)`` of it
   greedily from the ``diversity`` x ``batch_size`` best-scored candidates, trading score
   against the schedule components (each dimension's tiling, the loop order, the write-back
   nest) the batch does not cover yet (the paper's submodular objective), the rest at random
   from the whole space;
3. the batch is measured through the search context (cache, budgets, progress, result);
4. the cost model (:mod:`looprl.costmodel`) is refitted on every measurement so far.

Random schedules (the first batch, the chains' seeds, the epsilon picks) are walks of the
environment's actions by default, the short schedules random search samples; the annealing
then reaches any factor. The first batch, before any measurement but the untuned nest's, is
random, unless a ``prior`` gives it (e.g. the schedules a trained policy's greedy episode
passes through: the policy's prior replaces chance before the model has data), or ``transfer`` gives a global model fitted on the measurement cache's other problems (same
host); the local model is then fitted on top of it (AutoTVM section 4). The search ends when
the budget is spent (or after 1000 measurements without a budget, or when no unmeasured
schedule is found). Given the same measurements and seed it makes the same choices.

The schedules are not reached by the environment's actions: the result's ``actions`` are
empty and ``best_nest`` holds the schedule.
"""

from __future__ import annotations

import logging
import math
import numpy as np

from looprl import checks, defaults
from looprl.costmodel.schedule_features import features_batch
from looprl.costmodel.model import CostModel, TransferModel, import_xgboost
from looprl.actions import State
from looprl.ir.nest import LoopNest
from looprl.ir.step import MAX_FACTOR, MERGE, MIN_FACTOR, SPLIT, SWAP, Step
from looprl.measurement.records import measured_nests
from looprl.search.context import BudgetExhausted, SearchContext

logger = logging.getLogger("looprl.search")

# AutoTVM's own cap on the factors its annealing draws (MIN_FACTOR..this), within the one range
# of split factors: a wider draw spends the annealing on factors that do not pay at its budgets.
AUTOTVM_MAX_SPLIT = min(64, MAX_FACTOR)
UNBOUNDED_TRIALS = 1000  # measurements when neither a time nor an evaluation budget is set
MAX_TRANSFER_RECORDS = 20000  # global model: at most this many cached measurements (a sample)


# -- the schedule space ------------------------------------------------------------------
def in_space(nest: LoopNest, step: Step) -> bool:
    """Whether ``step`` applies to ``nest`` and leads to a schedule of the space: a merge's
    loop must be reachable again by a split, so it is the outermost loop of its dimension or
    has at most :data:`AUTOTVM_MAX_SPLIT` iterations."""
    if nest.why_not(step) is not None:
        return False
    if step.op != MERGE:
        return True
    loops, i = nest.loops, step.loop
    outer = loops[i]
    outermost = not any(lp.var == outer.var and lp.nest == outer.nest for lp in loops[:i])
    return outermost or nest.merge(i).loops[i].size <= AUTOTVM_MAX_SPLIT


def split_factor(size: int, rng) -> int:
    """A split factor for a loop of ``size`` iterations: any of 2..min(64, size), drawn half
    the time among the powers of two and a quarter of the time among the divisors of
    ``size`` (the factors hand-tuned schedules use), else uniformly."""
    top = min(AUTOTVM_MAX_SPLIT, size)
    draw = rng.random()
    if draw < 0.5:
        return 1 << int(rng.integers(1, top.bit_length()))
    if draw < 0.75:
        divisors = [f for f in range(MIN_FACTOR, top + 1) if size % f == 0]
        if divisors:
            return divisors[int(rng.integers(len(divisors)))]
    return int(rng.integers(MIN_FACTOR, top + 1))


class ScheduleSpace:
    """Random schedules and random neighbours of a schedule of one problem."""

    def __init__(self, root: LoopNest, max_loops: int, actions=None, factors: tuple[int, ...] | None = None):
        self.root = root
        self.max_loops = max_loops
        self.actions = actions  # an ActionSet: random schedules are its walks, as random search's
        self.factors = factors  # split factors a neighbour uses half the time (None: always any of 2..AUTOTVM_MAX_SPLIT)

    @staticmethod
    def _index(nest: LoopNest, rng, pairs: bool) -> int:
        """A random loop index (of a pair's upper loop when ``pairs``), in the compute nest
        four times in five: the write-back nest matters less."""
        compute, total = len(nest.compute), len(nest)
        if rng.random() < 0.8 or compute == total:
            return int(rng.integers(max(compute - pairs, 1)))
        return compute + int(rng.integers(max(total - compute - pairs, 1)))

    def _split(self, nest: LoopNest, rng) -> LoopNest | None:
        if len(nest) >= self.max_loops:
            return None
        loops = nest.loops
        i = self._index(nest, rng, False)
        size = loops[i].size
        if size < MIN_FACTOR:
            return None
        if self.factors is not None and rng.random() < 0.5:
            fitting = [f for f in self.factors if nest.why_not(Step(SPLIT, i, f)) is None]
            return nest.apply((Step(SPLIT, i, fitting[int(rng.integers(len(fitting)))]),)) if fitting else None
        return nest.apply((Step(SPLIT, i, split_factor(size, rng)),))

    def _swap(self, nest: LoopNest, rng) -> LoopNest | None:
        return self._pair_step(nest, rng, SWAP)

    def _merge(self, nest: LoopNest, rng) -> LoopNest | None:
        return self._pair_step(nest, rng, MERGE)

    def _pair_step(self, nest: LoopNest, rng, op: str) -> LoopNest | None:
        """``op`` (a swap or a merge) of a random loop and the next, or None where it does not
        apply or leaves the space."""
        step = Step(op, self._index(nest, rng, True))
        return nest.apply((step,)) if in_space(nest, step) else None

    def neighbour(self, nest: LoopNest, rng) -> LoopNest:
        """One random split, swap or merge of ``nest`` (``nest`` itself if none applies)."""
        moves = (self._split, self._swap, self._merge)
        for _ in range(12):
            found = moves[int(rng.integers(3))](nest, rng)
            if found is not None:
                return found
        return nest

    def random(self, rng, depth: int) -> LoopNest:
        """With an action set: a walk of 1..``depth`` of its actions, each uniform among the
        valid ones (the schedules random search measures). Else a random walk of 1..``depth``
        // 2 transforms (two splits for one swap, any factor) from the untuned nest."""
        if self.actions is not None:
            state = State(self.root, 0)
            for _ in range(int(rng.integers(1, max(depth, 1) + 1))):
                valid = np.flatnonzero(self.actions.mask(state))
                if valid.size == 0:
                    break
                state = self.actions.apply(state, int(rng.choice(valid)))
            return state.nest
        nest = self.root
        for _ in range(int(rng.integers(1, max(depth // 2, 1) + 1))):
            for _ in range(12):
                found = (self._split if rng.random() < 2 / 3 else self._swap)(nest, rng)
                if found is not None:
                    nest = found
                    break
        return nest

    def random_many(self, rng, depth: int, count: int) -> list[LoopNest]:
        """``count`` distinct random schedules (fewer if the walks keep finding the same)."""
        found: dict[str, LoopNest] = {}
        for _ in range(count * 20):
            if len(found) >= count:
                break
            nest = self.random(rng, depth)
            found.setdefault(nest.key, nest)
        return list(found.values())


def components(nest: LoopNest) -> tuple:
    """What the diversity term counts: each dimension's compute tiling, the compute loop
    order and the write-back nest."""
    tilings = tuple((var, tuple((lp.size, lp.step) for lp in nest.compute if lp.var == var)) for var in nest.problem.dims)
    order = ("order", tuple(lp.var for lp in nest.compute))
    write_back = ("write_back", nest.key.split("|")[1])
    return tilings + (order, write_back)


def diverse_pick(candidates: list[tuple[float, str, LoopNest]], count: int, alpha: float) -> list[LoopNest]:
    """Greedily pick ``count`` of ``candidates`` (best score first) maximising normalised rank
    score plus ``alpha`` x the fraction of their components the picks so far do not cover."""
    if count <= 0 or not candidates:
        return []
    total = len(candidates)
    quality = [1.0 - position / max(total - 1, 1) for position in range(total)]
    parts = [components(nest) for _, _, nest in candidates]
    covered: set = set()
    chosen: list[int] = []
    left = list(range(total))
    while left and len(chosen) < count:
        best, best_gain = None, -math.inf
        for index in left:
            new = sum(part not in covered for part in parts[index])
            gain = quality[index] + alpha * new / len(parts[index])
            if gain > best_gain:
                best, best_gain = index, gain
        chosen.append(best)
        left.remove(best)
        covered.update(parts[best])
    return [candidates[i][2] for i in chosen]


# -- the tuner ------------------------------------------------------------------------------
class _Tuner:
    def __init__(self, context: SearchContext, depth: int, rng: np.random.Generator, options: dict):
        self.context = context
        self.depth = depth
        self.rng = rng
        self.o = options
        self.root = context.root()
        factors = None if options["any_factor"] else tuple(context.actions.split_factors)
        self.space = ScheduleSpace(self.root.state.nest, context.actions.max_loops, context.actions if options["walks"] else None, factors)
        self.measured: dict[str, tuple[LoopNest, float]] = {self.root.state.nest.key: (self.root.state.nest, self.root.gflops)}
        self.features: dict[str, np.ndarray] = {}  # measured schedules' feature rows
        self.chains: list[LoopNest] = []
        # Features describe the register planning for the search's target (its ISA).
        self.target = context.target
        self.layout = {"max_levels": defaults.MAX_LOOPS, "isa": self.target.isa}
        seed = int(rng.integers(2**31))
        self.local = CostModel(options["objective"], seed=seed, **self.layout)
        self.model = self.local
        if options["transfer"]:
            global_model = self._global_model(seed)
            if global_model is not None:
                self.model = TransferModel(global_model)
        self.scores: dict[str, float] = {}  # this round's predictions

    def _global_model(self, seed: int) -> CostModel | None:
        evaluator = self.context.evaluator
        records = _records(evaluator, self.context.problem.name)
        if len(records) > MAX_TRANSFER_RECORDS:
            keep = np.sort(self.rng.choice(len(records), MAX_TRANSFER_RECORDS, replace=False))
            records = [records[i] for i in keep]
        measured = measured_nests(records)
        nests = [nest for nest, _ in measured]
        values = [gflops for _, gflops in measured]
        groups = [nest.problem.name for nest in nests]
        if len(nests) < 2:
            logger.info("autotvm transfer: no measurements of other problems in the cache; starting without a global model")
            return None
        target = getattr(getattr(evaluator, "target", None), "key", None)
        model = CostModel(self.o["objective"], seed=seed, target=target, **self.layout)
        model.fit(self._features(nests), values, groups)
        logger.info("autotvm transfer: global model fitted on %d measurements of %d problems", len(nests), len(set(groups)))
        return model

    # -- model ---------------------------------------------------------------------------
    def _features(self, nests: list[LoopNest]) -> np.ndarray:
        return features_batch(nests, self.layout["max_levels"], target=self.target)

    def _predict(self, nests: list[LoopNest]) -> np.ndarray:
        """This round's scores of ``nests`` (memoised by schedule)."""
        missing = list({n.key: n for n in nests if n.key not in self.scores}.values())
        if missing:
            for nest, score in zip(missing, self.model.predict(self._features(missing))):
                self.scores[nest.key] = float(score)
        return np.array([self.scores[n.key] for n in nests])

    def _refit(self) -> None:
        keys = list(self.measured)
        new = [self.measured[k][0] for k in keys if k not in self.features]
        if new:
            for nest, row in zip(new, self._features(new)):
                self.features[nest.key] = row
        x = np.stack([self.features[k] for k in keys])
        y = np.array([self.measured[k][1] for k in keys])
        if len(set(y.tolist())) > 1:
            self.model.fit(x, y)
        self.scores = {}

    def _model_ready(self) -> bool:
        return isinstance(self.model, TransferModel) or self.local.fitted

    # -- exploration ---------------------------------------------------------------------
    def _check_time(self) -> None:
        reason = self.context.exhausted()
        if reason is not None:
            raise BudgetExhausted(reason)

    def _anneal(self) -> list[tuple[float, str, LoopNest]]:
        """Candidates from the persistent simulated-annealing chains: the best-scored
        unmeasured schedules seen, best first."""
        o, rng = self.o, self.rng
        keep = max(1, int(round(o["diversity"] * o["batch_size"])))
        if not self.chains:
            self.chains = [self.space.random(rng, self.depth) for _ in range(o["chains"])]
        else:  # a fraction of the chains restart from the best schedules measured so far
            best = sorted(self.measured.values(), key=lambda item: -item[1])[: max(1, int(len(self.chains) * o["restart"]))]
            self.chains[-len(best) :] = [nest for nest, _ in best]
        scores = self._predict(self.chains)
        scale = float(np.std(scores)) or 1.0
        top: dict[str, tuple[float, LoopNest]] = {}

        def offer(nests, values) -> bool:
            changed = False
            for nest, value in zip(nests, values):
                if nest.key in self.measured or nest.key in top:
                    continue
                if len(top) < keep or value > min(v for v, _ in top.values()):
                    top[nest.key] = (float(value), nest)
                    changed = True
                    if len(top) > keep:
                        worst = min(top, key=lambda k: (top[k][0], k))
                        del top[worst]
            return changed

        offer(self.chains, scores)
        quiet = 0
        for step in range(o["max_steps"]):
            if step % 32 == 31:
                self._check_time()
            temperature = o["temperature"] * scale * (1.0 - step / o["max_steps"])
            proposals = [self.space.neighbour(nest, rng) for nest in self.chains]
            values = self._predict(proposals)
            draws = rng.random(len(proposals))
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                accept = (values >= scores) | (draws < np.exp((values - scores) / max(temperature, 1e-12)))
            self.chains = [p if a else c for p, c, a in zip(proposals, self.chains, accept)]
            scores = np.where(accept, values, scores)
            quiet = 0 if offer(proposals, values) else quiet + 1
            if quiet >= o["early_stop"]:
                break
        return sorted(((v, k, n) for k, (v, n) in top.items()), key=lambda item: (-item[0], item[1]))

    def _random_unmeasured(self, count: int, exclude: set[str]) -> list[LoopNest]:
        found: list[LoopNest] = []
        for _ in range(count * 50):
            if len(found) >= count:
                break
            nest = self.space.random(self.rng, self.depth)
            if nest.key not in self.measured and nest.key not in exclude:
                exclude.add(nest.key)
                found.append(nest)
        return found

    def _prior_batch(self) -> list[LoopNest]:
        """The first batch from the ``prior`` (e.g. the schedules a trained policy's greedy
        episode passes through, :class:`looprl.policy.rollout.PolicyPrior`), in its order, at
        most a batch, the rest of the batch random. Schedules with data layouts, of more loops
        than the space allows or of another problem are left out (the annealing's space has
        none of them)."""
        picked: dict[str, LoopNest] = {}
        for nest in self.o["prior"](self.context.problem):
            if (isinstance(nest, LoopNest) and nest.problem == self.context.problem and nest.key not in self.measured and not nest.layouts
                    and len(nest) <= self.space.max_loops):
                picked.setdefault(nest.key, nest)
        first = list(picked.values())[: self.o["batch_size"]]
        return first + self._random_unmeasured(self.o["batch_size"] - len(first), set(picked))

    def _batch(self) -> list[LoopNest]:
        o = self.o
        size = o["batch_size"]
        if not self._model_ready():
            if o["prior"] is not None and len(self.measured) == 1:
                return self._prior_batch()
            return self._random_unmeasured(size, set())
        explore = int(o["epsilon"] * size) + int(self.rng.random() < (o["epsilon"] * size) % 1)
        picked = diverse_pick(self._anneal(), size - explore, o["alpha"])
        chosen = {n.key for n in picked}
        return picked + self._random_unmeasured(size - len(picked), chosen)

    def run(self) -> None:
        context = self.context
        unbounded = context.deadline is None and context.max_evaluations is None
        while not (unbounded and len(self.measured) >= UNBOUNDED_TRIALS):
            self._check_time()
            batch = self._batch()
            if not batch:
                logger.info("autotvm: no unmeasured schedule found; the search is done")
                return
            for nest in batch:
                node = context.visit(nest)
                # AutoTVM's rule: a schedule that fails to build or run teaches the model zero throughput.
                self.measured[nest.key] = (nest, 0.0 if node is None else node.gflops)
            self._refit()


def autotvm(
    context: SearchContext,
    depth: int,
    rng: np.random.Generator,
    *,
    objective: str = "rank",
    transfer: bool = False,
    batch_size: int = 8,
    chains: int = 64,
    max_steps: int = 200,
    early_stop: int = 25,
    epsilon: float = 0.05,
    diversity: float = 2.0,
    alpha: float = 0.5,
    temperature: float = 1.0,
    walks: bool = True,
    restart: float = 0.125,
    any_factor: bool = False,
    prior=None,
) -> None:
    """AutoTVM's model-guided search (module docstring): rounds of ``batch_size``
    measurements (8: at the budgets of tens of measurements this library's searches get, eight
    refits of the model find faster schedules than the paper's two of 32; on the models test
    split at 64 measurements, 1.19x random search against 1.03x with batches of 32) picked by ``chains`` simulated-annealing chains (at most ``max_steps`` steps,
    ending early after ``early_stop`` steps that find no better candidate) on an XGBoost cost
    model (``objective`` ``"rank"`` or ``"regression"``); ``epsilon`` of each batch random;
    ``diversity`` x ``batch_size`` candidates for the diversity-aware pick weighted by ``alpha``;
    ``transfer`` adds a global model fitted on the cache's other problems. ``depth`` bounds the
    random walks that seed the chains and the random picks; ``walks`` draws those as random
    search does (walks of the env's actions) instead of from the whole 2..64 space.
    ``prior`` (a callable: problem -> schedules, such as
    ``looprl.policy.rollout.PolicyPrior(policy)``, the schedules a trained policy's greedy
    episode passes through, latest first) gives the first batch instead of chance (the rest of
    the batch random); None: a random first batch."""
    options = {
        "objective": checks.one_of(objective, "autotvm objective", ("rank", "regression")),
        "transfer": checks.flag(transfer, "transfer"),
        "batch_size": checks.positive_int(batch_size, "batch_size"),
        "chains": checks.positive_int(chains, "chains"),
        "max_steps": checks.positive_int(max_steps, "max_steps"),
        "early_stop": checks.positive_int(early_stop, "early_stop"),
        "epsilon": checks.fraction(epsilon, "epsilon"),
        "diversity": checks.finite_float(diversity, "diversity", minimum=1.0),
        "alpha": checks.finite_float(alpha, "alpha", minimum=0.0),
        "temperature": checks.finite_float(temperature, "temperature", minimum=0.0),
        "walks": checks.flag(walks, "walks"),
        "restart": checks.fraction(restart, "restart"),
        "any_factor": checks.flag(any_factor, "any_factor"),
        "prior": prior,
    }
    if prior is not None and not callable(prior):
        raise ValueError(f"prior must be a callable (problem -> schedules) or None, got {type(prior).__name__}")
    import_xgboost()  # fail before measuring anything
    _Tuner(context, depth, rng, options).run()


def _records(evaluator, exclude_problem: str) -> list[tuple[str, str, float]]:
    """(problem, schedule key, GFLOPS) of the evaluator's cache on this host, for its target
    and timing budget, except ``exclude_problem``'s (:meth:`MeasurementCache.records`)."""
    records = getattr(getattr(evaluator, "cache", None), "records", None)
    if not callable(records):
        return []
    options = {"exclude_problem": exclude_problem}
    if getattr(evaluator, "target", None) is not None:
        options["target"] = evaluator.target
    if isinstance(getattr(evaluator, "budget_s", None), float):
        options["budget_s"] = evaluator.budget_s
    return [(str(p), str(k), float(g)) for p, k, g in records(**options)]
