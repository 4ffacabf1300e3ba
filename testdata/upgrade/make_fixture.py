"""Makes the upgrade fixture: a data directory written by a given countersign binary,
holding every kind of stored document (accounts, sessions, invitations, the setup claim,
rooms, members, answered questions, deliveries pending and done, the outbox cursor,
Slack messages and a handled Slack click, emails sent and an email decision token), and
the events of all of it.

    python3 make_fixture.py COUNTERSIGN_BINARY OUTDIR

OUTDIR gets the data directory (`data/`) and `fixture.json` (the secrets and ids a test
needs: tokens, a password, a session, an email link token, request ids, the time).
Slack is a stand-in on loopback that answers like Slack's Web API; email goes to the SMTP
sink of tests/python. The webhook points at a closed port, so its deliveries wait for a
retry. Run with the Python of target/pyvenv (aiosmtpd).
"""

import hashlib
import hmac
import http.server
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SINK = os.path.join(HERE, "..", "..", "tests", "python", "smtp_sink.py")
SIGNING_SECRET = "fixture-signing-secret"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeSlack(http.server.BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        method = self.path.rsplit("/", 1)[-1]
        FakeSlack.posts += 1
        answer = {"ok": True}
        if method == "chat.postMessage":
            answer.update({"channel": "C0FIXTURE", "ts": f"1764590400.{FakeSlack.posts:06d}"})
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def call(base, method, path, token=None, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if body is not None:
        request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, dict(response.headers), json.loads(response.read() or b"null")


def main():
    try:
        make()
    finally:
        for child in CHILDREN:
            child.kill()


CHILDREN = []


def make():
    binary, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    shutil.rmtree(out, ignore_errors=True)
    data = os.path.join(out, "data")
    mail = os.path.join(out, "mail")
    os.makedirs(mail)
    port, slack_port, smtp_port = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    slack = http.server.ThreadingHTTPServer(("127.0.0.1", slack_port), FakeSlack)
    threading.Thread(target=slack.serve_forever, daemon=True).start()
    sink = subprocess.Popen(
        [sys.executable, SINK, str(smtp_port), mail],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    CHILDREN.append(sink)
    assert sink.stdout.readline().strip() == "READY"
    config = os.path.join(out, "countersign.toml")
    with open(config, "w") as f:
        f.write(f"""listen = "127.0.0.1:{port}"
public_url = "{base}"

[log]
origin = "countersign/upgrade-fixture"

[[webhooks]]
name = "audit"
url = "http://127.0.0.1:9/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

[slack]
bot_token = "xoxb-fixture"
signing_secret = "{SIGNING_SECRET}"
api_base_url = "http://127.0.0.1:{slack_port}/api"

[slack.approvers]
U0ALICE = "alice"

[email]
smtp_url = "smtp://127.0.0.1:{smtp_port}"
from = "countersign <approvals@example.com>"
token_decisions = true

[email.approvers]
"alice@example.com" = "alice"
""")

    def cli(*args):
        return subprocess.run(
            [binary, "--data-dir", data, "--config", config, *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    tokens = {
        name: cli("token", "create", "--role", role, "--name", name)
        for name, role in [("root", "admin"), ("deploy-bot", "agent"), ("bob", "approver")]
    }
    invite = cli("user", "add", "--username", "alice", "--role", "approver", "--display-name", "Alice")
    invite_token = re.search(r"token=([A-Za-z0-9_-]+)", invite).group(1)
    open_invite = cli("user", "add", "--username", "carol", "--role", "admin")  # left open
    open_invite = re.search(r"token=([A-Za-z0-9_-]+)", open_invite).group(1)

    server = subprocess.Popen(
        [binary, "--data-dir", data, "--config", config, "serve"], stderr=subprocess.PIPE, text=True
    )
    CHILDREN.append(server)
    setup_token = None
    for line in server.stderr:
        m = re.search(r"/setup\?token=([A-Za-z0-9_-]+)", line)
        if m:
            setup_token = m.group(1)
            break
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    assert setup_token, "serve printed no setup link"
    password = "correct horse battery staple"
    origin = {"origin": base}
    call(base, "POST", "/ui/accept", body={"token": setup_token, "username": "admin", "password": password}, headers=origin)
    _, headers, _ = call(base, "POST", "/ui/accept", body={"token": invite_token, "password": password}, headers=origin)
    session = re.search(r"cs_session=([^;]+)", headers["set-cookie"]).group(1)

    agent, bob = tokens["deploy-bot"], tokens["bob"]

    def tool(name, arguments):
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        request = urllib.request.Request(base + "/mcp", data=json.dumps(body).encode(), method="POST")
        for k, v in {
            "authorization": f"Bearer {agent}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-11-25",
        }.items():
            request.add_header(k, v)
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        data_line = next(l for l in text.splitlines() if l.startswith("data: "))
        result = json.loads(data_line[6:])["result"]
        assert not result.get("isError"), result
        return result["structuredContent"]

    # A room with members, presence, an answered question, an open one, a resolved
    # blocker, and an approval shown in it.
    call(base, "POST", "/api/v1/rooms", bob, {"name": "release-train", "title": "Release train"})
    tool("join_room", {"room": "release-train"})
    tool("set_presence", {"room": "release-train", "status": "working", "note": "canary at 5%"})
    call(base, "POST", "/api/v1/rooms/release-train/messages", agent, {"text": "Canary is green."})
    q = call(base, "POST", "/api/v1/rooms/release-train/messages", agent, {"text": "Promote to 100%?", "type": "question"})[2]["id"]
    call(base, "POST", f"/api/v1/rooms/release-train/questions/{q}/answer", bob, {"text": "Yes, go."})
    call(base, "POST", "/api/v1/rooms/release-train/messages", agent, {"text": "Also bump the CDN TTL?", "type": "question"})
    blocker = tool("report_blocker", {"room": "release-train", "description": "The deploy key expired."})["blocker_id"]
    call(base, "POST", f"/api/v1/rooms/release-train/blockers/{blocker}/resolve", bob, {"reply": "Renewed it."})
    call(base, "POST", "/api/v1/rooms", bob, {"name": "month-end"})
    call(base, "POST", "/api/v1/rooms/month-end/delete", bob, {})
    ask = lambda **kw: call(base, "POST", "/api/v1/requests", agent, {"action_description": "Fixture", "timeout_hours": 168, **kw})[2]["request_id"]
    in_room = ask(action_description="Deploy 2.14 to production", room="release-train")
    call(base, "POST", f"/api/v1/requests/{in_room}/decision", bob, {"decision": "approved", "comment": "ship it"})
    call(base, "POST", f"/api/v1/requests/{in_room}/actions", agent, {"tool": "deploy"})
    call(base, "POST", f"/api/v1/requests/{in_room}/outcome", agent, {"status": "succeeded"})
    clicked = ask(action_description="Deploy 2.14 (approved by a Slack click)", recipient_slack="C0FIXTURE")
    slack_pending = ask(action_description="Rotate the database password", recipient_slack="C0FIXTURE")
    emailed = ask(action_description="Refund order 1042", recipient_email="alice@example.com")
    time.sleep(4)

    # Approve the first request by a signed click, as Slack sends it.
    payload = {
        "type": "block_actions",
        "trigger_id": "fixture-trigger",
        "user": {"id": "U0ALICE"},
        "actions": [{"action_id": "countersign_approve", "value": clicked, "action_ts": "1.0"}],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()))
    sig = "v0=" + hmac.new(SIGNING_SECRET.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(base + "/slack/interactivity", data=body, method="POST")
    request.add_header("content-type", "application/x-www-form-urlencoded")
    request.add_header("x-slack-request-timestamp", ts)
    request.add_header("x-slack-signature", sig)
    urllib.request.urlopen(request, timeout=30).read()
    time.sleep(4)

    link = None
    for name in sorted(os.listdir(mail)):
        with open(os.path.join(mail, name)) as f:
            m = re.search(r"#t=([A-Za-z0-9_-]+)", json.load(f)["text"])
            link = link or (m and m.group(1))
    assert link, "no email decision link was sent"

    server.terminate()
    server.wait(timeout=30)
    sink.kill()
    slack.shutdown()
    shutil.rmtree(mail)
    # One file, as a copied data directory would be: the write-ahead log folded in.
    db = sqlite3.connect(os.path.join(data, "countersign.db"))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    shutil.move(config, os.path.join(data, "countersign.toml"))
    with open(os.path.join(out, "fixture.json"), "w") as f:
        json.dump({
            "made_by": subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip(),
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tokens": tokens,
            "password": password,
            "session": session,
            "open_invite": open_invite,
            "email_link_token": link,
            "requests": {"in_room": in_room, "clicked": clicked, "slack_pending": slack_pending, "emailed": emailed},
        }, f, indent=1)
    print("fixture in", out)


if __name__ == "__main__":
    main()
