"""The directory in the simulation: the real ``DirectoryState`` behind one-hop messages.

One shard owns every simulated object (the owner's place costs nothing here: every message
takes one hop, whoever sends it). Requests arrive a hop after they are sent; an answer that
is ``NotYet`` waits, like ``directory/shard.py``'s waiters, until an instruction wakes its id;
replies take another hop. Waits never time out: a simulated run ends, or reports what still
waits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, Half, LocateHint
from hoplited.directory.state import (
    RING_WAIT,
    DirectoryState,
    Entry,
    HalvesRule,
    Instruction,
    NotYet,
    Source,
    Split,
    Wake,
)
from hoplited.sim.clock import Clock

Attempt = Callable[[], bool]  # True once answered


class Shard:
    """``DirectoryState`` (fan-out ``fanout``, every node alive) reached in one hop."""

    def __init__(self, clock: Clock, latency: float, fanout: int, me: str,
                 fanout_for: Callable[[int, int], int] | None = None,
                 halves_for: HalvesRule | None = None) -> None:
        self.clock, self.latency = clock, latency
        self.state = DirectoryState(fanout, is_alive=lambda node: True,
                                    owner_of=lambda oid: me, me=me, fanout_for=fanout_for,
                                    halves_for=halves_for)
        self._waiters: defaultdict[ObjectID, list[Attempt]] = defaultdict(list)

    @property
    def waiting(self) -> int:
        """Requests still waiting for an answer."""
        return sum(map(len, self._waiters.values()))

    def locate(self, oid: ObjectID, requester: str, exclude: Iterable[str], offset: int,
               reply: Callable[[Source | Split | HopliteError], None],
               hint: LocateHint = PLAIN) -> None:
        """``Locate``: a source for ``requester`` (enrolled behind it), the split into two
        halves, or the shard's error; ``hint``: what the get says (``Among``: how many get
        the object together; ``Half``: of that half, waiting ``RING_WAIT`` at most for the
        parent in its tree to ask, as ``directory/shard.py`` does)."""
        excluded = tuple(exclude)
        patience: list[bool] = []  # [True] while waiting for a parent, [False] once over

        def attempt() -> bool:
            patient = not patience or patience[0]
            try:
                answer: Source | Split | NotYet | HopliteError = self.state.try_locate(
                    oid, requester, excluded, offset, hint, patient=patient)
            except HopliteError as exc:
                answer = exc
            if isinstance(answer, NotYet):
                if answer.ring and not patience:
                    patience.append(True)
                    self.clock.after(RING_WAIT, impatient)
                return False
            if isinstance(hint, Half) or isinstance(answer, Split):
                # receivers waiting for this one may go on; woken next, not from within an
                # attempt (``_apply`` is iterating over the waiters)
                self.clock.after(0.0, lambda: self._apply([Wake(oid)]))
            self.clock.after(self.latency, lambda: reply(answer))
            return True

        def impatient() -> None:
            patience[0] = False
            self._apply([Wake(oid)])
        self.clock.after(self.latency, lambda: self._ask(oid, attempt))

    def wait_object(self, oid: ObjectID, reply: Callable[[Entry], None]) -> None:
        """``WaitObject``: the entry once a node holds all of ``oid``."""
        def attempt() -> bool:
            answer = self.state.try_wait_object(oid)
            if isinstance(answer, NotYet):
                return False
            self.clock.after(self.latency, lambda: reply(answer))
            return True
        self.clock.after(self.latency, lambda: self._ask(oid, attempt))

    def publish(self, oid: ObjectID, holder: str, size: int, dtype: str, shape: list[int],
                version: bytes, inline: bytes | None, received: int | None = None,
                producing: bool = False, receivers: int = 0) -> None:
        """``Publish`` (``received`` None: complete) or ``Announce`` (a partial holding)."""
        self.clock.after(self.latency, lambda: self._apply(self.state.publish(
            oid, holder, size, dtype, shape, version, inline, received, producing,
            receivers=receivers)))

    def progress(self, oid: ObjectID, holder: str, received: int, half: int = -1) -> None:
        self.clock.after(self.latency, lambda: self._apply(
            self.state.progress(oid, holder, received, half)))

    def transfer_done(self, oid: ObjectID, source: str, receiver: str, complete: bool,
                      half: int = -1) -> None:
        self.clock.after(self.latency, lambda: self._apply(
            self.state.transfer_done(oid, source, receiver, complete, half)))

    def fail(self, oid: ObjectID, error: HopliteError) -> None:
        """``FailEntry``: ``oid`` will never exist; its waiters get ``error``."""
        self.clock.after(self.latency, lambda: self._apply(self.state.fail(oid, error)))

    def _ask(self, oid: ObjectID, attempt: Attempt) -> None:
        if not attempt():
            self._waiters[oid].append(attempt)

    def _apply(self, instructions: list[Instruction]) -> None:
        """Carry out the state's instructions: only ``Wake`` occurs without failures."""
        for ins in instructions:
            if isinstance(ins, Wake):
                waiting = self._waiters.pop(ins.oid, [])
                self._waiters[ins.oid] = [a for a in waiting if not a()]
