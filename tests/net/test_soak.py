"""The soak's short form, run by ``make soak`` after the long one (``make test`` leaves it out:
it is marked ``soak``): a mixed workload at twice the store's capacity, then every daemon must
be alive, within its memory bound, empty again once the workload is gone, and have seen no
error but CapacityError (hoplited/tools/soak.py)."""

from __future__ import annotations

import os

import pytest

from hoplited.tools.soak import SoakSettings, run_soak

pytestmark = [pytest.mark.net, pytest.mark.soak]

# Two minutes; HOPLITE_SOAK_SECONDS sets another length.
SOAK_SECONDS = float(os.environ.get("HOPLITE_SOAK_SECONDS", "120"))


@pytest.mark.timeout(SOAK_SECONDS + 600)
async def test_soak_mixed_workload_at_twice_the_capacity() -> None:
    report = await run_soak(SoakSettings(duration=SOAK_SECONDS))
    assert report.ok, "\n".join(report.lines())
    assert report.errors.keys() <= {"CapacityError"}
    assert report.bytes_checked > 0
