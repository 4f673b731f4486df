"""The shared-memory arena: one memfd per daemon, written by the daemon, read by its clients.

Why a memfd passed over the Unix socket rather than files in /dev/shm: the kernel frees it
when the daemon and its clients are gone, so a SIGKILLed daemon leaves nothing behind, and
nothing on the filesystem can be opened by another user. Objects are (offset, size) extents,
page-aligned so a client can map one read-only. Only the daemon writes: it maps the memfd
once, then seals it against every later writable mapping and write (``F_SEAL_FUTURE_WRITE``),
and hands clients a read-only descriptor. A client therefore cannot write an object, not
even by reopening its descriptor through /proc; a put's bytes reach the arena through the
daemon (docs/security.md). Freed extents keep their pages ("warm"):
faulting fresh shared pages inside recv_into measured 2.6 s/GiB against 0.3 s/GiB for a bulk
populate, so allocation pre-populates in a worker thread and reuse costs nothing. The arena
remembers which ranges are backed (nothing gives pages back), so an extent whose pages are all
warm skips the worker thread too: a 1 MiB broadcast allocates and populates on every receiver
in every run, and would pay a thread hand-off and a wake-up of the loop each time
(docs/benchmarks.md, "Warm extents"). And it keeps one more extent of the largest size it has
given out warm ahead (:meth:`Arena.keep_warm`): an object that needs more memory than the node
ever held (a lost input put again beside the node's own, in the middle of the collective) then
finds its pages backed, where backing them while every core streams takes seconds
(docs/design.md §2.2).
"""

from __future__ import annotations

import asyncio
import bisect
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import mmap
import os

from hoplite_client.wire.errors import CapacityError

log = logging.getLogger("hoplited.arena")

PAGE = mmap.PAGESIZE
# Populate in slices so a receiver can start writing the first ones early.
POPULATE_SLICE = 32 * 1024 * 1024
# Linux >= 5.1 (fcntl names it from Python 3.12 on): no new writable mapping and no write,
# while mappings made before the seal keep writing (the daemon's own).
F_SEAL_FUTURE_WRITE = 0x0010
# Linux >= 5.14; pre-faulting a range beats faulting pages in one by one inside a copy or a
# recv_into (measured 0.3 s/GiB against 2.6 s/GiB here).
MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _round_up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def populate_write(address: int, length: int) -> int:
    """Back and map ``length`` bytes at ``address`` writable; 0 or the errno (ctypes drops the
    GIL, so a worker thread can do this while the event loop runs)."""
    if _libc.madvise(address, length, MADV_POPULATE_WRITE) != 0:
        return ctypes.get_errno()
    return 0


