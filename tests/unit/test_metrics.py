"""The status record turned into Prometheus metric families (hoplited/metrics.py)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hoplited.metrics import families, registry_for

RECORD: dict[str, Any] = {
    "node_id": "n1",
    "bytes_in": 300, "bytes_out": 700,
    "peers": {"n2": {"in": 300, "out": 200}, "n3": {"in": 0, "out": 500}},
    "store": {"objects": 3, "complete_objects": 2, "stored_bytes": 4096, "arena_used": 8192,
              "capacity": 1 << 20, "pinned_deleted": 1},
    "members": [{"node_id": "n1", "alive": True}, {"node_id": "n2", "alive": True},
                {"node_id": "n3", "alive": False}],
    "directory": {"entries": 5, "waiting_gets": 2},
    "clients": 4, "reduce_tasks": 1, "reduce_folds": 2, "reduce_merges": 6, "watching": 2,
    "late_inputs_held": 7, "late_leaves_ahead": 8, "reduce_pulls_paused": 9,
    "reduces_in_halves": 3, "gets_in_halves": 4, "allreduces_as_ring": 5, "rings_given_up": 1,
    "transfers": [{"object": "ab", "phase": "pulling", "source": "n2", "received": 10,
                   "size": 20}],
    "errors": {"ObjectNotFoundError": 2, "InvalidArgumentError": 1},
}


def samples(record: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} as a scraper would parse the exposition."""
    text = "".join(generate_latest(registry_for(lambda: record)).decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.parametrize("name, labels, value", [
    ("hoplite_transfer_bytes_total", {"direction": "in"}, 300),
    ("hoplite_transfer_bytes_total", {"direction": "out"}, 700),
    ("hoplite_peer_transfer_bytes_total", {"peer": "n2", "direction": "in"}, 300),
    ("hoplite_peer_transfer_bytes_total", {"peer": "n2", "direction": "out"}, 200),
    ("hoplite_peer_transfer_bytes_total", {"peer": "n3", "direction": "out"}, 500),
    ("hoplite_store_objects", {}, 3),
    ("hoplite_store_used_bytes", {}, 8192),
    ("hoplite_store_capacity_bytes", {}, 1 << 20),
    ("hoplite_store_pinned_deleted_objects", {}, 1),
    ("hoplite_members", {"state": "alive"}, 2),
    ("hoplite_members", {"state": "dead"}, 1),
    ("hoplite_directory_entries", {}, 5),
    ("hoplite_directory_waiting_gets", {}, 2),
    ("hoplite_clients", {}, 4),
    ("hoplite_reduce_tasks", {}, 1),
    ("hoplite_watching", {}, 2),
    ("hoplite_reduce_folds_total", {}, 2),
    ("hoplite_reduce_merges_total", {}, 6),
    ("hoplite_late_inputs_held_total", {}, 7),
    ("hoplite_late_leaves_ahead_total", {}, 8),
    ("hoplite_reduce_pulls_paused_total", {}, 9),
    ("hoplite_reduces_in_halves_total", {}, 3),
    ("hoplite_gets_in_halves_total", {}, 4),
    ("hoplite_allreduces_as_ring_total", {}, 5),
    ("hoplite_rings_given_up_total", {}, 1),
    ("hoplite_transfers_in_flight", {}, 1),
    ("hoplite_errors_total", {"type": "ObjectNotFoundError"}, 2),
    ("hoplite_errors_total", {"type": "InvalidArgumentError"}, 1),
])
def test_every_status_field_becomes_a_sample(name: str, labels: dict[str, str],
                                             value: float) -> None:
    key = (name, tuple(sorted({"node": "n1", **labels}.items())))
    assert samples(RECORD)[key] == value


def test_a_sparse_record_gives_what_it_has() -> None:
    """A field the record lacks yields no sample rather than a made-up zero."""
    got = samples({"node_id": "n9", "members": []})
    names = {name for name, _ in got}
    assert "hoplite_store_objects" not in names and "hoplite_clients" not in names
    assert got[("hoplite_transfer_bytes_total", (("direction", "in"), ("node", "n9")))] == 0
    assert len(families({"node_id": "n9"})) == 4  # traffic (total, per peer), members, errors
