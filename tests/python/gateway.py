"""The MCP gateway from outside: the official Python MCP client launches
`countersign proxy -- python upstream_server.py` (an upstream written with the official
SDK, not by countersign), exactly as an agent's client would, and the approver decides
over REST on the `serve` of the same data directory (another process).

What must hold (docs/gateway.md): the upstream's tools are served with their names and
annotations; a read-only call of the trusted upstream passes with no request; a
destructive call does nothing until approved, runs exactly once after approval and never
after a rejection or a timeout; the rejection's reason reaches the agent; resources and
prompts pass through; a kill -9 of the gateway while a call is held or being forwarded
never makes the call run twice, and a forward cut off is recorded as `unknown`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import mcp
from mcp.client.stdio import stdio_client

from harness import Context, Results, check, child_env, http, run_cli

UPSTREAM = Path(__file__).resolve().parent / "upstream_server.py"
# The reference filesystem server from npm (tests/upstreams: `npm ci --prefix tests/upstreams`).
FILESYSTEM = Path(__file__).resolve().parents[1] / "upstreams/node_modules/.bin/mcp-server-filesystem"


def calls(notes: Path) -> list[str]:
    log = notes / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@asynccontextmanager
async def gateway(
    ctx: Context, notes: Path, *extra: str, agent: str, upstream: list[str] | None = None,
    remote: Path | None = None,
) -> AsyncIterator[mcp.Client]:
    """The official client launching the gateway, which launches the upstream. With
    `remote` (a token file), the gateway asks the running serve over HTTP
    (`proxy --server URL`) and has no data directory of its own."""
    env = {**{k: v for k, v in child_env().items() if k == "COUNTERSIGN_LOG"}, "UPSTREAM_DIR": str(notes)}
    if remote is None:
        where = ["--data-dir", str(ctx.data_dir), "proxy", "--agent-name", agent]
    else:
        where = ["proxy", "--server", ctx.base_url]
        env["COUNTERSIGN_TOKEN_FILE"] = str(remote)
        env["HOME"] = str(ctx.scratch / f"{agent}-home")
    params = mcp.StdioServerParameters(
        command=ctx.binary,
        args=[*where, *extra, "--", *(upstream or [sys.executable, str(UPSTREAM)])],
        env=env,
    )
    errlog_path = ctx.scratch / f"proxy-{agent}.log"
    with open(errlog_path, "a", encoding="utf-8") as errlog:
        try:
            async with mcp.Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
                yield client
        except BaseException:
            errlog.flush()
            text = errlog_path.read_text(encoding="utf-8").strip()
            if text:
                print(f"stderr of `countersign proxy`:\n{text}", flush=True)
            raise


def pending_of(ctx: Context, agent: str, by: str | None = None) -> list[dict[str, Any]]:
    """The pending requests of the local gateway's `agent` (or of the principal `by`)."""
    r = http("GET", ctx.url("/api/v1/requests?status=pending"), token=ctx.approver_token)
    check(r.status == 200, f"list pending: {r.status} {r.body[:200]!r}")
    body = r.json()
    items = body["requests"] if isinstance(body, dict) else body
    return [q for q in items if q["requested_by"] == (by or f"stdio:{agent}")]


