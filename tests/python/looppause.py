"""The LoopPause profile driven as LoopPause's own page drives it: the seed's example
calls (shared/seeds/001, "示例") with the official Python MCP client, over stdio
(`countersign mcp --profile looppause`, local and relayed with LOOPPAUSE_API_URL /
LOOPPAUSE_API_KEY) and over Streamable HTTP (`/mcp/profile/looppause`).

Each transport runs: request_approval -> pending -> an approver approves over REST ->
responded with response.decision, responder, responded_at, channel -> verify_proof of
the whole result valid (and of the proof alone, and bound to the action); a rejection
(responded, decision rejected, verify_proof not valid); an edited result (decision, a
comment, the signature) never valid, with the warning; a timeout -> timed_out; a
cancel -> expired. Then `/.well-known/looppause-signing-key.json` is checked against the
JWKS and used to verify a proof's signature independently, and the `sha256=` HMAC
webhooks of a `format = "looppause"` endpoint are checked by webhook_receiver.py.

It runs a serve of its own (its config has the seed's example recipients and the
webhook). `run_all.py` runs it; `python looppause.py` needs COUNTERSIGN_BIN.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_der_public_key
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import verify_proof
from harness import Context, Results, Server, check, child_env, create_token, http

SECRET = "lp_signing_secret_for_tests"
# The page's example; its scraped email address replaced by a real one.
EXAMPLE = {
    "action_description": "Transfer £12,450 to Globex Corp for invoice INV-2341",
    "action_details": {
        "vendor": "Globex Corp",
        "amount": "12450",
        "currency": "GBP",
        "invoice_ref": "INV-2341",
    },
    "recipient_slack": "#finance-approvals",
    "recipient_email": "finance@example.com",
    "timeout_hours": 4,
}
TOOLS = {"request_approval", "check_approval", "verify_proof"}


def body_of(result: Any, what: str) -> dict[str, Any]:
    """`JSON.parse(result.content[0].text)`, as the seed's example reads a result."""
    text = " ".join(getattr(c, "text", "") for c in result.content)
    check(not result.is_error, f"{what} failed: {text}")
    body = json.loads(result.content[0].text)
    check(isinstance(body, dict), f"{what}: not a JSON object: {text}")
    return body


