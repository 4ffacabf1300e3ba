"""countersign driven by the official Python MCP SDK (`mcp` 2.x), over stdio and over
Streamable HTTP, plus the HTTP security checks done with urllib.

Each `test_*` function takes a `harness.Context` and raises on failure. `run_all.py` runs
them against a server it starts; `python mcp_clients.py` does the same.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import anyio.to_thread
import httpx2
import mcp
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

import verify_proof
from harness import Context, Results, check, child_env, create_token, http, leaf_exceptions

AGENT_TOOLS = {
    "request_approval",
    "check_approval",
    "wait_for_approval",
    "verify_proof",
    "record_action",
    "cancel_approval",
    "record_decision",
    "record_outcome",
    "get_evidence",
    "verify_evidence",
    "post_message",
    "read_messages",
    "wait_for_message",
    "join_room",
    "leave_room",
    "set_presence",
    "wait_for_feedback",
    "report_blocker",
    "wait_for_resolution",
}
OPERATOR_TOOLS = {"list_pending_approvals", "approve", "reject"}

# How long the approver takes: past the server's 5 s progress interval, so the waiter
# must have received a progress notification before the decision, with a margin for a
# busy machine (the suite runs four clients at once on two cores).
APPROVE_AFTER_SECONDS = 7.5
WAIT_TIMEOUT_SECONDS = 60
# The waiter must return this soon after the decision (it is pushed, not polled).
WAKE_WITHIN_SECONDS = 3.0

# Contract violations in countersign that are known and reported but not yet fixed. A
# check listed here that fails is reported as XFAIL and does not fail the run; once it
# passes, the run says so, and the entry should be removed. COUNTERSIGN_TEST_STRICT=1
# makes every check strict.
KNOWN_BUGS: dict[str, str] = {}


def expect(bug: str, condition: bool, message: str, results: Results) -> None:
    """`check`, except that a failure listed in KNOWN_BUGS is recorded as an XFAIL and the
    test goes on, and a known bug that no longer fails is pointed out."""
    strict = os.environ.get("COUNTERSIGN_TEST_STRICT") == "1"
    if condition:
        if bug in KNOWN_BUGS:
            results.note(f"known bug {bug!r} no longer reproduces: remove it from KNOWN_BUGS in mcp_clients.py")
        return
    if bug in KNOWN_BUGS and not strict:
        results.xfail(f"{bug}: {message} ({KNOWN_BUGS[bug]})")
        return
    raise AssertionError(message)


# --- connections ----------------------------------------------------------------------


@asynccontextmanager
async def stdio_connection(
    ctx: Context, agent_name: str, mode: str = "auto", remote_token: str | None = None
) -> AsyncIterator[mcp.Client]:
    """The official client launching `countersign mcp` itself, as Claude Code would; with
    `remote_token`, `countersign mcp --server URL` relaying it to the running serve."""
    # Merged over the SDK's safe default environment (PATH, HOME, ...); no
    # COUNTERSIGN_* variable of this process reaches the child.
    env = {k: v for k, v in child_env().items() if k == "COUNTERSIGN_LOG"}
    args = ["mcp", "--data-dir", str(ctx.data_dir), "--agent-name", agent_name]
    if remote_token is not None:
        token_file = ctx.scratch / f"relay-{agent_name}.token"
        token_file.write_text(remote_token + "\n")
        token_file.chmod(0o600)
        args = ["mcp", "--server", ctx.base_url]
        env["COUNTERSIGN_TOKEN_FILE"] = str(token_file)
        # No data directory of its own: HOME points where nothing may appear.
        env["HOME"] = str(ctx.scratch / f"relay-home-{agent_name}")
    params = mcp.StdioServerParameters(command=ctx.binary, args=args, env=env)
    errlog_path = ctx.scratch / f"mcp-stdio-{agent_name}.log"
    with open(errlog_path, "w", encoding="utf-8") as errlog:
        try:
            async with mcp.Client(stdio_client(params, errlog=errlog), mode=mode) as client:
                yield client
        except BaseException:
            errlog.flush()
            text = errlog_path.read_text(encoding="utf-8").strip()
            if text:
                print(f"stderr of `countersign mcp`:\n{text}", flush=True)
            raise


@asynccontextmanager
async def http_connection(ctx: Context, token: str | None, mode: str = "auto") -> AsyncIterator[mcp.Client]:
    """The official client over Streamable HTTP with a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http_client:
        transport = streamable_http_client(ctx.url("/mcp"), http_client=http_client)
        async with mcp.Client(transport, mode=mode) as client:
            yield client


