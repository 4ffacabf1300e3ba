"""Verify and redeem countersign proofs in the service that acts on them.

A proof is a DSSE envelope whose payload is a signed decision statement
(docs/proof-format.md). `verify_proof` checks it offline against the server's JWKS and,
when given, the action about to run; `fetch_jwks` and `JwksCache` get the keys from a
server (optionally pinned to key ids); `redeem_proof` asks the server to consume the
approval for exactly that action, once. Every check fails closed: anything unexpected
makes the result invalid, with the server's stable reason code.

Only `cryptography` (Ed25519) and `rfc8785` (canonical JSON) are used beyond the
standard library; HTTP is urllib.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "PAYLOAD_TYPE",
    "STATEMENT_TYPE",
    "JWKS_PATH",
    "REDEEM_PATH",
    "UNBOUND_WARNING",
    "JwksError",
    "Reason",
    "VerifyResult",
    "RedeemResult",
    "TrustedKeys",
    "canonical_json",
    "compute_action_digest",
    "pae",
    "jwk_thumbprint",
    "load_jwks",
    "verify_proof",
    "jwks_url",
    "fetch_jwks",
    "JwksCache",
    "redeem_proof",
    "LOOPPAUSE_KEY_PATH",
    "LOOPPAUSE_FAILED_WARNING",
    "verify_looppause_proof",
]

PAYLOAD_TYPE = "application/vnd.countersign.decision+json"
STATEMENT_TYPE = "countersign.decision/v1"
JWKS_PATH = "/.well-known/jwks.json"
REDEEM_PATH = "/api/v1/proofs/redeem"
UNBOUND_WARNING = (
    "the action was not checked: this proof approves the action it names, which may not be "
    "the one about to run; pass the action to bind the check to it, or redeem the proof to "
    "consume it for exactly that action"
)


class JwksError(Exception):
    """A JWKS that cannot be used: unreachable, malformed, or holding none of the pinned keys.

    `code` is `jwks_unusable`, `jwks_unreachable` or `pin_mismatch`.
    """

    def __init__(self, message: str, code: str = "jwks_unusable") -> None:
        super().__init__(message)
        self.code = code


# --- canonical JSON and the action digest -------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical JSON of a JSON value, as UTF-8 bytes."""
    return rfc8785.dumps(value)


def _check_action(action: Any) -> None:
    if not isinstance(action, Mapping):
        raise TypeError("an action is {description, details}")
    if not isinstance(action.get("description"), str):
        raise TypeError("action description must be a string")
    details = action.get("details")
    if not isinstance(details, Mapping):
        raise TypeError("action details must be an object of strings")
    for k, v in details.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"action details {k!r} must be a string (amounts and ids are strings)")


def compute_action_digest(description: str, details: Mapping[str, str] | None = None) -> str:
    """``"sha256:" + hex(SHA-256(JCS({description, details})))``: the digest a proof binds."""
    details = {} if details is None else details
    _check_action({"description": description, "details": details})
    canonical = canonical_json({"description": description, "details": dict(details)})
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


# --- encodings ----------------------------------------------------------------------------

_STD_B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_URL_B64 = re.compile(r"[A-Za-z0-9_-]*")


def _decode_std_b64(text: Any) -> bytes | None:
    """RFC 4648 standard base64 with padding, strictly: None for anything else."""
    if not isinstance(text, str) or not _STD_B64.fullmatch(text):
        return None
    raw = base64.b64decode(text, validate=True)
    # Non-zero padding bits would let two texts name one byte string.
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _decode_url_b64(text: Any) -> bytes | None:
    if not isinstance(text, str) or not _URL_B64.fullmatch(text) or len(text) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") == text else None


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of a payload type and the decoded payload."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


# --- keys ---------------------------------------------------------------------------------