async def held_request(ctx: Context, agent: str, within: float = 20, by: str | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = pending_of(ctx, agent, by)
        if found:
            check(len(found) == 1, f"one held call, one request: {found}")
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no pending request from {by or 'stdio:' + agent} within {within}s")


def approved_of(ctx: Context, by: str) -> list[dict[str, Any]]:
    """The approved requests of the principal `by`, newest first."""
    r = http("GET", ctx.url("/api/v1/requests?status=approved"), token=ctx.approver_token)
    check(r.status == 200, f"list approved: {r.status} {r.body[:200]!r}")
    body = r.json()
    items = body["requests"] if isinstance(body, dict) else body
    return [q for q in items if q["requested_by"] == by]


async def forwarded_once(ctx: Context, by: str, count: int) -> list[dict[str, Any]]:
    """Waits (the outcome is written beside the answer, not before it) until `by` has
    `count` approved requests, each claimed once and with its outcome recorded."""
    deadline = time.monotonic() + 10
    while True:
        found = approved_of(ctx, by)
        done = [q for q in found if (q.get("outcome") or {}).get("status") == "succeeded"]
        if len(found) == count and len(done) == count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{by}: expected {count} forwarded requests with outcomes, got {found}")
        await asyncio.sleep(0.05)


async def with_outcome(ctx: Context, rid: str) -> dict[str, Any]:
    """The request once its outcome is recorded (written beside the call's answer, so
    it may land just after the agent has the answer); as it is after 10 s otherwise."""
    deadline = time.monotonic() + 10
    while True:
        done = request(ctx, rid)
        if done.get("outcome") or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.05)


def request(ctx: Context, rid: str) -> dict[str, Any]:
    r = http("GET", ctx.url(f"/api/v1/requests/{rid}"), token=ctx.approver_token)
    check(r.status == 200, f"get {rid}: {r.status} {r.body[:200]!r}")
    return r.json()