def structured(result: Any, what: str) -> dict[str, Any]:
    """The structured content of a successful tool result, checked against its text."""
    text = " ".join(getattr(c, "text", "") for c in result.content)
    check(not result.is_error, f"{what} failed: {text}")
    data = result.structured_content
    check(isinstance(data, dict), f"{what} returned no structured content: {result}")
    # Tools that return structured content SHOULD also return it serialized as text.
    texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
    if texts:
        check(json.loads(texts[0]) == data, f"{what}: the text content is not the structured content")
    return data


def error_text(result: Any, what: str) -> str:
    check(result.is_error, f"{what} succeeded but must fail: {result.structured_content}")
    return " ".join(getattr(c, "text", "") for c in result.content)


# --- the flows ------------------------------------------------------------------------


async def check_tool_list(client: mcp.Client, label: str, results: Results) -> None:
    listing = await client.list_tools()
    names = {t.name for t in listing.tools}
    check(AGENT_TOOLS <= names, f"{label}: tools/list lacks {sorted(AGENT_TOOLS - names)}; has {sorted(names)}")
    check(not (OPERATOR_TOOLS & names), f"{label}: an agent is offered operator tools {sorted(OPERATOR_TOOLS & names)}")
    for tool in listing.tools:
        schema = tool.input_schema
        check(
            isinstance(schema, dict) and schema.get("type") == "object",
            f"{label}: {tool.name} has no object inputSchema: {schema}",
        )
        check(tool.description, f"{label}: {tool.name} has no description")
    required = {t.name: set(t.input_schema.get("required", [])) for t in listing.tools}
    check("action_description" in required["request_approval"], f"{label}: request_approval does not require action_description")
    check("request_id" in required["wait_for_approval"], f"{label}: wait_for_approval does not require request_id")
    without = sorted(t.name for t in listing.tools if not t.output_schema)
    expect(
        "tools-output-schema",
        not without,
        f"{label}: tools without an outputSchema: {without}",
        results,
    )


