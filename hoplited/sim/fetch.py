"""A simulated get: the real ``FetchPlan`` decides, the simulated shard and links carry out.

The driver mirrors ``transfer/fetcher.py``: ask the owner (``Locate``), allocate, pull from
the source it names, report the pull's end (``TransferDone``) and progress every
``PROGRESS_INTERVAL`` while receiving, so later locates can tell how far along it is.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import among
from hoplited.directory.state import Source, Split
from hoplited.sim.cluster import Cluster
from hoplited.sim.errors import SimulationError
from hoplited.sim.network import Copy
from hoplited.transfer import fetch_plan as fp
from hoplited.transfer.fetch_plan import view_id

# Receivers tell the shard how far along they are this often (docs/design.md §3; the value of
# transfer/fetcher.py, which this package does not import: it is asyncio).
PROGRESS_INTERVAL = 0.05


class Fetch:
    """One get of ``oid`` on ``node``; ``on_end(self)`` runs when it is done or failed;
    ``receivers``: how many get it together, as the get says (0: unknown)."""

    def __init__(self, cluster: Cluster, node: str, oid: ObjectID,
                 on_end: Callable[[Fetch], None], receivers: int = 0, half: int = -1,
                 split: fp.FetchHalves | None = None) -> None:
        self.cluster, self.node, self.oid, self.on_end = cluster, node, oid, on_end
        self.half, self.split = half, split  # a half, and what the split said, if half >= 0
        self.key = oid if half < 0 else view_id(oid, half)  # its copy in the stores
        self.plan = fp.FetchPlan(oid, node, deadline=None,
                                 hint=among(receivers) if split is None else split.hint(half))
        self.done_at: float | None = None
        self.error: HopliteError | None = None
        self._copy: Copy | None = None
        self._size = 0  # of the last answer (an inline object's)
        self._todo: deque[fp.Instruction] = deque()
        self._reported = (0, float("-inf"))  # (blocks, when) of the last progress report

    def start(self) -> None:
        self._todo.extend(self.plan.start(self.cluster.clock.now))
        self._next()

    def _next(self) -> None:
        """Carry out instructions until one has to wait for the network or the shard."""
        c = self.cluster
        while self._todo:
            ins = self._todo.popleft()
            if isinstance(ins, fp.AskOwner):
                c.shard.locate(self.oid, self.node, ins.exclude, ins.offset, self._answered,
                               ins.hint)
                return
            if isinstance(ins, fp.FetchHalves):
                self._halves(ins)
                return
            if isinstance(ins, fp.Allocate):
                self._copy = self._create(ins.size)
                self._copy.follow(self._progress)
            elif isinstance(ins, fp.Pull):
                assert self._copy is not None
                c.net.pull(self._source_copy(ins.source), self._copy,
                           functools.partial(self._pulled, ins.source))
                return
            elif isinstance(ins, fp.UseLocalCopy):
                c.copies[(self.node, self.key)].when_complete(
                    lambda t: c.clock.at(t, self._next))
                return
            elif isinstance(ins, fp.StoreInline):
                self._create(self._size).fill(c.clock.now)
            elif isinstance(ins, fp.Report):
                c.shard.transfer_done(self.oid, ins.source, self.node, ins.complete,
                                      self.half)
            elif isinstance(ins, fp.Done | fp.Fail):
                if isinstance(ins, fp.Done):
                    self.done_at = c.clock.now
                else:
                    self.error = ins.error
                self.on_end(self)
                return
            else:
                raise SimulationError(f"{ins} only follows a put again, not modelled")

    def _handle(self, event: fp.Event) -> None:
        self._todo.extend(self.plan.handle(event))
        self._next()

    def _pulled(self, source: str) -> None:
        """The pull from ``source`` ended: the copy is complete (no failures here)."""
        copy = self._copy
        assert copy is not None
        self._handle(fp.PullEnded(self.cluster.clock.now, source,
                                  copy.layout.held(len(copy.full)), None))

    def _answered(self, answer: Source | Split | HopliteError) -> None:
        now = self.cluster.clock.now
        if isinstance(answer, HopliteError):
            self._handle(fp.LocateFailed(now, answer))
            return
        e = answer.entry
        self._size = e.size
        if isinstance(answer, Split):
            self._handle(fp.Located(now, None, e.size, e.dtype, tuple(e.shape), e.version,
                                    halves=answer.bounds, index=answer.index,
                                    receivers=answer.receivers))
            return
        here = (self.half < 0 and self._copy is None  # a half's copy may be a placeholder
                and (self.node, self.key) in self.cluster.copies)
        self._handle(fp.Located(now, answer.node, e.size, e.dtype, tuple(e.shape), e.version,
                                here))

    def _halves(self, ins: fp.FetchHalves) -> None:
        """Fetch both halves, each as its own ``Fetch`` of a view; the copy of the whole is
        complete (and a source of each half) once both are."""
        c, left = self.cluster, [len(ins.bounds)]

        def ended(half: Fetch) -> None:
            if half.error is not None:
                self._handle(fp.HalvesEnded(half.error))
                return
            left[0] -= 1
            if not left[0]:
                self._create(ins.size).fill(c.clock.now)
                self._handle(fp.HalvesEnded(None))

        for h in range(len(ins.bounds)):
            Fetch(c, self.node, self.oid, ended, half=h, split=ins).start()

    def _source_copy(self, source: str) -> Copy:
        """``source``'s copy to pull: of the object, or of this half. A holder of the whole
        serves a half from it (its half is there when the whole is); a receiver named before
        its own fetch of the half began serves the copy that fetch will fill, as hoplited's
        sender waits for it (transfer/sender.py, ``ENROLLED_WAIT``)."""
        copies = self.cluster.copies
        copy = copies.get((source, self.key))
        if copy is None and self.half >= 0:
            assert self.split is not None
            lo, hi = self.split.bounds[self.half]
            copy = copies[(source, self.key)] = Copy(source, self.cluster.net.layout(hi - lo))
            whole = copies.get((source, self.oid))
            if whole is not None:
                whole.when_complete(copy.fill)
        if copy is None:
            raise SimulationError(f"{source} was named a source of {self.key.hex()} and holds "
                                  f"no copy")
        return copy

    def _create(self, size: int) -> Copy:
        """This node's copy, empty; a half's may exist already, made by a pull from it."""
        copies = self.cluster.copies
        copy = copies.get((self.node, self.key)) if self.half >= 0 else None
        if copy is None or copy.full or copy.layout.size != size:
            copy = copies[(self.node, self.key)] = Copy(self.node, self.cluster.net.layout(size))
        return copy

    def _progress(self) -> None:
        """A block's arrival time is known: report it if the last report is old enough."""
        copy = self._copy
        assert copy is not None
        blocks, last = self._reported
        if len(copy.full) > blocks and copy.full[-1] - last >= PROGRESS_INTERVAL:
            blocks, when = len(copy.full), copy.full[-1]
            self._reported = (blocks, when)
            received = copy.layout.held(blocks)
            self.cluster.clock.at(when, lambda: self.cluster.shard.progress(
                self.oid, self.node, received, self.half))
