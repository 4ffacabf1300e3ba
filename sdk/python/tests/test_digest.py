"""The action digest against answers computed independently: the product's vectors
(testdata/action-digest.json, a copy of shared/vectors/action-digest.json) and more in
testdata/sdk/jcs-vectors.json."""

import json
import unittest

from countersign_verify import canonical_json, compute_action_digest, jwk_thumbprint, pae

from .signer import TESTDATA


class DigestTest(unittest.TestCase):
    def test_known_answers(self):
        for name in ("action-digest.json", "sdk/jcs-vectors.json"):
            vectors = json.loads((TESTDATA / name).read_text(encoding="utf-8"))["vectors"]
            self.assertTrue(vectors)
            for v in vectors:
                a = v["action"]
                with self.subTest(name=name, description=a["description"]):
                    canonical = canonical_json({"description": a["description"], "details": a["details"]})
                    self.assertEqual(canonical.decode("utf-8"), v["canonical_json"])
                    self.assertEqual(compute_action_digest(a["description"], a["details"]), v["action_digest"])

    def test_general_values(self):
        values = json.loads((TESTDATA / "sdk/jcs-vectors.json").read_text(encoding="utf-8"))["values"]
        for v in values:
            self.assertEqual(canonical_json(v["value"]).decode("utf-8"), v["canonical_json"])

    def test_order_of_details_does_not_matter(self):
        self.assertEqual(compute_action_digest("Pay", {"b": "2", "a": "1"}), compute_action_digest("Pay", {"a": "1", "b": "2"}))
        self.assertEqual(compute_action_digest("Pay"), compute_action_digest("Pay", {}))

    def test_not_an_action(self):
        # Amounts are strings in the contract: a number would silently be another action.
        with self.assertRaises(TypeError):
            compute_action_digest("Pay", {"amount": 12})
        with self.assertRaises(TypeError):
            compute_action_digest(12, {})
        with self.assertRaises(TypeError):
            compute_action_digest("Pay", ["a"])

    def test_pae_and_thumbprint_examples(self):
        self.assertEqual(pae("http://example.com/HelloWorld", b"hello world"), b"DSSEv1 29 http://example.com/HelloWorld 11 hello world")
        rfc8037 = {"crv": "Ed25519", "kty": "OKP", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
        self.assertEqual(jwk_thumbprint(rfc8037), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k")


if __name__ == "__main__":
    unittest.main()
