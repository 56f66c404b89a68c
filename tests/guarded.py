"""Arrays flush against an inaccessible page: any out-of-bounds access by a kernel faults."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_PROT_NONE = 0


class GuardedArray:
    """An array (float32 unless ``dtype`` says otherwise) that ends (``side="end"``) or starts
    (``side="start"``) exactly at a PROT_NONE page. Keep this object alive while the array is used."""

    def __init__(self, shape: tuple[int, ...], side: str = "end", dtype=np.float32):
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        data_pages = -(-max(nbytes, 1) // _PAGE)
        self._map = mmap.mmap(-1, (data_pages + 2) * _PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._base = base
        for guard in (base, base + (data_pages + 1) * _PAGE):
            if _libc.mprotect(guard, _PAGE, _PROT_NONE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect failed")
        start = _PAGE if side == "start" else (data_pages + 1) * _PAGE - nbytes
        buffer = (ctypes.c_char * nbytes).from_address(base + start)
        self.array = np.frombuffer(buffer, dtype=dtype).reshape(shape)

    def release(self) -> None:
        _libc.mprotect(self._base, len(self._map), mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = None