def jwk_thumbprint(jwk: Mapping[str, Any]) -> str:
    """RFC 7638 thumbprint of an OKP key: base64url SHA-256 of {"crv","kty","x"}."""
    for member in ("crv", "kty", "x"):
        if not isinstance(jwk.get(member), str):
            raise TypeError(f"a JWK needs the string member {member!r}")
    required = json.dumps(
        {"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")
    return base64.urlsafe_b64encode(hashlib.sha256(required).digest()).rstrip(b"=").decode("ascii")


def _jwk_problem(jwk: Any) -> str | None:
    if not isinstance(jwk, Mapping):
        return "not an object"
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        return "not an OKP / Ed25519 key"
    if "d" in jwk:
        return "it holds a private key"
    if "alg" in jwk and jwk["alg"] not in ("EdDSA", "Ed25519"):
        return f"alg is {jwk['alg']!r}"
    if "use" in jwk and jwk["use"] != "sig":
        return f"use is {jwk['use']!r}"
    raw = _decode_url_b64(jwk.get("x"))
    if raw is None or len(raw) != 32:
        return "x is not a 32-byte base64url Ed25519 key"
    if jwk.get("kid") != jwk_thumbprint(jwk):
        return "its kid is not its RFC 7638 thumbprint"
    return None


class TrustedKeys:
    """Keys ready to verify with, by kid; made by `load_jwks`, `fetch_jwks` or a `JwksCache`.

    `rejected` maps the kid of each published key that failed a check to why.
    """

    def __init__(self, keys: dict[str, Ed25519PublicKey], rejected: dict[str, str] | None = None) -> None:
        self.keys = keys
        self.rejected = rejected or {}

    @property
    def key_ids(self) -> list[str]:
        return list(self.keys)

    def pinned(self, pin: str | Iterable[str]) -> TrustedKeys:
        """Only the pinned keys; JwksError(code="pin_mismatch") when none of them is here."""
        wanted = {pin} if isinstance(pin, str) else set(pin)
        keys = {kid: key for kid, key in self.keys.items() if kid in wanted}
        if not keys:
            raise JwksError(
                f"none of the pinned keys ({', '.join(sorted(wanted))}) is in the JWKS, which has "
                f"{', '.join(self.keys) or 'no usable key'}",
                "pin_mismatch",
            )
        return TrustedKeys(keys, self.rejected)


def load_jwks(jwks: Any, pin: str | Iterable[str] | None = None) -> TrustedKeys:
    """The usable keys of a JWKS (a dict, its JSON text, or TrustedKeys): OKP / Ed25519 keys
    whose kid is their thumbprint. Keys that fail a check are left out, so a proof naming
    them cannot verify. With `pin`, only pinned key ids are kept."""
    if isinstance(jwks, TrustedKeys):
        return jwks.pinned(pin) if pin is not None else jwks
    if isinstance(jwks, (str, bytes)):
        try:
            jwks = json.loads(jwks)
        except ValueError as e:
            raise JwksError(f"the JWKS is not JSON: {e}") from e
    if not isinstance(jwks, Mapping) or not isinstance(jwks.get("keys"), list):
        raise JwksError("a JWKS is an object with a keys array")
    keys: dict[str, Ed25519PublicKey] = {}
    rejected: dict[str, str] = {}
    for jwk in jwks["keys"]:
        problem = _jwk_problem(jwk)
        kid = jwk.get("kid") if isinstance(jwk, Mapping) else None
        if problem is not None:
            if isinstance(kid, str):
                rejected[kid] = problem
            continue
        if kid not in keys:
            keys[kid] = Ed25519PublicKey.from_public_bytes(_decode_url_b64(jwk["x"]) or b"")
    trusted = TrustedKeys(keys, rejected)
    return trusted.pinned(pin) if pin is not None else trusted


# --- verification -------------------------------------------------------------------------


@dataclass
class Reason:
    code: str
    message: str


@dataclass
class VerifyResult:
    """`valid` is True only when every check passed: act on nothing else. `bound` says
    whether the action was checked; `warning` is set when valid but not bound."""

    valid: bool = False
    bound: bool = False
    key_id: str | None = None
    reasons: list[Reason] = field(default_factory=list)
    warning: str | None = None
    statement: dict[str, Any] | None = None
    request_id: str | None = None
    decision: str | None = None
    action_digest: str | None = None
    valid_until: str | None = None

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def __bool__(self) -> bool:
        return self.valid


_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|\+00:00)")