async def approval_flow(
    client: mcp.Client,
    ctx: Context,
    label: str,
    expected_requester: str,
) -> dict[str, Any]:
    """request -> wait (with progress) -> approve over REST -> woken -> verify -> use once."""
    action = {
        "description": f"Transfer GBP 12,450 to Globex Corp for invoice INV-{label}",
        "details": {
            "vendor": "Globex Corp",
            "amount": "12450",
            "currency": "GBP",
            "invoice_ref": f"INV-{label}-{secrets.token_hex(4)}",
            "memo": "Zahlung für «Q3» 🚀",
        },
    }
    requested = structured(
        await client.call_tool(
            "request_approval",
            {
                "action_description": action["description"],
                "action_details": action["details"],
                "timeout_seconds": 600,
                "valid_for_seconds": 600,
            },
        ),
        f"{label}: request_approval",
    )
    request_id = requested["request_id"]
    check(requested["status"] == "pending", f"{label}: a new request is {requested['status']}, not pending")
    digest = verify_proof.action_digest(action["description"], action["details"])
    check(
        requested["action_digest"] == digest,
        f"{label}: request_approval's action_digest {requested['action_digest']} is not the independently computed {digest}",
    )
    verify_proof.parse_utc(requested["expires_at"], "expires_at")

    before = structured(await client.call_tool("check_approval", {"request_id": request_id}), f"{label}: check_approval")
    check(before["status"] == "pending" and before.get("proof") is None, f"{label}: undecided request looks like {before}")

    progress: list[tuple[float, float, float | None, str | None]] = []
    outcome: dict[str, Any] = {}
    returned = anyio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((time.monotonic(), value, total, message))

    async def waiter() -> None:
        try:
            outcome["result"] = await client.call_tool(
                "wait_for_approval",
                {"request_id": request_id, "timeout_seconds": WAIT_TIMEOUT_SECONDS},
                progress_callback=on_progress,
            )
        except Exception as e:  # noqa: BLE001 - reported by the main task
            outcome["error"] = e
        finally:
            outcome["at"] = time.monotonic()
            returned.set()

    async with anyio.create_task_group() as tg:
        started = time.monotonic()
        tg.start_soon(waiter)
        await anyio.sleep(APPROVE_AFTER_SECONDS)
        check(
            not returned.is_set(),
            f"{label}: wait_for_approval returned before any decision: {outcome}",
        )
        check(
            progress,
            f"{label}: no progress notification during a {APPROVE_AFTER_SECONDS:.0f}s wait (the server promises one every 5 s)",
        )
        deciding = time.monotonic()
        decision = await anyio.to_thread.run_sync(
            lambda: ctx.approve(request_id, comment=f"ok from {label}", fields={"po_number": "PO-7781"})
        )
        check(decision.status == 200, f"{label}: the REST decision answered {decision.status}: {decision.body!r}")
        with anyio.fail_after(WAKE_WITHIN_SECONDS + 10):
            await returned.wait()

    if "error" in outcome:
        raise AssertionError(f"{label}: wait_for_approval raised {outcome['error']!r}") from outcome["error"]
    woke_after = outcome["at"] - deciding
    waited = outcome["at"] - started
    check(
        woke_after < WAKE_WITHIN_SECONDS,
        f"{label}: wait_for_approval returned {woke_after:.2f}s after the decision (must be pushed, < {WAKE_WITHIN_SECONDS}s)",
    )
    check(waited < WAIT_TIMEOUT_SECONDS / 2, f"{label}: the wait took {waited:.1f}s of its {WAIT_TIMEOUT_SECONDS}s timeout")
    print(f"    {label}: woken {woke_after * 1000:.0f} ms after the decision; {len(progress)} progress notification(s)")

    first_progress = progress[0][0] - started
    check(first_progress < APPROVE_AFTER_SECONDS, f"{label}: first progress after {first_progress:.1f}s")
    values = [p[1] for p in progress]
    check(values == sorted(values), f"{label}: progress went backwards: {values}")
    check(all(p[2] == WAIT_TIMEOUT_SECONDS for p in progress), f"{label}: progress total is not the timeout: {progress}")
    check(all(isinstance(p[3], str) and p[3] for p in progress), f"{label}: progress without a message: {progress}")

    waited_view = structured(outcome["result"], f"{label}: wait_for_approval")
    check(waited_view["status"] == "approved", f"{label}: wait_for_approval returned {waited_view['status']}")
    proof = waited_view.get("proof")
    check(isinstance(proof, dict), f"{label}: an approved request has no proof: {waited_view}")
    approvers = (waited_view.get("decision") or {}).get("approvers") or []
    check(
        [a.get("display_name") for a in approvers] == [ctx.approver_name],
        f"{label}: approvers are {approvers}, expected {ctx.approver_name}",
    )

    # The proof, checked by code that shares nothing with countersign.
    jwks = await anyio.to_thread.run_sync(lambda: verify_proof.fetch_jwks(ctx.url("/.well-known/jwks.json")))
    statement = verify_proof.verify(proof, jwks, expected_action=action, expected_request_id=request_id)
    check(statement["action"] == action, f"{label}: the signed action is {statement['action']}, expected {action}")
    check(statement["action_digest"] == digest, f"{label}: statement digest {statement['action_digest']} != {digest}")
    check(statement["authorization_type"] == "human", f"{label}: authorization_type {statement['authorization_type']}")
    check(
        statement["requested_by"].get("id") == expected_requester,
        f"{label}: requested_by is {statement['requested_by']}, expected id {expected_requester}",
    )
    approver = statement["approvers"][0]
    check(
        approver["display_name"] == ctx.approver_name and approver["channel"] == "api",
        f"{label}: the signed approver is {approver}",
    )
    check(statement["fields"] == {"po_number": "PO-7781"}, f"{label}: signed fields are {statement['fields']}")
    check(statement["comment"] == f"ok from {label}", f"{label}: signed comment is {statement['comment']!r}")
    verify_proof.negative_checks(proof, jwks, action)

    # countersign's own verifier agrees, and tells a different action apart.
    server_view = structured(
        await client.call_tool(
            "verify_proof",
            {"proof": proof, "action_description": action["description"], "action_details": action["details"]},
        ),
        f"{label}: verify_proof",
    )
    check(server_view["valid"] is True, f"{label}: the server calls its own fresh proof invalid: {server_view}")
    check(server_view["keyid"] == proof["signatures"][0]["keyid"], f"{label}: verify_proof keyid {server_view['keyid']}")
    other = structured(
        await client.call_tool(
            "verify_proof",
            {
                "proof": proof,
                "action_description": action["description"],
                "action_details": dict(action["details"], amount="99999"),
            },
        ),
        f"{label}: verify_proof (other action)",
    )
    check(other["valid"] is False, f"{label}: the proof verified for another action: {other}")
    check(
        "action_mismatch" in {r["code"] for r in other["reasons"]},
        f"{label}: verify_proof for another action gave reasons {other['reasons']}",
    )

    checked = structured(await client.call_tool("check_approval", {"request_id": request_id}), f"{label}: check_approval")
    check(checked["status"] == "approved" and checked["proof"] == proof, f"{label}: check_approval disagrees with the wait")

    # Single use: record_action works once.
    used = structured(
        await client.call_tool(
            "record_action",
            {"request_id": request_id, "tool": "payments.transfer", "details": {"transfer_id": "TR-1"}},
        ),
        f"{label}: record_action",
    )
    check(used["request_id"] == request_id and used["tool"] == "payments.transfer", f"{label}: record_action returned {used}")
    verify_proof.parse_utc(used["recorded_at"], "recorded_at")
    again = await client.call_tool("record_action", {"request_id": request_id, "tool": "payments.transfer"})
    text = error_text(again, f"{label}: a second record_action")
    check("already_used" in text or "already used" in text, f"{label}: the second record_action says {text!r}")
    after = structured(await client.call_tool("verify_proof", {"proof": proof}), f"{label}: verify_proof after use")
    check(
        after["valid"] is False and "already_used" in {r["code"] for r in after["reasons"]},
        f"{label}: a used proof verifies as {after}",
    )
    return statement


