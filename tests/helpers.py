"""Constants and helpers shared by the test tiers (tests/ is on sys.path: its conftest)."""

from __future__ import annotations

# Small arenas keep eight daemons cheap.
TEST_CAPACITY = "512MiB"
# Heartbeats fast enough for failure tests, slow enough for a loaded 2-core machine.
FAST_HEARTBEAT = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "4"]