def _parse_utc(value: Any) -> datetime | None:
    """A UTC RFC 3339 time, or None."""
    m = _TIME.fullmatch(value) if isinstance(value, str) else None
    if not m:
        return None
    try:
        whole = datetime(*(int(g) for g in m.groups()[:6]), tzinfo=timezone.utc)
    except ValueError:
        return None
    # Digits past microseconds cannot change a comparison with valid_until at millisecond
    # precision; they are dropped, not rounded.
    frac = m.group(7)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    return whole.replace(microsecond=micro)


def _as_time(now: Any) -> datetime:
    if now is None:
        return datetime.now(timezone.utc)
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise TypeError("now must be timezone-aware")
        return now
    if isinstance(now, (int, float)):
        return datetime.fromtimestamp(now, timezone.utc)
    parsed = _parse_utc(now)
    if parsed is None:
        raise TypeError(f"now is not a UTC RFC 3339 time: {now!r}")
    return parsed


def _envelope_of(proof: Any) -> Any:
    """The envelope in a proof given as an envelope, JSON text, or a body with `proof`."""
    if isinstance(proof, (str, bytes)):
        try:
            proof = json.loads(proof)
        except ValueError:
            return None
    if isinstance(proof, Mapping) and "payloadType" not in proof and isinstance(proof.get("proof"), Mapping):
        return proof["proof"]
    return proof


def _statement_problem(st: Any) -> str | None:
    if not isinstance(st, dict):
        return "the statement is not a JSON object"
    if st.get("type") != STATEMENT_TYPE:
        return f"type is {st.get('type')!r}, not {STATEMENT_TYPE}"
    for f in ("request_id", "decision", "authorization_type", "action_digest", "nonce"):
        if not isinstance(st.get(f), str):
            return f"{f} is not a string"
    if st["decision"] not in ("approved", "rejected"):
        return f"decision is {st['decision']!r}"
    try:
        _check_action(st.get("action"))
    except TypeError as e:
        return str(e)
    for f in ("requested_at", "decided_at", "valid_until"):
        if _parse_utc(st.get(f)) is None:
            return f"{f} is not a UTC RFC 3339 time"
    if not isinstance(st.get("approvers"), list):
        return "approvers is not an array"
    return None


