// verifyLoopPauseProof: the whole check_approval result of countersign's LoopPause
// profile verifies with the pinned SPKI key or a JWKS; an edited result, a rejection, a
// pending result and a foreign key never do.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createPublicKey } from "node:crypto";

import { LOOPPAUSE_FAILED_WARNING, verifyLoopPauseProof } from "../index.js";
import { ACTION, DURING, envelope, jwksOf, makeKey, statement } from "./signer.js";

/** A check_approval result as the profile shapes it (crates/countersign-server/src/mcp/looppause.rs). */
function resultOf(st, key) {
  const proof = envelope(st, key);
  return {
    pause_id: st.request_id,
    agent_id: st.requested_by.id,
    status: "responded",
    created_at: st.requested_at,
    expires_at: "2030-01-02T00:00:00.000Z",
    action_digest: st.action_digest,
    response: {
      decision: st.decision,
      comment: st.comment,
      fields: st.fields,
      responder: st.approvers.map((a) => a.id).join(","),
      responded_at: st.decided_at,
      channel: "api",
      authorization_type: st.authorization_type === "fallback" ? "system_fallback" : st.authorization_type,
      valid_until: st.valid_until,
      nonce: st.nonce,
      signing_key_id: key.kid,
      signature_alg: "Ed25519",
      signature: `ed25519=${Buffer.from(proof.signatures[0].sig, "base64").toString("base64url")}`,
    },
    proof,
    message: "responded: approved.",
  };
}

const spki = (key) => createPublicKey({ key: key.jwk, format: "jwk" }).export({ format: "der", type: "spki" }).toString("base64");

test("the seed's call: the whole result, with the pinned SPKI key", async () => {
  const key = makeKey();
  const result = resultOf(statement({ comment: "PO number: PO-2341" }), key);
  const r = await verifyLoopPauseProof(result, { publicKey: spki(key), now: DURING });
  assert.equal(r.valid, true, JSON.stringify(r.reasons));
  assert.equal(r.key_id, key.kid);
  assert.match(r.verified_at, /^2030-01-01T00:05:00/);
  assert.ok(r.warning, "not bound to an action: a warning");
  const bound = await verifyLoopPauseProof(result, { jwks: jwksOf(key), action: ACTION, now: DURING });
  assert.equal(bound.valid, true);
  assert.equal(bound.warning, null);
  assert.equal((await verifyLoopPauseProof(result.proof, { jwks: jwksOf(key), now: DURING })).valid, true);
});

test("an edited result, a rejection, a pending result and a foreign key are not valid", async () => {
  const key = makeKey();
  const opts = { jwks: jwksOf(key), now: DURING };
  const result = resultOf(statement(), key);
  for (const edit of [
    (r) => (r.response.comment = "PO number: PO-9999"),
    (r) => (r.response.fields = { po_number: "PO-1" }),
    (r) => (r.response.signature = "ed25519=AAAA"),
    (r) => (r.pause_id = "req_other"),
  ]) {
    const edited = structuredClone(result);
    edit(edited);
    const r = await verifyLoopPauseProof(edited, opts);
    assert.equal(r.valid, false);
    assert.ok(r.warning.startsWith(LOOPPAUSE_FAILED_WARNING));
  }
  const rejected = resultOf(statement({ decision: "rejected" }), key);
  assert.equal((await verifyLoopPauseProof(rejected, opts)).valid, false);
  const flipped = structuredClone(rejected);
  flipped.response.decision = "approved";
  assert.equal((await verifyLoopPauseProof(flipped, opts)).valid, false);
  assert.equal((await verifyLoopPauseProof({ status: "pending" }, opts)).valid, false);
  const other = makeKey();
  const foreign = await verifyLoopPauseProof(result, { publicKey: spki(other), now: DURING });
  assert.equal(foreign.valid, false);
  assert.ok(foreign.warning);
  await assert.rejects(() => verifyLoopPauseProof(result, { publicKey: "bm90IGEga2V5" }));
});
