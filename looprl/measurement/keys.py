"""The measurement cache's keys: what makes two measurements comparable.

A key holds the host (CPU model, LLVM, features), the target the code was generated for, the
code generator's version and the timing protocol (its version and budget), and for a schedule
with a parallel loop the thread count it ran on: a value measured under other rules is never
reused. A schedule without a parallel loop runs on one thread whatever the caller's thread
count, so it is stored under the one-thread key (the key of every measurement made before
threads existed).

These strings are stored in users' cache files: changing their form orphans every stored
measurement (tests/measurement/test_cache_schema.py pins it).
"""

from __future__ import annotations

from functools import lru_cache

from looprl import checks, defaults
from looprl.backend.codegen import CODEGEN_VERSION
from looprl.backend.host import host_fingerprint
from looprl.target import TARGET_NAMES, Target
from looprl.ir.dtypes import DEFAULT_DTYPE, as_dtype
from looprl.ir.nest import LoopNest
from looprl.measurement.timing import TIMING_PROTOCOL_VERSION


def measurement_host() -> str:
    """The machine part of every key (CPU model, LLVM CPU and features, llvmlite)."""
    return host_fingerprint()


def _threads_suffix(threads) -> str:
    """The key's thread part: nothing for one thread (keys from before threads existed)."""
    threads = checks.positive_int(threads, "threads")
    return "" if threads == 1 else f"|threads-{threads}"


def measurement_key(target: Target | None = None, budget_s: float = defaults.STATE_BUDGET_S, threads: int = 1) -> str:
    """The cache's key for schedules measured on this host for ``target`` (None: the host's)
    by the timing protocol with ``budget_s`` seconds per state, on ``threads`` threads."""
    budget_s = checks.seconds(budget_s, "budget_s")  # checked outside the memo, as True == 1 there
    return _measurement_key(Target.resolve(target), budget_s) + _threads_suffix(threads)  # None resolved now, not memoised


@lru_cache(maxsize=64)
def _measurement_key(target: Target, budget_s: float) -> str:
    budget_ms = budget_s * 1000
    return f"{host_fingerprint()}|{target.key}|codegen-{CODEGEN_VERSION}|timing-v{TIMING_PROTOCOL_VERSION}-{budget_ms:g}ms"


def peak_key(target: Target | None = None, threads: int = 1, dtype: str = "float32") -> str:
    """The cache's key for the measured peak of ``target`` (None: the host's) on this host,
    on ``threads`` threads, of ``dtype``'s kernels (named only when not float32)."""
    return _peak_key(Target.resolve(target)) + _threads_suffix(threads) + ("" if as_dtype(dtype) == DEFAULT_DTYPE else f"|{as_dtype(dtype).name}")


@lru_cache(maxsize=16)
def _peak_key(target: Target) -> str:
    return f"{host_fingerprint()}|{target.key}|peak-timing-v{TIMING_PROTOCOL_VERSION}"


# Part of the reference kernel's key: bump when that kernel or its timing budget changes
# (looprl.measurement.load), so that a quiet figure of the old one is not compared with the new.
REFERENCE_VERSION = 1


def reference_key(host_key: str) -> str:
    """The cache's key for the quiet figure of the load's reference kernel
    (:mod:`looprl.measurement.load`: the best reading seen, in GFLOPS, stored in the peaks
    table) that goes with ``host_key``, a :func:`measurement_key` (this host, the target, the
    code generator's and timing's versions, the threads): the records measured under that key
    are judged against it."""
    return f"{host_key}|reference-v{REFERENCE_VERSION}"


BANDWIDTH_VERSION = 2  # how memory_bandwidth reads: 2 added the prefetching patterns


def bandwidth_key(level: str, target: Target, threads: int = 1) -> str:
    """The cache's key for this host's measured bandwidth from ``level`` (``"llc"`` or
    ``"dram"``) with ``target``'s vector loads, on ``threads`` threads (stored in the peaks
    table: a ceiling of this host, in GB/s). ``stream-v2``: the read patterns with software
    prefetches (a bandwidth measured without them is not reused)."""
    return (f"{host_fingerprint()}|{target.key}|bandwidth-{level}-stream-v{BANDWIDTH_VERSION}-timing-v{TIMING_PROTOCOL_VERSION}"
            + _threads_suffix(threads))


def schedule_threads(nest: LoopNest, threads: int) -> int:
    """The threads ``nest`` runs on when a caller offers ``threads``: 1 without a parallel loop."""
    return threads if nest.is_parallel else 1


def key_target(host_key: str) -> Target | None:
    """The target a :func:`measurement_key` names (the part between the host and the code
    generator's version): this host's own or a named one (:data:`~looprl.target.TARGET_NAMES`)
    whose key it is; else, for another machine's own target, the named target of its vector
    ISA (the same lanes and registers, not its CPU's features); None where it names no target
    looprl knows. For what depends only on lanes and registers (a plan's steps), and checked
    by its caller against what it is for (a record's schedule)."""
    if not isinstance(host_key, str) or "|codegen-" not in host_key:
        return None
    parts = host_key.rsplit("|codegen-", 1)[0].rsplit("|", 4)
    if len(parts) < 5:
        return None
    key = "|".join(parts[1:])
    for target in (Target.host(), *map(Target.named, TARGET_NAMES)):
        if target.key == key:
            return target
    return Target.named(parts[1]) if parts[1] in TARGET_NAMES else None


def tuned_problem(problem_name: str, tuner: str) -> str:
    """The tuned table's problem column: the problem, and the tuner's version if given."""
    return f"{problem_name}|{tuner}" if tuner else problem_name


def tuned_problem_name(column: str) -> str:
    """The problem's name in a tuned table's problem column (:func:`tuned_problem`)."""
    return column.split("|", 1)[0]
