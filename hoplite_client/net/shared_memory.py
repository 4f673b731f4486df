"""The shared-memory contract between a daemon and its clients: pre-faulting arena pages.

Both sides map the daemon's memfd arena; both pre-fault the pages they are about to write.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# Linux >= 5.14; pre-faulting a range beats faulting pages in one by one inside a copy or a
# recv_into (measured 0.3 s/GiB against 2.6 s/GiB here).
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def populate_write(address: int, length: int) -> int:
    """Back and map ``length`` bytes at ``address`` writable; 0 or the errno (ctypes drops the
    GIL, so a worker thread can do this while the event loop runs)."""
    if _libc.madvise(address, length, MADV_POPULATE_WRITE) != 0:
        return ctypes.get_errno()
    return 0
