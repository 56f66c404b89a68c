"""Memory for the weights looprl converts once and then reads on every call (packed or private
copies of constant inputs), on huge pages where the host offers them.

A decode step reads every weight of a model once, from memory, with everything else read in
between: the translation of each weight's pages is cold as well. On 4 KB pages a 1 MB weight
spans 256 of them; on the AMD EPYC Zen 4 of 2026-11-30 (one thread, 256 rotating copies of a
1x512x512 linear layer's packed weight, informal) the same kernel read them at 20-25 GB/s on
4 KB pages and at 29-30 GB/s on 2 MB pages, the rate of the host's measured DRAM bound (whose
buffer numpy already puts on huge pages). So weights are carved, one after another, from
arenas of :data:`ARENA_BYTES` aligned to :data:`HUGE_PAGE_BYTES` and advised ``MADV_HUGEPAGE``
(Linux' transparent huge pages in mode ``always`` or ``madvise``): a model's many small weights
share huge pages. A weight larger than a quarter of an arena gets a mapping of its own, rounded
up to whole huge pages. Where the host has no such advice (not Linux, THP ``never``) the
memory is ordinary, and everything works the same, only slower.

An arena's huge pages are given back as the arrays on them die, and its mapping when the last
one is gone (each keeps it alive); an array's memory must be held through the array (an address
alone does not keep it), as for any numpy array. ``LOOPRL_HUGE_PAGES=0`` in the environment
turns the advice off, to measure what it is worth; any other value than ``0`` or ``1`` is a
``ValueError`` at the first weight.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import mmap
import os
import threading
import weakref

import numpy as np

from looprl import checks
from looprl.backend.buffers import ALIGNMENT, _shape, aligned_empty

HUGE_PAGE_BYTES = 2 << 20  # x86-64's transparent huge page
ARENA_BYTES = 32 << 20  # one arena: sixteen huge pages, carved in turn
HUGE_PAGES = os.environ.get("LOOPRL_HUGE_PAGES", "1").strip()  # "1" (the default) or "0": see the module docstring

_lock = threading.RLock()  # re-entrant: a finaliser may run (garbage collection) while the lock is held


class _Arena:
    """:data:`ARENA_BYTES` carved front to back. Each huge page counts the live arrays that
    touch it; a page the carving has passed whose count falls to zero is given back to the system
    (``MADV_DONTNEED``; the addresses stay the arena's), so arrays that die (a tune's candidates
    and cold copies) do not keep memory resident beside the weights that live on."""

    def __init__(self):
        self.region, self.offset, self.memory = _mapping(ARENA_BYTES)
        self.next = 0
        self.live = [0] * (ARENA_BYTES // HUGE_PAGE_BYTES)

    def carve(self, nbytes: int) -> int | None:
        """The offset of ``nbytes`` more (rounded up to the alignment), or None where they do not fit."""
        size = max(-(-nbytes // ALIGNMENT), 1) * ALIGNMENT
        if self.next + size > ARENA_BYTES:
            return None
        start, self.next = self.next, self.next + size
        for page in self._pages(start, size):
            self.live[page] += 1
        return start

    def release(self, start: int, nbytes: int) -> None:
        """An array carved at ``start`` died (a finaliser's call)."""
        size = max(-(-nbytes // ALIGNMENT), 1) * ALIGNMENT
        with _lock:
            for page in self._pages(start, size):
                self.live[page] -= 1
                if not self.live[page] and (page + 1) * HUGE_PAGE_BYTES <= self.next:
                    self._give_back(page)

    def retire(self) -> None:
        """No more carving here: the pages already free are given back now, the others as their
        arrays die."""
        with _lock:
            self.next = ARENA_BYTES
            for page, count in enumerate(self.live):
                if not count:
                    self._give_back(page)

    def _give_back(self, page: int) -> None:
        """Huge page ``page``'s memory returned to the system (its addresses stay the arena's)."""
        self.region.madvise(mmap.MADV_DONTNEED, self.offset + page * HUGE_PAGE_BYTES, HUGE_PAGE_BYTES)

    @staticmethod
    def _pages(start: int, size: int) -> range:
        return range(start // HUGE_PAGE_BYTES, (start + size - 1) // HUGE_PAGE_BYTES + 1)


# The arenas being carved: one for weights that live on, one for arrays that a timing makes and
# drops (:func:`for_timing`), so that short-lived arrays do not share huge pages with long-lived
# ones and keep them resident after they die.
_current: dict[bool, _Arena] = {}
_timing = contextvars.ContextVar("looprl_weight_memory_timing", default=False)


@contextlib.contextmanager
def for_timing():
    """Inside, :func:`weight_empty` carves from the timing arenas (a tune's candidates' packed
    weights and cold copies: many, dropped soon), apart from the weights that live on."""
    token = _timing.set(True)
    try:
        yield
    finally:
        _timing.reset(token)


def huge_pages_on() -> bool:
    """Whether weights are advised onto huge pages in this process (``LOOPRL_HUGE_PAGES``)."""
    if HUGE_PAGES not in ("0", "1"):
        raise ValueError(f"LOOPRL_HUGE_PAGES must be 0 or 1, not {HUGE_PAGES!r}")
    return HUGE_PAGES == "1" and hasattr(mmap, "MADV_HUGEPAGE")


def weight_empty(shape: tuple[int, ...] | int, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array for a weight written once and read on every call:
    :data:`~looprl.backend.buffers.ALIGNMENT`-aligned, on huge pages where the host offers them
    (see the module docstring)."""
    shape = _shape(shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if not huge_pages_on():
        return aligned_empty(shape, dtype)
    if nbytes > ARENA_BYTES // 4:  # a mapping of its own, freed with the array
        memory = _mapping(math.ceil(nbytes / HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES)[2]
        return memory[:nbytes].view(dtype).reshape(shape)
    timing = _timing.get()
    with _lock:
        arena = _current.get(timing)
        start = None if arena is None else arena.carve(nbytes)
        if start is None:
            if arena is not None:
                arena.retire()
            arena = _current[timing] = _Arena()
            start = arena.carve(nbytes)
    array = arena.memory[start : start + nbytes].view(dtype).reshape(shape)
    weakref.finalize(array, arena.release, start, nbytes)
    return array


def _mapping(nbytes: int) -> tuple[mmap.mmap, int, np.ndarray]:
    """``nbytes`` (a multiple of :data:`HUGE_PAGE_BYTES`) of fresh anonymous memory starting
    on a huge-page boundary and advised ``MADV_HUGEPAGE``: the mapping, the offset in it where
    that memory starts, and the memory as a uint8 array (which keeps the mapping alive)."""
    checks.positive_int(nbytes, "nbytes")
    # Private: shared anonymous memory is shmem, which transparent huge pages leave alone.
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, dtype=np.uint8)
    offset = (-whole.ctypes.data) % HUGE_PAGE_BYTES
    try:
        region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)
    except OSError:  # THP unavailable here: ordinary pages
        pass
    return region, offset, whole[offset : offset + nbytes]
