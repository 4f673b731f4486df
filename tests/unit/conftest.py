"""The unit tier: every reduce plan checks its records agree after each event it handles."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hoplited.collectives.plan as plan_module


@pytest.fixture(autouse=True)
def check_plan_invariants(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(plan_module, "CHECK_INVARIANTS", True)
    yield