def verify_proof(
    proof: Any,
    jwks: Any,
    action: Mapping[str, Any] | None = None,
    *,
    now: datetime | float | str | None = None,
    expected_key_id: str | None = None,
    pin: str | Iterable[str] | None = None,
) -> VerifyResult:
    """Verifies a proof offline against trusted keys.

    Never raises for a bad proof: the result says ``valid=False`` with `reasons` (each a
    `Reason(code, message)`). Raises only for bad arguments (an action that is not
    ``{"description": str, "details": {str: str}}``, unusable keys, a pin none of whose
    keys is in the JWKS).

    `proof` is the DSSE envelope, its JSON text, or a body holding it as ``proof`` (a
    request as the API returns it). `jwks` is a JWKS dict (or text) or TrustedKeys.
    `action` is the action about to run: without it the result is ``bound=False`` with a
    warning. `now` is when to check expiry (default now).
    """
    keys = load_jwks(jwks, pin)
    digest = None
    if action is not None:
        digest = compute_action_digest(action.get("description"), action.get("details") or {})
    at = _as_time(now)

    result = VerifyResult(bound=digest is not None)

    def fail(code: str, message: str) -> VerifyResult:
        result.reasons.append(Reason(code, message))
        return result

    envelope = _envelope_of(proof)
    if not isinstance(envelope, Mapping):
        return fail("malformed_envelope", "the proof is not a JSON object")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        return fail("wrong_payload_type", f"payloadType is {envelope.get('payloadType')!r}, not {PAYLOAD_TYPE}")
    body = _decode_std_b64(envelope.get("payload"))
    if body is None:
        return fail("malformed_envelope", "payload is not standard padded base64")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        return fail("malformed_envelope", "the envelope has no signatures")

    message = pae(PAYLOAD_TYPE, body)
    unknown: list[str] = []
    bad: list[str] = []
    for s in signatures:
        kid = s.get("keyid") if isinstance(s, Mapping) and isinstance(s.get("keyid"), str) else None
        if expected_key_id is not None and kid != expected_key_id:
            unknown.append(f"{kid} is not the expected key {expected_key_id}")
            continue
        key = keys.keys.get(kid) if kid is not None else None
        if key is None:
            why = keys.rejected.get(kid) if kid is not None else None
            unknown.append(f"{kid} is in the JWKS but unusable: {why}" if why else f"{kid} is not a trusted key")
            continue
        sig = _decode_std_b64(s.get("sig"))
        try:
            if sig is None or len(sig) != 64:
                raise InvalidSignature
            key.verify(sig, message)
        except InvalidSignature:
            bad.append(f"the signature by {kid} does not verify")
            continue
        result.key_id = kid
        break
    if result.key_id is None:
        if bad:
            return fail("bad_signature", "; ".join(bad + unknown))
        return fail("unknown_key", "; ".join(unknown))

    try:
        st = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return fail("malformed_statement", f"the payload is not JSON: {e}")
    problem = _statement_problem(st)
    if problem:
        return fail("malformed_statement", problem)
    result.statement = st
    result.request_id = st["request_id"]
    result.decision = st["decision"]
    result.action_digest = st["action_digest"]
    result.valid_until = st["valid_until"]

    recomputed = compute_action_digest(st["action"]["description"], st["action"]["details"])
    if recomputed != st["action_digest"]:
        return fail("digest_mismatch", f"action_digest {st['action_digest']} is not the digest of its action ({recomputed})")
    if st["decision"] != "approved":
        fail("not_approved", f"the decision is {st['decision']}, not approved")
    until = _parse_utc(st["valid_until"])
    if not (until is not None and at < until):
        fail("expired", f"the approval was valid until {st['valid_until']}")
    if digest is not None and digest != st["action_digest"]:
        fail("action_mismatch", f"the proof is for another action ({st['action_digest']}), not this one ({digest})")
    result.valid = not result.reasons
    if result.valid and digest is None:
        result.warning = UNBOUND_WARNING
    return result


# --- talking to a server ------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could hand the keys' source, or the executor token, to another host.
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def jwks_url(server_url: str) -> str:
    """The JWKS URL of a server (its base URL, or the JWKS URL itself)."""
    base = server_url.rstrip("/")
    return base if base.endswith(JWKS_PATH) else base + JWKS_PATH


def fetch_jwks(server_url: str, pin: str | Iterable[str] | None = None, timeout: float = 10.0) -> TrustedKeys:
    """GETs a server's JWKS and returns its usable keys. With `pin`, only pinned key ids
    are trusted, and a JWKS holding none of them raises JwksError(code="pin_mismatch")."""
    url = jwks_url(server_url)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with _opener.open(request, timeout=timeout) as response:
            status = response.status
            raw = response.read()
    except urllib.error.HTTPError as e:
        raise JwksError(f"GET {url} answered {e.code}", "jwks_unreachable") from e
    except (urllib.error.URLError, OSError) as e:
        raise JwksError(f"GET {url} failed: {e}", "jwks_unreachable") from e
    if status != 200:
        raise JwksError(f"GET {url} answered {status}", "jwks_unreachable")
    return load_jwks(raw, pin)


