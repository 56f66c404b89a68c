"""The one search engine: a :class:`SearchContext` (memo, budget, graph) that strategies
propose to — the baselines over LoopNest-v0's actions (greedy with lookahead L, beam search of
width W depth- or breadth-first, random walks, as in the LoopTune paper), AutoTVM, and the
policy-guided search and stages of ``looprl.tune``; one driver runs staged searches
(:class:`StagedSearch`) and one rule decides their winner (:func:`confirm_winner`).

>>> from looprl import search
>>> result = search.run("128x256x64", algo="beam4dfs", budget_s=60)
>>> result.best_gflops, result.actions

``python -m looprl.search --help`` runs them from the command line.
"""

from looprl.search.algorithms import PAPER_ALGORITHMS, parse_algorithm
from looprl.search.context import SearchContext
from looprl.search.runner import DEFAULT_BUDGET_S, DEFAULT_DEPTH, SearchResult, run
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.search.staged import StagedSearch, confirm_winner

__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_DEPTH", "PAPER_ALGORITHMS", "ScheduleRecord", "SearchContext", "SearchResult", "StagedSearch",
           "confirm_winner", "parse_algorithm", "run"]
