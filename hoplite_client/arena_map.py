"""The client's mapping of its daemon's arena: writes for put, read-only views for get.

A get maps just the object's pages read-only (its own ``mmap``), so the returned array cannot
be made writable and keeps the mapping alive; when the last array over it is gone, the
mapping is collected and a finalizer tells the daemon the object may be freed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hoplite_client.net.shared_memory import populate_write


class ArenaMap:
    """The arena file descriptor from the daemon and a writable mapping of it."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))

    def writable(self, offset: int, size: int) -> NDArray[np.uint8]:
        """A uint8 array over an extent the daemon reserved for us (pre-faulted)."""
        if size:
            populate_write(self._base + offset - offset % mmap.PAGESIZE,
                           size + offset % mmap.PAGESIZE)
        return np.frombuffer(self.map, dtype=np.uint8, count=size, offset=offset)

    def view(self, offset: int, size: int, dtype: np.dtype[Any], shape: tuple[int, ...],
             on_release: Callable[[], None]) -> NDArray[Any]:
        """A read-only array over an extent; ``on_release`` runs once no array uses it."""
        region = mmap.mmap(self.fd, size, prot=mmap.PROT_READ, offset=offset)
        weakref.finalize(region, on_release)
        return np.frombuffer(region, dtype=dtype, count=size // dtype.itemsize).reshape(shape)

    def close(self) -> None:
        """Unmap the arena and close its descriptor (views from :meth:`view` are separate).
        An array from :meth:`writable` still alive somewhere (a put's frame not yet collected)
        keeps the mapping: it is then unmapped when that array goes, not here."""
        try:
            self.map.close()
        except BufferError:
            pass
        os.close(self.fd)
