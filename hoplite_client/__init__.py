"""hoplite_client: the async SDK for a hoplite cluster (talks to the local ``hoplited``)."""

from .client import Client, connect
from .errors import (AuthenticationError, CapacityError, ConnectionLostError, HopliteError,
                     HopliteTimeoutError, InvalidArgumentError, ObjectDeletedError,
                     ObjectExistsError, ObjectNotFoundError, PeerUnavailableError, ProtocolError)
from .ids import ObjectID
from .sync import SyncClient

__all__ = [
    "AuthenticationError", "CapacityError", "Client", "ConnectionLostError", "HopliteError",
    "HopliteTimeoutError", "InvalidArgumentError", "ObjectDeletedError", "ObjectExistsError",
    "ObjectID", "ObjectNotFoundError", "PeerUnavailableError", "ProtocolError", "SyncClient",
    "connect",
]
