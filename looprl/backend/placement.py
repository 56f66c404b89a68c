"""Team placement: while a parallel kernel runs on looprl's private runtime, each thread of its
team is held to a core of its own.

Why. The private runtime's pool threads sleep soon after a parallel region
(:mod:`looprl.backend.threads`: so that they leave the cores to other work), and every call
wakes them. On a 2-vCPU KVM guest (AMD EPYC Zen 4, 2026-11-29) the woken pool thread was put
on the core of the thread that woke it, already busy with its own share, instead of the idle
one, and the calling thread, woken in turn by the pool thread at the end of the region,
followed it to that core: the team took turns on one core. A two-thread kernel of 0.43 ms
(128x312x960, AVX2 code) ran at 92 GFLOPS call after call, its one-thread speed, against 180
with the pool threads spinning (``GOMP_SPINCOUNT=30000``); tune's duels then found no team
that paid (a team of 256x256x256 at 111 GFLOPS, one thread's speed). Holding the pool thread
alone to the other core, or the calling thread alone to its core, left it at 92; holding both
gave 184. Whether a guest's scheduler does this depends on the host (the same guest ran such
teams at full speed in another session), so looprl holds the threads wherever it runs teams
on its own runtime.

How. For each call on ``threads`` > 1 threads, :func:`placed_team`:

* holds the calling thread to the core it is on (its CPU affinity narrowed to that core for
  the call, then restored as it was);
* holds the runtime's pool threads of this calling thread (libgomp keeps a pool per calling
  thread) each to another core of the calling thread's affinity, lowest first: placed once,
  by a parallel region of their own in which each pool thread sets its own affinity, and
  placed again only when the calling thread is found on another core or a team of another
  size is asked for.

A pool thread held to a core waits for that core where other work runs on it; on a machine
with cores to spare, a woken thread might have found an idle one instead. A program that
places its threads itself can turn placement off with ``LOOPRL_PLACE_TEAMS=0`` in its
environment (read when looprl is imported); ``experiments/team_placement.py`` times teams
both ways. The calls of torch's
runtime (where torch loaded it first, looprl's kernels share torch's pool, whose threads spin
long after a region) and of a runtime set up by ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` are
left as that runtime places them. ``looprl-bench mixed`` measures a team's calls with other
work between them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Iterator

from looprl.backend.threads import private_runtime

PLACE_TEAMS = os.environ.get("LOOPRL_PLACE_TEAMS", "1").strip()  # "1" (the default) or "0": see the module docstring
_REGION_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(void *), what GOMP_parallel runs
_placed = threading.local()  # .cores: (the calling thread's core, its pool threads' cores) last placed


def _sched_getcpu():
    """glibc's ``sched_getcpu`` (the core the calling thread is on), or None where it is missing."""
    try:
        function = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = ctypes.c_int, []
    return function


_GETCPU = _sched_getcpu()


def current_core() -> int | None:
    """The core the calling thread runs on now, or None where this cannot be asked."""
    if _GETCPU is None:
        return None
    core = _GETCPU()
    return core if core >= 0 else None


def pool_cores(core: int, allowed: set[int], threads: int) -> tuple[int, ...] | None:
    """The cores a team of ``threads`` whose calling thread is on ``core`` holds its pool threads
    to: the lowest ``threads - 1`` of ``allowed`` (the calling thread's affinity) other than
    ``core``; None where there are not that many (the team is then left unplaced)."""
    others = sorted(set(allowed) - {core})
    return tuple(others[: threads - 1]) if len(others) >= threads - 1 else None


@contextlib.contextmanager
def placed_team(threads: int) -> Iterator[None]:
    """Hold the calling thread and the pool threads of a team of ``threads`` each to a core of
    its own while the block runs (see the module docstring); nothing on one thread, off the
    private runtime, with ``LOOPRL_PLACE_TEAMS=0``, or where the cores cannot be asked or set."""
    if PLACE_TEAMS not in ("0", "1"):
        raise ValueError(f"LOOPRL_PLACE_TEAMS must be 0 or 1, not {PLACE_TEAMS!r}")
    runtime = private_runtime()
    core = current_core() if PLACE_TEAMS == "1" and threads > 1 and runtime is not None else None
    if core is None:
        yield
        return
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set()
    pool = pool_cores(core, allowed, threads) if core in allowed else None
    if pool is None:
        yield
        return
    os.sched_setaffinity(0, {core})
    try:
        if getattr(_placed, "cores", None) != (core, pool):
            _place_pool(runtime, pool)
            _placed.cores = (core, pool)
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def _place_pool(runtime: ctypes.CDLL, pool: tuple[int, ...]) -> None:
    """Run a parallel region of ``len(pool) + 1`` threads on ``runtime`` in which pool thread
    ``i`` (1, 2, ...) holds itself to core ``pool[i - 1]``."""

    def place(_) -> None:
        number = runtime.omp_get_thread_num()
        if number > 0:
            try:
                os.sched_setaffinity(0, {pool[number - 1]})
            except OSError:
                pass  # (a core taken away meanwhile) this thread stays where it may run

    body = _REGION_BODY(place)
    runtime.GOMP_parallel(body, None, ctypes.c_uint(len(pool) + 1), ctypes.c_uint(0))
