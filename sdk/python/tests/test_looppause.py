"""verify_looppause_proof: the whole check_approval result of countersign's LoopPause
profile verifies with the pinned SPKI key or a JWKS; an edited result, a rejection, a
pending result and a foreign key never do."""

import base64
import copy
import unittest

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from countersign_verify import LOOPPAUSE_FAILED_WARNING, JwksError, verify_looppause_proof

from .signer import ACTION, DURING, envelope, jwks_of, make_key, statement


def result_of(st, key):
    """A check_approval result as the profile shapes it (mcp/looppause.rs)."""
    proof = envelope(st, key)
    raw = base64.b64decode(proof["signatures"][0]["sig"])
    return {
        "pause_id": st["request_id"],
        "agent_id": st["requested_by"]["id"],
        "status": "responded",
        "created_at": st["requested_at"],
        "action_digest": st["action_digest"],
        "response": {
            "decision": st["decision"],
            "comment": st["comment"],
            "fields": st["fields"],
            "responder": ",".join(a["id"] for a in st["approvers"]),
            "responded_at": st["decided_at"],
            "channel": "api",
            "authorization_type": st["authorization_type"],
            "valid_until": st["valid_until"],
            "nonce": st["nonce"],
            "signing_key_id": key.kid,
            "signature_alg": "Ed25519",
            "signature": "ed25519=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
        },
        "proof": proof,
    }


def spki(key):
    der = key.private.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode()


class LoopPauseTest(unittest.TestCase):
    def test_the_whole_result_verifies_with_the_pinned_key(self):
        key = make_key()
        result = result_of(statement(comment="PO number: PO-2341"), key)
        r = verify_looppause_proof(result, public_key=spki(key), now=DURING)
        self.assertTrue(r["valid"], r["reasons"])
        self.assertEqual(r["key_id"], key.kid)
        self.assertTrue(r["verified_at"].startswith("2030-01-01T00:05:00"))
        self.assertTrue(r["warning"])  # not bound to an action
        bound = verify_looppause_proof(result, jwks=jwks_of(key), action=ACTION, now=DURING)
        self.assertTrue(bound["valid"])
        self.assertIsNone(bound["warning"])
        self.assertTrue(verify_looppause_proof(result["proof"], jwks=jwks_of(key), now=DURING)["valid"])

    def test_edited_rejected_pending_and_foreign_are_not_valid(self):
        key = make_key()
        result = result_of(statement(), key)
        for path, value in [
            (("response", "comment"), "PO number: PO-9999"),
            (("response", "fields"), {"po_number": "PO-1"}),
            (("response", "signature"), "ed25519=AAAA"),
            (("pause_id",), "req_other"),
        ]:
            edited = copy.deepcopy(result)
            target = edited
            for k in path[:-1]:
                target = target[k]
            target[path[-1]] = value
            r = verify_looppause_proof(edited, jwks=jwks_of(key), now=DURING)
            self.assertFalse(r["valid"], path)
            self.assertTrue(r["warning"].startswith(LOOPPAUSE_FAILED_WARNING))
        rejected = result_of(statement(decision="rejected"), key)
        self.assertFalse(verify_looppause_proof(rejected, jwks=jwks_of(key), now=DURING)["valid"])
        flipped = copy.deepcopy(rejected)
        flipped["response"]["decision"] = "approved"
        self.assertFalse(verify_looppause_proof(flipped, jwks=jwks_of(key), now=DURING)["valid"])
        self.assertFalse(verify_looppause_proof({"status": "pending"}, jwks=jwks_of(key), now=DURING)["valid"])
        foreign = verify_looppause_proof(result, public_key=spki(make_key()), now=DURING)
        self.assertFalse(foreign["valid"])
        self.assertTrue(foreign["warning"])
        with self.assertRaises(JwksError):
            verify_looppause_proof(result, public_key="bm90IGEga2V5", now=DURING)


if __name__ == "__main__":
    unittest.main()
