"""check_task: the stripe tasks a member refuses before it allocates anything (a table)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import StripeTask
from hoplited.collectives.allreduce import check_task

pytestmark = pytest.mark.unit

INPUTS = [ObjectID(bytes([i + 1]) * 20) for i in range(4)]
V = b"v" * 8
GOOD = StripeTask(result=ObjectID(b"\xee" * 20), inputs=INPUTS, op="sum", size=16 << 20,
                  dtype="<f4", shape=[4 << 20], version=V, stripes=4, stripe=1, gen=0,
                  timeout=None, pair=False)


def test_a_good_task_passes() -> None:
    check_task(GOOD)
    check_task(replace(GOOD, stripe=-1))
    check_task(replace(GOOD, stripes=2, stripe=1, pair=True))
    check_task(replace(GOOD, stripes=2, stripe=-1, pair=True))


@pytest.mark.parametrize("change", [
    {"dtype": "no-such-type"}, {"op": "frobnicate"}, {"stripes": 1}, {"stripes": 5},
    {"stripe": 4}, {"stripe": -2}, {"gen": -1}, {"version": b"v"}, {"size": 4 << 20},
    {"inputs": INPUTS[:1]}, {"size": -1}, {"shape": [3]},
    {"pair": True},  # a pair has two halves
], ids=repr)
def test_bad_tasks_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        check_task(replace(GOOD, **change))
