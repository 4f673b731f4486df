"""Challenge-response proof of the cluster token: HMAC-SHA256 over both nonces and node ids.

Each side sends a fresh nonce; each proves knowledge of the token by an HMAC that binds its
role, both nonces and both node ids, so a proof cannot be replayed or reflected. The token
itself never crosses the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

NONCE_SIZE = 16  # 128 random bits per side: replay odds are negligible


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def proof(token: bytes, role: bytes, own_nonce: bytes, peer_nonce: bytes,
          own_id: str, peer_id: str) -> bytes:
    """HMAC proving the sender (``role`` b"server" or b"client") knows ``token``."""
    fields = [b"hoplite-auth-v1", role, own_nonce, peer_nonce, own_id.encode(), peer_id.encode()]
    msg = b"".join(struct.pack("!I", len(f)) + f for f in fields)  # length-prefixed: unambiguous
    return hmac.new(token, msg, hashlib.sha256).digest()


def verify(expected: bytes, received: bytes) -> bool:
    """Constant-time comparison of two proofs."""
    return hmac.compare_digest(expected, received)
