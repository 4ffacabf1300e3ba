// The action digest and RFC 8785 canonical JSON against answers computed independently
// with Python's rfc8785 package: the product's vectors (testdata/action-digest.json, a
// copy of shared/vectors/action-digest.json) and more in testdata/sdk/jcs-vectors.json.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { canonicalJson, computeActionDigest, jwkThumbprint, pae } from "../index.js";

const testdata = new URL("../../../testdata/", import.meta.url);
const read = (name) => JSON.parse(readFileSync(new URL(name, testdata), "utf8"));

for (const file of ["action-digest.json", "sdk/jcs-vectors.json"]) {
  test(`action digests of ${file}`, () => {
    const { vectors } = read(file);
    assert.ok(vectors.length > 0);
    for (const v of vectors) {
      const { description, details } = v.action;
      assert.equal(canonicalJson({ description, details }), v.canonical_json, description);
      assert.equal(computeActionDigest(description, details), v.action_digest, description);
    }
  });
}

test("canonical JSON of general values, numbers among them", () => {
  const { values } = read("sdk/jcs-vectors.json");
  assert.ok(values.length > 0);
  for (const v of values) assert.equal(canonicalJson(v.value), v.canonical_json);
});

test("the digest ignores the order details were written in", () => {
  assert.equal(
    computeActionDigest("Pay", { b: "2", a: "1" }),
    computeActionDigest("Pay", { a: "1", b: "2" }),
  );
  assert.notEqual(computeActionDigest("Pay", { a: "1" }), computeActionDigest("Pay ", { a: "1" }));
});

test("what has no canonical form, or is not an action, is refused", () => {
  assert.throws(() => canonicalJson(Number.NaN), TypeError);
  assert.throws(() => canonicalJson(Infinity), TypeError);
  assert.throws(() => canonicalJson("\ud800"), TypeError);
  assert.throws(() => canonicalJson({ "\udc00x": 1 }), TypeError);
  assert.throws(() => canonicalJson(undefined), TypeError);
  assert.throws(() => canonicalJson(new Date()), TypeError);
  // Amounts are strings in the contract: a number would silently be another action.
  assert.throws(() => computeActionDigest("Pay", { amount: 12 }), TypeError);
  assert.throws(() => computeActionDigest(12, {}), TypeError);
  assert.throws(() => computeActionDigest("Pay", ["a"]), TypeError);
  assert.equal(canonicalJson("\ud83d\ude00"), '"\ud83d\ude00"');
});

test("PAE and the JWK thumbprint match their specifications' examples", () => {
  // DSSE's own example.
  assert.equal(
    pae("http://example.com/HelloWorld", Buffer.from("hello world")).toString(),
    "DSSEv1 29 http://example.com/HelloWorld 11 hello world",
  );
  // RFC 8037 appendix A.3.
  assert.equal(
    jwkThumbprint({ crv: "Ed25519", kty: "OKP", x: "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" }),
    "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k",
  );
});
