"""verify_proof: a real proof from countersign verifies offline
(testdata/sdk/server-proof.json), and each way a proof can be wrong fails closed with the
server's reason code."""

import base64
import copy
import json
import unittest
from datetime import datetime, timezone

from countersign_verify import UNBOUND_WARNING, JwksError, load_jwks, verify_proof

from .signer import ACTION, DURING, TESTDATA, envelope, flip, jwks_of, make_key, statement

FIXTURE = json.loads((TESTDATA / "sdk/server-proof.json").read_text(encoding="utf-8"))


class ServerProofTest(unittest.TestCase):
    def verify(self, proof=None, **kw):
        kw.setdefault("jwks", FIXTURE["jwks"])
        kw.setdefault("now", FIXTURE["verify_at"])
        return verify_proof(FIXTURE["proof"] if proof is None else proof, kw.pop("jwks"), kw.pop("action", FIXTURE["action"]), **kw)

    def test_verifies_bound_to_its_action(self):
        r = self.verify()
        self.assertEqual(r.reasons, [])
        self.assertTrue(r.valid and r.bound and r)
        self.assertIsNone(r.warning)
        self.assertEqual(r.key_id, FIXTURE["jwks"]["keys"][0]["kid"])
        self.assertEqual(r.statement["action"], FIXTURE["action"])
        self.assertEqual(r.request_id, r.statement["request_id"])
        # As the API returns a request, and as JSON text.
        self.assertTrue(self.verify({"status": "approved", "proof": FIXTURE["proof"]}).valid)
        self.assertTrue(self.verify(json.dumps(FIXTURE["proof"]), jwks=json.dumps(FIXTURE["jwks"])).valid)

    def test_refusals(self):
        other = {"description": FIXTURE["action"]["description"], "details": dict(FIXTURE["action"]["details"], amount="99999")}
        self.assertEqual(self.verify(action=other).codes, ["action_mismatch"])
        self.assertEqual(self.verify(now=FIXTURE["proof_valid_until"]).codes, ["expired"])
        self.assertEqual(self.verify(jwks=jwks_of(make_key())).codes, ["unknown_key"])
        self.assertEqual(self.verify(expected_key_id=make_key().kid).codes, ["unknown_key"])
        with self.assertRaises(JwksError) as e:
            self.verify(pin=[make_key().kid])
        self.assertEqual(e.exception.code, "pin_mismatch")
        self.assertTrue(self.verify(pin=FIXTURE["jwks"]["keys"][0]["kid"]).valid)