class JwksCache:
    """A server's keys, fetched once and kept for `ttl` seconds. A proof signed by a key
    the cache does not hold makes it fetch again (at most once per `min_refresh`
    seconds), so a rotation is picked up; with `pin`, only pinned keys are ever trusted.
    Safe to share between threads."""

    def __init__(
        self,
        server_url: str,
        pin: str | Iterable[str] | None = None,
        ttl: float = 300.0,
        min_refresh: float = 30.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server_url = server_url
        self.pin = [pin] if isinstance(pin, str) else (list(pin) if pin is not None else None)
        self.ttl = ttl
        self.min_refresh = min_refresh
        self.timeout = timeout
        self._clock = clock
        self._keys: TrustedKeys | None = None
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()

    def get(self, force: bool = False) -> TrustedKeys:
        """The trusted keys, fetched if missing, stale, or `force`d."""
        with self._lock:
            fresh = self._clock() - self._fetched_at < self.ttl
            if self._keys is not None and fresh and not force:
                return self._keys
            self._keys = fetch_jwks(self.server_url, self.pin, self.timeout)
            self._fetched_at = self._clock()
            return self._keys

    def verify_proof(self, proof: Any, action: Mapping[str, Any] | None = None, **options: Any) -> VerifyResult:
        """`verify_proof` with this server's keys."""
        result = verify_proof(proof, self.get(), action, **options)
        if "unknown_key" in result.codes and self._clock() - self._fetched_at >= self.min_refresh:
            result = verify_proof(proof, self.get(force=True), action, **options)
        return result


@dataclass
class RedeemResult:
    """`redeemed` is True only when the server consumed the approval for this action: act
    on nothing else. When refused, `code` is the server's (already_used, action_mismatch,
    not_approved, approval_expired, invalid_proof, not_found, ...)."""

    redeemed: bool
    status: int
    code: str | None = None
    message: str | None = None
    body: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.redeemed


def redeem_proof(
    server_url: str,
    token: str,
    proof: Any,
    action: Mapping[str, Any],
    timeout: float = 10.0,
) -> RedeemResult:
    """Redeems a proof for exactly `action` with an executor token: the server checks it
    and consumes the approval, once. Raises only when the server cannot be reached."""
    details = action.get("details") or {}
    _check_action({"description": action.get("description"), "details": details})
    url = server_url.rstrip("/") + REDEEM_PATH
    data = json.dumps(
        {"proof": _envelope_of(proof), "action_description": action["description"], "action_details": details}
    ).encode("utf-8")
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        },
    )
    try:
        with _opener.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if status == 200 and isinstance(body, dict) and body.get("redeemed") is True:
        return RedeemResult(True, 200, body=body)
    error = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
    return RedeemResult(
        False,
        status,
        code=error.get("code") or "unexpected_answer",
        message=error.get("message") or raw[:500].decode("utf-8", "replace"),
        body=body if isinstance(body, dict) else {},
    )


# --- LoopPause compatibility ----------------------------------------------------------

LOOPPAUSE_KEY_PATH = "/.well-known/looppause-signing-key.json"
LOOPPAUSE_FAILED_WARNING = "Proof verification FAILED. Do NOT execute the action."
_LP_AUTHORIZATION = {"human": "human", "policy": "policy", "grant": "grant", "fallback": "system_fallback"}


