// fetchJwks, JwksCache and redeemProof against a small HTTP server on loopback that
// answers as countersign does (the real server is the Rust test's: live.test.js).

import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";

import { JwksCache, JwksError, fetchJwks, jwksUrl, redeemProof } from "../index.js";
import { ACTION, DURING, envelope, jwksOf, makeKey, statement } from "./signer.js";

/** A server whose JWKS is `state.jwks`, counting its GETs, and recording redemptions. */
async function serve(state) {
  state.gets = 0;
  state.redeemed = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      if (req.method === "GET" && req.url === "/.well-known/jwks.json") {
        state.gets += 1;
        res.writeHead(state.status ?? 200, { "content-type": "application/json" });
        return res.end(typeof state.jwks === "string" ? state.jwks : JSON.stringify(state.jwks));
      }
      if (req.method === "POST" && req.url === "/api/v1/proofs/redeem") {
        state.redeemed.push({ auth: req.headers.authorization, body: JSON.parse(body) });
        const first = state.redeemed.length === 1;
        res.writeHead(first ? 200 : 409, { "content-type": "application/json" });
        return res.end(
          JSON.stringify(
            first
              ? { redeemed: true, request_id: "req_1", redeemed_by: "token:payments" }
              : { error: { code: "already_used", message: "redeemed by token:payments" } },
          ),
        );
      }
      res.writeHead(404).end();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  state.url = `http://127.0.0.1:${server.address().port}`;
  return server;
}

test("jwksUrl takes a base URL or the JWKS URL", () => {
  assert.equal(jwksUrl("http://h:1"), "http://h:1/.well-known/jwks.json");
  assert.equal(jwksUrl("http://h:1/"), "http://h:1/.well-known/jwks.json");
  assert.equal(jwksUrl("http://h:1/.well-known/jwks.json"), "http://h:1/.well-known/jwks.json");
});

test("fetchJwks: pinning keeps only pinned keys, and refuses a JWKS without them", async (t) => {
  const a = makeKey();
  const b = makeKey();
  const state = { jwks: jwksOf(a, b) };
  const server = await serve(state);
  t.after(() => server.close());
  assert.deepEqual((await fetchJwks(state.url)).keyIds.sort(), [a.kid, b.kid].sort());
  assert.deepEqual((await fetchJwks(state.url, { pin: [b.kid, "gone"] })).keyIds, [b.kid]);
  await assert.rejects(fetchJwks(state.url, { pin: [makeKey().kid] }), (e) => e instanceof JwksError && e.code === "pin_mismatch");
  state.status = 500;
  await assert.rejects(fetchJwks(state.url), (e) => e.code === "jwks_unreachable");
  state.status = 200;
  state.jwks = "<html>";
  await assert.rejects(fetchJwks(state.url), JwksError);
  await assert.rejects(fetchJwks("http://127.0.0.1:9", { timeoutMs: 2000 }), (e) => e.code === "jwks_unreachable");
});

test("JwksCache fetches once, and again for a key it does not know (a rotation)", async (t) => {
  const old = makeKey();
  const rotated = makeKey();
  const state = { jwks: jwksOf(old) };
  const server = await serve(state);
  t.after(() => server.close());
  const cache = new JwksCache(state.url, { minRefreshMs: 0 });
  const opts = { action: ACTION, now: DURING };
  assert.equal((await cache.verifyProof(envelope(statement(), old), opts)).valid, true);
  assert.equal((await cache.verifyProof(envelope(statement(), old), opts)).valid, true);
  assert.equal(state.gets, 1);
  state.jwks = jwksOf(old, rotated);
  const r = await cache.verifyProof(envelope(statement(), rotated), opts);
  assert.equal(r.valid, true);
  assert.equal(r.keyId, rotated.kid);
  assert.equal(state.gets, 2);

  // Pinned to the old key, the rotated key is never trusted, however often it is fetched.
  const pinned = new JwksCache(state.url, { pin: [old.kid], minRefreshMs: 0 });
  const p = await pinned.verifyProof(envelope(statement(), rotated), opts);
  assert.deepEqual(p.reasons.map((x) => x.code), ["unknown_key"]);
  assert.equal((await pinned.verifyProof(envelope(statement(), old), opts)).valid, true);

  // Within minRefreshMs an unknown key is not a reason to fetch again.
  const slow = new JwksCache(state.url, { minRefreshMs: 60_000 });
  const before = state.gets;
  await slow.verifyProof(envelope(statement(), makeKey()), opts);
  assert.equal(state.gets, before + 1);
  // Past the TTL it fetches again.
  const short = new JwksCache(state.url, { ttlMs: 0 });
  await short.get();
  await short.get();
  assert.equal(state.gets, before + 3);
});

test("redeemProof posts the envelope and the action with the token; a refusal is redeemed: false", async (t) => {
  const key = makeKey();
  const state = { jwks: jwksOf(key) };
  const server = await serve(state);
  t.after(() => server.close());
  const proof = envelope(statement(), key);
  const first = await redeemProof(state.url + "/", "secret", { proof }, ACTION);
  assert.equal(first.redeemed, true);
  assert.equal(first.request_id, "req_1");
  assert.equal(state.redeemed[0].auth, "Bearer secret");
  assert.deepEqual(state.redeemed[0].body, { proof, action_description: ACTION.description, action_details: ACTION.details });
  const second = await redeemProof(state.url, "secret", proof, ACTION);
  assert.deepEqual(second, { redeemed: false, status: 409, code: "already_used", message: "redeemed by token:payments" });
  await assert.rejects(redeemProof(state.url, "secret", proof, { description: "x", details: { n: 1 } }), TypeError);
});
