"""Weights looprl converts once are carved from huge-page arenas (looprl.backend.weight_memory):
the arrays are right, the memory is advised where the host allows it, the bound kernels and the
cold copies that time them use it, and the switch is checked."""

import ctypes
import gc
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

import looprl
from looprl.backend import weight_memory
from looprl.backend.weight_memory import ARENA_BYTES, HUGE_PAGE_BYTES, weight_empty
from looprl.measurement.timing import Workspace


def _thp_mode() -> str | None:
    """Linux' transparent huge page mode (``always``, ``madvise`` or ``never``), None elsewhere."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        return None
    text = path.read_text()
    return text[text.index("[") + 1 : text.index("]")]


needs_thp = pytest.mark.skipif(_thp_mode() not in ("always", "madvise") or not hasattr(mmap, "MADV_HUGEPAGE"),
                               reason="the host offers no transparent huge pages to advise")


def _advised(address: int) -> bool:
    """Whether the mapping that holds ``address`` is advised ``MADV_HUGEPAGE`` (its ``hg`` flag in
    ``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds address {address:#x}")


def _from_weight_memory(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a mapping of looprl.backend.weight_memory (the object at
    the end of its chain of bases)."""
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return isinstance(owner, memoryview) and isinstance(owner.obj, mmap.mmap)


@pytest.fixture
def huge_pages(monkeypatch):
    monkeypatch.setattr(weight_memory, "HUGE_PAGES", "1")


def test_a_weight_array_has_its_shape_and_dtype_is_aligned_writable_and_keeps_its_values(huge_pages):
    arrays = [weight_empty((3, 5)), weight_empty(7, np.uint16), weight_empty((0, 4)), weight_empty((1100, 1100))]
    assert [(a.shape, a.dtype) for a in arrays] == [((3, 5), np.float32), ((7,), np.uint16), ((0, 4), np.float32),
                                                    ((1100, 1100), np.float32)]
    values = []
    for i, array in enumerate(arrays):
        assert array.flags.c_contiguous and array.flags.writeable
        assert array.ctypes.data % 64 == 0
        array[...] = np.arange(array.size).reshape(array.shape) + i
        values.append(array.copy())
    for array, kept in zip(arrays, values):  # none overlaps another
        assert np.array_equal(array, kept)


def test_small_weights_share_an_arena_and_a_large_one_gets_whole_huge_pages(huge_pages):
    first, second = weight_empty(1000), weight_empty(1000)
    assert 0 < second.ctypes.data - first.ctypes.data < ARENA_BYTES  # carved one after the other
    large = weight_empty(ARENA_BYTES // 4 + 1, np.uint8)
    assert large.ctypes.data % HUGE_PAGE_BYTES == 0


def _resident_bytes(address: int) -> int:
    """The resident bytes of the mapping that holds ``address`` (``Rss`` in ``/proc/self/smaps``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not hasattr(mmap, "MADV_HUGEPAGE"), reason="needs Linux")
def test_the_pages_of_weights_that_died_are_given_back_and_the_live_ones_kept(huge_pages, monkeypatch):
    monkeypatch.setattr(weight_memory, "_current", {})  # a fresh arena
    arrays = [weight_empty(HUGE_PAGE_BYTES // 4 // 4, np.float32) for _ in range(12)]  # three huge pages, filled
    for i, array in enumerate(arrays):
        array.fill(i)
    kept, address = arrays[0], arrays[0].ctypes.data
    before = _resident_bytes(address)
    assert before >= 3 * HUGE_PAGE_BYTES - 64 * 1024
    del arrays, array
    gc.collect()
    after = _resident_bytes(address)
    assert after <= before - 2 * HUGE_PAGE_BYTES + 64 * 1024  # the second and third pages given back
    assert np.all(kept == 0)  # the first page, which holds a live weight, kept


@needs_thp
def test_weights_are_advised_onto_huge_pages(huge_pages):
    for array in (weight_empty((256, 256)), weight_empty((3000, 3000))):
        assert _from_weight_memory(array) and _advised(array.ctypes.data)


@needs_thp
def test_a_bound_kernel_packs_its_weight_onto_huge_pages_and_computes_as_numpy(huge_pages):
    problem = looprl.linear(2, 96, 40, bias=False)
    kernel = looprl.tune(problem, cache=":memory:", remember=False, budget_s=0).kernel
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 96), np.float32), rng.standard_normal((40, 96), np.float32)
    bound = kernel.bind(in1=w)
    assert bound._buffers["in1"] is not w
    assert _from_weight_memory(bound._buffers["in1"]) and _advised(bound._buffers["in1"].ctypes.data)
    np.testing.assert_allclose(bound(x), x @ w.T, rtol=1e-5, atol=1e-5)


@needs_thp
def test_packed_cold_copies_are_timed_on_huge_pages_where_bound_kernels_pack_their_weights(huge_pages):
    problem = looprl.linear(1, 64, 64, bias=False).with_cold(True)
    workspace = Workspace(problem)
    source = workspace.cold_copies("in1")
    assert len(source) > 1  # row-major, as a user's weight: wherever numpy puts them

    class Layout:  # the layout of a packed copy: as many elements, its own key
        key, elements = "copied", 64 * 64

    def packer(src: int, dst: int) -> None:  # a packing function's signature: addresses
        ctypes.memmove(dst, src, 64 * 64 * 4)

    packed = workspace.cold_copies("in1", Layout(), packer)
    assert len(packed) == len(source)
    assert all(_from_weight_memory(copy) for copy in packed)
    assert all(_advised(copy.ctypes.data) for copy in (packed[0], packed[len(packed) // 2], packed[-1]))  # smaps read once a copy
    assert all(np.array_equal(copy.reshape(64, 64), src) for copy, src in zip(packed, source))


def _imported_with(monkeypatch, value: str):
    """A fresh copy of looprl.backend.weight_memory imported with ``LOOPRL_HUGE_PAGES=value`` (the
    switch is read when the module is imported, as in a process started with it), beside the
    process's own module, which it leaves as it was: no process start, no import of looprl, each."""
    import importlib.util

    monkeypatch.setenv("LOOPRL_HUGE_PAGES", value)
    spec = importlib.util.spec_from_file_location("weight_memory_imported_with_the_switch", weight_memory.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_switch_turns_the_advice_off_and_a_bad_value_is_a_value_error_that_names_it(monkeypatch):
    off = _imported_with(monkeypatch, "0")
    assert off.huge_pages_on() is False and off.weight_empty(10).ctypes.data % 64 == 0
    bad = _imported_with(monkeypatch, "yes")
    with pytest.raises(ValueError, match="LOOPRL_HUGE_PAGES"):
        bad.weight_empty(10)


def test_a_bad_shape_is_a_value_error(huge_pages):
    with pytest.raises(ValueError, match="extent"):
        weight_empty("big")
    with pytest.raises(ValueError):
        weight_empty((-1, 3))


def _mapping_of(array: np.ndarray):
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner.obj


def test_a_timings_arrays_come_from_arenas_apart_from_the_weights_that_live_on(huge_pages, monkeypatch):
    monkeypatch.setattr(weight_memory, "_current", {})
    kept = weight_empty(1000)
    with weight_memory.for_timing():
        transient = weight_empty(1000)
    after = weight_empty(1000)
    assert _mapping_of(kept) is _mapping_of(after)  # the weights that live on, side by side
    assert _mapping_of(transient) is not _mapping_of(kept)
