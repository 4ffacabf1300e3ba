#!/usr/bin/env python3
"""An independent verifier for countersign proofs.

It shares no code with countersign: it uses only Python's standard library (urllib,
base64, hashlib, json, datetime), `cryptography` for Ed25519 and `rfc8785` for JSON
canonicalization, following the public contracts in the project's product brief:

- proof: a DSSE v1 envelope {"payloadType", "payload", "signatures": [{"keyid", "sig"}]}
  signed with Ed25519 over PAE(payloadType, payload);
- keys: a JWKS at /.well-known/jwks.json with OKP/Ed25519 keys whose kid is the RFC 7638
  thumbprint;
- action digest: "sha256:" + hex(SHA-256(RFC 8785 JSON of {"description", "details"})).

Use it as a library (`verify(...)`, `action_digest(...)`, `self_check()`,
`negative_checks(...)`) or from the command line:

    python verify_proof.py --self-test
    python verify_proof.py --jwks-url http://127.0.0.1:8787/.well-known/jwks.json \
        --description "Delete staging database" --details '{}' proof.json
"""

from __future__ import annotations

import argparse
import base64
import binascii
import copy
import hashlib
import json
import re
import sys
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.countersign.decision+json"
STATEMENT_TYPE = "countersign.decision/v1"
STATEMENT_FIELDS = (
    "type",
    "request_id",
    "decision",
    "authorization_type",
    "action",
    "action_digest",
    "requested_by",
    "approvers",
    "comment",
    "fields",
    "requested_at",
    "decided_at",
    "valid_until",
    "nonce",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
KNOWN_ANSWERS = REPO_ROOT / "testdata" / "action-digest.json"


class VerificationError(Exception):
    """The proof is not valid; the message says why."""


# --- encodings ------------------------------------------------------------------------


def b64_std_decode(text: str, what: str) -> bytes:
    """RFC 4648 standard base64 with padding, strictly (no URL alphabet, no junk)."""
    if not isinstance(text, str):
        raise VerificationError(f"{what} is not a string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise VerificationError(f"{what} is not standard padded base64: {e}") from e


def b64url_nopad_decode(text: str, what: str) -> bytes:
    """RFC 7515 base64url without padding (JWK members)."""
    if not isinstance(text, str) or "=" in text:
        raise VerificationError(f"{what} is not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise VerificationError(f"{what} is not base64url: {e}") from e


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP len(type) SP type SP len(body) SP body,
    lengths as ASCII decimal byte counts."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def action_digest(description: str, details: dict[str, str]) -> str:
    """sha256 over the RFC 8785 canonical JSON of {"description", "details"}."""
    canonical = rfc8785.dumps({"description": description, "details": details})
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def jwk_thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638 thumbprint of an OKP key (RFC 8037 section 2: members crv, kty, x), as
    unpadded base64url of the SHA-256 of the lexicographically ordered JSON without
    whitespace."""
    for member in ("crv", "kty", "x"):
        if not isinstance(jwk.get(member), str):
            raise VerificationError(f"JWK is missing the string member {member!r}: {jwk}")
    required = json.dumps(
        {"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]},
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    ).encode("utf-8")
    return base64.urlsafe_b64encode(hashlib.sha256(required).digest()).rstrip(b"=").decode("ascii")


def parse_utc(value: Any, what: str) -> datetime:
    """A UTC RFC 3339 timestamp ("...Z" or "+00:00")."""
    if not isinstance(value, str) or not (value.endswith("Z") or value.endswith("+00:00")):
        raise VerificationError(f"{what} is not a UTC RFC 3339 time: {value!r}")
    if "T" not in value:
        raise VerificationError(f"{what} has no 'T' between date and time: {value!r}")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise VerificationError(f"{what} is not RFC 3339: {value!r} ({e})") from e
    if parsed.utcoffset() != timezone.utc.utcoffset(None):
        raise VerificationError(f"{what} is not UTC: {value!r}")
    return parsed


# --- keys -----------------------------------------------------------------------------


def fetch_jwks(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET the JWKS; it must be public (no Authorization header is sent)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if response.status != 200:
            raise VerificationError(f"GET {url} answered {response.status}")
        content_type = response.headers.get("Content-Type", "")
        if "json" not in content_type:
            raise VerificationError(f"GET {url} answered Content-Type {content_type!r}, not JSON")
        return json.loads(response.read())


def load_keys(jwks: dict[str, Any]) -> dict[str, Ed25519PublicKey]:
    """Checks every published key and returns them by kid."""
    keys = jwks.get("keys")
    if not isinstance(keys, list) or not keys:
        raise VerificationError(f"the JWKS has no keys: {jwks}")
    out: dict[str, Ed25519PublicKey] = {}
    for jwk in keys:
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise VerificationError(f"a published key is not OKP/Ed25519: {jwk}")
        if "d" in jwk:
            raise VerificationError("the JWKS publishes a private key member 'd'")
        if "alg" in jwk and jwk["alg"] not in ("EdDSA", "Ed25519"):
            raise VerificationError(f"unexpected alg {jwk['alg']!r}")
        if "use" in jwk and jwk["use"] != "sig":
            raise VerificationError(f"unexpected use {jwk['use']!r}")
        raw = b64url_nopad_decode(jwk["x"], "JWK x")
        if len(raw) != 32:
            raise VerificationError(f"an Ed25519 public key is 32 bytes, this one {len(raw)}")
        expected_kid = jwk_thumbprint(jwk)
        if jwk.get("kid") != expected_kid:
            raise VerificationError(
                f"kid {jwk.get('kid')!r} is not the RFC 7638 thumbprint {expected_kid!r}"
            )
        if expected_kid in out:
            raise VerificationError(f"kid {expected_kid} is published twice")
        out[expected_kid] = Ed25519PublicKey.from_public_bytes(raw)
    return out


# --- verification ---------------------------------------------------------------------


def verify(
    envelope: dict[str, Any],
    jwks: dict[str, Any],
    expected_action: dict[str, Any] | None = None,
    expected_request_id: str | None = None,
    expected_decision: str = "approved",
    now: datetime | None = None,
    required_approvals: int | None = None,
) -> dict[str, Any]:
    """Verifies a proof and returns its statement; raises VerificationError otherwise.

    `expected_action` is {"description": str, "details": {str: str}}: the action about to
    be performed, which the proof must be for exactly. `required_approvals`: the
    approval must name at least this many approvers, each with the account it counted
    as, no account twice (a quorum).
    """
    keys = load_keys(jwks)
    if not isinstance(envelope, dict):
        raise VerificationError("the proof is not a JSON object")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise VerificationError(f"payloadType is {envelope.get('payloadType')!r}, not {PAYLOAD_TYPE!r}")
    body = b64_std_decode(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise VerificationError("the envelope has no signatures")

    message = pae(PAYLOAD_TYPE, body)
    problems = []
    verified_by = None
    for sig in signatures:
        kid = sig.get("keyid") if isinstance(sig, dict) else None
        key = keys.get(kid)
        if key is None:
            problems.append(f"keyid {kid!r} is not in the JWKS")
            continue
        raw = b64_std_decode(sig.get("sig"), "sig")
        if len(raw) != 64:
            problems.append(f"signature by {kid} is {len(raw)} bytes, not 64")
            continue
        try:
            key.verify(raw, message)
        except InvalidSignature:
            problems.append(f"the signature by {kid} does not verify")
            continue
        verified_by = kid
        break
    if verified_by is None:
        raise VerificationError("no valid signature: " + "; ".join(problems))

    try:
        statement = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VerificationError(f"the payload is not JSON: {e}") from e
    if not isinstance(statement, dict):
        raise VerificationError("the statement is not a JSON object")
    missing = [f for f in STATEMENT_FIELDS if f not in statement]
    if missing:
        raise VerificationError(f"the statement lacks {missing}")
    if statement["type"] != STATEMENT_TYPE:
        raise VerificationError(f"statement type is {statement['type']!r}, not {STATEMENT_TYPE!r}")
    if statement["decision"] not in ("approved", "rejected"):
        raise VerificationError(f"decision is {statement['decision']!r}")
    if statement["decision"] != expected_decision:
        raise VerificationError(f"decision is {statement['decision']!r}, expected {expected_decision!r}")
    if statement["authorization_type"] not in ("human", "policy", "fallback", "grant"):
        raise VerificationError(f"authorization_type is {statement['authorization_type']!r}")
    if expected_request_id is not None and statement["request_id"] != expected_request_id:
        raise VerificationError(
            f"request_id is {statement['request_id']!r}, expected {expected_request_id!r}"
        )

    action = statement["action"]
    if not (
        isinstance(action, dict)
        and set(action) == {"description", "details"}
        and isinstance(action["description"], str)
        and isinstance(action["details"], dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in action["details"].items())
    ):
        raise VerificationError(f"the statement's action is not {{description, details: {{str: str}}}}: {action!r}")
    recomputed = action_digest(action["description"], action["details"])
    if statement["action_digest"] != recomputed:
        raise VerificationError(
            f"action_digest {statement['action_digest']!r} is not the digest of the signed action {recomputed!r}"
        )
    if expected_action is not None:
        expected = action_digest(expected_action["description"], expected_action.get("details", {}))
        if expected != recomputed:
            raise VerificationError(
                f"the proof is for another action: it binds {recomputed}, the expected action is {expected}"
            )

    approvers = statement["approvers"]
    if not isinstance(approvers, list):
        raise VerificationError("approvers is not a list")
    if statement["authorization_type"] == "human":
        if not approvers:
            raise VerificationError("the statement names no approver")
        if "policy" in statement:
            raise VerificationError("a human decision names a policy")
    elif statement["authorization_type"] == "grant":
        # A standing grant a person gave earlier (docs/policies.md#standing-grants): no
        # approver of its own; the grant and its maker.
        if approvers:
            raise VerificationError(f"a grant decision names approvers {approvers!r}")
        grant = statement.get("grant")
        maker = grant.get("granted_by") if isinstance(grant, dict) else None
        if not (
            isinstance(grant, dict)
            and isinstance(grant.get("id"), str)
            and grant["id"]
            and isinstance(maker, dict)
            and all(isinstance(maker.get(m), str) and maker[m] for m in ("id", "display_name", "channel", "auth_method"))
        ):
            raise VerificationError(f"a grant decision names no grant and maker: {grant!r}")
        if "policy" in statement:
            raise VerificationError("a grant decision names a policy")
    else:
        # A rule decided (docs/policies.md): no person, and the policy behind it.
        if approvers:
            raise VerificationError(f"a {statement['authorization_type']} decision names approvers {approvers!r}")
        policy = statement.get("policy")
        if not (
            isinstance(policy, dict)
            and set(policy) == {"id", "policy_set"}
            and isinstance(policy["id"], str)
            and policy["id"]
            and isinstance(policy["policy_set"], str)
            and re.fullmatch(r"sha256:[0-9a-f]{64}", policy["policy_set"])
        ):
            raise VerificationError(f"a {statement['authorization_type']} decision names no policy: {policy!r}")
    for approver in approvers:
        for member in ("id", "display_name", "channel", "auth_method"):
            if not isinstance(approver, dict) or not isinstance(approver.get(member), str) or not approver[member]:
                raise VerificationError(f"approver {approver!r} lacks {member}")
    if required_approvals is not None and statement["decision"] == "approved":
        accounts = [a.get("account") for a in approvers]
        if any(not isinstance(a, str) or not a for a in accounts):
            raise VerificationError(f"a quorum's approvers must each name their account: {approvers!r}")
        if len(set(accounts)) != len(accounts):
            raise VerificationError(f"an account is counted twice among the approvers: {accounts!r}")
        if len(accounts) < required_approvals:
            raise VerificationError(
                f"the approval names {len(accounts)} approvers, {required_approvals} are required"
            )
    if not isinstance(statement["fields"], dict):
        raise VerificationError("fields is not an object")
    if not isinstance(statement["nonce"], str) or len(statement["nonce"]) < 16:
        raise VerificationError(f"nonce {statement['nonce']!r} is too short to be single use")

    requested_at = parse_utc(statement["requested_at"], "requested_at")
    decided_at = parse_utc(statement["decided_at"], "decided_at")
    valid_until = parse_utc(statement["valid_until"], "valid_until")
    if not requested_at <= decided_at <= valid_until:
        raise VerificationError("requested_at <= decided_at <= valid_until does not hold")
    now = now or datetime.now(timezone.utc)
    if valid_until <= now:
        raise VerificationError(f"the proof expired at {statement['valid_until']}")
    return statement


# --- self-checks ----------------------------------------------------------------------


def self_check() -> int:
    """The action digest against the project's known answers; returns how many were checked."""
    vectors = json.loads(KNOWN_ANSWERS.read_text(encoding="utf-8"))["vectors"]
    assert vectors, f"no vectors in {KNOWN_ANSWERS}"
    for v in vectors:
        action = v["action"]
        canonical = rfc8785.dumps({"description": action["description"], "details": action["details"]})
        assert canonical.decode("utf-8") == v["canonical_json"], (
            f"canonical JSON differs for {action['description']!r}:\n"
            f"  got      {canonical!r}\n  expected {v['canonical_json']!r}"
        )
        got = action_digest(action["description"], action["details"])
        assert got == v["action_digest"], f"digest of {action['description']!r} is {got}, expected {v['action_digest']}"
    # The PAE of the DSSE specification's own example.
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    # RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
    rfc8037_key = {"crv": "Ed25519", "kty": "OKP", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
    assert jwk_thumbprint(rfc8037_key) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    return len(vectors)


def _expect_failure(what: str, fn, needle: str) -> None:
    try:
        fn()
    except VerificationError as e:
        assert needle in str(e), f"{what}: failed, but for another reason: {e}"
        return
    raise AssertionError(f"{what}: the tampered proof verified")


def _flip_b64_byte(text: str, index: int) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[index % len(raw)] ^= 0x01
    return base64.b64encode(bytes(raw)).decode("ascii")


def negative_checks(envelope: dict[str, Any], jwks: dict[str, Any], action: dict[str, Any]) -> list[str]:
    """Tampered variants of a valid proof must all fail; returns what was checked."""
    checked = []
    raw_len = len(base64.b64decode(envelope["payload"]))
    for index in (0, raw_len // 2, raw_len - 1):
        tampered = copy.deepcopy(envelope)
        tampered["payload"] = _flip_b64_byte(tampered["payload"], index)
        _expect_failure(f"payload byte {index} flipped", lambda: verify(tampered, jwks, action), "does not verify")
        checked.append(f"payload byte {index} flipped")
    for index in (0, 31, 63):
        tampered = copy.deepcopy(envelope)
        tampered["signatures"][0]["sig"] = _flip_b64_byte(tampered["signatures"][0]["sig"], index)
        _expect_failure(f"signature byte {index} flipped", lambda: verify(tampered, jwks, action), "does not verify")
        checked.append(f"signature byte {index} flipped")

    # A forged statement that claims approval of another action, signed by no key we know.
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["action"]["details"] = dict(statement["action"]["details"], amount="999999")
    statement["action_digest"] = action_digest(statement["action"]["description"], statement["action"]["details"])
    forged = copy.deepcopy(envelope)
    forged["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    _expect_failure("edited statement, not re-signed", lambda: verify(forged, jwks, action), "does not verify")
    checked.append("edited statement with a recomputed digest")

    other = {"description": action["description"], "details": dict(action.get("details", {}), extra="1")}
    _expect_failure("different action", lambda: verify(envelope, jwks, other), "another action")
    other = {"description": action["description"] + ".", "details": action.get("details", {})}
    _expect_failure("different description", lambda: verify(envelope, jwks, other), "another action")
    checked.append("a different action does not match")

    wrong_type = dict(copy.deepcopy(envelope), payloadType="application/json")
    _expect_failure("payloadType changed", lambda: verify(wrong_type, jwks, action), "payloadType")
    checked.append("another payloadType")

    unknown = copy.deepcopy(envelope)
    unknown["signatures"][0]["keyid"] = "not-a-published-kid"
    _expect_failure("unknown keyid", lambda: verify(unknown, jwks, action), "not in the JWKS")
    checked.append("an unknown keyid")

    bad_kid = copy.deepcopy(jwks)
    kid = bad_kid["keys"][0]["kid"]
    # Change the first character to another one (a kid may itself start with "A").
    bad_kid["keys"][0]["kid"] = ("B" if kid[0] == "A" else "A") + kid[1:]
    _expect_failure("JWKS kid not a thumbprint", lambda: verify(envelope, bad_kid, action), "thumbprint")
    checked.append("a JWKS whose kid is not the thumbprint")

    later = parse_utc(statement["valid_until"], "valid_until").replace(microsecond=0)
    _expect_failure("after valid_until", lambda: verify(envelope, jwks, action, now=later + timedelta(seconds=1)), "expired")
    checked.append("use after valid_until")

    _expect_failure(
        "expecting a rejection",
        lambda: verify(envelope, jwks, action, expected_decision="rejected"),
        "decision",
    )
    checked.append("the decision must be the expected one")
    return checked


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true", help="check the known answers and exit")
    parser.add_argument("--jwks-url", help="e.g. http://127.0.0.1:8787/.well-known/jwks.json")
    parser.add_argument("--description", help="the action's description the proof must be for")
    parser.add_argument("--details", default="{}", help="the action's details as a JSON object")
    parser.add_argument("proof", nargs="?", help="a file with the DSSE envelope (- for stdin)")
    args = parser.parse_args(argv)
    if args.self_test:
        n = self_check()
        print(f"self-test ok: {n} action-digest vectors, PAE, RFC 8037 thumbprint")
        return 0
    if not args.jwks_url or not args.proof:
        parser.error("give --jwks-url and a proof file (or --self-test)")
    text = sys.stdin.read() if args.proof == "-" else Path(args.proof).read_text(encoding="utf-8")
    envelope = json.loads(text)
    if "proof" in envelope and "payloadType" not in envelope:
        envelope = envelope["proof"]
    expected = None
    if args.description is not None:
        expected = {"description": args.description, "details": json.loads(args.details)}
    try:
        statement = verify(envelope, fetch_jwks(args.jwks_url), expected)
    except VerificationError as e:
        print(f"INVALID: {e}", file=sys.stderr)
        return 1
    print(json.dumps(statement, indent=2, ensure_ascii=False))
    print("VALID", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
