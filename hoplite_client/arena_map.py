"""The client's read-only access to its daemon's arena: one mapping per object it gets.

The daemon hands over a read-only descriptor of a memfd sealed against writes, so no mapping
made here can write the store (docs/security.md). A get maps just the object's pages (its
own ``mmap``), so the returned array cannot be made writable and keeps the mapping alive;
when the last array over it is gone, the mapping is collected and a finalizer tells the
daemon the object may be freed.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray


class ArenaMap:
    """The arena's read-only file descriptor from the daemon."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def view(self, offset: int, size: int, dtype: np.dtype[Any], shape: tuple[int, ...],
             on_release: Callable[[], None]) -> NDArray[Any]:
        """A read-only array over an extent; ``on_release`` runs once no array uses it."""
        region = mmap.mmap(self.fd, size, prot=mmap.PROT_READ, offset=offset)
        weakref.finalize(region, on_release)
        return np.frombuffer(region, dtype=dtype, count=size // dtype.itemsize).reshape(shape)

    def close(self) -> None:
        """Close the descriptor (views from :meth:`view` hold mappings of their own)."""
        os.close(self.fd)