async def call(client: mcp.Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return body_of(await client.call_tool(tool, args), tool)


async def poll(client: mcp.Client, pause_id: str, within: float = 10.0) -> dict[str, Any]:
    """The seed's loop: check_approval until the status is not pending."""
    deadline = time.monotonic() + within
    while True:
        body = await call(client, "check_approval", {"pause_id": pause_id})
        if body["status"] != "pending":
            return body
        check(time.monotonic() < deadline, f"{pause_id} still pending after {within}s")
        await anyio.sleep(0.2)


def decide(ctx: Context, pause_id: str, decision: str, comment: str) -> None:
    r = http(
        "POST",
        ctx.url(f"/api/v1/requests/{pause_id}/decision"),
        {"decision": decision, "comment": comment},
        token=ctx.approver_token,
    )
    check(r.status == 200, f"{decision} over REST answered {r.status}: {r.body[:300]!r}")


async def flows(client: mcp.Client, ctx: Context, label: str, agent_token: str) -> tuple[list[str], dict[str, Any]]:
    """Every flow on one connection; returns the pause_ids it made and an approved result."""
    tools = {t.name for t in (await client.list_tools()).tools}
    check(tools == TOOLS, f"{label}: the profile lists {sorted(tools)}, not {sorted(TOOLS)}")

    # A timeout first, so that it has run out by the end.
    short = await call(client, "request_approval", {**EXAMPLE, "action_description": f"{label}: short", "timeout_hours": 0.0004})
    started = time.monotonic()

    # Step 1 of the example.
    created = await call(client, "request_approval", EXAMPLE)
    pause_id = created["pause_id"]
    check(created["status"] == "pending", f"{label}: created {created}")
    check("check_approval" in created["MANDATORY_NEXT_STEP"], f"{label}: {created}")
    verify_proof.parse_utc(created["expires_at"], "expires_at")
    pending = await call(client, "check_approval", {"pause_id": pause_id})
    check(pending["status"] == "pending" and "response" not in pending, f"{label}: {pending}")

    # Step 2: a person approves; the loop sees responded.
    decide(ctx, pause_id, "approved", "PO number: PO-2341")
    proof = await poll(client, pause_id)
    check(proof["status"] == "responded", f"{label}: {proof}")
    response = proof["response"]
    check(response["decision"] == "approved", f"{label}: {response}")
    check(response["responder"].endswith(ctx.approver_name), f"{label}: responder {response['responder']}")
    check(response["channel"] == "api", f"{label}: channel {response['channel']}")
    check(response["comment"] == "PO number: PO-2341", f"{label}: comment {response['comment']}")
    check(response["authorization_type"] == "human", f"{label}: {response}")
    check(response["signature_alg"] == "Ed25519" and response["signature"].startswith("ed25519="), f"{label}: {response}")
    verify_proof.parse_utc(response["responded_at"], "responded_at")
    check(proof["pause_id"] == pause_id and proof["agent_id"], f"{label}: {proof}")

    # Step 3: verify_proof({ proof }), the whole result.
    verification = await call(client, "verify_proof", {"proof": proof})
    check(verification["valid"] is True, f"{label}: the genuine proof: {verification}")
    check(verification["key_id"] == response["signing_key_id"], f"{label}: {verification}")
    verify_proof.parse_utc(verification["verified_at"], "verified_at")
    check(verification.get("warning"), f"{label}: not bound to an action, yet no warning: {verification}")
    alone = await call(client, "verify_proof", {"proof": proof["proof"]})
    check(alone["valid"] is True, f"{label}: the proof alone: {alone}")
    bound = await call(
        client,
        "verify_proof",
        {"proof": proof, "action_description": EXAMPLE["action_description"], "action_details": EXAMPLE["action_details"]},
    )
    check(bound["valid"] is True and bound["bound"] is True and not bound.get("warning"), f"{label}: bound: {bound}")
    other = await call(
        client,
        "verify_proof",
        {"proof": proof, "action_description": EXAMPLE["action_description"], "action_details": {**EXAMPLE["action_details"], "amount": "99999"}},
    )
    check(other["valid"] is False and other["warning"], f"{label}: another action: {other}")

    # Edited results and proofs are never valid.
    for path, value in [
        (("response", "comment"), "PO number: PO-9999"),
        (("response", "signature"), "ed25519=AAAA"),
        (("pause_id",), "req_someoneelse"),
    ]:
        edited = copy.deepcopy(proof)
        target = edited
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        answer = await call(client, "verify_proof", {"proof": edited})
        check(answer["valid"] is False and "FAILED" in answer["warning"], f"{label}: edited {path}: {answer}")
    forged = copy.deepcopy(proof)
    statement = json.loads(base64.b64decode(forged["proof"]["payload"]))
    statement["action"]["details"]["amount"] = "1"
    forged["proof"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    answer = await call(client, "verify_proof", {"proof": forged})
    check(answer["valid"] is False and answer["warning"], f"{label}: a re-encoded payload: {answer}")
    nothing = await call(client, "verify_proof", {"proof": {"status": "pending"}})
    check(nothing["valid"] is False and nothing["warning"], f"{label}: a pending result: {nothing}")

    # A rejection: responded, decision rejected; its proof is not one to act on, and a
    # result edited to say approved is refused.
    rejected_id = (await call(client, "request_approval", {**EXAMPLE, "action_description": f"{label}: rejected"}))["pause_id"]
    decide(ctx, rejected_id, "rejected", "not this quarter")
    rejected = await poll(client, rejected_id)
    check(rejected["status"] == "responded" and rejected["response"]["decision"] == "rejected", f"{label}: {rejected}")
    check(rejected["response"]["comment"] == "not this quarter", f"{label}: {rejected}")
    answer = await call(client, "verify_proof", {"proof": rejected})
    check(answer["valid"] is False and answer["warning"], f"{label}: a rejection verified: {answer}")
    flipped = copy.deepcopy(rejected)
    flipped["response"]["decision"] = "approved"
    answer = await call(client, "verify_proof", {"proof": flipped})
    check(answer["valid"] is False and "FAILED" in answer["warning"], f"{label}: a rejection edited to approved: {answer}")

    # Cancelled by hand: expired.
    cancelled_id = (await call(client, "request_approval", {**EXAMPLE, "action_description": f"{label}: cancelled"}))["pause_id"]
    r = http("POST", ctx.url(f"/api/v1/requests/{cancelled_id}/cancel"), {}, token=agent_token)
    check(r.status == 200, f"{label}: cancel answered {r.status}: {r.body[:300]!r}")
    expired = await poll(client, cancelled_id)
    check(expired["status"] == "expired" and "response" not in expired, f"{label}: {expired}")

    # The timeout (1.44 s) has run out by now, or soon.
    await anyio.sleep(max(0.0, 1.6 - (time.monotonic() - started)))
    timed_out = await poll(client, short["pause_id"], within=15)
    check(timed_out["status"] == "timed_out" and "response" not in timed_out, f"{label}: {timed_out}")

    # Unknown arguments are refused with a clear error, not ignored.
    result = await client.call_tool("check_approval", {"pause_id": pause_id, "request_id": pause_id})
    check(result.is_error, f"{label}: an unknown argument was accepted")
    return [pause_id, rejected_id, cancelled_id, short["pause_id"]], proof


def stdio_params(ctx: Context, name: str, env_relay: str | None) -> mcp.StdioServerParameters:
    env = {k: v for k, v in child_env().items() if k == "COUNTERSIGN_LOG"}
    if env_relay is None:
        args = ["mcp", "--profile", "looppause", "--data-dir", str(ctx.data_dir), "--agent-name", name]
    else:
        # The seed's own configuration: only LOOPPAUSE_API_KEY and LOOPPAUSE_API_URL.
        args = ["mcp", "--profile", "looppause"]
        env.update({"LOOPPAUSE_API_KEY": env_relay, "LOOPPAUSE_API_URL": ctx.base_url})
        env["HOME"] = str(ctx.scratch / f"home-{name}")
    return mcp.StdioServerParameters(command=ctx.binary, args=args, env=env)


async def run_stdio(ctx: Context, name: str, agent_token: str, env_relay: str | None):
    errlog_path = ctx.scratch / f"looppause-{name}.log"
    with open(errlog_path, "w", encoding="utf-8") as errlog:
        try:
            async with mcp.Client(stdio_client(stdio_params(ctx, name, env_relay), errlog=errlog)) as client:
                return await flows(client, ctx, name, agent_token)
        except BaseException:
            errlog.flush()
            print(f"stderr of `countersign mcp --profile looppause`:\n{errlog_path.read_text()}", flush=True)
            raise


async def run_http(ctx: Context, agent_token: str):
    headers = {"Authorization": f"Bearer {agent_token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http_client:
        transport = streamable_http_client(ctx.url("/mcp/profile/looppause"), http_client=http_client)
        async with mcp.Client(transport) as client:
            return await flows(client, ctx, "http", agent_token)


def check_signing_key(ctx: Context, proof: dict[str, Any]) -> None:
    """The seed's key document, matched to the JWKS, verifies a proof on its own."""
    r = http("GET", ctx.url("/.well-known/looppause-signing-key.json"))
    check(r.status == 200, f"the LoopPause key path answered {r.status}")
    doc = r.json()
    jwks = http("GET", ctx.url("/.well-known/jwks.json")).json()
    check(doc["key_id"] == proof["response"]["signing_key_id"], f"key_id {doc['key_id']} is not the proof's")
    der = base64.b64decode(doc["public_key"])
    key = load_der_public_key(der)
    check(isinstance(key, Ed25519PublicKey), "public_key is not an Ed25519 SPKI")
    jwk = next(k for k in jwks["keys"] if k["kid"] == doc["key_id"])
    check(key.public_bytes_raw() == verify_proof.b64url_nopad_decode(jwk["x"], "x"), "the SPKI key is not the JWKS key")
    envelope = proof["proof"]
    body = base64.b64decode(envelope["payload"])
    key.verify(base64.b64decode(envelope["signatures"][0]["sig"]), verify_proof.pae(envelope["payloadType"], body))
    raw = verify_proof.b64url_nopad_decode(proof["response"]["signature"].removeprefix("ed25519="), "signature")
    key.verify(raw, verify_proof.pae(envelope["payloadType"], body))
    # The SDK's verify_looppause_proof with the key pinned as the seed shows.
    try:
        from countersign_verify import verify_looppause_proof
    except ImportError:  # the SDK is not installed in this environment
        return
    answer = verify_looppause_proof(proof, public_key=doc["public_key"])
    check(answer["valid"] is True, f"verify_looppause_proof on a live result: {answer}")
    edited = copy.deepcopy(proof)
    edited["response"]["comment"] = "edited"
    check(verify_looppause_proof(edited, public_key=doc["public_key"])["valid"] is False, "an edited live result verified")


class Receiver:
    """webhook_receiver.py --format looppause, its records collected from stdout."""

    def __init__(self, scratch: Path):
        script = Path(__file__).resolve().parent / "webhook_receiver.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--secret", SECRET, "--format", "looppause"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout
        first = json.loads(self.proc.stdout.readline())
        self.url = first["listening"]
        self.records: list[dict[str, Any]] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def test_looppause(binary: str, scratch: Path, results: Results) -> None:
    data_dir = scratch / "looppause-data"
    data_dir.mkdir(mode=0o700)
    receiver = Receiver(scratch)
    (data_dir / "countersign.toml").write_text(
        '[notify]\nallowed_recipients = ["email:finance@example.com", "slack:#finance-approvals"]\n\n'
        f'[[webhooks]]\nname = "looppause"\nurl = "{receiver.url}"\nsecret = "{SECRET}"\nformat = "looppause"\n'
    )
    server = Server(binary, data_dir)
    try:
        agent = create_token(binary, data_dir, "agent", "lp-agent")
        relay = create_token(binary, data_dir, "agent", "lp-relay")
        approver = create_token(binary, data_dir, "approver", "lp-approver")
        server.start()
        ctx = Context(
            binary=binary,
            data_dir=data_dir,
            base_url=server.base_url,
            agent_token=agent,
            approver_token=approver,
            agent_name="lp-agent",
            approver_name="lp-approver",
            scratch=scratch,
        )
        made: list[str] = []

        async def main() -> None:
            ids, proof = await run_http(ctx, agent)
            made.extend(ids)
            ids, _ = await run_stdio(ctx, "lp-relay", relay, env_relay=relay)
            made.extend(ids)
            check_signing_key(ctx, proof)

        anyio.run(main)
        # Every request's creation reached the receiver, each with a valid sha256= HMAC.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            seen = {r.get("request_id") for r in receiver.records if r.get("valid")}
            if set(made) <= seen:
                break
            time.sleep(0.2)
        check(receiver.records, "no webhook arrived")
        bad = [r for r in receiver.records if not r.get("valid")]
        check(not bad, f"webhooks whose X-LoopPause-Signature did not verify: {bad[:3]}")
        missing = set(made) - {r.get("request_id") for r in receiver.records}
        check(not missing, f"no webhook for {sorted(missing)}")
    finally:
        server.stop()
        receiver.stop()


def test_local_stdio(binary: str, scratch: Path, results: Results) -> None:
    """`countersign mcp --profile looppause` on a data directory, as the local agent."""
    data_dir = scratch / "looppause-local"
    data_dir.mkdir(mode=0o700)
    (data_dir / "countersign.toml").write_text(
        '[notify]\nallowed_recipients = ["email:finance@example.com", "slack:#finance-approvals"]\n'
    )
    server = Server(binary, data_dir)
    try:
        approver = create_token(binary, data_dir, "approver", "lp-approver")
        server.start()
        ctx = Context(binary, data_dir, server.base_url, "", approver, "lp-local", "lp-approver", scratch)

        async def main() -> None:
            errlog_path = scratch / "looppause-local.log"
            with open(errlog_path, "w", encoding="utf-8") as errlog:
                params = stdio_params(ctx, "lp-local", None)
                async with mcp.Client(stdio_client(params, errlog=errlog)) as client:
                    created = await call(client, "request_approval", EXAMPLE)
                    decide(ctx, created["pause_id"], "approved", "ok")
                    proof = await poll(client, created["pause_id"])
                    check(proof["status"] == "responded" and proof["response"]["decision"] == "approved", f"local: {proof}")
                    answer = await call(client, "verify_proof", {"proof": proof})
                    check(answer["valid"] is True, f"local: {answer}")

        anyio.run(main)
    finally:
        server.stop()


if __name__ == "__main__":
    import tempfile

    binary = os.environ["COUNTERSIGN_BIN"]
    results = Results()
    scratch = Path(tempfile.mkdtemp(prefix="countersign-looppause-"))
    results.run("LoopPause profile (HTTP, LOOPPAUSE_* relay, key, webhooks)", lambda: test_looppause(binary, scratch, results))
    results.run("LoopPause profile over local stdio", lambda: test_local_stdio(binary, scratch, results))
    print(f"python: {len(results.passed)} passed, {len(results.failed)} failed")
    sys.exit(1 if results.failed else 0)