class Arena:
    """A fixed-capacity memfd with a first-fit extent allocator (extents coalesce on free);
    ``client_fd`` is the read-only descriptor clients are given."""

    def __init__(self, capacity: int, name: str = "hoplite") -> None:
        self.capacity = _round_up(max(capacity, PAGE))
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.capacity)
        self.map = mmap.mmap(self.fd, self.capacity)
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot seal the arena against clients' writes (Linux "
                                     f"5.1 or later needed): {exc.strerror}") from exc
        self.client_fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        self.view = memoryview(self.map)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self._free_starts: list[int] = [0]
        self._free_len: dict[int, int] = {0: self.capacity}
        self.used = 0
        self._can_populate = True
        # backed ranges, disjoint, sorted and merged: [start, end) pairs, flattened
        self._backed: list[int] = []
        self.largest = 0  # the largest extent given out so far
        self._high = 0  # the end of the highest extent given out so far
        self._grown = asyncio.Event()  # the warm target moved up: keep_warm has work
        # extents clients' puts are filling now; warming ahead waits for none to be left
        self._filling: set[int] = set()
        self._quiet = asyncio.Event()
        self._quiet.set()

    def alloc(self, size: int) -> int:
        """Reserve ``size`` bytes; returns the page-aligned offset or raises CapacityError."""
        need = _round_up(max(size, 1))
        for start in self._free_starts:
            length = self._free_len[start]
            if length >= need:
                self._take(start, length, need)
                self.used += need
                target = self.warm_target
                self.largest = max(self.largest, need)
                self._high = max(self._high, start + need)
                if self.warm_target > target:
                    self._grown.set()
                return start
        free = self.capacity - self.used
        raise CapacityError(f"object store full: {size} bytes requested, {free} of "
                            f"{self.capacity} free (largest extent {self.largest_free()})",
                            requested=size, free=free)

    def _take(self, start: int, length: int, need: int) -> None:
        i = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[i]
        del self._free_len[start]
        if length > need:
            bisect.insort(self._free_starts, start + need)
            self._free_len[start + need] = length - need

    def free(self, offset: int, size: int) -> None:
        """Return an extent; it merges with free neighbours."""
        length = _round_up(max(size, 1))
        self.used -= length
        i = bisect.bisect_left(self._free_starts, offset)
        if i < len(self._free_starts) and self._free_starts[i] == offset + length:
            nxt = self._free_starts.pop(i)
            length += self._free_len.pop(nxt)
        if i > 0:
            prev = self._free_starts[i - 1]
            if prev + self._free_len[prev] == offset:
                self._free_len[prev] += length
                return
        self._free_starts.insert(i, offset)
        self._free_len[offset] = length

    def largest_free(self) -> int:
        return max(self._free_len.values(), default=0)

    def buffer(self, offset: int, size: int) -> memoryview:
        return self.view[offset:offset + size]

    def backed(self, offset: int, size: int) -> bool:
        """Whether every page of the extent is backed already (``populate`` has nothing to
        do), or pages cannot be populated here at all."""
        if not self._can_populate or size == 0:
            return True
        i = bisect.bisect_right(self._backed, offset)
        return i % 2 == 1 and self._backed[i] >= offset + _round_up(size)

    @property
    def warm_target(self) -> int:
        """Where the pages kept backed end: past the highest extent given out so far, room
        for one more of the largest. First fit places any extent no larger below it."""
        return min(self.capacity, self._high + self.largest)

    def unwarmed(self) -> tuple[int, int] | None:
        """The first range below :attr:`warm_target` not backed yet, at most a populate slice
        long; None when every page below it is (or pages cannot be populated here)."""
        if not self._can_populate:
            return None
        target = self.warm_target
        lo, hi = 0, target
        for start, end in zip(self._backed[::2], self._backed[1::2]):
            if start > lo:
                hi = start
                break
            lo = end
        if lo >= target:
            return None
        return lo, min(hi, lo + POPULATE_SLICE)

    async def keep_warm(self) -> None:
        """Back the pages below :attr:`warm_target` ahead of need, a slice at a time in a
        worker thread, for as long as the daemon runs; a machine out of memory leaves them to
        the allocations (which then say so). It waits while a put fills an extent: that put
        is what the warm pages are for, and backing the next ones beside it takes CPU from
        its copy (1.7x a bare socket copy on a busy node, docs/design.md §2.2)."""
        while True:
            await self._quiet.wait()
            gap = self.unwarmed()
            if gap is None:
                self._grown.clear()
                await self._grown.wait()
                continue
            try:
                await self._populate_slice(*gap)
            except CapacityError as exc:
                log.warning("stopped keeping arena pages warm ahead: %s", exc)
                return

    def fill_begins(self, offset: int) -> None:
        """A client's put is filling the extent at ``offset``: warming ahead waits."""
        self._filling.add(offset)
        self._quiet.clear()

    def fill_ends(self, offset: int) -> None:
        """That put is sealed or gone (a second call is harmless)."""
        self._filling.discard(offset)
        if not self._filling:
            self._quiet.set()

    def _mark_backed(self, lo: int, hi: int) -> None:
        """Add [lo, hi) to the backed ranges, merging it with those it touches."""
        ranges = self._backed
        i = bisect.bisect_left(ranges, lo)  # first boundary at or after lo
        j = bisect.bisect_right(ranges, hi)  # first boundary after hi
        new = ([] if i % 2 else [lo]) + ([] if j % 2 else [hi])
        ranges[i:j] = new

    async def populate(self, offset: int, size: int) -> None:
        """Back an extent with memory and map it, in a worker thread (the loop keeps running);
        at once if it is backed already.

        Raises CapacityError when the machine has no memory left, instead of the SIGBUS a
        write into an unbackable shared page would cause.
        """
        if self.backed(offset, size):
            return
        end = offset + _round_up(size)
        pos = offset
        while pos < end and self._can_populate:
            n = min(POPULATE_SLICE, end - pos)
            await self._populate_slice(pos, pos + n)
            pos += n

    async def _populate_slice(self, lo: int, hi: int) -> None:
        """Back [lo, hi) in a worker thread; CapacityError when the machine cannot."""
        loop = asyncio.get_running_loop()
        err = await loop.run_in_executor(None, populate_write, self._base + lo, hi - lo)
        if err == errno.EINVAL:
            if self._can_populate:
                log.info("MADV_POPULATE_WRITE unsupported; pages will fault in on first use")
            self._can_populate = False
            return
        if err:
            raise CapacityError(f"no memory to back {hi - lo} bytes: {os.strerror(err)}",
                                requested=hi - lo)
        self._mark_backed(lo, hi)

    def close(self) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:
            pass  # the ctypes base pointer still exports the mapping; process exit frees it
        os.close(self.client_fd)
        os.close(self.fd)
