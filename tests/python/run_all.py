#!/usr/bin/env python3
"""Runs the whole outside-in suite against a countersign it starts itself.

    COUNTERSIGN_BIN=target/debug/countersign python3 tests/python/run_all.py

It creates a temporary data directory, an agent and an approver token (`countersign token
create`), starts `countersign serve --listen 127.0.0.1:0`, and runs:

- verify_proof.self_check: the action digest against testdata/action-digest.json, PAE and
  the RFC 7638 thumbprint against published examples;
- the HTTP security checks (urllib);
- the official MCP client over stdio (`countersign mcp` on the same data directory) and
  over Streamable HTTP, each with the newest protocol (mode="auto": server/discover,
  2026-07-28) and with the initialize handshake (mode="legacy", 2025-11-25), side by side;
- the official client without a token;
- policies: a rule's approval and refusal and a fallback's approval, made with the
  official client, their proofs checked by verify_proof and the policy set's digest
  recomputed;
- the MCP gateway (gateway.py): `countersign proxy` in front of an upstream made with the
  official SDK (upstream_server.py), launched by the official client: passes, holds,
  approvals, rejections, timeouts, many calls at once, kill -9 while held and forwarding;
- the gateway `serve` runs (served_gateway.py): a second serve with a [[gateway]] of three
  upstreams (stdio, Streamable HTTP, the npm filesystem server), called over HTTP by the
  official client with several agent tokens, kill -9 of serve while held and forwarding,
  and `proxy --server` against that second serve;
- the LoopPause profile (looppause.py): the seed's example calls and flows with the
  official client over `/mcp/profile/looppause` and `countersign mcp --profile looppause`
  (local, and relayed with LOOPPAUSE_API_URL / LOOPPAUSE_API_KEY), the seed's key path,
  and `sha256=` HMAC webhooks checked by webhook_receiver.py --format looppause;
- verify_log: an independent verifier of the transparency log and evidence bundles,
  written from docs/log-format.md (Merkle self-check against RFC 9162 vectors; every entry,
  inclusion and consistency proof and checkpoint of the live log; bundles, full mode and a
  key rotation on a server of its own; tampered proofs, checkpoints and bundles refused;
  room and account events made over REST and the CLI, in their documented shapes).

Exit status: 0 when every test passed, 1 when one failed, 2 when the suite could not run.
The last line is "python: N passed, N failed".
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gateway  # noqa: E402
import looppause  # noqa: E402
import served_gateway  # noqa: E402
import mcp_clients  # noqa: E402
import verify_log  # noqa: E402
import verify_proof  # noqa: E402
from harness import Context, Results, Server, create_token  # noqa: E402


def log_and_bundles(ctx: Context, results: Results) -> None:
    verify_log.test_live_log(ctx, results)
    verify_log.test_evidence_bundles(ctx, results)


def main() -> int:
    started = time.monotonic()
    binary = os.environ.get("COUNTERSIGN_BIN") or os.environ.get("COUNTERSIGN_TEST_BIN")
    if not binary:
        print("error: set COUNTERSIGN_BIN to the countersign binary (e.g. target/debug/countersign)", file=sys.stderr)
        return 2
    binary = str(Path(binary).resolve())
    if not os.access(binary, os.X_OK):
        print(f"error: COUNTERSIGN_BIN={binary} is not an executable file", file=sys.stderr)
        return 2

    results = Results()
    print("--- verify_proof self-check (known answers)", flush=True)
    results.run("verify_proof known answers", lambda: print(f"    {verify_proof.self_check()} vectors"))
    results.run("verify_log self-check (RFC 9162)", lambda: print(f"    {verify_log.self_check()} proofs"))

    scratch = Path(tempfile.mkdtemp(prefix="countersign-pytest-"))
    data_dir = scratch / "data"
    data_dir.mkdir(mode=0o700)
    # A request may name ops@example.com as a recipient (a known one); nothing is sent.
    # Policies for tools only test_policy_proofs names; every other request matches none.
    (data_dir / mcp_clients.POLICY_FILE).write_text(mcp_clients.POLICIES)
    (data_dir / "countersign.toml").write_text(
        '[notify]\nallowed_recipients = ["email:ops@example.com"]\n\n'
        f'[policy]\nfiles = ["{mcp_clients.POLICY_FILE}"]\n'
    )
    server = Server(binary, data_dir)
    keep = os.environ.get("COUNTERSIGN_TEST_KEEP") == "1"
    try:
        try:
            agent_name, approver_name = "py-agent", "py-approver"
            agent = create_token(binary, data_dir, "agent", agent_name)
            approver = create_token(binary, data_dir, "approver", approver_name)
            server.start()
        except Exception as e:  # noqa: BLE001
            print(f"error: could not start countersign: {e}", file=sys.stderr)
            return 2
        print(f"countersign at {server.base_url}, data directory {data_dir}", flush=True)
        ctx = Context(
            binary=binary,
            data_dir=data_dir,
            base_url=server.base_url,
            agent_token=agent,
            approver_token=approver,
            agent_name=agent_name,
            approver_name=approver_name,
            scratch=scratch,
        )
        results.run("HTTP auth, Origin/Host and roles", lambda: mcp_clients.test_http_security(ctx, results))
        results.run("official MCP client without a token", lambda: mcp_clients.test_http_client_without_token(ctx, results))
        # Each flow waits out a 6 s "human"; side by side they take that long once.
        results.run_parallel(
            [
                ("official MCP client over stdio (auto)", lambda: mcp_clients.test_mcp_stdio(ctx, results, "auto")),
                ("official MCP client over stdio (legacy)", lambda: mcp_clients.test_mcp_stdio(ctx, results, "legacy")),
                ("official MCP client relayed by `countersign mcp --server` (auto)", lambda: mcp_clients.test_mcp_relay(ctx, results, "auto")),
                ("official MCP client relayed by `countersign mcp --server` (legacy)", lambda: mcp_clients.test_mcp_relay(ctx, results, "legacy")),
                ("official MCP client over Streamable HTTP (auto)", lambda: mcp_clients.test_mcp_http(ctx, results, "auto")),
                ("official MCP client over Streamable HTTP (legacy)", lambda: mcp_clients.test_mcp_http(ctx, results, "legacy")),
                ("transparency log and evidence bundles (independent verifier)", lambda: log_and_bundles(ctx, results)),
                ("full-mode bundle, review and key rotation (independent verifier)", lambda: verify_log.test_full_mode_bundle(binary, scratch, results)),
                ("room and account events (independent verifier)", lambda: verify_log.test_rooms_and_accounts(ctx, results)),
                ("policy and fallback proofs (independent verifier)", lambda: mcp_clients.test_policy_proofs(ctx, results)),
                ("MCP gateway in front of an upstream made with the official SDK", lambda: gateway.test_gateway(ctx, results)),
                ("MCP gateway run by serve ([[gateway]], /mcp/gateway/<name>)", lambda: served_gateway.test_served_gateway(ctx, results)),
                ("LoopPause profile: the seed's flows over HTTP and LOOPPAUSE_* relay, its key path and sha256= webhooks", lambda: looppause.test_looppause(binary, scratch, results)),
                ("LoopPause profile over local stdio", lambda: looppause.test_local_stdio(binary, scratch, results)),
            ]
        )
        results.run("the whole log after every test (independent verifier)", lambda: verify_log.test_whole_log_at_the_end(ctx, results))
        if server.proc and server.proc.poll() is not None:
            results.failed.append(("server stayed up", f"countersign serve exited with {server.proc.returncode}"))
    finally:
        server.stop()
        if results.failed and server.log:
            print("--- stderr of countersign serve:\n" + "\n".join(server.log[-200:]), flush=True)
        if keep or results.failed:
            print(f"kept {scratch} for inspection", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"--- done in {time.monotonic() - started:.1f}s", flush=True)
    for text in results.xfailed:
        print(f"known bug (xfail): {text}")
    for text in results.notes:
        print(f"note: {text}")
    for name, _ in results.failed:
        print(f"FAILED: {name}")
    print(f"python: {len(results.passed)} passed, {len(results.failed)} failed", flush=True)
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
