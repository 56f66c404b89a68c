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


def _libc_function(name: str, restype, argtypes):
    """glibc's ``name`` with its C signature, or None where the C library lacks it."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.restype, function.argtypes = restype, argtypes
    return function


# Called on every team call (a few hundred nanoseconds each, where os.sched_[gs]etaffinity
# building Python sets cost about 7 us a call): the calling thread's core and its CPU mask.
_CPU_SET_BYTES = 128  # glibc's cpu_set_t: 1024 cores
_CpuSet = ctypes.c_ubyte * _CPU_SET_BYTES
_GETCPU = _libc_function("sched_getcpu", ctypes.c_int, [])
_GET_MASK = _libc_function("sched_getaffinity", ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p])
_SET_MASK = _libc_function("sched_setaffinity", ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p])
_ONE_CORE: dict[int, ctypes.Array] = {}  # core -> a mask of that core alone


def current_core() -> int | None:
    """The core the calling thread runs on now, or None where this cannot be asked."""
    if _GETCPU is None:
        return None
    core = _GETCPU()
    return core if core >= 0 else None


def places_teams() -> bool:
    """Whether teams are placed in this process: placement on (``LOOPRL_PLACE_TEAMS``) and the
    kernels on looprl's private runtime (loaded, and not one another library or a user's
    ``GOMP_SPINCOUNT``/``OMP_WAIT_POLICY`` set up)."""
    return PLACE_TEAMS == "1" and private_runtime() is not None


def pool_cores(core: int, allowed: set[int], threads: int) -> tuple[int, ...] | None:
    """The cores a team of ``threads`` whose calling thread is on ``core`` holds its pool threads
    to: the lowest ``threads - 1`` of ``allowed`` (the calling thread's affinity) other than
    ``core``; None where there are not that many (the team is then left unplaced)."""
    others = sorted(set(allowed) - {core})
    return tuple(others[: threads - 1]) if len(others) >= threads - 1 else None


def hold_team(threads: int):
    """Hold the calling thread and the pool threads of a team of ``threads`` each to a core of
    its own (see the module docstring): the calling thread's CPU mask as it was, to hand to
    :func:`release_team` when the call is over; None where nothing was held (one thread, off
    the private runtime, ``LOOPRL_PLACE_TEAMS=0``, or where the cores cannot be asked or set)."""
    if PLACE_TEAMS != "1":
        if PLACE_TEAMS != "0":
            raise ValueError(f"LOOPRL_PLACE_TEAMS must be 0 or 1, not {PLACE_TEAMS!r}")
        return None
    runtime = private_runtime()
    if threads < 2 or runtime is None or _GETCPU is None or _GET_MASK is None or _SET_MASK is None:
        return None
    saved = _CpuSet()
    core = _GETCPU()
    if core < 0 or _GET_MASK(0, _CPU_SET_BYTES, saved) != 0:
        return None
    pool = _pool_for(core, bytes(saved), threads)
    if pool is None:
        return None
    single = _ONE_CORE.get(core)
    if single is None:
        single = _ONE_CORE.setdefault(core, _CpuSet.from_buffer_copy(_mask_bytes({core})))
    if _SET_MASK(0, _CPU_SET_BYTES, single) != 0:
        return None
    if getattr(_placed, "cores", None) != (core, pool):
        _place_pool(runtime, pool)
        _placed.cores = (core, pool)
    return saved


def release_team(saved) -> None:
    """Give the calling thread back the CPU mask :func:`hold_team` returned (None: nothing)."""
    if saved is not None:
        _SET_MASK(0, _CPU_SET_BYTES, saved)


@contextlib.contextmanager
def placed_team(threads: int) -> Iterator[None]:
    """:func:`hold_team` for the length of the block, then :func:`release_team`."""
    saved = hold_team(threads)
    try:
        yield
    finally:
        release_team(saved)


def _pool_for(core: int, mask: bytes, threads: int) -> tuple[int, ...] | None:
    """:func:`pool_cores` of the cores in ``mask`` (a CPU mask's bytes), remembered per mask,
    core and team size; None where ``core`` is not in the mask or too few cores are."""
    key = (core, mask, threads)
    known = getattr(_placed, "pools", None)
    if known is None:
        known = _placed.pools = {}
    if key not in known:
        bits = int.from_bytes(mask, "little")
        allowed = {index for index in range(bits.bit_length()) if bits >> index & 1}
        known[key] = pool_cores(core, allowed, threads) if core in allowed else None
    return known[key]


def _mask_bytes(cores: set[int]) -> bytes:
    """A CPU mask of ``cores``, as glibc's cpu_set_t bytes."""
    return sum(1 << core for core in cores).to_bytes(_CPU_SET_BYTES, "little")


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
