"""One error tree for the whole product, rooted at :class:`HopliteError`.

Every error has a stable wire ``code`` so a daemon can send it to a client (or a peer) as an
``Error`` frame and the receiver re-raises the same class with the same data.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar


class HopliteError(Exception):
    """Base of every error raised by hoplite; ``data`` carries machine-readable details.
    ``reported`` is True when another daemon answered with this error (it reached us as an
    ``Error`` reply), False when it happened here: reaching a peer failed, for instance."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str = "", **data: Any) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message
        self.data = data
        self.reported = False


class ObjectNotFoundError(HopliteError):
    """No object with this id exists (never put, or deleted)."""

    code = "not_found"


class ObjectExistsError(HopliteError):
    """An object with this id already exists; objects are immutable."""

    code = "exists"


class HopliteTimeoutError(HopliteError, builtins.TimeoutError):
    """The caller's timeout ran out (for example a get of an id nobody has put)."""

    code = "timeout"


class CapacityError(HopliteError):
    """The object store has no room for the object."""

    code = "capacity"


class InvalidArgumentError(HopliteError, ValueError):
    """The request is well-formed but its content is wrong (dtype, shape, size...)."""

    code = "invalid"


class ProtocolError(HopliteError):
    """A frame broke the wire protocol."""

    code = "protocol"


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol forbids (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids."""


class AuthenticationError(HopliteError):
    """The peer could not prove it knows the cluster token (or we could not)."""

    code = "auth"


class VersionMismatchError(HopliteError):
    """The peer speaks no protocol version we speak."""

    code = "version"


class ConnectionLostError(HopliteError, ConnectionError):
    """The connection to the daemon or a peer closed before the answer arrived."""

    code = "connection_lost"


class UnreachableError(ConnectionLostError):
    """No connection to the peer could be made at all (nothing listens there, no route):
    unlike a connection lost midway, nothing of ours reached it. Travels as
    ``connection_lost``."""


class PeerUnavailableError(HopliteError):
    """A cluster member is dead or unreachable (``data['node']`` names it when known)."""

    code = "unavailable"


class NotOwnerError(HopliteError):
    """The asked shard does not own the object id; ``data['owner']`` names the one that does."""

    code = "not_owner"


class ObjectDeletedError(ObjectNotFoundError):
    """The object was deleted while the operation was using it."""

    code = "deleted"


class DeclaredDeadError(HopliteError):
    """The answering member declared us dead: it refuses all we send under this node id,
    which must come back as a new member (docs/design.md §5, "Declared dead, then running
    again"); ``data['by']`` names the member."""

    code = "declared_dead"


ERRORS_BY_CODE: dict[str, type[HopliteError]] = {
    cls.code: cls
    for cls in (
        HopliteError,
        ObjectNotFoundError,
        ObjectExistsError,
        HopliteTimeoutError,
        CapacityError,
        InvalidArgumentError,
        ProtocolError,
        AuthenticationError,
        VersionMismatchError,
        ConnectionLostError,
        PeerUnavailableError,
        NotOwnerError,
        ObjectDeletedError,
        DeclaredDeadError,
    )
}


def error_from_wire(code: str, message: str, data: dict[str, Any]) -> HopliteError:
    """Rebuild the typed error a remote side reported; unknown codes become ``HopliteError``."""
    cls = ERRORS_BY_CODE.get(code, HopliteError)
    if cls is ProtocolError:
        cls = RemoteProtocolError
    error = cls(message)
    error.data = dict(data)
    error.reported = True
    return error


class ForeignDaemonError(HopliteError):
    """The Unix socket is served by a process of another user than us or root, which would
    receive all we put: the client refuses it before sending a byte; ``data`` has ``path``
    and ``uid``. Raised on the client only, it never crosses the wire, so it has no entry in
    :data:`ERRORS_BY_CODE`."""

    code = "foreign_daemon"
