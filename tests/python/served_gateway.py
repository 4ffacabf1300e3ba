"""The MCP gateway that `serve` runs (`[[gateway]]` in its config, served at
`/mcp/gateway/<name>`), from outside: a second countersign serve of its own, in front of
three upstreams not written by countersign (upstream_server.py over stdio and over
Streamable HTTP, made with the official SDK's MCPServer, and the reference
@modelcontextprotocol/server-filesystem from npm), called by the official Python client
over Streamable HTTP with agent tokens.

What must hold (docs/gateway.md): the upstreams' tools are combined under
`<upstream>__<tool>` with their schemas and annotations; only a trusted upstream's
read-only tool passes unasked; a held call does nothing until approved, runs once after the
approval with exactly the approved arguments, never after a rejection; a retry of the same
call joins the same request and still runs once; many agents through one gateway are
decided each on their own; a token that may not ask is refused; kill -9 of the server while
a call is held runs nothing, and while a call is being forwarded runs it at most once, the
restarted server recording the outcome as `unknown`. And the remote client
(`countersign proxy --server`) works against this second serve too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import mcp
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from gateway import FILESYSTEM, UPSTREAM, calls, text_of
from harness import Context, Results, Server, check, child_env, create_token, http

GATEWAY = "tools"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A serve of its own with a [[gateway]] of three upstreams, its tokens, and an HTTP
    upstream process."""

    def __init__(self, ctx: Context):
        self.binary = ctx.binary
        self.root = ctx.scratch / "served"
        self.data_dir = self.root / "data"
        self.data_dir.mkdir(parents=True, mode=0o700)
        self.notes = self.root / "notes"  # the stdio upstream's
        self.http_notes = self.root / "http-notes"  # the HTTP upstream's
        self.files = self.root / "files"  # the filesystem server's root
        self.files.mkdir()
        (self.files / "readme.txt").write_text("hello from the filesystem")
        port = free_port()
        self.http_upstream = subprocess.Popen(
            [sys.executable, str(UPSTREAM), "--http", str(port)],
            env={**child_env(), "UPSTREAM_DIR": str(self.http_notes)},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        fs = f'[[gateway.upstream]]\nname = "fs"\ncommand = ["{FILESYSTEM}", "{self.files}"]\ntrusted = true\n' if FILESYSTEM.exists() else ""
        (self.data_dir / "countersign.toml").write_text(
            f'[[gateway]]\nname = "{GATEWAY}"\nhold_seconds = 30\nforward_timeout_seconds = 2\n\n'
            f'[[gateway.upstream]]\nname = "notes"\ncommand = ["{sys.executable}", "{UPSTREAM}"]\n'
            f'env = {{ UPSTREAM_DIR = "{self.notes}" }}\ntrusted = true\n\n'
            f'[[gateway.upstream]]\nname = "remote"\nurl = "http://127.0.0.1:{port}/mcp"\n\n'
            + fs
        )
        self.agents = {name: create_token(self.binary, self.data_dir, "agent", name) for name in ("alpha", "beta", "gamma")}
        self.rooms_only = self._token("agent", "rooms-only", "--scopes", "rooms")
        self.approver = create_token(self.binary, self.data_dir, "approver", "served-approver")
        self.server = Server(self.binary, self.data_dir)

    def _token(self, role: str, name: str, *extra: str) -> str:
        out = subprocess.run(
            [self.binary, "token", "create", "--role", role, "--name", name, *extra, "--data-dir", str(self.data_dir)],
            env=child_env(), capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return out.strip()

    def start(self) -> None:
        self.server = Server(self.binary, self.data_dir)
        self.server.start()

    def kill(self) -> None:
        """kill -9 of serve (its stdio upstreams lose their parent and their stdin)."""
        assert self.server.proc
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait(10)

    def url(self, path: str) -> str:
        return self.server.base_url + path

    def request(self, rid: str) -> dict[str, Any]:
        r = http("GET", self.url(f"/api/v1/requests/{rid}"), token=self.approver)
        check(r.status == 200, f"get {rid}: {r.status} {r.body[:200]!r}")
        return r.json()

    def pending(self, agent: str) -> list[dict[str, Any]]:
        r = http("GET", self.url("/api/v1/requests?status=pending"), token=self.approver)
        check(r.status == 200, f"list pending: {r.status}")
        body = r.json()
        items = body["requests"] if isinstance(body, dict) else body
        return [q for q in items if q["requested_by"] == f"token:{agent}"]

    async def held(self, agent: str, count: int = 1, within: float = 20) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = self.pending(agent)
            if len(found) >= count:
                check(len(found) == count, f"{count} held call(s), {len(found)} requests: {found}")
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(f"no {count} pending request(s) from token:{agent} within {within}s")

    def decide(self, rid: str, decision: str, comment: str | None = None) -> int:
        body: dict[str, Any] = {"decision": decision}
        if comment:
            body["comment"] = comment
        return http("POST", self.url(f"/api/v1/requests/{rid}/decision"), body, token=self.approver).status

    def stop(self) -> None:
        self.server.stop()
        self.http_upstream.terminate()
        try:
            self.http_upstream.wait(10)
        except subprocess.TimeoutExpired:
            self.http_upstream.kill()


@asynccontextmanager
async def client(served: Served, token: str | None, gateway: str = GATEWAY) -> AsyncIterator[mcp.Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http_client:
        transport = streamable_http_client(served.url(f"/mcp/gateway/{gateway}"), http_client=http_client)
        async with mcp.Client(transport) as c:
            yield c


async def combined_and_held(served: Served) -> None:
    async with client(served, served.agents["alpha"]) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        expected = {"notes__read_note", "notes__write_note", "notes__slow_write", "remote__read_note", "remote__write_note"}
        check(expected <= set(tools), f"the upstreams' tools, prefixed: {sorted(tools)}")
        if FILESYSTEM.exists():
            check({"fs__read_text_file", "fs__write_file"} <= set(tools), f"and the filesystem server's: {sorted(tools)}")
        check(tools["notes__read_note"].annotations.read_only_hint is True, "annotations kept")
        check("text" in tools["notes__write_note"].input_schema.get("properties", {}), "schemas kept")

        # A trusted upstream's read passes unasked; the same tool of an untrusted one waits.
        r = await c.call_tool("notes__read_note", {"name": "a"})
        check(not r.is_error and "(none)" in text_of(r), f"a trusted read passes: {text_of(r)}")
        check(served.pending("alpha") == [], "no request for it")
        call = asyncio.create_task(c.call_tool("remote__read_note", {"name": "a"}))
        held = (await served.held("alpha"))[0]
        check(held["action_details"].get("upstream") == "remote", f"the untrusted upstream's read is held: {held['action_details']}")
        check(served.decide(held["request_id"], "approved") == 200, "approve")
        r = await asyncio.wait_for(call, 30)
        check(not r.is_error, f"then it runs: {text_of(r)}")

        # A write: held, nothing runs before the approval, then once, as approved.
        call = asyncio.create_task(c.call_tool("notes__write_note", {"name": "a", "text": "hello"}))
        held = (await served.held("alpha"))[0]
        details = held["action_details"]
        check(details.get("upstream") == "notes" and details.get("tool") == "write_note", f"upstream and tool, unprefixed: {details}")
        check(details.get("/text") == '"hello"', f"every argument bound: {details}")
        await asyncio.sleep(1.0)
        check(not call.done() and calls(served.notes) == [], "nothing runs before the approval")
        check(served.decide(held["request_id"], "approved") == 200, "approve")
        r = await asyncio.wait_for(call, 30)
        check(not r.is_error and calls(served.notes) == ["write_note a"], f"ran once: {text_of(r)} {calls(served.notes)}")
        check((served.notes / "a").read_text() == "hello", "with the approved arguments")
        # The outcome is written beside the answer: it may land just after it.
        deadline = time.monotonic() + 10
        done = served.request(held["request_id"])
        while not done.get("outcome") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            done = served.request(held["request_id"])
        check((done.get("outcome") or {}).get("status") == "succeeded", f"outcome recorded: {done.get('outcome')}")
        check(done["requested_by"] == "token:alpha", "as the calling agent")

        # The HTTP upstream: a write waits, a rejection's reason reaches the agent.
        call = asyncio.create_task(c.call_tool("remote__write_note", {"name": "r", "text": "no"}))
        held = (await served.held("alpha"))[0]
        check(served.decide(held["request_id"], "rejected", "not this one") == 200, "reject")
        r = await asyncio.wait_for(call, 30)
        check(r.is_error and "not this one" in text_of(r), f"the reason reaches the agent: {text_of(r)}")
        check(calls(served.http_notes) == [], "a rejected call never runs")

        # Two identical calls at once: one request, one run.
        first = asyncio.create_task(c.call_tool("notes__write_note", {"name": "twice", "text": "x"}))
        await served.held("alpha")
        second = asyncio.create_task(c.call_tool("notes__write_note", {"name": "twice", "text": "x"}))
        await asyncio.sleep(1.0)
        held = await served.held("alpha")
        check(served.decide(held[0]["request_id"], "approved") == 200, "approve")
        answers = await asyncio.wait_for(asyncio.gather(first, second), 30)
        check(sum(1 for a in answers if not a.is_error) == 1, f"one of the two runs: {[text_of(a) for a in answers]}")
        check(calls(served.notes).count("write_note twice") == 1, f"once: {calls(served.notes)}")

        if FILESYSTEM.exists():
            r = await c.call_tool("fs__read_text_file", {"path": str(served.files / "readme.txt")})
            check(not r.is_error and "hello from the filesystem" in text_of(r), f"a filesystem read passes: {text_of(r)}")
            target = served.files / "out.txt"
            call = asyncio.create_task(c.call_tool("fs__write_file", {"path": str(target), "content": "approved"}))
            held = (await served.held("alpha"))[0]
            check(not target.exists(), "not written before the approval")
            served.decide(held["request_id"], "approved")
            r = await asyncio.wait_for(call, 30)
            check(not r.is_error and target.read_text() == "approved", f"written once approved: {text_of(r)}")
    print("    combined upstreams: trusted read passed, untrusted read and writes held, ran once; retry joined", flush=True)


async def who_may_call(served: Served) -> None:
    r = http("POST", served.url(f"/mcp/gateway/{GATEWAY}"), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
             headers={"Accept": "application/json, text/event-stream"})
    check(r.status == 401, f"no token: {r.status}")
    r = http("POST", served.url(f"/mcp/gateway/{GATEWAY}"), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
             token=served.rooms_only, headers={"Accept": "application/json, text/event-stream"})
    check(r.status == 403 and b"request scope" in r.body, f"a token that may not ask: {r.status} {r.body[:200]!r}")
    r = http("POST", served.url("/mcp/gateway/nope"), {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
             token=served.agents["alpha"], headers={"Accept": "application/json, text/event-stream"})
    check(r.status == 404 and b"[[gateway]]" in r.body, f"an unknown gateway: {r.status} {r.body[:200]!r}")
    async with client(served, served.approver) as c:
        r = await c.call_tool("notes__write_note", {"name": "by-approver", "text": "x"})
        check(r.is_error and "agent token" in text_of(r), f"an approver's token does not call through: {text_of(r)}")
    check("write_note by-approver" not in calls(served.notes), "and nothing ran")
    print("    no token 401, a token that may not ask 403, an unknown gateway 404, an approver refused", flush=True)


async def many_agents(served: Served) -> None:
    """Three agents, four calls each, at once through one gateway."""
    per = 4
    async def agent(name: str) -> list[Any]:
        async with client(served, served.agents[name]) as c:
            tasks = [asyncio.create_task(c.call_tool("notes__write_note", {"name": f"{name}{i}", "text": str(i)})) for i in range(per)]
            held = await served.held(name, per, within=30)
            for q in held:
                rejected = q["action_details"]["/name"] in (f'"{name}0"', f'"{name}2"')
                served.decide(q["request_id"], "rejected" if rejected else "approved", "no" if rejected else None)
            return await asyncio.wait_for(asyncio.gather(*tasks), 60)
    answers = await asyncio.gather(agent("beta"), agent("gamma"))
    for name, results in zip(("beta", "gamma"), answers):
        ran = sorted(c for c in calls(served.notes) if c.startswith(f"write_note {name}"))
        check(ran == [f"write_note {name}1", f"write_note {name}3"], f"{name}: each approved call once, no rejected one: {ran}")
        check([r.is_error for r in results] == [True, False, True, False], f"{name}: answers match decisions")
    print(f"    two agents x {per} calls at once: each decided on its own", flush=True)


async def kill_while_held_and_forwarding(served: Served) -> None:
    # While held: the restarted server leaves the request pending; approving it runs nothing.
    held: dict[str, Any] = {}
    try:
        async with client(served, served.agents["alpha"]) as c:
            call = asyncio.create_task(c.call_tool("notes__write_note", {"name": "k", "text": "x"}))
            held = (await served.held("alpha"))[0]
            served.kill()
            try:
                await asyncio.wait_for(call, 10)
            except BaseException:  # noqa: BLE001 - the server is gone, as it should be
                pass
    except BaseException:  # noqa: BLE001
        if not held:
            raise
    served.start()
    check(served.decide(held["request_id"], "approved") == 200, "approve after the kill")
    await asyncio.sleep(1.5)
    check("write_note k" not in calls(served.notes), f"nothing ran: {calls(served.notes)}")

    # While forwarding: slow_write approved and claimed, then the server dies.
    held = {}
    claimed = False
    try:
        async with client(served, served.agents["alpha"]) as c:
            call = asyncio.create_task(c.call_tool("notes__slow_write", {"name": "s", "text": "y", "seconds": 3}))
            held = (await served.held("alpha"))[0]
            served.decide(held["request_id"], "approved")
            deadline = time.monotonic() + 10
            while served.request(held["request_id"]).get("used") is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            claimed = served.request(held["request_id"]).get("used") is not None
            served.kill()
            try:
                await asyncio.wait_for(call, 10)
            except BaseException:  # noqa: BLE001
                pass
    except BaseException:  # noqa: BLE001
        if not held:
            raise
    check(claimed, "the forward was claimed before the kill")
    served.start()
    # The restarted server sweeps forwards older than its forward timeout (2 s) and a
    # margin (2 s): the cut-off one is recorded as unknown, and never sent again.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        outcome = served.request(held["request_id"]).get("outcome")
        if outcome:
            break
        await asyncio.sleep(0.25)
    check((outcome or {}).get("status") == "unknown", f"recorded as unknown: {outcome}")
    await asyncio.sleep(3.5)  # past the upstream's sleep
    ran = [c for c in calls(served.notes) if c == "slow_write s"]
    check(len(ran) <= 1, f"at most once: {ran}")
    async with client(served, served.agents["alpha"]) as c:
        r = await c.call_tool("notes__read_note", {"name": "a"})
        check(not r.is_error, "the restarted server's gateway works")
    print(f"    kill -9 of serve while held: nothing ran; while forwarding: {len(ran)} run(s), outcome unknown", flush=True)


async def remote_proxy(served: Served, ctx: Context) -> None:
    """`countersign proxy --server` against this second serve, with a gateway token."""
    token = served._token("agent", "laptop", "--scopes", "request,gateway")
    token_file = served.root / "laptop.token"
    token_file.write_text(token + "\n")
    notes = served.root / "laptop-notes"
    env = {"UPSTREAM_DIR": str(notes), "COUNTERSIGN_TOKEN_FILE": str(token_file), "HOME": str(served.root / "laptop-home")}
    params = mcp.StdioServerParameters(
        command=ctx.binary, args=["proxy", "--server", served.server.base_url, "--", sys.executable, str(UPSTREAM)], env=env,
    )
    with open(served.root / "laptop-proxy.log", "a", encoding="utf-8") as errlog:
        async with mcp.Client(stdio_client(params, errlog=errlog), mode="legacy") as c:
            call = asyncio.create_task(c.call_tool("write_note", {"name": "l", "text": "remote"}))
            held = (await served.held("laptop"))[0]
            served.decide(held["request_id"], "approved")
            r = await asyncio.wait_for(call, 30)
            check(not r.is_error and calls(notes) == ["write_note l"], f"ran once: {text_of(r)}")
    print("    the remote client against the second serve: held, approved there, ran once", flush=True)


async def stdio_and_doctor(served: Served, ctx: Context) -> None:
    """`countersign proxy --gateway tools`: the same configured gateway over stdio, on the
    data directory; `countersign doctor` reaches every upstream."""
    out = subprocess.run([ctx.binary, "doctor", "--data-dir", str(served.data_dir)], env=child_env(),
                         capture_output=True, text=True, timeout=120)
    check("ok    gateway tools upstream notes" in out.stdout and "3 tools, 1 marked read-only" in out.stdout,
          f"doctor reaches the stdio upstream: {out.stdout}")
    check("ok    gateway tools upstream remote (http://127.0.0.1:" in out.stdout and "(not trusted: they are held like the rest)" in out.stdout,
          f"and the HTTP one: {out.stdout}")
    params = mcp.StdioServerParameters(
        command=ctx.binary, args=["--data-dir", str(served.data_dir), "proxy", "--gateway", GATEWAY, "--agent-name", "local"],
        env={"HOME": str(served.root / "local-home")},
    )
    with open(served.root / "local-proxy.log", "a", encoding="utf-8") as errlog:
        async with mcp.Client(stdio_client(params, errlog=errlog), mode="legacy") as c:
            names = {t.name for t in (await c.list_tools()).tools}
            check({"notes__write_note", "remote__write_note"} <= names, f"the configured upstreams, prefixed: {sorted(names)}")
            call = asyncio.create_task(c.call_tool("remote__write_note", {"name": "local", "text": "stdio"}))
            deadline = time.monotonic() + 20
            held: list[dict[str, Any]] = []
            while not held and time.monotonic() < deadline:
                r = http("GET", served.url("/api/v1/requests?status=pending"), token=served.approver)
                body = r.json()
                held = [q for q in (body["requests"] if isinstance(body, dict) else body) if q["requested_by"] == "stdio:local"]
                await asyncio.sleep(0.1)
            check(len(held) == 1, f"held on the data directory: {held}")
            served.decide(held[0]["request_id"], "approved")
            r = await asyncio.wait_for(call, 30)
            check(not r.is_error and "write_note local" in calls(served.http_notes), f"ran once: {text_of(r)}")
    print("    proxy --gateway over stdio: the configured upstreams, held and run once; doctor reached both", flush=True)


def test_served_gateway(ctx: Context, results: Results) -> None:
    served = Served(ctx)
    try:
        served.start()

        async def run() -> None:
            await who_may_call(served)
            await combined_and_held(served)
            await many_agents(served)
            await remote_proxy(served, ctx)
            await stdio_and_doctor(served, ctx)
            await kill_while_held_and_forwarding(served)

        asyncio.run(run())
    except BaseException:
        print("--- stderr of the second serve:\n" + "\n".join(served.server.log[-80:]), flush=True)
        raise
    finally:
        served.stop()