def describe(client: mcp.Client) -> str:
    info = client.server_info
    return f"{info.name} {info.version}" if info else "(anonymous)"


async def edge_flow(client: mcp.Client, ctx: Context, label: str) -> None:
    """Cancellation wakes a waiter, a request nobody answers times out (fail closed), and
    out-of-range or unknown arguments are refused."""

    async def new_request(description: str, **extra: Any) -> str:
        created = structured(
            await client.call_tool("request_approval", {"action_description": description, **extra}),
            f"{label}: request_approval",
        )
        return created["request_id"]

    # 1. A second call on the same connection cancels the request a first one waits on.
    request_id = await new_request(f"Restart the {label} worker", action_details={"host": "worker-1"})
    outcome: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            outcome["result"] = await client.call_tool(
                "wait_for_approval", {"request_id": request_id, "timeout_seconds": WAIT_TIMEOUT_SECONDS}
            )
            outcome["at"] = time.monotonic()

        tg.start_soon(waiter)
        await anyio.sleep(0.5)
        cancelled_at = time.monotonic()
        cancelled = structured(
            await client.call_tool("cancel_approval", {"request_id": request_id}), f"{label}: cancel_approval"
        )
        check(cancelled["status"] == "cancelled", f"{label}: cancel_approval left status {cancelled['status']}")
        with anyio.fail_after(WAKE_WITHIN_SECONDS + 10):
            while "at" not in outcome:
                await anyio.sleep(0.02)
    woken = structured(outcome["result"], f"{label}: wait_for_approval on a cancelled request")
    check(woken["status"] == "cancelled" and woken.get("proof") is None, f"{label}: the waiter saw {woken}")
    check(outcome["at"] - cancelled_at < WAKE_WITHIN_SECONDS, f"{label}: the waiter woke {outcome['at'] - cancelled_at:.2f}s after the cancel")
    text = error_text(
        await client.call_tool("record_action", {"request_id": request_id, "tool": "systemctl"}),
        f"{label}: record_action on a cancelled request",
    )
    check("not_approved" in text, f"{label}: record_action on a cancelled request says {text!r}")
    r = await anyio.to_thread.run_sync(lambda: ctx.approve(request_id))
    check(r.status == 409, f"{label}: approving a cancelled request answered {r.status}: {r.body!r}")

    # 2. Nobody answers: after timeout_seconds the request is timed_out, never approved.
    request_id = await new_request(f"Email 3,200 customers ({label})", timeout_seconds=2)
    started = time.monotonic()
    waited = structured(
        await client.call_tool("wait_for_approval", {"request_id": request_id, "timeout_seconds": 30}),
        f"{label}: wait_for_approval on a request that times out",
    )
    elapsed = time.monotonic() - started
    check(waited["status"] == "timed_out", f"{label}: an unanswered request ended {waited['status']}")
    check(elapsed < 2 + WAKE_WITHIN_SECONDS, f"{label}: the time-out reached the waiter after {elapsed:.1f}s (expires in 2 s)")
    check(waited.get("decision") is None or waited["decision"]["authorization_type"] != "human", f"{label}: a timeout claims a human decision: {waited}")
    r = await anyio.to_thread.run_sync(lambda: ctx.approve(request_id))
    check(r.status == 409, f"{label}: approving a timed-out request answered {r.status}: {r.body!r}")

    # 3. A short wait on a pending request returns pending, not an error.
    request_id = await new_request(f"Deploy v2.14.0 ({label})", action_details={"env": "production"})
    started = time.monotonic()
    pending = structured(
        await client.call_tool("wait_for_approval", {"request_id": request_id, "timeout_seconds": 1}),
        f"{label}: a 1 s wait",
    )
    check(pending["status"] == "pending", f"{label}: a 1 s wait returned {pending['status']}")
    check(0.9 <= time.monotonic() - started < 5, f"{label}: a 1 s wait took {time.monotonic() - started:.1f}s")

    # 4. Refusals: out-of-range wait, unknown argument, unknown request.
    text = error_text(
        await client.call_tool("wait_for_approval", {"request_id": request_id, "timeout_seconds": 301}),
        f"{label}: wait_for_approval with timeout_seconds=301",
    )
    check("300" in text, f"{label}: the refusal of a 301 s wait does not name the limit: {text!r}")
    try:
        bad = await client.call_tool("request_approval", {"action_description": "x", "approver": "me"})
    except mcp.MCPError as e:
        check("approver" in str(e) or e.code == -32602, f"{label}: unknown argument refused with {e!r}")
    else:
        check(bad.is_error, f"{label}: request_approval accepted an unknown argument 'approver': {bad.structured_content}")
    text = error_text(
        await client.call_tool("check_approval", {"request_id": "req_does_not_exist"}),
        f"{label}: check_approval of an unknown request",
    )
    check("not_found" in text, f"{label}: an unknown request gives {text!r}")
    structured(await client.call_tool("cancel_approval", {"request_id": request_id}), f"{label}: cancel_approval")


