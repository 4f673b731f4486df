"""bench.compare's outputs: the standard set rewrites the docs table and the plot unless told
otherwise; a run of chosen cases writes them only where asked, so it cannot replace the
standard table with a few rows (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.compare import DOCS, PLOT, outputs

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("chosen, docs, plot, expected", [
    (False, None, None, (DOCS, PLOT)),  # the standard set: the standard outputs
    (False, "other.md", "other.png", ("other.md", "other.png")),
    (True, None, None, (None, None)),  # chosen cases: nothing unless asked
    (True, "few.md", None, ("few.md", None)),
    (True, None, "few.png", (None, "few.png")),
])
def test_where_a_run_writes(chosen: bool, docs: str | None, plot: str | None,
                            expected: tuple[str | None, str | None]) -> None:
    assert outputs(chosen, docs, plot) == expected
