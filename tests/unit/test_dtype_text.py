"""parse_dtype and check_meta: the dtype text a client or peer sends, as a table. Numpy's own
parser fails on foreign text with TypeError, ValueError or SyntaxError; each must be a typed
InvalidArgumentError (a node id such as "09d76a56d9d6" sent as a dtype crashed a handler)."""

from __future__ import annotations

import numpy as np
import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.collectives.ops import check_reducible
from hoplited.memory.store import check_meta, parse_dtype

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, itemsize", [
    ("<f4", 4), ("float64", 8), ("|S16", 16), ("<c16", 16), ("?", 1), ("<M8[ns]", 8),
])
def test_plain_dtypes_parse(text: str, itemsize: int) -> None:
    assert parse_dtype(text).itemsize == itemsize


@pytest.mark.parametrize("text", [
    "09d76a56d9d6",  # numpy reads a repeat count and raises SyntaxError
    "no-such-type", "", "x" * 5000, "i4," * 1000, "(3,)",
])
def test_foreign_text_is_a_typed_error(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_dtype(text)
    with pytest.raises(InvalidArgumentError):
        check_meta(text, [1], 4)
    with pytest.raises(InvalidArgumentError):
        check_reducible("sum", text)


@pytest.mark.parametrize("text, shape, size", [
    ("O", [1], 8),  # objects would need pickling
    ("i4,i4", [1], 8),  # records are not plain
    ("<f4", [-1], 4),
    ("<f4", [4], 15),
])
def test_meta_numpy_reads_but_we_refuse(text: str, shape: list[int], size: int) -> None:
    np.dtype(text)  # numpy itself reads each of these
    with pytest.raises(InvalidArgumentError):
        check_meta(text, shape, size)
