"""reconcile, the Ray supervisor's pure core: which nodes get a daemon, which are forgotten."""

from __future__ import annotations

import pytest
from helpers import top_level_imports

import hoplite_client.ray.placement as placement_module
from hoplite_client.ray.placement import RETRY_AFTER, Daemon, Forget, Instruction, Start, reconcile

pytestmark = pytest.mark.unit

UP = Daemon(listen="10.0.0.1:7000")
UP2 = Daemon(listen="10.0.0.2:7000")
STARTING = Daemon()
FAILED = Daemon(failed_at=100.0)


@pytest.mark.parametrize("alive,daemons,now,expected", [
    # nothing yet: only the first node seeds a cluster; the others wait for it
    (["a", "b", "c"], {}, 0.0, [Start("a", ())]),
    # the seed is starting: nobody else starts (they would have nobody to join)
    (["a", "b"], {"a": STARTING}, 0.0, []),
    # the seed listens: everyone else joins it
    (["a", "b", "c"], {"a": UP}, 0.0, [Start("b", (UP.listen,)), Start("c", (UP.listen,))]),
    # a node that joined later joins every daemon listening
    (["a", "b", "c"], {"a": UP, "b": UP2}, 0.0, [Start("c", (UP.listen, UP2.listen))]),
    # a dead node's daemon is forgotten, and not joined
    (["a", "c"], {"a": UP, "b": UP2}, 0.0, [Forget("b"), Start("c", (UP.listen,))]),
    # the seed's node died: the next node seeds again
    (["b"], {"a": UP}, 0.0, [Forget("a"), Start("b", ())]),
    # a failed start is tried again only after RETRY_AFTER
    (["a", "b"], {"a": UP, "b": FAILED}, 100.0 + RETRY_AFTER / 2, []),
    (["a", "b"], {"a": UP, "b": FAILED}, 100.0 + RETRY_AFTER, [Start("b", (UP.listen,))]),
    # a failed seed lets the next node seed, and is retried later
    (["a", "b"], {"a": FAILED}, 101.0, [Start("b", ())]),
    # everyone has a daemon: nothing to do
    (["a", "b"], {"a": UP, "b": UP2}, 0.0, []),
])
def test_reconcile(alive: list[str], daemons: dict[str, Daemon], now: float,
                   expected: list[Instruction]) -> None:
    assert reconcile(alive, daemons, now) == expected


def test_the_core_does_no_io() -> None:
    assert top_level_imports(placement_module) <= {"__future__", "collections", "dataclasses"}
