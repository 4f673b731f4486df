"""check_ring_task: the ring tasks a member refuses before it allocates anything (a table).
A task names this member's part only: its place, the ring's size, its neighbours, its inputs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import MAX_IDS_PER_FRAME
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import RingTask
from hoplited.collectives.ring import RING_MAX
from hoplited.collectives.ring_member import check_ring_task

pytestmark = pytest.mark.unit

ME = "me"
INPUTS = [ObjectID(bytes([i + 1]) * 20) for i in range(3)]
GOOD = RingTask(result=ObjectID(b"\xee" * 20), inputs=INPUTS[:2], position=1, members=4,
                predecessor="a", successor="b", op="sum", size=16 << 20, dtype="<f4",
                shape=[4 << 20], version=b"v" * 8)


@pytest.mark.parametrize("change, position", [
    ({}, 1),
    ({"position": 0, "members": 2, "predecessor": "a", "successor": "a"}, 0),  # two members
    ({"position": RING_MAX - 1, "members": RING_MAX}, RING_MAX - 1),
    ({"inputs": INPUTS[:1] * 2}, 1),  # an input listed twice counts twice
], ids=repr)
def test_good_tasks_give_the_place_and_the_inputs(change: dict[str, Any], position: int) -> None:
    task = replace(GOOD, **change)
    assert check_ring_task(ME, task) == (position, list(task.inputs))


@pytest.mark.parametrize("change", [
    {"members": 1}, {"members": RING_MAX + 1}, {"position": 4}, {"position": -1},
    {"inputs": []}, {"inputs": INPUTS[:1] * (MAX_IDS_PER_FRAME + 1)},
    {"predecessor": ""}, {"successor": ""}, {"predecessor": ME}, {"successor": ME},
    {"predecessor": "b"},  # one neighbour on both sides is a ring of two only
    {"members": 2, "position": 0},  # a ring of two has one neighbour
    {"dtype": "no-such-type"}, {"op": "frobnicate"}, {"size": 64}, {"version": b"v"},
    {"shape": [3]},
], ids=repr)
def test_bad_tasks_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        check_ring_task(ME, replace(GOOD, **change))
