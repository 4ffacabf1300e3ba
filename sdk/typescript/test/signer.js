// Test keys and proofs signed here, shaped as countersign signs them, so every failure
// of verifyProof can be produced on purpose.

import { generateKeyPairSync, randomBytes, sign } from "node:crypto";

import { PAYLOAD_TYPE, STATEMENT_TYPE, computeActionDigest, jwkThumbprint, pae } from "../index.js";

export function makeKey() {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const { x } = publicKey.export({ format: "jwk" });
  const jwk = { kty: "OKP", crv: "Ed25519", x, alg: "EdDSA", use: "sig" };
  jwk.kid = jwkThumbprint(jwk);
  return { privateKey, jwk, kid: jwk.kid };
}

export const ACTION = {
  description: "Transfer GBP 12,450 to Globex Corp for invoice INV-2341",
  details: { vendor: "Globex Corp", amount: "12450", currency: "GBP", invoice_ref: "INV-2341" },
};

export function statement(overrides = {}, action = ACTION) {
  return {
    type: STATEMENT_TYPE,
    request_id: "req_0123456789abcdef0123456789abcdef",
    decision: "approved",
    authorization_type: "human",
    action,
    action_digest: computeActionDigest(action.description, action.details),
    requested_by: { id: "token:bot", display_name: "bot", auth_method: "bearer_token" },
    approvers: [{ id: "token:alice", display_name: "alice", channel: "api", auth_method: "bearer_token" }],
    comment: null,
    fields: {},
    requested_at: "2030-01-01T00:00:00.000Z",
    decided_at: "2030-01-01T00:01:00.000Z",
    valid_until: "2030-01-01T00:16:00.000Z",
    nonce: randomBytes(16).toString("base64url"),
    ...overrides,
  };
}

/** A DSSE envelope over `body` (an object, serialized, or raw bytes) signed by `key`. */
export function envelope(body, key, payloadType = PAYLOAD_TYPE) {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body));
  const sig = sign(null, pae(payloadType, bytes), key.privateKey);
  return {
    payloadType,
    payload: bytes.toString("base64"),
    signatures: [{ keyid: key.kid, sig: sig.toString("base64") }],
  };
}

export const jwksOf = (...keys) => ({ keys: keys.map((k) => k.jwk) });

/** A time inside the test statements' validity. */
export const DURING = "2030-01-01T00:05:00Z";
