// verifyProof: a real proof from countersign verifies offline (testdata/sdk/server-proof.json),
// and each way a proof can be wrong fails closed with the server's reason code.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { JwksError, UNBOUND_WARNING, loadJwks, verifyProof } from "../index.js";
import { ACTION, DURING, envelope, jwksOf, makeKey, statement } from "./signer.js";

const fixture = JSON.parse(readFileSync(new URL("../../../testdata/sdk/server-proof.json", import.meta.url), "utf8"));

const codes = (r) => r.reasons.map((x) => x.code);

test("a proof signed by a countersign server verifies, bound to its action", () => {
  const r = verifyProof(fixture.proof, { jwks: fixture.jwks, action: fixture.action, now: fixture.verify_at });
  assert.deepEqual(r.reasons, []);
  assert.equal(r.valid, true);
  assert.equal(r.bound, true);
  assert.equal(r.warning, null);
  assert.equal(r.keyId, fixture.jwks.keys[0].kid);
  assert.equal(r.requestId, r.statement.request_id);
  assert.equal(r.statement.decision, "approved");
  assert.deepEqual(r.statement.action, fixture.action);
  // As the API returns a request (the envelope as its `proof`), and as JSON text.
  const view = { request_id: r.requestId, status: "approved", proof: fixture.proof };
  assert.equal(verifyProof(view, { jwks: fixture.jwks, action: fixture.action, now: fixture.verify_at }).valid, true);
  assert.equal(verifyProof(JSON.stringify(fixture.proof), { jwks: JSON.stringify(fixture.jwks), action: fixture.action, now: fixture.verify_at }).valid, true);
});

test("the real proof: another action, a later time, another key all fail", () => {
  const base = { jwks: fixture.jwks, now: fixture.verify_at };
  const other = { ...fixture.action, details: { ...fixture.action.details, amount: "99999" } };
  assert.deepEqual(codes(verifyProof(fixture.proof, { ...base, action: other })), ["action_mismatch"]);
  assert.deepEqual(codes(verifyProof(fixture.proof, { ...base, action: fixture.action, now: fixture.proof_valid_until })), ["expired"]);
  assert.deepEqual(codes(verifyProof(fixture.proof, { ...base, jwks: jwksOf(makeKey()) })), ["unknown_key"]);
  assert.deepEqual(codes(verifyProof(fixture.proof, { ...base, expectedKeyId: makeKey().kid })), ["unknown_key"]);
  assert.throws(() => verifyProof(fixture.proof, { ...base, pin: [makeKey().kid] }), (e) => e instanceof JwksError && e.code === "pin_mismatch");
  assert.equal(verifyProof(fixture.proof, { ...base, pin: fixture.jwks.keys[0].kid }).valid, true);
});

test("without the action: valid for the signature and state only, and says so", () => {
  const key = makeKey();
  const r = verifyProof(envelope(statement(), key), { jwks: jwksOf(key), now: DURING });
  assert.equal(r.valid, true);
  assert.equal(r.bound, false);
  assert.equal(r.warning, UNBOUND_WARNING);
});

test("each flipped byte of payload or signature is a bad signature", () => {
  const key = makeKey();
  const good = envelope(statement(), key);
  const opts = { jwks: jwksOf(key), action: ACTION, now: DURING };
  assert.equal(verifyProof(good, opts).valid, true);
  const flip = (b64, i) => {
    const raw = Buffer.from(b64, "base64");
    raw[i % raw.length] ^= 1;
    return raw.toString("base64");
  };
  const payloadLength = Buffer.from(good.payload, "base64").length;
  for (const i of [0, payloadLength >> 1, payloadLength - 1]) {
    const r = verifyProof({ ...good, payload: flip(good.payload, i) }, opts);
    assert.deepEqual(codes(r), ["bad_signature"], `payload byte ${i}`);
    assert.equal(r.statement, null);
  }
  for (const i of [0, 31, 63]) {
    const r = verifyProof({ ...good, signatures: [{ ...good.signatures[0], sig: flip(good.signatures[0].sig, i) }] }, opts);
    assert.deepEqual(codes(r), ["bad_signature"], `signature byte ${i}`);
  }
});

test("an edited statement with a recomputed digest, not re-signed, fails", () => {
  const key = makeKey();
  const good = envelope(statement(), key);
  const edited = { ...ACTION, details: { ...ACTION.details, amount: "999999" } };
  const forged = envelope(statement({}, edited), makeKey());
  const r = verifyProof({ ...good, payload: forged.payload }, { jwks: jwksOf(key), action: edited, now: DURING });
  assert.deepEqual(codes(r), ["bad_signature"]);
});

