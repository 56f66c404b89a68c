"""What looprl keeps derived from a layer's weight and bias, and when it derives it again.

:class:`ContentCache`: derived again whenever the tensors' contents differ, bit for bit, from
those it was derived from (compared on every call, with the C library's ``memcmp`` where it
can). :class:`FrozenCache`: derived once per pair of tensors, their values promised constant
(``tune_module(frozen=True)``, Inductor's ``freezing``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np
import torch


class ContentCache:
    """A value derived from the contents of some CPU tensors (kernels bound to a layer's weight
    and bias: their copies, re-laid or packed), derived again whenever :meth:`get` is given
    tensors whose contents are not, bit for bit, those it was derived from. The one place where
    looprl keeps something computed from a tensor across calls: a cache of anything derived
    from a weight uses it, so nothing derived outlives the data it was derived from.

    ``derive(*arrays)`` computes the value from C-contiguous numpy copies of the tensors (None
    for a tensor given as None); the copies are kept, and on every :meth:`get` each tensor's
    current elements are compared with them (all of them, byte for byte: a NaN equals itself,
    -0.0 differs from 0.0; with the C library's ``memcmp`` where the tensor is contiguous).

    Why contents and not what torch tracks (checked on torch 2.13): a call compares the values
    the tensor holds now with the values the cached result was computed from, so it sees a
    change however it was made: ``.data.mul_()`` and other in-place edits through ``.data``,
    ``.data = new`` (also a strided tensor of the same shape), ``copy_``, ``load_state_dict``
    (in place, or ``assign=True``: a new Parameter), ``zero_``/``fill_``/any in-place op under
    ``no_grad`` or ``inference_mode``, a replaced Parameter, ``torch.utils.swap_tensors``,
    writes through ``tensor.numpy()`` or through another tensor sharing the storage, an
    optimiser step. What torch tracks misses several of these: ``.data`` is a new tensor with
    its own version counter, so ``p.data.mul_(2)`` leaves ``p``'s ``_version``, ``data_ptr``
    and storage unchanged, and so do numpy writes and edits through a kept ``.data`` alias;
    ``swap_tensors`` keeps ``id(p)`` and gave ``p`` a storage at the address of one freed
    earlier; a new Parameter can take the ``id`` of a freed one, with a version counter
    starting again at 0. A key of identity, pointer, storage and version is therefore no proof
    that the contents are unchanged, and a checksum of a few sampled elements misses edits of
    the others; so no such shortcut is taken.

    The cost, per call: reading the tensors and their copies (which take as much memory again).
    Measured on the project's 2-vCPU AMD EPYC (Zen 5), one thread, one row (a decode step): a
    3072x768 layer's call took 450 us, of which the comparison 200 us, where its bound kernel
    alone, weights resident in the cache, took 91 us and ``F.linear`` 125 us (the comparison
    and the copy push the kernel's packed weights out of the cache); a 1024x1024 layer's 131 us
    (comparison 93, kernel alone 43, ``F.linear`` 57); not scripted. Scripted since
    (``experiments/content_cache_cost.py``, AMD EPYC Zen 1, AVX2): 2195 us, of which the
    comparison 1391, against 901 frozen, 930 for ``F.linear`` and 1000 for oneDNN's packed
    linear at 768->3072. So on few rows the call usually loses to
    torch's, and the layer's routes (:meth:`LinearKernels.judge`) give those rows to torch.
    Binding again instead of comparing would cost more (0.8 ms for 1024x1024, the weight
    re-laid element by element). Safe to use from several threads: the copies and the
    value are replaced together, under a lock."""

    def __init__(self, derive):
        self._derive = derive
        self._entry: tuple[tuple, object] | None = None  # ((dtype, copy) per tensor derived from, the value), replaced whole
        self._lock = threading.Lock()

    @property
    def kept(self) -> tuple | None:
        """``(the copies compared on each call, as (dtype, array) or None per tensor, the value
        derived from them)``, the last derived; None before the first."""
        return self._entry

    def get(self, *tensors):
        """The value derived from the tensors' contents as they are now."""
        entry = self._entry
        if entry is None or not _same_contents(entry[0], tensors):
            with self._lock:
                entry = self._entry
                if entry is None or not _same_contents(entry[0], tensors):
                    kept = tuple(None if tensor is None else (tensor.dtype, numpy_view(tensor).copy()) for tensor in tensors)
                    entry = self._entry = (kept, self._derive(*(None if pair is None else pair[1] for pair in kept)))
        return entry[1]


def _same_contents(kept: tuple, tensors: tuple) -> bool:
    """Whether each tensor (or None) holds, bit for bit, the elements of its kept copy (``(dtype,
    array)``, or None too)."""
    if len(kept) != len(tensors):
        return False
    for pair, tensor in zip(kept, tensors):
        if pair is None or tensor is None:
            if pair is not tensor:
                return False
            continue
        dtype, array = pair
        if tensor.dtype != dtype or tuple(tensor.shape) != array.shape:
            return False
        if _memcmp is not None and tensor.is_contiguous():  # the bytes compared as they lie: no temporary, stops at a difference
            if _memcmp(tensor.data_ptr(), array.ctypes.data, array.nbytes) != 0:
                return False
            continue
        bits = np.dtype(f"u{array.itemsize}")
        if not np.array_equal(numpy_view(tensor).view(bits), array.view(bits)):
            return False
    return True


def _load_memcmp():
    """The C library's ``memcmp`` (1.4-1.7x faster than ``np.array_equal`` on a weight, which
    writes a temporary of booleans first), or None where it cannot be found."""
    try:
        name = ctypes.util.find_library("c")
        function = ctypes.CDLL(name).memcmp
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


_memcmp = _load_memcmp()



class FrozenCache:
    """A value derived from copies of a weight and a bias (or None) once per pair of tensors:
    what :func:`~looprl.torch.tune_module`'s ``frozen=True`` promises is that their values do
    not change, as ``torch.compile`` with Inductor's ``freezing`` does. A new tensor (``.data =
    new``, a new Parameter, ``load_state_dict(assign=True)``) is derived from again; an in-place
    edit is not seen. ``derive(weight, bias)`` gets C-contiguous numpy copies (None for no bias).

    Bound by identity, not by address: the cache keeps an alias of each tensor it derived from
    (``tensor.detach()``: the same storage), so that storage stays allocated and no other
    tensor can be given its address; a tensor whose data pointer, strides, shape and dtype are
    those of the kept alias is then the tensor bound (the same memory), any other is new. (A
    key of addresses alone, kept after the tensor was freed, took a new tensor allocated at the
    freed address for the old one: 38 of 40 rounds of ``.data = new`` twice between calls on a
    256x256 layer, torch 2.13.) The cost: the bound tensors stay allocated until the next call
    binds their replacements (a weight replaced and never called again is kept)."""

    def __init__(self, derive):
        self._derive = derive
        # ((the bound weight's alias and how it is seen, the bias's or None), the value), replaced whole
        self._entry: tuple[tuple, object] | None = None

    @property
    def value(self):
        """The value derived last, or None before the first."""
        entry = self._entry
        return None if entry is None else entry[1]

    def get(self, weight, bias):
        """The value derived from ``weight`` and ``bias``, bound again when either is another
        tensor than the one bound."""
        entry = self._entry
        if entry is None or not (_same_tensor(entry[0][0], weight) and _same_tensor(entry[0][1], bias)):
            kept = (_seen(weight.detach()), None if bias is None else _seen(bias.detach()))
            copies = tuple(None if seen is None else numpy_view(seen[0]).copy() for seen in kept)
            entry = self._entry = (kept, self._derive(*copies))
        return entry[1]


def numpy_view(tensor) -> np.ndarray:
    """The memory of CPU ``tensor`` (detached) as a numpy array, no copy: float32 as float32,
    bfloat16 as the ``uint16`` bits looprl's kernels take (numpy has no bfloat16)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _seen(alias) -> tuple:
    """``alias`` (a tensor, kept alive) with how it is seen: its data pointer, dtype, shape and
    strides, read once here rather than on every :func:`_same_tensor` (a decode step asks once
    per layer per token)."""
    return alias, alias.data_ptr(), alias.dtype, alias.shape, alias.stride()


def _same_tensor(seen, tensor) -> bool:
    """Whether ``tensor`` (or None) is the memory of the alias of ``seen`` (:func:`_seen`: kept
    alive, so no other tensor can lie at its address) seen the same way."""
    if seen is None or tensor is None:
        return seen is tensor
    _, pointer, dtype, shape, stride = seen
    return tensor.data_ptr() == pointer and tensor.dtype == dtype and tensor.shape == shape and tensor.stride() == stride
