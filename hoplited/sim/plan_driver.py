"""The in-memory driver of a decision core: it feeds the plan its events and hands each
instruction to the handler registered for the instruction's type.

The simulator's reduce and allreduce (:mod:`hoplited.sim.reduce`, :mod:`hoplited.sim.allreduce`)
and the reduce's repair model (tests/unit/test_reduce_repair_model.py) are built on it, each
registering what it does with each kind of instruction. A kind with no handler stops the run at
once, so a new instruction cannot go by unnoticed; a driver that deliberately does nothing
with a kind registers it with :meth:`PlanDriver.ignore`. Events are handled in arrival order,
and an event fed while instructions run is queued behind, never handled inside the event that
caused it: the order of ``collectives/coordinator.py``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from hoplited.sim.errors import SimulationError

# The clock hook: run a callback that many seconds from now (``Clock.after``).
Later = Callable[[float, Callable[[], object]], None]
E = TypeVar("E")  # the plan's events
E_co = TypeVar("E_co", covariant=True)
K = TypeVar("K")  # one kind of instruction


class Plan(Protocol):
    """A decision core: one event in, the instructions it gives out."""

    def handle(self, event: Any, /) -> Sequence[object]: ...


P = TypeVar("P", bound=Plan)


class Timer(Protocol[E_co]):
    """An instruction to feed ``event`` back ``delay`` seconds from now (``plan.After``)."""

    @property
    def delay(self) -> float: ...

    @property
    def event(self) -> E_co: ...


def _nothing(ins: object) -> None:
    """The handler of an ignored kind."""


def _refuse(why: str, ins: object) -> None:
    """The handler of a refused kind."""
    raise SimulationError(f"{ins} {why}")


class PlanDriver(Generic[P, E]):
    """Owns ``plan``, the queue of its events and the clock hook ``later``; carries out each
    instruction with the handler registered for its type (:meth:`on`)."""

    def __init__(self, plan: P, later: Later) -> None:
        self.plan = plan
        self.later = later
        self._events: deque[E] = deque()
        self._draining = False
        self._handlers: dict[type, Callable[[Any], object]] = {}

    def on(self, kind: type[K], handler: Callable[[K], object]) -> None:
        """Carry out each instruction of type ``kind`` with ``handler`` (in place of any
        handler registered for it before)."""
        self._handlers[kind] = handler

    def ignore(self, *kinds: type) -> None:
        """Do nothing with instructions of these types (the caller says why)."""
        for kind in kinds:
            self._handlers[kind] = _nothing

    def refuse(self, why: str, *kinds: type) -> None:
        """Stop the run at an instruction of these types with ``SimulationError("{ins}
        {why}")``: what the model leaves out."""
        for kind in kinds:
            self._handlers[kind] = functools.partial(_refuse, why)

    @property
    def kinds(self) -> frozenset[type]:
        """The instruction types with a handler (registered, ignored or refused)."""
        return frozenset(self._handlers)

    @property
    def pending(self) -> int:
        """Events queued and not handled yet."""
        return len(self._events)

    def queue(self, event: E) -> None:
        """Queue ``event`` for the next :meth:`drain`."""
        self._events.append(event)

    def feed(self, event: E) -> None:
        """Queue ``event`` and handle the queue (if an event is being handled, it comes after)."""
        self.queue(event)
        self.drain()

    def drain(self) -> None:
        """Hand the queued events to the plan in order, each instruction to its handler, until
        no event is left, those the handlers queue included."""
        if self._draining:
            return  # the drain under way reaches the event once the one before it is done
        self._draining = True
        try:
            while self._events:
                for ins in self.plan.handle(self._events.popleft()):
                    self.execute(ins)
        finally:
            self._draining = False

    def execute(self, ins: object) -> None:
        """Carry out ``ins`` with the handler of its type; none registered: SimulationError."""
        handler = self._handlers.get(type(ins))
        if handler is None:
            raise SimulationError(f"{type(ins).__name__} has no handler in "
                                  f"{type(self).__name__}: {ins}")
        handler(ins)

    def feed_after(self, delay: float, event: E) -> None:
        """Feed ``event`` ``delay`` seconds from now."""
        self.later(delay, functools.partial(self.feed, event))

    def fire(self, ins: Timer[E]) -> None:
        """The handler of a timer (``plan.After``): its event is fed at its time."""
        self.feed_after(ins.delay, ins.event)
