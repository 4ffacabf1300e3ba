"""fetch_jwks, JwksCache and redeem_proof against a small HTTP server on loopback that
answers as countersign does (the real server is the Rust test's: test_live.py)."""

import json
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from countersign_verify import JwksCache, JwksError, fetch_jwks, jwks_url, redeem_proof

from .signer import ACTION, DURING, envelope, jwks_of, make_key, statement


class FakeServer:
    """Serves `self.jwks` (counting GETs) and records redemptions: the first succeeds."""

    def __init__(self, jwks):
        self.jwks, self.status, self.gets, self.redeemed = jwks, 200, 0, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, body):
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path != "/.well-known/jwks.json":
                    return self.answer(404, {})
                fake.gets += 1
                self.answer(fake.status, fake.jwks if not isinstance(fake.jwks, bytes) else fake.jwks)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.redeemed.append((self.headers["Authorization"], body))
                if len(fake.redeemed) == 1:
                    self.answer(200, {"redeemed": True, "request_id": "req_1"})
                else:
                    self.answer(409, {"error": {"code": "already_used", "message": "redeemed by token:payments"}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class HttpTest(unittest.TestCase):
    def serve(self, jwks):
        server = FakeServer(jwks)
        self.addCleanup(server.close)
        return server

    def test_jwks_url(self):
        self.assertEqual(jwks_url("http://h:1"), "http://h:1/.well-known/jwks.json")
        self.assertEqual(jwks_url("http://h:1/"), "http://h:1/.well-known/jwks.json")
        self.assertEqual(jwks_url("http://h:1/.well-known/jwks.json"), "http://h:1/.well-known/jwks.json")

    def test_fetch_and_pin(self):
        a, b = make_key(), make_key()
        s = self.serve(jwks_of(a, b))
        self.assertEqual(sorted(fetch_jwks(s.url).key_ids), sorted([a.kid, b.kid]))
        self.assertEqual(fetch_jwks(s.url, pin=[b.kid, "gone"]).key_ids, [b.kid])
        with self.assertRaises(JwksError) as e:
            fetch_jwks(s.url, pin=[make_key().kid])
        self.assertEqual(e.exception.code, "pin_mismatch")
        s.status = 500
        with self.assertRaises(JwksError) as e:
            fetch_jwks(s.url)
        self.assertEqual(e.exception.code, "jwks_unreachable")
        s.status, s.jwks = 200, b"<html>"
        with self.assertRaises(JwksError):
            fetch_jwks(s.url)
        with self.assertRaises(JwksError) as e:
            fetch_jwks("http://127.0.0.1:9", timeout=2)
        self.assertEqual(e.exception.code, "jwks_unreachable")

    def test_cache_fetches_once_and_again_for_an_unknown_key(self):
        old, rotated = make_key(), make_key()
        s = self.serve(jwks_of(old))
        clock = Clock()
        cache = JwksCache(s.url, min_refresh=10, clock=clock)
        self.assertTrue(cache.verify_proof(envelope(statement(), old), ACTION, now=DURING).valid)
        self.assertTrue(cache.verify_proof(envelope(statement(), old), ACTION, now=DURING).valid)
        self.assertEqual(s.gets, 1)
        s.jwks = jwks_of(old, rotated)
        # Within min_refresh an unknown key is not a reason to fetch again.
        self.assertEqual(cache.verify_proof(envelope(statement(), rotated), ACTION, now=DURING).codes, ["unknown_key"])
        self.assertEqual(s.gets, 1)
        clock.t = 11
        r = cache.verify_proof(envelope(statement(), rotated), ACTION, now=DURING)
        self.assertTrue(r.valid)
        self.assertEqual((r.key_id, s.gets), (rotated.kid, 2))
        # Past the TTL it fetches again.
        clock.t = 1000
        cache.get()
        self.assertEqual(s.gets, 3)

        # Pinned to the old key, the rotated key is never trusted, however often it is fetched.
        pinned = JwksCache(s.url, pin=old.kid, min_refresh=0)
        self.assertEqual(pinned.verify_proof(envelope(statement(), rotated), ACTION, now=DURING).codes, ["unknown_key"])
        self.assertTrue(pinned.verify_proof(envelope(statement(), old), ACTION, now=DURING).valid)

    def test_redeem(self):
        key = make_key()
        s = self.serve(jwks_of(key))
        proof = envelope(statement(), key)
        first = redeem_proof(s.url + "/", "secret", {"proof": proof}, ACTION)
        self.assertTrue(first.redeemed and first)
        self.assertEqual(first.body["request_id"], "req_1")
        auth, body = s.redeemed[0]
        self.assertEqual(auth, "Bearer secret")
        self.assertEqual(body, {"proof": proof, "action_description": ACTION["description"], "action_details": ACTION["details"]})
        second = redeem_proof(s.url, "secret", proof, ACTION)
        self.assertFalse(second)
        self.assertEqual((second.status, second.code, second.message), (409, "already_used", "redeemed by token:payments"))
        with self.assertRaises(TypeError):
            redeem_proof(s.url, "secret", proof, {"description": "x", "details": {"n": 1}})


if __name__ == "__main__":
    unittest.main()
