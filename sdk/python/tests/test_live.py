"""Against a running countersign server, when crates/countersign/tests/it/sdk_verifiers.rs
runs this suite: it sets COUNTERSIGN_SDK_LIVE to a JSON file with the server's URL, an
executor token, a proof of an approval (unused, for this suite alone) with its action, and
a proof of a rejection. Without it, the test is skipped."""

import json
import os
import unittest

from countersign_verify import JwksCache, JwksError, fetch_jwks, redeem_proof, verify_proof

from .signer import make_key

LIVE_FILE = os.environ.get("COUNTERSIGN_SDK_LIVE")


@unittest.skipUnless(LIVE_FILE, "COUNTERSIGN_SDK_LIVE is not set")
class LiveServerTest(unittest.TestCase):
    def test_verify_pin_refuse_tampering_redeem_once(self):
        with open(LIVE_FILE, encoding="utf-8") as f:
            live = json.load(f)
        server, token, proof, action, rejected = (
            live["server"], live["executor_token"], live["proof"], live["action"], live["rejected"],
        )

        # The JWKS from the server; the proof verifies against it, bound to its action.
        keys = fetch_jwks(server)
        self.assertGreaterEqual(len(keys.key_ids), 1)
        ok = verify_proof(proof, keys, action)
        self.assertEqual(ok.reasons, [])
        self.assertTrue(ok.valid and ok.bound)
        self.assertIn(ok.key_id, keys.key_ids)
        kid = ok.key_id

        # Pinned to the key that signed it, through the cache: still valid.
        pinned = JwksCache(server, pin=[kid])
        self.assertTrue(pinned.verify_proof(proof, action).valid)
        self.assertEqual(pinned.verify_proof(proof, action, expected_key_id=kid).key_id, kid)

        # A pin the server does not hold: refused before any proof is looked at.
        wrong = make_key().kid
        with self.assertRaises(JwksError) as e:
            fetch_jwks(server, pin=[wrong])
        self.assertEqual(e.exception.code, "pin_mismatch")
        with self.assertRaises(JwksError):
            JwksCache(server, pin=wrong).verify_proof(proof, action)

        # Another action: the offline check and the server both refuse it, nothing consumed.
        tampered = {"description": action["description"], "details": dict(action["details"], amount="1000000")}
        self.assertEqual(verify_proof(proof, keys, tampered).codes, ["action_mismatch"])
        refused = redeem_proof(server, token, proof, tampered)
        self.assertFalse(refused.redeemed)
        self.assertEqual(refused.code, "action_mismatch")

        # The rejection's proof is genuine but approves nothing.
        self.assertEqual(verify_proof(rejected["proof"], keys, rejected["action"]).codes, ["not_approved"])
        self.assertEqual(redeem_proof(server, token, rejected["proof"], rejected["action"]).code, "not_approved")

        # Redeemed once, for exactly the action; a second redemption is refused.
        first = redeem_proof(server, token, proof, action)
        self.assertTrue(first.redeemed, first)
        self.assertEqual(first.body["request_id"], ok.request_id)
        self.assertEqual(first.body["action_digest"], ok.action_digest)
        second = redeem_proof(server, token, proof, action)
        self.assertFalse(second.redeemed)
        self.assertEqual((second.status, second.code), (409, "already_used"))


if __name__ == "__main__":
    unittest.main()
