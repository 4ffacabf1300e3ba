// Against a running countersign server, when crates/countersign/tests/it/sdk_verifiers.rs
// runs this suite: it sets COUNTERSIGN_SDK_LIVE to a JSON file with the server's URL, an
// executor token, a proof of an approval (unused, for this suite alone) with its action,
// and a proof of a rejection. Without it, the test is skipped.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { JwksCache, JwksError, fetchJwks, redeemProof, verifyProof } from "../index.js";
import { makeKey } from "./signer.js";

const file = process.env.COUNTERSIGN_SDK_LIVE;
const live = file ? JSON.parse(readFileSync(file, "utf8")) : null;
const codes = (r) => r.reasons.map((x) => x.code);

test("a live server's proof: verify, pin, refuse tampering, redeem once", { skip: live ? false : "COUNTERSIGN_SDK_LIVE is not set" }, async () => {
  const { server, executor_token: token, proof, action, rejected } = live;

  // The JWKS from the server; the proof verifies against it, bound to its action.
  const keys = await fetchJwks(server);
  assert.ok(keys.keyIds.length >= 1);
  const ok = verifyProof(proof, { jwks: keys, action });
  assert.deepEqual(ok.reasons, []);
  assert.equal(ok.valid, true);
  assert.equal(ok.bound, true);
  assert.ok(keys.keyIds.includes(ok.keyId));
  const kid = ok.keyId;

  // Pinned to the key that signed it, through the cache: still valid.
  const pinned = new JwksCache(server, { pin: [kid] });
  assert.equal((await pinned.verifyProof(proof, { action })).valid, true);
  assert.equal((await pinned.verifyProof(proof, { action, expectedKeyId: kid })).keyId, kid);

  // A pin the server does not hold: refused before any proof is looked at.
  const wrong = makeKey().kid;
  await assert.rejects(fetchJwks(server, { pin: [wrong] }), (e) => e instanceof JwksError && e.code === "pin_mismatch");
  await assert.rejects(new JwksCache(server, { pin: wrong }).verifyProof(proof, { action }), (e) => e.code === "pin_mismatch");

  // Another action: the offline check and the server both refuse it, and nothing is consumed.
  const tampered = { description: action.description, details: { ...action.details, amount: "1000000" } };
  assert.deepEqual(codes(verifyProof(proof, { jwks: keys, action: tampered })), ["action_mismatch"]);
  const refused = await redeemProof(server, token, proof, tampered);
  assert.equal(refused.redeemed, false);
  assert.equal(refused.code, "action_mismatch");

  // The rejection's proof is genuine but approves nothing.
  assert.deepEqual(codes(verifyProof(rejected.proof, { jwks: keys, action: rejected.action })), ["not_approved"]);
  const notApproved = await redeemProof(server, token, rejected.proof, rejected.action);
  assert.equal(notApproved.code, "not_approved");

  // Redeemed once, for exactly the action; a second redemption is refused.
  const first = await redeemProof(server, token, proof, action);
  assert.equal(first.redeemed, true, JSON.stringify(first));
  assert.equal(first.request_id, ok.requestId);
  assert.equal(first.action_digest, ok.actionDigest);
  const second = await redeemProof(server, token, proof, action);
  assert.equal(second.redeemed, false);
  assert.equal(second.status, 409);
  assert.equal(second.code, "already_used");
});
