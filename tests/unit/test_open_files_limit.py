"""A daemon raises its soft limit on open files to the hard one: it keeps about four
connections per other member (hoplited/main.py, docs/design.md §5)."""

from __future__ import annotations

import resource

import pytest

from hoplited.main import raise_open_files_limit


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit to raise the soft one to")
    low = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert raise_open_files_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
