"""The simulator's plan driver: a handler per instruction type, events in arrival order, timers
at their time (hoplited/sim/plan_driver.py)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import plan as p
from hoplited.collectives import stripes as s
from hoplited.sim.allreduce import AllreduceRun
from hoplited.sim.clock import Clock
from hoplited.sim.cluster import Cluster, node_name
from hoplited.sim.errors import SimulationError
from hoplited.sim.plan_driver import PlanDriver
from hoplited.sim.reduce import ReduceRun
from hoplited.sim.scenarios import object_id

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Ping:
    """An instruction of the scripted plan; ``reply``: the event its handler feeds back."""

    n: int
    reply: str = ""


@dataclass(frozen=True)
class Pong:
    """Another kind of instruction."""

    n: int


class Script:
    """A plan answering each event with the instructions scripted for it; ``log`` records
    each event it handles (with the time ``now`` says) in one list with what handlers do."""

    def __init__(self, script: dict[object, list[object]],
                 now: Callable[[], float] = lambda: 0.0) -> None:
        self.script, self.now = script, now
        self.log: list[object] = []

    def handle(self, event: object) -> list[object]:
        self.log.append(("event", event, self.now()))
        return self.script.get(event, [])


Driver = PlanDriver[Script, object]


def at_once(delay: float, fn: Callable[[], object]) -> None:
    """A clock hook for tests that keep no time."""
    fn()


def test_each_instruction_goes_to_the_handler_registered_for_its_type() -> None:
    driver = Driver(Script({"go": [Ping(1), Pong(2), Ping(3)]}), at_once)
    pings: list[Ping] = []
    pongs: list[Pong] = []
    driver.on(Ping, lambda ins: pytest.fail("replaced"))
    driver.on(Ping, pings.append)  # replaces the handler before it
    driver.on(Pong, pongs.append)
    driver.feed("go")
    assert (pings, pongs, driver.kinds) == ([Ping(1), Ping(3)], [Pong(2)], frozenset({Ping, Pong}))


def test_an_instruction_with_no_handler_stops_the_run_at_once_naming_it() -> None:
    driver = Driver(Script({"go": [Ping(1), Pong(2), Ping(3)], "more": [Ping(4)]}), at_once)
    pings: list[Ping] = []
    driver.on(Ping, pings.append)
    with pytest.raises(SimulationError, match=r"^Pong has no handler in PlanDriver: "
                                              r"Pong\(n=2\)$"):
        driver.feed("go")
    assert pings == [Ping(1)]  # nothing after it ran
    driver.feed("more")  # the driver goes on with the next event fed
    assert pings == [Ping(1), Ping(4)]


def test_ignored_kinds_do_nothing_and_refused_kinds_stop_the_run_saying_why() -> None:
    driver = Driver(Script({"go": [Pong(1), Ping(2)]}), at_once)
    driver.ignore(Pong)
    driver.refuse("is not modelled here", Ping)
    with pytest.raises(SimulationError, match=r"^Ping\(n=2, reply=''\) is not modelled here$"):
        driver.feed("go")


def test_events_fed_by_handlers_are_handled_in_order_after_the_event_that_caused_them() -> None:
    """A handler's event waits for the rest of the current event's instructions, then the
    events before it: the plan is never handed an event inside another."""
    plan = Script({"a": [Ping(1, "b"), Ping(2, "c")], "b": [Ping(3, "d")], "c": [Ping(4)]})
    driver = Driver(plan, at_once)

    def ping(ins: Ping) -> None:
        plan.log.append(("ping", ins.n))
        if ins.reply:
            driver.feed(ins.reply)
    driver.on(Ping, ping)
    driver.feed("a")
    assert plan.log == [("event", "a", 0.0), ("ping", 1), ("ping", 2), ("event", "b", 0.0),
                        ("ping", 3), ("event", "c", 0.0), ("ping", 4), ("event", "d", 0.0)]


def test_queued_events_wait_for_a_drain() -> None:
    plan = Script({})
    driver = Driver(plan, at_once)
    driver.queue("a")
    driver.queue("b")
    assert (plan.log, driver.pending) == ([], 2)
    driver.drain()
    assert (plan.log, driver.pending) == ([("event", "a", 0.0), ("event", "b", 0.0)], 0)


def test_after_feeds_its_event_at_its_time() -> None:
    clock = Clock()
    late, later = p.HoldOver(ObjectID(b"\x01" * 20)), p.HoldOver(ObjectID(b"\x02" * 20))
    plan = Script({"go": [p.After(2.0, later), p.After(0.5, late)]}, lambda: clock.now)
    driver = Driver(plan, clock.after)
    driver.on(p.After, driver.fire)
    driver.feed("go")
    assert plan.log == [("event", "go", 0.0)]  # nothing fed before its time
    clock.run()
    assert plan.log == [("event", "go", 0.0), ("event", late, 0.5), ("event", later, 2.0)]


def test_the_simulators_drivers_have_a_handler_for_every_instruction() -> None:
    """Every instruction the plans may give is carried out, ignored or refused, by design."""
    c = Cluster.build(1e9 / 8, 1e-4, 1 << 16, fanout=1)
    ids = [object_id(f"in-{i}") for i in range(4)]
    reduce = ReduceRun(c, node_name(0), object_id("out"), ids)
    allreduce = AllreduceRun(c, node_name(0), object_id("all"), ids,
                             {node_name(i): 0.0 for i in range(4)}, 0.0,
                             lambda node, oid: None, lambda node, t: None)
    assert reduce.kinds == set(typing.get_args(p.Instruction))
    assert allreduce.kinds == set(typing.get_args(s.Instruction))