# --- tests ----------------------------------------------------------------------------


def test_mcp_stdio(ctx: Context, results: Results, mode: str = "auto") -> None:
    """`mode`: "auto" negotiates the newest protocol (server/discover, 2026-07-28 era);
    "legacy" forces the initialize handshake (2025-11-25 era) most clients still use."""
    agent = f"py-stdio-{mode}"
    label = f"stdio/{mode}"

    async def main() -> None:
        async with stdio_connection(ctx, agent, mode) as client:
            print(f"    {label}: protocol {client.protocol_version}, server {describe(client)}")
            await check_tool_list(client, label, results)
            await approval_flow(client, ctx, label, f"stdio:{agent}")
            if mode == "auto":
                await edge_flow(client, ctx, label)

    anyio.run(main)


def test_mcp_relay(ctx: Context, results: Results, mode: str = "auto") -> None:
    """`countersign mcp --server URL`: a stdio client of a team server, relayed to its
    /mcp as the token's agent; progress while waiting, the proof, and a bad token refused
    with a message that says so."""
    label = f"stdio relay/{mode}"

    async def main() -> None:
        async with stdio_connection(ctx, f"relay-{mode}", mode, remote_token=ctx.agent_token) as client:
            print(f"    {label}: protocol {client.protocol_version}, server {describe(client)}")
            await check_tool_list(client, label, results)
            await approval_flow(client, ctx, label, f"token:{ctx.agent_name}")
        home = ctx.scratch / f"relay-home-relay-{mode}"
        check(not home.exists(), f"{label}: the relay made a data directory of its own: {home}")
        refused = None
        try:
            async with stdio_connection(ctx, f"relay-bad-{mode}", mode, remote_token="cs_not_a_real_token") as client:
                await client.list_tools()
        except Exception as e:  # noqa: BLE001 - the refusal is what is tested
            refused = "; ".join(str(x) for x in leaf_exceptions(e))
        check(refused is not None and ("token" in refused.lower() or "unauthenticated" in refused.lower()),
              f"{label}: a bad token must be refused, saying why: {refused!r}")

    anyio.run(main)


def test_mcp_http(ctx: Context, results: Results, mode: str = "auto") -> None:
    label = f"http/{mode}"

    async def main() -> None:
        async with http_connection(ctx, ctx.agent_token, mode) as client:
            print(f"    {label}: protocol {client.protocol_version}, server {describe(client)}")
            await check_tool_list(client, label, results)
            await approval_flow(client, ctx, label, f"token:{ctx.agent_name}")
            if mode == "auto":
                await edge_flow(client, ctx, label)

    anyio.run(main)


def test_http_client_without_token(ctx: Context, results: Results) -> None:
    """The official client, given no token, must not get in."""

    async def main() -> None:
        try:
            async with http_connection(ctx, None) as client:
                tools = await client.list_tools()
        except Exception as e:  # noqa: BLE001 - any refusal will do; print what the SDK said
            leaves = leaf_exceptions(e)
            described = "; ".join(
                f"{type(x).__name__}: {x}" + (f" (code {x.code}, data {x.error.data!r})" if hasattr(x, "error") else "")
                for x in leaves
            )
            # The SDK turns the HTTP 401 into a generic error; the status itself is
            # checked with urllib in test_http_security.
            print(f"    refused as expected: {described}")
            return
        raise AssertionError(f"connected without a token and listed {[t.name for t in tools.tools]}")

    anyio.run(main)


MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}


def error_code(response) -> str | None:
    try:
        return response.json()["error"]["code"]
    except Exception:  # noqa: BLE001
        return None


