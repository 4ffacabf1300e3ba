"""Test keys and proofs signed here, shaped as countersign signs them, so every failure of
verify_proof can be produced on purpose."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from countersign_verify import PAYLOAD_TYPE, STATEMENT_TYPE, compute_action_digest, jwk_thumbprint, pae

TESTDATA = Path(__file__).resolve().parents[3] / "testdata"

ACTION = {
    "description": "Transfer GBP 12,450 to Globex Corp for invoice INV-2341",
    "details": {"vendor": "Globex Corp", "amount": "12450", "currency": "GBP", "invoice_ref": "INV-2341"},
}

# A time inside the test statements' validity.
DURING = "2030-01-01T00:05:00Z"


@dataclass
class Key:
    private: Ed25519PrivateKey
    jwk: dict[str, str]

    @property
    def kid(self) -> str:
        return self.jwk["kid"]


def make_key() -> Key:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(), "alg": "EdDSA", "use": "sig"}
    jwk["kid"] = jwk_thumbprint(jwk)
    return Key(private, jwk)


def statement(action: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    action = action or ACTION
    st = {
        "type": STATEMENT_TYPE,
        "request_id": "req_0123456789abcdef0123456789abcdef",
        "decision": "approved",
        "authorization_type": "human",
        "action": action,
        "action_digest": compute_action_digest(action["description"], action["details"]),
        "requested_by": {"id": "token:bot", "display_name": "bot", "auth_method": "bearer_token"},
        "approvers": [{"id": "token:alice", "display_name": "alice", "channel": "api", "auth_method": "bearer_token"}],
        "comment": None,
        "fields": {},
        "requested_at": "2030-01-01T00:00:00.000Z",
        "decided_at": "2030-01-01T00:01:00.000Z",
        "valid_until": "2030-01-01T00:16:00.000Z",
        "nonce": base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode(),
    }
    st.update(overrides)
    return st


def envelope(body: Any, key: Key, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sig = key.private.sign(pae(payload_type, raw))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(raw).decode(),
        "signatures": [{"keyid": key.kid, "sig": base64.b64encode(sig).decode()}],
    }


def jwks_of(*keys: Key) -> dict[str, Any]:
    return {"keys": [k.jwk for k in keys]}


def flip(b64: str, index: int) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[index % len(raw)] ^= 1
    return base64.b64encode(bytes(raw)).decode()
