"""hoplite_client: the async SDK for a hoplite cluster (talks to the local ``hoplited``).

The errors and :class:`ObjectID` load eagerly; the client facade (and numpy with it) loads on
first use, so the daemon can import the shared layers (:mod:`.wire`, :mod:`.net`) without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hoplite_client.wire.errors import (
    AuthenticationError,
    CapacityError,
    ConnectionLostError,
    DeclaredDeadError,
    ForeignDaemonError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    ObjectDeletedError,
    ObjectExistsError,
    ObjectNotFoundError,
    PeerUnavailableError,
    ProtocolError,
)
from hoplite_client.wire.ids import ObjectID

if TYPE_CHECKING:
    from hoplite_client.client import Client, connect
    from hoplite_client.sync import SyncClient

_FACADE = {"Client": "hoplite_client.client", "connect": "hoplite_client.client",
           "SyncClient": "hoplite_client.sync"}

__all__ = [
    "AuthenticationError", "CapacityError", "Client", "ConnectionLostError", "DeclaredDeadError",
    "ForeignDaemonError", "HopliteError",
    "HopliteTimeoutError", "InvalidArgumentError", "ObjectDeletedError", "ObjectExistsError",
    "ObjectID", "ObjectNotFoundError", "PeerUnavailableError", "ProtocolError", "SyncClient",
    "connect",
]


def __getattr__(name: str) -> Any:
    """Load the facade's names on first access (PEP 562)."""
    module = _FACADE.get(name)
    if module is None:
        raise AttributeError(f"module 'hoplite_client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