def _jwks_of_spki(public_key: str) -> dict[str, Any]:
    """A JWKS holding the Ed25519 key given as base64 SPKI DER (LoopPause's pinned form)."""
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    try:
        key = load_der_public_key(base64.b64decode(public_key, validate=True))
    except (ValueError, binascii.Error, TypeError) as e:
        raise JwksError(f"public_key is not a base64 SPKI DER key: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise JwksError("public_key is not an Ed25519 key")
    x = base64.urlsafe_b64encode(key.public_bytes_raw()).rstrip(b"=").decode()
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": x}
    jwk["kid"] = jwk_thumbprint(jwk)
    return {"keys": [jwk]}


def _lp_mismatches(result: Mapping[str, Any], envelope: Mapping[str, Any], st: Mapping[str, Any]) -> list[str]:
    """The fields a check_approval result shows that differ from its signed statement."""
    bad: list[str] = []
    missing = object()

    def check(name: str, shown: Any, signed: Any) -> None:
        if shown is not missing and shown != signed:
            bad.append(name)

    check("pause_id", result.get("pause_id", missing), st.get("request_id"))
    check("action_digest", result.get("action_digest", missing), st.get("action_digest"))
    check("status", result.get("status", missing), "responded")
    r = result.get("response", missing)
    if r is missing:
        return bad
    if not isinstance(r, Mapping):
        return bad + ["response"]
    sigs = envelope.get("signatures") or [{}]
    sig = sigs[0] if isinstance(sigs[0], Mapping) else {}
    check("response.decision", r.get("decision", missing), st.get("decision"))
    check("response.comment", r.get("comment", missing), st.get("comment"))
    check("response.fields", r.get("fields", missing), st.get("fields"))
    check(
        "response.authorization_type",
        r.get("authorization_type", missing),
        _LP_AUTHORIZATION.get(st.get("authorization_type"), st.get("authorization_type")),
    )
    check("response.nonce", r.get("nonce", missing), st.get("nonce"))
    check("response.signing_key_id", r.get("signing_key_id", missing), sig.get("keyid"))
    if "signature" in r:
        raw = _decode_std_b64(sig.get("sig", ""))
        expected = "ed25519=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode() if raw else None
        if r["signature"] != expected:
            bad.append("response.signature")
    for shown_name, signed_name in (("responded_at", "decided_at"), ("valid_until", "valid_until")):
        if shown_name in r and _parse_utc(r[shown_name]) != _parse_utc(st.get(signed_name)):
            bad.append(f"response.{shown_name}")
    return bad


def verify_looppause_proof(
    proof: Any,
    *,
    public_key: str | None = None,
    jwks: Any = None,
    server_url: str | None = None,
    action: Mapping[str, Any] | None = None,
    now: datetime | float | str | None = None,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """LoopPause's verifier (verifyLoopPauseProof) for countersign's LoopPause profile.

    Takes the whole check_approval result (or its ``proof``), verifies the DSSE/Ed25519
    proof inside with countersign's rules, and checks that every decision field the
    result shows is the signed one, so an edited result is never valid. Returns
    LoopPause's answer ``{"valid", "key_id", "verified_at", "warning"}`` with
    countersign's ``reasons``, ``bound`` and ``statement`` beside it.

    Keys: `public_key` (base64 SPKI DER, pinned), or `jwks`, or fetched from
    `server_url` (default: the LOOPPAUSE_API_URL environment variable).
    """
    import os

    at = _as_time(now)
    whole = proof
    if isinstance(whole, (str, bytes)):
        try:
            whole = json.loads(whole)
        except ValueError:
            whole = None
    if public_key is not None:
        jwks = _jwks_of_spki(public_key)
    if jwks is None:
        url = server_url or os.environ.get("LOOPPAUSE_API_URL")
        if not url:
            raise TypeError("verify_looppause_proof needs public_key, jwks or server_url (or LOOPPAUSE_API_URL)")
        jwks = fetch_jwks(url, timeout=timeout)
    has_result = isinstance(whole, Mapping) and "payloadType" not in whole
    pending = has_result and not isinstance(whole.get("proof"), Mapping)
    if pending:
        r = VerifyResult()
        r.reasons.append(Reason("malformed_envelope", f"no proof here: the status is {whole.get('status')!r}, not responded"))
    else:
        r = verify_proof(whole, jwks, action, now=at)
    if has_result and not pending and r.statement:
        bad = _lp_mismatches(whole, whole["proof"], r.statement)
        if bad:
            r.reasons.append(
                Reason("result_mismatch", f"the result's {', '.join(bad)} differ from the signed proof: it was altered")
            )
            r.valid = False
    valid = r.valid and not r.reasons
    envelope = whole.get("proof") if has_result else whole
    key_id = r.key_id
    if key_id is None and isinstance(envelope, Mapping):
        sigs = envelope.get("signatures") or []
        if sigs and isinstance(sigs[0], Mapping):
            key_id = sigs[0].get("keyid")
    return {
        "valid": valid,
        "verified_at": at.isoformat().replace("+00:00", "Z"),
        "key_id": key_id,
        "warning": r.warning if valid else f"{LOOPPAUSE_FAILED_WARNING} ({'; '.join(x.message for x in r.reasons)})",
        "bound": r.bound,
        "reasons": [{"code": x.code, "message": x.message} for x in r.reasons],
        "statement": r.statement,
    }
