"""Unit tests of the challenge-response proofs of the cluster token."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hoplite_client.wire import auth

TOKEN = b"cluster-secret-token-0123456789"
N1 = b"\x01" * auth.NONCE_SIZE
N2 = b"\x02" * auth.NONCE_SIZE
BASE = dict(token=TOKEN, role=b"server", own_nonce=N1, peer_nonce=N2, own_id="node-a", peer_id="node-b")


def p(**changes) -> bytes:
    """The proof of BASE with some arguments changed."""
    return auth.proof(**{**BASE, **changes})


def test_proof_is_deterministic_sha256():
    """The same inputs give the same 32-byte proof."""
    assert p() == p() and len(p()) == 32


@pytest.mark.parametrize("changes", [
    {"role": b"client"},
    {"own_nonce": N2},
    {"peer_nonce": N1},
    {"own_nonce": N2, "peer_nonce": N1},
    {"own_id": "node-c"},
    {"peer_id": "node-c"},
    {"own_id": "node-b", "peer_id": "node-a"},
    {"token": TOKEN + b"!"},
    {"token": b"other"},
], ids=lambda c: ",".join(c))
def test_proof_changes_with_every_input(changes):
    """Changing the role, either nonce, either node id or the token changes the proof."""
    assert p(**changes) != p()


def test_server_and_client_proofs_differ():
    """A server's proof cannot be reflected as the client's on the same handshake."""
    server = auth.proof(TOKEN, b"server", N1, N2, "srv", "cli")
    client = auth.proof(TOKEN, b"client", N2, N1, "cli", "srv")
    assert server != client


def test_verify_accepts_right_and_rejects_wrong():
    """verify() accepts the expected proof and rejects any other, including truncations."""
    good = p()
    assert auth.verify(good, bytes(good))
    assert not auth.verify(good, p(token=b"wrong"))
    assert not auth.verify(good, good[:-1])
    assert not auth.verify(good, b"")
    assert not auth.verify(good, bytes([good[0] ^ 1]) + good[1:])


def test_new_nonce_fresh():
    """new_nonce() returns NONCE_SIZE fresh random bytes."""
    nonces = {auth.new_nonce() for _ in range(50)}
    assert len(nonces) == 50 and all(len(n) == auth.NONCE_SIZE for n in nonces)


@settings(max_examples=200, deadline=None)
@given(token=st.binary(min_size=8, max_size=64), role=st.sampled_from([b"server", b"client"]),
       n1=st.binary(min_size=16, max_size=16), n2=st.binary(min_size=16, max_size=16),
       a=st.text(max_size=20), b=st.text(max_size=20))
def test_token_never_in_proof(token, role, n1, n2, a, b):
    """The proof never contains the token (raw or hex) and a wrong token never verifies."""
    proof = auth.proof(token, role, n1, n2, a, b)
    assert token not in proof and token.hex() not in proof.hex()
    assert auth.verify(proof, auth.proof(token, role, n1, n2, a, b))
    assert not auth.verify(proof, auth.proof(token + b"x", role, n1, n2, a, b))
