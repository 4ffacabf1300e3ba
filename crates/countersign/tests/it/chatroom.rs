//! The agent chatroom's flows (shared/seeds/004, docs/rooms.md): the chatroom profile's
//! blocking `request_approval` over Streamable HTTP (`/mcp/profile/chatroom`) and over
//! stdio (`countersign mcp --profile chatroom`), with a real MCP client (rmcp's), decided
//! by a person over REST (and relayed from stdio to a server's profile with `--server`);
//! and `serve` listening beyond loopback, printing the addresses
//! a phone on the same network reaches it at, which it then answers to.

use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

use crate::approval_gate::{call, over_http};
use crate::common::{self, McpClient, Server, create_token, skip};

const PROFILE_PATH: &str = "/mcp/profile/chatroom";

/// The pending request described `description`, as the approver lists it.
async fn pending(server: &Server, approver: &str, description: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, list) = server
            .get("/api/v1/requests?status=pending", Some(approver))
            .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        if let Some(id) = list["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["action_description"] == description)
            .and_then(|r| r["request_id"].as_str())
        {
            return id.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no pending request {description:?}: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// request_approval in a task: the call blocks until the request is decided.
fn ask(
    client: &McpClient,
    args: Value,
) -> tokio::task::JoinHandle<Result<(String, Value), String>> {
    let peer = client.peer().clone();
    tokio::spawn(async move { call(&peer, "request_approval", args).await })
}

/// The seed's flows against one client: approve, reject with a reason, time out.
async fn flows(server: &Server, client: &McpClient, approver: &str, label: &str) {
    let names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    for tool in [
        "request_approval",
        "check_approval",
        "record_action",
        "post_message",
        "read_messages",
        "wait_for_message",
        "join_room",
        "leave_room",
        "set_presence",
        "wait_for_feedback",
        "report_blocker",
    ] {
        assert!(
            names.contains(&tool.to_string()),
            "{label}: {tool} missing: {names:?}"
        );
    }
    for absent in [
        "approve",
        "list_pending_approvals",
        "kick",
        "record_decision",
    ] {
        assert!(
            !names.contains(&absent.to_string()),
            "{label}: {absent} offered"
        );
    }

    // Approved: the one call returns the decision and its proof.
    let description = format!("{label}: deploy release 42 to production");
    let waiting = ask(
        client,
        json!({"action_description": description, "action_details": {"release": "42"}, "timeout_seconds": 120}),
    );
    let id = pending(server, approver, &description).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "{label}: request_approval returned before a decision"
    );
    let (status, body) = server.decide(&id, approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, approved) = waiting.await.unwrap().expect("request_approval");
    assert_eq!(approved["request_id"], id.as_str());
    assert_eq!(approved["status"], "approved", "{approved}");
    assert!(
        approved["proof"].is_object(),
        "the proof comes with it: {approved}"
    );
    let (_, used) = call(
        client.peer(),
        "record_action",
        json!({"request_id": id, "tool": "deploy"}),
    )
    .await
    .expect("record_action");
    assert_eq!(used["request_id"], id.as_str());

    // Rejected: the reason reaches the agent.
    let description = format!("{label}: drop the staging database");
    let waiting = ask(
        client,
        json!({"action_description": description, "timeout_seconds": 120}),
    );
    let id = pending(server, approver, &description).await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(approver),
            &json!({"decision": "rejected", "comment": "not during the release"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (text, rejected) = waiting.await.unwrap().expect("request_approval");
    assert_eq!(rejected["status"], "rejected");
    assert!(text.contains("not during the release"), "{text}");

    // Nobody answers: timeout_seconds is the wait and the expiry, and it fails closed.
    let description = format!("{label}: call the payments API");
    let started = Instant::now();
    let (_, timed_out) = call(
        client.peer(),
        "request_approval",
        json!({"action_description": description, "timeout_seconds": 1}),
    )
    .await
    .expect("request_approval");
    assert_eq!(timed_out["status"], "timed_out", "{timed_out}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let id = timed_out["request_id"].as_str().unwrap();
    let (_, view) = server
        .get(&format!("/api/v1/requests/{id}"), Some(approver))
        .await;
    assert_eq!(view["status"], "timed_out", "closed for everyone: {view}");

    // The room gates: a question times out and the agent proceeds; a blocker holds
    // until a person resolves it, and the agent reads the reply.
    let room = format!("{label}-room");
    call(client.peer(), "join_room", json!({"room": room}))
        .await
        .expect("join_room");
    call(
        client.peer(),
        "post_message",
        json!({"room": room, "text": "starting", "type": "progress"}),
    )
    .await
    .expect("post_message");
    let (_, feedback) = call(
        client.peer(),
        "wait_for_feedback",
        json!({"room": room, "question": "Blue or green?", "timeout_seconds": 1}),
    )
    .await
    .expect("wait_for_feedback");
    assert_eq!(feedback["answered"], false, "{feedback}");
    let (_, blocker) = call(
        client.peer(),
        "report_blocker",
        json!({"room": room, "description": "the staging key expired"}),
    )
    .await
    .expect("report_blocker");
    let blocker_id = blocker["blocker_id"].as_str().unwrap().to_string();
    let (status, body) = server
        .post(
            &format!("/api/v1/rooms/{room}/blockers/{blocker_id}/resolve"),
            Some(approver),
            &json!({"reply": "rotated it"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, resolution) = call(
        client.peer(),
        "wait_for_resolution",
        json!({"room": room, "blocker_id": blocker_id, "timeout_seconds": 5}),
    )
    .await
    .expect("wait_for_resolution");
    assert_eq!(resolution["resolved"], true, "{resolution}");
    assert_eq!(resolution["reply"], "rotated it");

    // What the profile refuses, with the reason.
    let refused = call(
        client.peer(),
        "request_approval",
        json!({"action_description": "x", "timeout_hours": 1}),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("timeout_seconds"), "{refused}");
    let refused = call(
        client.peer(),
        "request_approval",
        json!({"action_description": "x", "timeout_seconds": 100000}),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("86400"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chatroom_request_approval_blocks_until_a_person_decides_over_http_and_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let agent = create_token(data, "agent", "chat-bot").await;
    let approver = create_token(data, "approver", "alice@example.com").await;
    let server = Server::start(data);

    let http = over_http(&server.url(PROFILE_PATH), &agent).await;
    flows(&server, &http, &approver, "http").await;

    let (transport, _stderr) = TokioChildProcess::builder(common::command(
        data,
        &["mcp", "--profile", "chatroom", "--agent-name", "chat-stdio"],
    ))
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn countersign mcp --profile chatroom");
    let stdio = tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed");
    flows(&server, &stdio, &approver, "stdio").await;

    // A stdio client of a team server: relayed to its /mcp/profile/chatroom as the token.
    let relay_token = create_token(data, "agent", "chat-relay").await;
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, &relay_token).unwrap();
    let mut cmd = common::bare_command();
    cmd.args([
        "mcp",
        "--profile",
        "chatroom",
        "--server",
        &server.base,
        "--token-file",
    ])
    .arg(&token_file);
    let (transport, _stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn countersign mcp --profile chatroom --server");
    let relayed = tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed");
    flows(&server, &relayed, &approver, "relay").await;

    let (status, body) = server.get("/mcp/profile/nope", Some(&agent)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.to_string().contains("/mcp/profile/chatroom"), "{body}");
}

#[tokio::test]
async fn serve_beyond_loopback_prints_where_a_phone_reaches_it_and_answers_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(common::bin());
    cmd.args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path());
    let server = Server::spawn(cmd);
    let port = server.addr.port();
    // The addresses are printed just after the `listening on` line Server::spawn waits for.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = server.stderr();
    while !log.contains("setup?token=") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        log = server.stderr();
    }
    let Some(line) = log.lines().find(|l| l.contains("reach it from a phone")) else {
        if log.contains("no network address of this machine") {
            return skip("this machine has no network address besides loopback");
        }
        panic!("no line says where a phone reaches serve:\n{log}");
    };
    let urls: Vec<&str> = line
        .split_whitespace()
        .filter(|w| w.starts_with("http://"))
        .collect();
    assert!(!urls.is_empty(), "{line}");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for url in &urls {
        assert!(url.ends_with(&format!(":{port}/")), "{url}");
        let host: std::net::IpAddr = url
            .trim_start_matches("http://")
            .rsplit_once(':')
            .unwrap()
            .0
            .trim_matches(['[', ']'])
            .parse()
            .unwrap();
        assert!(!host.is_loopback() && host.is_ipv4(), "{url}");
        // The address answers: Host is that address, and the sign-in page loads.
        let health = client.get(format!("{url}healthz")).send().await.unwrap();
        assert_eq!(health.status(), StatusCode::OK, "{url}healthz");
        let login = client.get(format!("{url}login")).send().await.unwrap();
        assert_eq!(login.status(), StatusCode::OK, "{url}login");
        // A form posted from that origin passes the Origin check (and fails on the
        // password, not on the host).
        let origin = url.trim_end_matches('/');
        let posted = client
            .post(format!("{url}login"))
            .header("origin", origin)
            .form(&[("username", "nobody"), ("password", "wrong")])
            .send()
            .await
            .unwrap();
        let status = posted.status();
        let body = posted.text().await.unwrap();
        assert!(!body.contains("forbidden_host"), "{status} {body}");
    }
    // Another name is still refused: the addresses are allowed, not every host.
    let refused = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .header("host", format!("attacker.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    // Links (the first admin's setup link among them) use the first address.
    let first = urls[0].trim_end_matches('/');
    assert!(
        log.contains(&format!("{first}/setup?token=")),
        "the setup link names {first}:\n{log}"
    );
}
