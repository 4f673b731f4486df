"""check_task: the stripe tasks a member refuses before it allocates anything (a table)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import MAX_READY, MAX_READY_HOLDERS
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import ReadyInput, StripeTask
from hoplited.collectives.allreduce import check_task

pytestmark = pytest.mark.unit

INPUTS = [ObjectID(bytes([i + 1]) * 20) for i in range(4)]
V = b"v" * 8
GOOD = StripeTask(result=ObjectID(b"\xee" * 20), inputs=INPUTS, op="sum", size=16 << 20,
                  dtype="<f4", shape=[4 << 20], version=V, stripes=4, stripe=1, gen=0,
                  timeout=None, pair=False, ready=[])
READY = ReadyInput(oid=INPUTS[0], holders=["n0"], version=V)
MANY = [ObjectID(i.to_bytes(20, "big")) for i in range(1, MAX_READY + 2)]


def test_a_good_task_passes() -> None:
    check_task(GOOD)
    check_task(replace(GOOD, stripe=-1))
    check_task(replace(GOOD, stripes=2, stripe=1, pair=True))
    check_task(replace(GOOD, stripes=2, stripe=-1, pair=True))
    check_task(replace(GOOD, stripes=3, stripe=2, pair=True))  # a trio's third
    check_task(replace(GOOD, stripes=2, stripe=0, pair=True,
                       ready=[READY, replace(READY, oid=INPUTS[2], holders=[])]))
    check_task(replace(GOOD, inputs=MANY, ready=[replace(READY, oid=oid, holders=["n"] * 4)
                                                 for oid in MANY[:MAX_READY]]))


@pytest.mark.parametrize("change", [
    {"dtype": "no-such-type"}, {"op": "frobnicate"}, {"stripes": 1}, {"stripes": 5},
    {"stripe": 4}, {"stripe": -2}, {"gen": -1}, {"version": b"v"}, {"size": 4 << 20},
    {"inputs": INPUTS[:1]}, {"size": -1}, {"shape": [3]},
    {"pair": True},  # a pair has two halves, a trio three
    {"stripes": 1, "pair": True}, {"stripes": 4, "pair": True},
    {"ready": [READY, READY]},  # an input named twice
    {"ready": [replace(READY, oid=ObjectID(b"\xaa" * 20))]},  # not one of the inputs
    {"ready": [replace(READY, holders=["n"] * (MAX_READY_HOLDERS + 1))]},
    {"inputs": MANY, "ready": [replace(READY, oid=oid) for oid in MANY]},  # too many
], ids=repr)
def test_bad_tasks_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        check_task(replace(GOOD, **change))
