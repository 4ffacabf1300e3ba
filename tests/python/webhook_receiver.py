#!/usr/bin/env python3
"""A webhook receiver that checks countersign's webhooks with an independent
implementation of the Standard Webhooks spec: the `standardwebhooks` package, the
spec's reference library. Run by crates/countersign/tests/it/webhooks.rs.

It listens on loopback and prints, one JSON object a line on stdout (flushed):

- first `{"listening": "http://127.0.0.1:PORT/"}`;
- then one record per delivery received, written when it arrives (before any
  deliberate hang), with:
  - `webhook_id`, `timestamp` (the headers as sent),
  - `type`: the payload's `type` (read from the body even when the signature fails, so
    a failed check still says which message it was),
  - `valid`: whether `standardwebhooks.Webhook(secret).verify(body, headers)` accepted it,
    and `error` (why not) when it did not,
  - `attempt`: how many times this `webhook-id` has arrived, this one included,
  - `answer`: the status it answers (`500` when told to fail, `401` for a bad signature,
    `204` when it takes the message) and `held: true` when it hangs before answering,
  - `duplicate`: whether the message was taken before (a receiver that deduplicates by
    `webhook-id` processes a message once; later copies are recorded with
    `duplicate: true` and acknowledged without being processed again),
  - `request_id`: the payload's `data.request_id`.

A message counts as taken (processed) when the receiver decides to answer 2xx, which
it records before hanging: a receiver that hangs and is then cut off has processed the
message, so a later redelivery is a duplicate. Rejected deliveries (500, 401) are not
taken.

Options:
  --secret whsec_...   the key to verify with (a wrong one makes every check fail)
  --fail-first N       answer 500 to the first N deliveries of each webhook-id
  --hang-first N       hold the first N taken deliveries of each webhook-id for
                       --hang-seconds (default 30) before answering, as a slow receiver
  --log FILE           also append the records to FILE
  --format looppause   check LoopPause's HMAC webhooks instead (`format = "looppause"`):
                       `X-LoopPause-Signature: sha256=<hex HMAC-SHA256(secret, body)>`,
                       the secret's bytes as they are, checked with Python's hmac
"""

import argparse
import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError
except ImportError as err:  # the Rust test checks for this first and says so
    print(f"standardwebhooks is not installed: {err}", file=sys.stderr)
    sys.exit(3)


class LoopPauseHmac:
    """LoopPause's legacy HMAC webhooks, written from its page: `sha256=` + hex
    HMAC-SHA256 of the raw body, keyed by LOOPPAUSE_SIGNING_SECRET."""

    def __init__(self, secret):
        self.key = secret.encode("utf-8")

    def verify(self, body, headers):
        given = headers.get("x-looppause-signature")
        if not given:
            raise KeyError("no X-LoopPause-Signature header")
        expected = "sha256=" + hmac.new(self.key, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(given, expected):
            raise ValueError(f"X-LoopPause-Signature {given} is not {expected}")


class State:
    def __init__(self, args):
        self.args = args
        self.webhook = LoopPauseHmac(args.secret) if args.format == "looppause" else Webhook(args.secret)
        self.lock = threading.Lock()
        self.attempts = {}  # webhook-id -> deliveries received
        self.taken = set()  # webhook-ids processed once
        self.log = open(args.log, "a", encoding="utf-8") if args.log else None

    def emit(self, record):
        line = json.dumps(record, sort_keys=True)
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            if self.log:
                self.log.write(line + "\n")
                self.log.flush()


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):  # keep stdout for records
            pass

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            record = {
                "webhook_id": headers.get("webhook-id"),
                "timestamp": headers.get("webhook-timestamp"),
                "path": self.path,
            }
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            record["type"] = payload.get("type") if isinstance(payload, dict) else None
            data = payload.get("data") if isinstance(payload, dict) else None
            record["request_id"] = data.get("request_id") if isinstance(data, dict) else None
            try:
                state.webhook.verify(body, headers)
                record["valid"] = True
            except (WebhookVerificationError, ValueError, KeyError) as err:
                record["valid"] = False
                record["error"] = f"{type(err).__name__}: {err}"

            msg_id = record["webhook_id"]
            hold = False
            with state.lock:
                attempt = state.attempts.get(msg_id, 0) + 1
                state.attempts[msg_id] = attempt
                record["attempt"] = attempt
                record["duplicate"] = False
                if not record["valid"]:
                    answer = 401
                elif attempt <= state.args.fail_first:
                    answer = 500
                else:
                    answer = 204
                    record["duplicate"] = msg_id in state.taken
                    state.taken.add(msg_id)
                    hold = attempt - state.args.fail_first <= state.args.hang_first
            record["answer"] = answer
            if hold:
                record["held"] = True
            state.emit(record)
            if hold:
                time.sleep(state.args.hang_seconds)
            try:
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()
            except OSError:
                pass  # the sender went away while we held it (killed)

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secret", required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--hang-first", type=int, default=0)
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--format", choices=["standard", "looppause"], default="standard")
    args = parser.parse_args()
    state = State(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    server.daemon_threads = True
    port = server.server_address[1]
    state.emit({"listening": f"http://127.0.0.1:{port}/"})
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
