"""The receivers hint's check: a whole count from 0 (unknown) to MAX_RECEIVERS, else refused."""

from __future__ import annotations

from typing import Any

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.receivers import MAX_RECEIVERS, check_receivers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [0, 1, 7, 999, MAX_RECEIVERS])
def test_whole_counts_in_range_pass(value: int) -> None:
    assert check_receivers(value) == value


@pytest.mark.parametrize("value, why", [
    (-1, "negative"),
    (MAX_RECEIVERS + 1, "more nodes than any cluster"),
    (2**64, "far too many"),
    (True, "a bool is not a count"),
    (1.0, "a float, even a whole one"),
    ("8", "text"),
    (None, "None: 0 means unknown"),
])
def test_anything_else_is_refused(value: Any, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match="receivers"):
        check_receivers(value)