test("a signature by a key outside the JWKS, or a JWKS that lies about a kid, is unknown_key", () => {
  const key = makeKey();
  const stranger = makeKey();
  const opts = { action: ACTION, now: DURING };
  assert.deepEqual(codes(verifyProof(envelope(statement(), stranger), { ...opts, jwks: jwksOf(key) })), ["unknown_key"]);
  // The stranger's key published under the real key's kid: the thumbprint gives it away.
  const lying = { keys: [{ ...stranger.jwk, kid: key.kid }] };
  const r = verifyProof(envelope(statement(), key), { ...opts, jwks: lying });
  assert.deepEqual(codes(r), ["unknown_key"]);
  assert.match(r.reasons[0].message, /thumbprint/);
  // Private keys, other curves and malformed keys are never used.
  const priv = { keys: [{ ...key.jwk, d: "AAAA" }] };
  assert.deepEqual(codes(verifyProof(envelope(statement(), key), { ...opts, jwks: priv })), ["unknown_key"]);
  assert.deepEqual(loadJwks({ keys: [{ kty: "EC", crv: "P-256", x: "a", y: "b", kid: "k" }, null, 5] }).keyIds, []);
  assert.throws(() => loadJwks({ nokeys: [] }), JwksError);
  assert.throws(() => verifyProof(envelope(statement(), key), { action: ACTION }), TypeError);
});

test("one good signature among several is enough; expectedKeyId narrows it", () => {
  const a = makeKey();
  const b = makeKey();
  const env = envelope(statement(), b);
  env.signatures.unshift({ keyid: a.kid, sig: Buffer.alloc(64).toString("base64") });
  const opts = { jwks: jwksOf(a, b), action: ACTION, now: DURING };
  const r = verifyProof(env, opts);
  assert.equal(r.valid, true);
  assert.equal(r.keyId, b.kid);
  assert.deepEqual(codes(verifyProof(env, { ...opts, expectedKeyId: a.kid })), ["bad_signature"]);
  assert.equal(verifyProof(env, { ...opts, pin: [b.kid] }).valid, true);
});

test("the envelope must be exactly DSSE with standard padded base64", () => {
  const key = makeKey();
  const good = envelope(statement(), key);
  const opts = { jwks: jwksOf(key), action: ACTION, now: DURING };
  const check = (env, code) => assert.deepEqual(codes(verifyProof(env, opts)), [code], JSON.stringify(env).slice(0, 80));
  check({ ...good, payloadType: "application/json" }, "wrong_payload_type");
  check(envelope(statement(), key, "application/json"), "wrong_payload_type");
  const unpadded = good.payload.replace(/=+$/, "");
  check({ ...good, payload: unpadded === good.payload ? good.payload + "=" : unpadded }, "malformed_envelope");
  check({ ...good, payload: "-" + good.payload.slice(1) }, "malformed_envelope");
  // A last character with non-zero padding bits decodes to the same bytes: still refused.
  const p = good.payload.replace(/=+$/, "");
  const last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".indexOf(p.at(-1));
  const twin = p.slice(0, -1) + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[last | 1] + good.payload.slice(p.length);
  if (good.payload.endsWith("=") && twin !== good.payload) check({ ...good, payload: twin }, "malformed_envelope");
  check({ ...good, payload: " " + good.payload }, "malformed_envelope");
  check({ ...good, signatures: [] }, "malformed_envelope");
  check({ ...good, signatures: "x" }, "malformed_envelope");
  check({ ...good, signatures: [{ keyid: key.kid, sig: good.signatures[0].sig.slice(0, -4) }] }, "bad_signature");
  check(null, "malformed_envelope");
  check("not json", "malformed_envelope");
  check([good], "malformed_envelope");
});

test("the statement must be a countersign decision with a true digest", () => {
  const key = makeKey();
  const opts = { jwks: jwksOf(key), now: DURING };
  const check = (body, code) => assert.deepEqual(codes(verifyProof(envelope(body, key), opts)), [code]);
  check(Buffer.from("not json"), "malformed_statement");
  check(Buffer.from([0xff, 0xfe]), "malformed_statement");
  check([1], "malformed_statement");
  check(statement({ type: "in-toto" }), "malformed_statement");
  check(statement({ decision: "maybe" }), "malformed_statement");
  check(statement({ valid_until: "tomorrow" }), "malformed_statement");
  check(statement({ valid_until: "2030-01-01T00:16:00+02:00" }), "malformed_statement");
  check(statement({ action: { description: "x", details: { amount: 5 } } }), "malformed_statement");
  check(statement({ approvers: null }), "malformed_statement");
  check(statement({ action_digest: "sha256:" + "0".repeat(64) }), "digest_mismatch");
  const rejected = verifyProof(envelope(statement({ decision: "rejected" }), key), { ...opts, action: ACTION });
  assert.deepEqual(codes(rejected), ["not_approved"]);
  assert.equal(rejected.statement.decision, "rejected");
});

test("expiry: valid until valid_until, not at it; all reasons are given", () => {
  const key = makeKey();
  const env = envelope(statement(), key);
  const opts = { jwks: jwksOf(key), action: ACTION };
  assert.equal(verifyProof(env, { ...opts, now: "2030-01-01T00:15:59.999Z" }).valid, true);
  assert.deepEqual(codes(verifyProof(env, { ...opts, now: "2030-01-01T00:16:00.000Z" })), ["expired"]);
  assert.deepEqual(codes(verifyProof(env, { ...opts, now: new Date("2030-01-02T00:00:00Z") })), ["expired"]);
  assert.deepEqual(codes(verifyProof(env, { ...opts, now: Date.UTC(2030, 0, 1, 0, 5) })), []);
  const rejected = envelope(statement({ decision: "rejected" }), key);
  const other = { description: "other", details: {} };
  assert.deepEqual(codes(verifyProof(rejected, { ...opts, action: other, now: "2031-01-01T00:00:00Z" })), ["not_approved", "expired", "action_mismatch"]);
});