def text_of(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def approve_flow(ctx: Context, results: Results) -> None:
    agent = "gw-approve"
    notes = ctx.scratch / agent
    async with gateway(ctx, notes, agent=agent) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        check(set(tools) == {"read_note", "write_note", "slow_write"}, f"the upstream's tools, by name: {sorted(tools)}")
        check(tools["read_note"].annotations and tools["read_note"].annotations.read_only_hint is True, f"annotations kept: {tools['read_note']}")
        check(tools["write_note"].annotations and tools["write_note"].annotations.destructive_hint is True, f"annotations kept: {tools['write_note']}")
        check("name" in tools["write_note"].input_schema.get("properties", {}), f"schema kept: {tools['write_note'].input_schema}")

        # Read-only, trusted upstream, no policy speaks of it: passes, no request.
        r = await client.call_tool("read_note", {"name": "a"})
        check(not r.is_error and "(none)" in text_of(r), f"read_note passes: {r}")
        check(pending_of(ctx, agent) == [], "a passing call makes no request")

        # Destructive: held, nothing runs until a person approves; then once.
        call = asyncio.create_task(client.call_tool("write_note", {"name": "a", "text": "hello"}))
        held = await held_request(ctx, agent)
        details = held["action_details"]
        check(details.get("upstream") == "upstream_server" and details.get("tool") == "write_note", f"the request names upstream and tool: {details}")
        check(details.get("/name") == '"a"' and details.get("/text") == '"hello"', f"every argument bound as a JSON Pointer: {details}")
        await asyncio.sleep(1.0)
        check(not call.done(), "the held call does not answer before a decision")
        check(calls(notes) == [], f"nothing ran before the approval: {calls(notes)}")
        r = ctx.approve(held["request_id"])
        check(r.status == 200, f"approve: {r.status} {r.body[:200]!r}")
        result = await asyncio.wait_for(call, 30)
        check(not result.is_error, f"the approved call ran: {result}")
        check(calls(notes) == ["write_note a"], f"ran exactly once: {calls(notes)}")
        check((notes / "a").read_text() == "hello", "with exactly the approved arguments")
        done = await with_outcome(ctx, held["request_id"])
        check(done.get("used") is not None, f"the approval is used: {done}")
        check((done.get("outcome") or {}).get("status") == "succeeded", f"the outcome is recorded: {done}")

        # Read it back through the gateway.
        r = await client.call_tool("read_note", {"name": "a"})
        check(text_of(r).strip() == "hello", f"read back: {r}")

        # Resources and prompts pass through unchanged.
        resources = await client.list_resources()
        check(any(str(x.uri) == "note://list" for x in resources.resources), f"resources pass: {resources}")
        listed = await client.read_resource("note://list")
        check("a" in " ".join(getattr(c, "text", "") for c in listed.contents), f"read_resource passes: {listed}")
        prompts = await client.list_prompts()
        check(any(p.name == "summarize" for p in prompts.prompts), f"prompts pass: {prompts}")
        prompt = await client.get_prompt("summarize", {"name": "a"})
        check(len(prompt.messages) >= 1, f"get_prompt passes: {prompt}")

        # The same call made again later is a new request (the first one is finished).
        call = asyncio.create_task(client.call_tool("write_note", {"name": "a", "text": "hello"}))
        again = await held_request(ctx, agent)
        check(again["request_id"] != held["request_id"], "a finished call is not joined")
        ctx.approve(again["request_id"])
        await asyncio.wait_for(call, 30)
        check(calls(notes) == ["write_note a", "write_note a"], f"each approval runs once: {calls(notes)}")
    print(f"    approved, forwarded once, outcome recorded; reads passed; resources and prompts passed", flush=True)


async def policy_flow(ctx: Context, results: Results) -> None:
    """The suite's policies (mcp_clients.POLICIES) decide gateway calls: a permit that
    needs context.gateway approves at once (signed, naming the policy), a forbid refuses."""
    agent = "gw-policy"
    notes = ctx.scratch / agent
    async with gateway(ctx, notes, agent=agent) as client:
        r = await asyncio.wait_for(client.call_tool("write_note", {"name": "auto-1", "text": "by rule"}), 30)
        check(not r.is_error, f"a permit approves a gateway call at once: {text_of(r)}")
        check(calls(notes) == ["write_note auto-1"], f"and it ran once: {calls(notes)}")
        # The same call again at once: its own request (the first one's outcome is
        # written beside its answer, and the repeat waits for it rather than joining a
        # request whose forward has no outcome yet), approved and run again.
        r = await asyncio.wait_for(client.call_tool("write_note", {"name": "auto-1", "text": "by rule"}), 30)
        check(not r.is_error, f"the same call again is approved again: {text_of(r)}")
        check(calls(notes) == ["write_note auto-1"] * 2, f"and it ran again, once: {calls(notes)}")
        ruled = await forwarded_once(ctx, f"stdio:{agent}", 2)
        for q in ruled:
            check((q.get("decision") or {}).get("policy", {}).get("id") == "gw-auto-notes",
                  f"approved by the policy, named: {q.get('decision')}")
            check((q.get("used") or {}).get("tool") == "write_note", f"claimed for the forward: {q.get('used')}")
        r = await asyncio.wait_for(client.call_tool("write_note", {"name": "secrets", "text": "x"}), 30)
        check(r.is_error and "gw-no-secrets" in text_of(r), f"a forbid refuses it, naming the policy: {text_of(r)}")
        check(calls(notes) == ["write_note auto-1"] * 2, f"a refused call never runs: {calls(notes)}")
        check(pending_of(ctx, agent) == [], "no person was asked")
    print("    a policy approved one gateway call at once and refused another", flush=True)


async def reject_and_timeout_flow(ctx: Context, results: Results) -> None:
    agent = "gw-reject"
    notes = ctx.scratch / agent
    async with gateway(ctx, notes, "--hold", "3", agent=agent) as client:
        call = asyncio.create_task(client.call_tool("write_note", {"name": "b", "text": "no"}))
        held = await held_request(ctx, agent)
        r = http("POST", ctx.url(f"/api/v1/requests/{held['request_id']}/decision"),
                 {"decision": "rejected", "comment": "not on a Friday"}, token=ctx.approver_token)
        check(r.status == 200, f"reject: {r.status} {r.body[:200]!r}")
        result = await asyncio.wait_for(call, 30)
        check(result.is_error, f"a rejected call is a tool error: {result}")
        check("not on a Friday" in text_of(result), f"the approver's reason reaches the agent: {text_of(result)}")
        check(calls(notes) == [], "a rejected call never runs")

        started = time.monotonic()
        result = await asyncio.wait_for(client.call_tool("write_note", {"name": "c", "text": "late"}), 30)
        waited = time.monotonic() - started
        check(result.is_error and "not approved in time" in text_of(result), f"a timeout fails closed: {text_of(result)}")
        check(2.5 <= waited <= 15, f"after the hold (3 s): {waited:.1f}s")
        late = [q for q in pending_of(ctx, agent)]
        check(late == [], f"nothing left pending after the timeout: {late}")
        # Approving it now is too late: the request is closed, nothing runs.
        check(calls(notes) == [], f"nothing ran: {calls(notes)}")
    print("    rejection's reason reached the agent; a timeout failed closed; nothing ran", flush=True)


def proxy_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


async def kill_flow(ctx: Context, results: Results) -> None:
    """kill -9 of the gateway while a call is held, then while it is forwarded."""
    agent = "gw-kill"
    notes = ctx.scratch / agent
    marker = f"gw-kill-{uuid.uuid4().hex[:8]}"

    # While held: the request stays; approving it afterwards runs nothing.
    try:
        async with gateway(ctx, notes, "--name", marker, agent=agent) as client:
            call = asyncio.create_task(client.call_tool("write_note", {"name": "k", "text": "x"}))
            held = await held_request(ctx, agent)
            for pid in proxy_pids(f"proxy --agent-name {agent} --name {marker}"):
                os.kill(pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(call, 10)
            except BaseException:  # noqa: BLE001 - the connection is gone, as it should be
                pass
    except BaseException:  # noqa: BLE001
        pass
    r = ctx.approve(held["request_id"])
    check(r.status == 200, f"approve after the kill: {r.status}")
    await asyncio.sleep(1.0)
    check(calls(notes) == [], f"an approval of a dead gateway's call runs nothing: {calls(notes)}")

    # While forwarding: slow_write is approved and claimed, then the gateway dies.
    try:
        async with gateway(ctx, notes, "--name", marker, "--forward-timeout", "2", agent=agent) as client:
            call = asyncio.create_task(client.call_tool("slow_write", {"name": "s", "text": "y", "seconds": 3}))
            held2 = await held_request(ctx, agent)
            ctx.approve(held2["request_id"])
            deadline = time.monotonic() + 10
            while request(ctx, held2["request_id"]).get("used") is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            check(request(ctx, held2["request_id"]).get("used") is not None, "the forward was claimed")
            for pid in proxy_pids(f"proxy --agent-name {agent} --name {marker}"):
                os.kill(pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(call, 10)
            except BaseException:  # noqa: BLE001
                pass
    except BaseException:  # noqa: BLE001
        pass
    await asyncio.sleep(4.5)  # past the forward timeout, and past the upstream's sleep
    ran = calls(notes)
    check(len(ran) <= 1, f"at most once: {ran}")
    # A new gateway records the cut-off forward as unknown, and never sends it again.
    async with gateway(ctx, notes, "--name", marker, "--forward-timeout", "2", agent=agent) as client:
        await client.list_tools()
        view = request(ctx, held2["request_id"])
        check((view.get("outcome") or {}).get("status") == "unknown", f"recorded as unknown: {view.get('outcome')}")
    check(calls(notes) == ran, f"never sent again: {calls(notes)}")
    print(f"    kill -9 while held: nothing ran; while forwarding: {len(ran)} run(s), outcome unknown", flush=True)


async def many_agents(ctx: Context, results: Results) -> None:
    """Many calls held at once through one gateway, each decided on its own."""
    agent = "gw-many"
    notes = ctx.scratch / agent
    count = 12
    async with gateway(ctx, notes, agent=agent) as client:
        tasks = [asyncio.create_task(client.call_tool("write_note", {"name": f"m{i}", "text": str(i)})) for i in range(count)]
        deadline = time.monotonic() + 30
        while len(pending_of(ctx, agent)) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        held = pending_of(ctx, agent)
        check(len(held) == count, f"{count} held calls, {len(held)} requests")
        for i, q in enumerate(held):
            if i % 3 == 0:
                http("POST", ctx.url(f"/api/v1/requests/{q['request_id']}/decision"), {"decision": "rejected", "comment": "no"}, token=ctx.approver_token)
            else:
                ctx.approve(q["request_id"])
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        rejected = {q["action_details"]["/name"].strip('"') for i, q in enumerate(held) if i % 3 == 0}
        ran = sorted(calls(notes))
        expected = sorted(f"write_note m{i}" for i in range(count) if f"m{i}" not in rejected)
        check(ran == expected, f"each approved call ran once, no rejected one: {ran} vs {expected}")
        check(sum(1 for a in answers if a.is_error) == len(rejected), "each rejected call is an error")
    print(f"    {count} calls held at once: {count - len(rejected)} ran once, {len(rejected)} refused", flush=True)


async def filesystem_flow(ctx: Context, results: Results) -> None:
    """The reference filesystem server (npm), untouched: reads pass, a write waits."""
    if not FILESYSTEM.exists():
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{FILESYSTEM} is missing: run `npm ci --prefix tests/upstreams` (CI=true: no skip)")
        results.note(f"filesystem server SKIPPED: {FILESYSTEM} is missing (npm ci --prefix tests/upstreams)")
        return
    agent = "gw-fs"
    root = ctx.scratch / agent
    root.mkdir(parents=True, exist_ok=True)
    (root / "readme.txt").write_text("hello from the filesystem")
    async with gateway(ctx, root, agent=agent, upstream=[str(FILESYSTEM), str(root)]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        check({"read_text_file", "write_file", "list_directory"} <= set(tools), f"the filesystem server's tools: {sorted(tools)}")
        r = await client.call_tool("read_text_file", {"path": str(root / "readme.txt")})
        check(not r.is_error and "hello from the filesystem" in text_of(r), f"a read passes: {text_of(r)}")
        check(pending_of(ctx, agent) == [], "a read makes no request")
        target = root / "written.txt"
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "approved text"}))
        held = await held_request(ctx, agent)
        check(held["action_details"].get("upstream") == "mcp-server-filesystem", f"named after the package: {held['action_details']}")
        await asyncio.sleep(0.5)
        check(not target.exists(), "nothing is written before the approval")
        ctx.approve(held["request_id"])
        result = await asyncio.wait_for(call, 30)
        check(not result.is_error and target.read_text() == "approved text", f"written once approved: {text_of(result)}")
        call = asyncio.create_task(client.call_tool("write_file", {"path": str(target), "content": "rejected text"}))
        held = await held_request(ctx, agent)
        http("POST", ctx.url(f"/api/v1/requests/{held['request_id']}/decision"), {"decision": "rejected", "comment": "keep it"}, token=ctx.approver_token)
        result = await asyncio.wait_for(call, 30)
        check(result.is_error and "keep it" in text_of(result), f"refused with the reason: {text_of(result)}")
        check(target.read_text() == "approved text", "a rejected write changes nothing")
    print("    @modelcontextprotocol/server-filesystem: reads passed, a write waited for its approval, a rejected one did nothing", flush=True)


async def remote_flow(ctx: Context, results: Results) -> None:
    """`countersign proxy --server URL`: the gateway runs next to the agent with no data
    directory, and the gate is a serve it reaches over HTTP. An agent's own token cannot
    speak for a gateway; a gateway token's held call waits (with progress), runs once
    approved, is withdrawn when the client gives up, and a kill -9 runs nothing."""
    name = "gw-remote"
    notes = ctx.scratch / name
    out = run_cli(ctx.binary, "token", "create", "--role", "agent", "--name", name,
                  "--scopes", "request,gateway", "--data-dir", str(ctx.data_dir))
    gateway_file = ctx.scratch / f"{name}.token"
    gateway_file.write_text(out.strip() + "\n")
    agent_file = ctx.scratch / f"{name}-agent.token"
    agent_file.write_text(ctx.agent_token)
    by = f"token:{name}"

    # The agent's own token: the gateway does not start (the server refuses it the
    # gateway's routes), and so nothing is asked and nothing runs.
    env = {**child_env(), "COUNTERSIGN_TOKEN_FILE": str(agent_file), "UPSTREAM_DIR": str(notes),
           "HOME": str(ctx.scratch / f"{name}-home")}
    refused = subprocess.run(
        [ctx.binary, "proxy", "--server", ctx.base_url, "--", sys.executable, str(UPSTREAM)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )
    check(refused.returncode == 2 and "gateway scope" in refused.stderr,
          f"an agent token may not speak for a gateway: exit {refused.returncode}, {refused.stderr[-300:]!r}")
    check(calls(notes) == [], "nothing ran")

    async with gateway(ctx, notes, agent=name, remote=gateway_file) as client:
        r = await client.call_tool("read_note", {"name": "r"})
        check(not r.is_error, f"a read passes through the remote gate: {text_of(r)}")
        progress: list[str] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")

        call = asyncio.create_task(client.call_tool("write_note", {"name": "r", "text": "remote"}, progress_callback=on_progress))
        held = await held_request(ctx, name, by=by)
        check(held["action_details"].get("/text") == '"remote"', f"bound on the server: {held['action_details']}")
        await asyncio.sleep(1.0)
        check(not call.done() and calls(notes) == [], "nothing runs before the approval")
        check(any(held["request_id"] in p for p in progress), f"progress names the held request: {progress}")
        ctx.approve(held["request_id"])
        result = await asyncio.wait_for(call, 30)
        check(not result.is_error and calls(notes) == ["write_note r"], f"ran once: {text_of(result)} {calls(notes)}")
        done = await with_outcome(ctx, held["request_id"])
        check((done.get("outcome") or {}).get("status") == "succeeded", f"the outcome is on the server: {done.get('outcome')}")

        # A policy approves a call at once: claimed with its approval in one write on
        # the server, run once, its outcome recorded there.
        r = await asyncio.wait_for(client.call_tool("write_note", {"name": "auto-r", "text": "ruled"}), 30)
        check(not r.is_error, f"a policy approves the remote gateway's call: {text_of(r)}")
        check(calls(notes) == ["write_note r", "write_note auto-r"], f"ran once: {calls(notes)}")
        ruled = [q for q in await forwarded_once(ctx, by, 2) if q["action_details"].get("/name") == '"auto-r"']
        check(len(ruled) == 1 and (ruled[0].get("decision") or {}).get("policy", {}).get("id") == "gw-auto-notes",
              f"approved by the policy: {ruled}")

        # The client gives up: the request is withdrawn on the server, and stays so.
        call = asyncio.create_task(client.call_tool("write_note", {"name": "gone", "text": "never"}))
        held = await held_request(ctx, name, by=by)
        call.cancel()
        deadline = time.monotonic() + 10
        while request(ctx, held["request_id"])["status"] == "pending" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        check(request(ctx, held["request_id"])["status"] == "cancelled", f"withdrawn: {request(ctx, held['request_id'])['status']}")
        check(ctx.approve(held["request_id"]).status != 200, "a withdrawn call cannot be approved")
    check(calls(notes) == ["write_note r", "write_note auto-r"], f"nothing else ran: {calls(notes)}")
    check(not (ctx.scratch / f"{name}-home").exists(), "the remote gateway made no data directory")
    print("    remote gateway: agent token refused; held with progress, ran once; withdrawn when the client gave up", flush=True)


def test_gateway(ctx: Context, results: Results) -> None:
    async def run() -> None:
        await approve_flow(ctx, results)
        await filesystem_flow(ctx, results)
        await policy_flow(ctx, results)
        await reject_and_timeout_flow(ctx, results)
        await many_agents(ctx, results)
        await kill_flow(ctx, results)
        await remote_flow(ctx, results)

    asyncio.run(run())