class SyntheticProofTest(unittest.TestCase):
    def setUp(self):
        self.key = make_key()
        self.jwks = jwks_of(self.key)

    def codes(self, env, action=ACTION, now=DURING, **kw):
        return verify_proof(env, kw.pop("jwks", self.jwks), action, now=now, **kw).codes

    def test_unbound(self):
        r = verify_proof(envelope(statement(), self.key), self.jwks, now=DURING)
        self.assertTrue(r.valid)
        self.assertFalse(r.bound)
        self.assertEqual(r.warning, UNBOUND_WARNING)

    def test_flipped_bytes(self):
        good = envelope(statement(), self.key)
        self.assertEqual(self.codes(good), [])
        n = len(base64.b64decode(good["payload"]))
        for i in (0, n // 2, n - 1):
            self.assertEqual(self.codes(dict(good, payload=flip(good["payload"], i))), ["bad_signature"], i)
        for i in (0, 31, 63):
            bad = copy.deepcopy(good)
            bad["signatures"][0]["sig"] = flip(bad["signatures"][0]["sig"], i)
            self.assertEqual(self.codes(bad), ["bad_signature"], i)

    def test_edited_statement_not_resigned(self):
        good = envelope(statement(), self.key)
        edited = {"description": ACTION["description"], "details": dict(ACTION["details"], amount="999999")}
        forged = envelope(statement(edited), make_key())
        self.assertEqual(self.codes(dict(good, payload=forged["payload"]), action=edited), ["bad_signature"])

    def test_unknown_and_lying_keys(self):
        stranger = make_key()
        self.assertEqual(self.codes(envelope(statement(), stranger)), ["unknown_key"])
        lying = {"keys": [dict(stranger.jwk, kid=self.key.kid)]}
        r = verify_proof(envelope(statement(), self.key), lying, ACTION, now=DURING)
        self.assertEqual(r.codes, ["unknown_key"])
        self.assertIn("thumbprint", r.reasons[0].message)
        self.assertEqual(self.codes(envelope(statement(), self.key), jwks={"keys": [dict(self.key.jwk, d="AAAA")]}), ["unknown_key"])
        self.assertEqual(load_jwks({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k"}, None, 5]}).key_ids, [])
        with self.assertRaises(JwksError):
            load_jwks({"nokeys": []})

    def test_several_signatures(self):
        other = make_key()
        env = envelope(statement(), self.key)
        env["signatures"].insert(0, {"keyid": other.kid, "sig": base64.b64encode(bytes(64)).decode()})
        jwks = jwks_of(other, self.key)
        r = verify_proof(env, jwks, ACTION, now=DURING)
        self.assertTrue(r.valid)
        self.assertEqual(r.key_id, self.key.kid)
        self.assertEqual(self.codes(env, jwks=jwks, expected_key_id=other.kid), ["bad_signature"])
        self.assertTrue(verify_proof(env, jwks, ACTION, now=DURING, pin=[self.key.kid]).valid)

    def test_envelope_shape(self):
        good = envelope(statement(), self.key)
        cases = [
            (dict(good, payloadType="application/json"), "wrong_payload_type"),
            (envelope(statement(), self.key, "application/json"), "wrong_payload_type"),
            (dict(good, payload=good["payload"].rstrip("=") or "x"), "malformed_envelope"),
            (dict(good, payload="-" + good["payload"][1:]), "malformed_envelope"),
            (dict(good, payload=" " + good["payload"]), "malformed_envelope"),
            (dict(good, signatures=[]), "malformed_envelope"),
            (dict(good, signatures="x"), "malformed_envelope"),
            (None, "malformed_envelope"),
            ("not json", "malformed_envelope"),
            ([good], "malformed_envelope"),
        ]
        if not good["payload"].endswith("="):
            cases[2] = (dict(good, payload=good["payload"] + "="), "malformed_envelope")
        for env, code in cases:
            self.assertEqual(self.codes(env), [code], str(env)[:80])

    def test_statement_shape(self):
        for body, code in [
            (b"not json", "malformed_statement"),
            (b"\xff\xfe", "malformed_statement"),
            ([1], "malformed_statement"),
            (statement(type="in-toto"), "malformed_statement"),
            (statement(decision="maybe"), "malformed_statement"),
            (statement(valid_until="tomorrow"), "malformed_statement"),
            (statement(valid_until="2030-01-01T00:16:00+02:00"), "malformed_statement"),
            (dict(statement(), action={"description": "x", "details": {"amount": 5}}), "malformed_statement"),
            (statement(approvers=None), "malformed_statement"),
            (statement(action_digest="sha256:" + "0" * 64), "digest_mismatch"),
        ]:
            self.assertEqual(self.codes(envelope(body, self.key), action=None), [code], str(body)[:80])
        r = verify_proof(envelope(statement(decision="rejected"), self.key), self.jwks, ACTION, now=DURING)
        self.assertEqual(r.codes, ["not_approved"])
        self.assertEqual(r.statement["decision"], "rejected")

    def test_expiry(self):
        env = envelope(statement(), self.key)
        self.assertEqual(self.codes(env, now="2030-01-01T00:15:59.999Z"), [])
        self.assertEqual(self.codes(env, now="2030-01-01T00:16:00.000Z"), ["expired"])
        self.assertEqual(self.codes(env, now=datetime(2030, 1, 2, tzinfo=timezone.utc)), ["expired"])
        self.assertEqual(self.codes(env, now=datetime(2030, 1, 1, 0, 5, tzinfo=timezone.utc).timestamp()), [])
        rejected = envelope(statement(decision="rejected"), self.key)
        other = {"description": "other", "details": {}}
        self.assertEqual(self.codes(rejected, action=other, now="2031-01-01T00:00:00Z"), ["not_approved", "expired", "action_mismatch"])


if __name__ == "__main__":
    unittest.main()