def test_http_security(ctx: Context, results: Results) -> None:
    port = ctx.base_url.rsplit(":", 1)[1]

    health = http("GET", ctx.url("/healthz"))
    check(health.status == 200, f"GET /healthz without a token answered {health.status}")
    jwks = http("GET", ctx.url("/.well-known/jwks.json"))
    check(jwks.status == 200, f"GET /.well-known/jwks.json without a token answered {jwks.status}")
    kids = {k["kid"] for k in jwks.json()["keys"]}
    if "kid" in health.json():
        check(health.json()["kid"] in kids, f"healthz names signing key {health.json()['kid']}, the JWKS has {kids}")
    verify_proof.load_keys(jwks.json())

    r = http("POST", ctx.url("/mcp"), MCP_LIST, headers=MCP_HEADERS)
    check(r.status == 401, f"POST /mcp without a token answered {r.status}: {r.body[:300]!r}")
    check(r.headers.get("www-authenticate", "").lower().startswith("bearer"), f"401 without WWW-Authenticate: Bearer: {r.headers}")
    r = http("POST", ctx.url("/mcp"), MCP_LIST, token="cs_not-a-real-token", headers=MCP_HEADERS)
    check(r.status == 401, f"POST /mcp with an unknown token answered {r.status}")
    r = http("GET", ctx.url("/api/v1/requests/req_x"))
    check(r.status == 401, f"GET /api/v1/requests/... without a token answered {r.status}")
    r = http("POST", ctx.url("/api/v1/requests"), {"action_description": "x"}, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    check(r.status == 401, f"POST /api/v1/requests with Basic auth answered {r.status}")

    # Positive control: the same MCP request with a token and a same-origin Origin works.
    r = http("POST", ctx.url("/mcp"), MCP_LIST, token=ctx.agent_token, headers=dict(MCP_HEADERS, Origin=f"http://127.0.0.1:{port}"))
    check(r.status == 200, f"POST /mcp with a token and same Origin answered {r.status}: {r.body[:300]!r}")
    check(b"request_approval" in r.body, f"tools/list over raw HTTP did not list request_approval: {r.body[:300]!r}")

    # DNS rebinding / cross-site: refused even with a valid token.
    r = http("POST", ctx.url("/mcp"), MCP_LIST, token=ctx.agent_token, headers=dict(MCP_HEADERS, Origin="http://evil.example"))
    check(r.status == 403, f"POST /mcp with Origin: http://evil.example answered {r.status}: {r.body[:300]!r}")
    r = http("POST", ctx.url("/mcp"), MCP_LIST, token=ctx.agent_token, headers=dict(MCP_HEADERS, Host=f"evil.example:{port}"))
    check(r.status == 403, f"POST /mcp with Host: evil.example answered {r.status}")
    r = http("GET", ctx.url("/api/v1/requests/req_x"), token=ctx.agent_token, headers={"Origin": "http://evil.example"})
    check(r.status == 403, f"GET /api/v1 with Origin: http://evil.example answered {r.status}")

    # The agent never approves: an agent token on the decision endpoint gets 403.
    created = http(
        "POST",
        ctx.url("/api/v1/requests"),
        {"action_description": "Delete staging database", "action_details": {}, "timeout_seconds": 300},
        token=ctx.agent_token,
    )
    check(created.status == 201, f"POST /api/v1/requests answered {created.status}: {created.body!r}")
    req = created.json()
    check(
        req["action_digest"] == "sha256:63f9d847294aced392cec1056dda9f0b363c14c0f6838dd72844f3e926fa2adb",
        f"REST action_digest {req['action_digest']} differs from the known answer",
    )
    rid = req["request_id"]
    r = http("POST", ctx.url(f"/api/v1/requests/{rid}/decision"), {"decision": "approved"}, token=ctx.agent_token)
    check(r.status == 403, f"an agent token deciding answered {r.status}: {r.body!r}")
    check(error_code(r) == "forbidden", f"an agent token deciding: error {r.body!r}")
    r = http("GET", ctx.url(f"/api/v1/requests/{rid}"), token=ctx.agent_token)
    check(r.status == 200 and r.json()["status"] == "pending", f"after the agent's attempt the request is {r.body!r}")

    # First decision wins: a second one is refused, and the state does not change.
    r = http("POST", ctx.url(f"/api/v1/requests/{rid}/decision"), {"decision": "rejected", "comment": "no"}, token=ctx.approver_token)
    check(r.status == 200 and r.json()["status"] == "rejected", f"rejecting answered {r.status}: {r.body!r}")
    r = ctx.approve(rid)
    check(r.status == 409, f"approving a rejected request answered {r.status}: {r.body!r}")
    r = http("GET", ctx.url(f"/api/v1/requests/{rid}"), token=ctx.agent_token)
    view = r.json()
    check(view["status"] == "rejected", f"after a second decision the request is {view['status']}")
    # A rejection is signed too, and verifies as a rejection only.
    statement = verify_proof.verify(
        view["proof"],
        jwks.json(),
        expected_action={"description": "Delete staging database", "details": {}},
        expected_decision="rejected",
    )
    check(statement["comment"] == "no", f"the rejection's signed comment is {statement['comment']!r}")
    try:
        verify_proof.verify(view["proof"], jwks.json())
    except verify_proof.VerificationError:
        pass
    else:
        raise AssertionError("a rejection verified as an approval")
    r = http("POST", ctx.url(f"/api/v1/requests/{rid}/actions"), {"tool": "db.drop"}, token=ctx.agent_token)
    check(r.status == 409, f"recording an action on a rejected request answered {r.status}: {r.body!r}")


if __name__ == "__main__":
    import run_all

    raise SystemExit(run_all.main())


# --- policies (docs/policies.md) --------------------------------------------------------

POLICY_FILE = "py.cedar"
POLICIES = """@id("py-small-refunds")
@reason("refunds under 50 need no person")
permit(principal, action == Action::"py_refund", resource)
when { context.decimal has amount && context.decimal.amount.lessThan(decimal("50.0")) };

@id("py-no-drops")
@reason("nobody drops a table through an agent")
forbid(principal, action == Action::"py_drop_table", resource);

@id("py-quick-deploys")
@timeout_hours("0.0005")
@on_timeout("approve")
permit(principal, action == Action::"py_deploy", resource);

@id("py-two-for-transfers")
@approvals("2")
permit(principal, action == Action::"py_transfer", resource);

@id("gw-auto-notes")
@reason("notes named auto-* need no person, through the gateway only")
permit(principal, action == Action::"write_note", resource == Server::"upstream_server")
when { context.gateway && context.input has "/name" && context.input["/name"] like "*auto-*" };

@id("gw-no-secrets")
@reason("the secrets note is never written by an agent")
forbid(principal, action == Action::"write_note", resource)
when { context.input has "/name" && context.input["/name"] == "\\"secrets\\"" };
"""


def policy_set_digest() -> str:
    """The policy set's name as docs/policies.md defines it, computed here: sha256 of the
    RFC 8785 form of [{"name", "text"}] in the config's order."""
    import hashlib

    import rfc8785

    canonical = rfc8785.dumps([{"name": POLICY_FILE, "text": POLICIES}])
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_policy_proofs(ctx: Context, results: Results) -> None:
    """Policies decide three requests made with the official client: a rule approves one
    and refuses one at once, and a timeout becomes the approval the policy names. Each
    proof is checked by verify_proof, which shares nothing with countersign, and names
    the policy and the exact policy set (its digest recomputed here)."""
    label = "policies"
    expected_set = policy_set_digest()

    async def request(client: mcp.Client, tool: str, details: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
        action = {"description": f"{tool} for {label}", "details": {"tool": tool, **details}}
        created = structured(
            await client.call_tool(
                "request_approval",
                {"action_description": action["description"], "action_details": action["details"], "timeout_seconds": 600},
            ),
            f"{label}: request_approval {tool}",
        )
        return action, created

    def check_proof(view: dict[str, Any], action: dict[str, Any], decision: str, kind: str, policy: str, jwks: dict[str, Any]) -> None:
        proof = view.get("proof")
        check(isinstance(proof, dict), f"{label}: {policy}: the {decision} request has no proof: {view}")
        statement = verify_proof.verify(
            proof, jwks, expected_action=action, expected_request_id=view["request_id"], expected_decision=decision
        )
        check(statement["authorization_type"] == kind, f"{label}: {policy}: authorization_type {statement['authorization_type']}")
        check(
            statement["policy"] == {"id": policy, "policy_set": expected_set},
            f"{label}: the proof names {statement['policy']}, expected {policy} of {expected_set}",
        )
        check(statement["approvers"] == [], f"{label}: {policy}: a rule's decision names approvers {statement['approvers']}")
        if decision == "approved":
            # Tampered, re-signed by no known key, for another action: all refused.
            verify_proof.negative_checks(proof, jwks, action)
        else:
            try:
                verify_proof.verify(proof, jwks, expected_action=action)
            except verify_proof.VerificationError as e:
                check("decision" in str(e), f"{label}: a refusal's proof was refused for {e}, not its decision")
            else:
                raise AssertionError(f"{label}: a refusal's proof verified as an approval")

    async def main() -> None:
        jwks = await anyio.to_thread.run_sync(lambda: verify_proof.fetch_jwks(ctx.url("/.well-known/jwks.json")))
        async with http_connection(ctx, ctx.agent_token) as client:
            # Approved by rule, at once: the answer to request_approval is final.
            action, created = await request(client, "py_refund", {"amount": "12.50", "order": "881"})
            check(created["status"] == "approved", f"{label}: a small refund came back {created['status']}")
            view = structured(await client.call_tool("check_approval", {"request_id": created["request_id"]}), f"{label}: check_approval")
            check_proof(view, action, "approved", "policy", "py-small-refunds", jwks)

            # A larger refund matches no policy: a person decides, as without policies.
            _, large = await request(client, "py_refund", {"amount": "500", "order": "882"})
            check(large["status"] == "pending", f"{label}: a large refund came back {large['status']}, not pending")

            # Refused by rule, at once, with a proof of the refusal.
            action, created = await request(client, "py_drop_table", {"table": "invoices"})
            check(created["status"] == "rejected", f"{label}: a forbidden request came back {created['status']}")
            view = structured(await client.call_tool("check_approval", {"request_id": created["request_id"]}), f"{label}: check_approval")
            check_proof(view, action, "rejected", "policy", "py-no-drops", jwks)

            # Nobody decides within the policy's 1.8 s: it is approved by the fallback.
            action, created = await request(client, "py_deploy", {"service": "web"})
            check(created["status"] == "pending", f"{label}: a deploy came back {created['status']}, not pending")
            waited = structured(
                await client.call_tool("wait_for_approval", {"request_id": created["request_id"], "timeout_seconds": 30}),
                f"{label}: wait_for_approval",
            )
            check(waited["status"] == "approved", f"{label}: the deploy ended {waited['status']}, not approved by the fallback")
            check_proof(waited, action, "approved", "fallback", "py-quick-deploys", jwks)

            # Two approvals from two accounts: the first is recorded, the second decides;
            # the proof names both, each with its account.
            action, created = await request(client, "py_transfer", {"amount": "9000"})
            check(created["status"] == "pending", f"{label}: a transfer came back {created['status']}")
            check(created.get("quorum", {}).get("required") == 2, f"{label}: a transfer's quorum: {created}")
            request_id = created["request_id"]
            second = await anyio.to_thread.run_sync(
                lambda: create_token(ctx.binary, ctx.data_dir, "approver", "py-second-approver")
            )

            def decide(token: str) -> Any:
                return http("POST", ctx.url(f"/api/v1/requests/{request_id}/decision"), {"decision": "approved"}, token=token)

            first = await anyio.to_thread.run_sync(lambda: decide(ctx.approver_token))
            check(first.status == 200, f"{label}: the first approval: {first.status} {first.body!r}")
            again = await anyio.to_thread.run_sync(lambda: decide(ctx.approver_token))
            check(again.status == 409 and b"already_approved" in again.body, f"{label}: the same approver twice: {again.status} {again.body!r}")
            view = structured(await client.call_tool("check_approval", {"request_id": request_id}), f"{label}: check_approval")
            check(view["status"] == "pending" and view.get("proof") is None, f"{label}: one approval of two decided: {view}")
            final = await anyio.to_thread.run_sync(lambda: decide(second))
            check(final.status == 200, f"{label}: the second approval: {final.status} {final.body!r}")
            view = structured(await client.call_tool("check_approval", {"request_id": request_id}), f"{label}: check_approval")
            statement = verify_proof.verify(
                view["proof"], jwks, expected_action=action, expected_request_id=request_id, required_approvals=2
            )
            names = [a["id"] for a in statement["approvers"]]
            check(
                names == [f"token:{ctx.approver_name}", "token:py-second-approver"],
                f"{label}: the quorum's proof names {names}",
            )
            try:
                verify_proof.verify(view["proof"], jwks, expected_action=action, required_approvals=3)
            except verify_proof.VerificationError as e:
                check("3 are required" in str(e), f"{label}: a short quorum was refused for {e}")
            else:
                raise AssertionError(f"{label}: two approvers passed a check for three")

            # A standing grant the approver gives over REST approves the agent's next
            # request of that tool within its ceiling: a "grant" proof naming grant and maker.
            given = await anyio.to_thread.run_sync(
                lambda: http(
                    "POST",
                    ctx.url("/api/v1/grants"),
                    {"agent": f"token:{ctx.agent_name}", "tool": "py_topup", "max": {"amount": "20"}, "max_uses": 1},
                    token=ctx.approver_token,
                )
            )
            check(given.status == 201, f"{label}: a grant: {given.status} {given.body!r}")
            grant_id = given.json()["id"]
            action, created = await request(client, "py_topup", {"amount": "15"})
            check(created["status"] == "approved", f"{label}: a request inside a grant came back {created['status']}")
            view = structured(await client.call_tool("check_approval", {"request_id": created["request_id"]}), f"{label}: check_approval")
            statement = verify_proof.verify(view["proof"], jwks, expected_action=action, expected_request_id=created["request_id"])
            check(statement["authorization_type"] == "grant", f"{label}: {statement['authorization_type']}")
            check(statement["grant"]["id"] == grant_id, f"{label}: the proof names grant {statement['grant']}")
            check(
                statement["grant"]["granted_by"]["id"] == f"token:{ctx.approver_name}",
                f"{label}: the grant's maker is {statement['grant']['granted_by']}",
            )
            _, beyond = await request(client, "py_topup", {"amount": "15"})
            check(beyond["status"] == "pending", f"{label}: a used-up grant approved again: {beyond['status']}")
        print(f"    {label}: policy approval, policy refusal, fallback, quorum and grant proofs verified (policy set {expected_set[:19]}...)")

    anyio.run(main)
