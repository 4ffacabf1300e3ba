//! `countersign hook claude-code | cursor` driven with the exact JSON the clients'
//! documentation shows (testdata/hooks/*/, with their sources and dates): allow once
//! approved, deny with the approver's reason, deny and withdraw on timeout, a retried
//! identical call joining the same request, and a read-only tool passing with no request.
//! Claude Code and Cursor cannot run here; their documented shapes are the contract.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::common::{self, allow_unattended_cli, run_ok};

fn fixture(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/hooks")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Starts `countersign hook CLIENT` with `input` on stdin.
fn start_hook(data: &Path, client: &str, input: &str, extra: &[&str]) -> tokio::process::Child {
    let mut cmd = common::command(data, &["hook", client, "--agent-name", "coder"]);
    cmd.args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start countersign hook");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    tokio::spawn(async move {
        stdin.write_all(input.as_bytes()).await.unwrap();
    });
    child
}

async fn answer(child: tokio::process::Child) -> Value {
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the hook answers within 60 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hook exited {:?}: {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

async fn pending(data: &Path) -> Vec<Value> {
    let out = run_ok(data, &["pending", "--json"]).await;
    serde_json::from_str::<Vec<Value>>(&out).unwrap()
}

async fn held(data: &Path, count: usize) -> Vec<Value> {
    for _ in 0..300 {
        let found = pending(data).await;
        if found.len() >= count {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {count} pending request(s) within 15 s");
}

fn status_in_db(data: &Path, id: &str) -> String {
    let conn = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    conn.query_row("SELECT status FROM requests WHERE id = ?1", [id], |r| {
        r.get::<_, String>(0)
    })
    .unwrap()
}

fn decision(answer: &Value) -> (&str, &str) {
    let out = &answer["hookSpecificOutput"];
    assert_eq!(out["hookEventName"], "PreToolUse", "{answer}");
    (
        out["permissionDecision"].as_str().unwrap(),
        out["permissionDecisionReason"].as_str().unwrap(),
    )
}

#[tokio::test]
async fn claude_code_approve_reject_timeout_and_a_retry_that_joins() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    allow_unattended_cli(&data);
    let bash = fixture("claude-code/pretooluse-bash.json");

    // Approved: allow, and the request names the exact call.
    let hook = start_hook(&data, "claude-code", &bash, &["--timeout", "30"]);
    let requests = held(&data, 1).await;
    let request = &requests[0];
    assert_eq!(request["action_details"]["tool"], "Bash");
    assert_eq!(request["action_details"]["upstream"], "claude-code");
    assert_eq!(request["action_details"]["/command"], "\"npm test\"");
    assert_eq!(request["requested_by"], "stdio:coder");
    let id = request["request_id"].as_str().unwrap().to_string();
    run_ok(&data, &["approve", &id, "-y"]).await;
    let answer1 = answer(hook).await;
    let (verdict, reason) = decision(&answer1);
    assert_eq!(verdict, "allow", "{answer1}");
    assert!(reason.contains(&id), "{reason}");

    // Rejected: deny, with the approver's reason for the agent.
    let write = fixture("claude-code/pretooluse-write.json");
    let hook = start_hook(&data, "claude-code", &write, &["--timeout", "30"]);
    let id = held(&data, 1).await[0]["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    run_ok(
        &data,
        &["reject", &id, "-y", "--comment", "not in src/ on a Friday"],
    )
    .await;
    let answer2 = answer(hook).await;
    let (verdict, reason) = decision(&answer2);
    assert_eq!(verdict, "deny");
    assert!(reason.contains("not in src/ on a Friday"), "{reason}");

    // Timeout: deny, and the request is withdrawn (cancelled), never left to approve.
    let mcp = fixture("claude-code/pretooluse-mcp.json");
    let started = std::time::Instant::now();
    let hook = start_hook(&data, "claude-code", &mcp, &["--timeout", "2"]);
    let id = held(&data, 1).await[0]["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let answer3 = answer(hook).await;
    let (verdict, reason) = decision(&answer3);
    assert_eq!(verdict, "deny", "{answer3}");
    assert!(reason.contains("not approved in time"), "{reason}");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(status_in_db(&data, &id), "cancelled");
    assert!(pending(&data).await.is_empty());

    // A retry of the same call (the client gave up on the first hook) joins its request.
    let mut edited: Value = serde_json::from_str(&bash).unwrap();
    edited["tool_input"]["command"] = "cargo publish".into();
    let edited = edited.to_string();
    let mut first = start_hook(&data, "claude-code", &edited, &["--timeout", "30"]);
    let id = held(&data, 1).await[0]["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    first.kill().await.unwrap();
    let retry = start_hook(&data, "claude-code", &edited, &["--timeout", "30"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = pending(&data).await;
    assert_eq!(still.len(), 1, "the retry joined: {still:?}");
    assert_eq!(still[0]["request_id"], id.as_str());
    run_ok(&data, &["approve", &id, "-y"]).await;
    let answer4 = answer(retry).await;
    let (verdict, _) = decision(&answer4);
    assert_eq!(verdict, "allow");

    // Read-only tools pass with no request.
    let mut read: Value = serde_json::from_str(&write).unwrap();
    read["tool_name"] = "Read".into();
    let hook = start_hook(&data, "claude-code", &read.to_string(), &[]);
    let answer5 = answer(hook).await;
    let (verdict, reason) = decision(&answer5);
    assert_eq!(verdict, "allow");
    assert!(reason.contains("read-only"), "{reason}");
    assert!(pending(&data).await.is_empty());
}

#[tokio::test]
async fn cursor_shell_and_mcp_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    allow_unattended_cli(&data);

    let shell = fixture("cursor/beforeShellExecution.json");
    let hook = start_hook(&data, "cursor", &shell, &["--timeout", "30"]);
    let request = held(&data, 1).await.remove(0);
    assert_eq!(request["action_details"]["tool"], "shell");
    assert_eq!(
        request["action_details"]["/command"],
        "\"git push --force origin main\""
    );
    let id = request["request_id"].as_str().unwrap().to_string();
    run_ok(
        &data,
        &["reject", &id, "-y", "--comment", "no force pushes"],
    )
    .await;
    let answer1 = answer(hook).await;
    assert_eq!(answer1["permission"], "deny", "{answer1}");
    assert!(
        answer1["agent_message"]
            .as_str()
            .unwrap()
            .contains("no force pushes")
    );

    // tool_input is a JSON string in Cursor's beforeMCPExecution: bound as its object.
    let mcp = fixture("cursor/beforeMCPExecution.json");
    let hook = start_hook(&data, "cursor", &mcp, &["--timeout", "30"]);
    let request = held(&data, 1).await.remove(0);
    assert_eq!(request["action_details"]["tool"], "create_entities");
    assert_eq!(
        request["action_details"]["/entities/0/name"],
        "\"countersign\""
    );
    let id = request["request_id"].as_str().unwrap().to_string();
    run_ok(&data, &["approve", &id, "-y"]).await;
    let answer2 = answer(hook).await;
    assert_eq!(answer2["permission"], "allow", "{answer2}");
}

#[tokio::test]
async fn input_the_hook_cannot_read_blocks_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for (client, input, says) in [
        ("claude-code", "not json", "not JSON"),
        (
            "claude-code",
            r#"{"hook_event_name":"PostToolUse","tool_name":"Bash","tool_input":{},"session_id":"s"}"#,
            "PreToolUse only",
        ),
        (
            "cursor",
            r#"{"hook_event_name":"beforeShellExecution","conversation_id":"c"}"#,
            "command",
        ),
    ] {
        let child = start_hook(&data, client, input, &[]);
        let out = child.wait_with_output().await.unwrap();
        // Exit status 2 blocks the call in both clients.
        assert_eq!(out.status.code(), Some(2), "{client} {input}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Starts `countersign hook claude-code --server URL --token-file F`, with no data
/// directory of its own (the one it would default to must stay untouched).
fn start_remote_hook(
    home: &Path,
    server: &common::Server,
    token_file: &Path,
    input: &str,
    timeout: &str,
) -> tokio::process::Child {
    let mut cmd = common::bare_command();
    cmd.env("HOME", home)
        .env("XDG_DATA_HOME", home.join("xdg"))
        .env("COUNTERSIGN_SERVER", &server.base)
        .env("COUNTERSIGN_TOKEN_FILE", token_file)
        .args(["hook", "claude-code", "--timeout", timeout])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start countersign hook");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    tokio::spawn(async move {
        stdin.write_all(input.as_bytes()).await.unwrap();
    });
    child
}

#[tokio::test]
async fn claude_code_hook_against_a_remote_serve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let approver = common::create_token(&data, "approver", "alice").await;
    let agent = common::create_token(&data, "agent", "laptop").await;
    let gateway = run_ok(
        &data,
        &[
            "token",
            "create",
            "--role",
            "agent",
            "--name",
            "laptop-gw",
            "--scopes",
            "request,gateway",
        ],
    )
    .await
    .trim()
    .to_string();
    let server = common::Server::start(&data);
    let home = dir.path().join("elsewhere");
    std::fs::create_dir_all(&home).unwrap();
    let agent_file = home.join("agent.token");
    std::fs::write(&agent_file, &agent).unwrap();
    let gateway_file = home.join("gateway.token");
    std::fs::write(&gateway_file, format!("{gateway}\n")).unwrap();
    let bash = fixture("claude-code/pretooluse-bash.json");
    let remote_pending = || async {
        let (_, body) = server
            .get("/api/v1/requests?status=pending", Some(&approver))
            .await;
        body["requests"].as_array().cloned().unwrap_or_default()
    };

    // An agent's own token cannot speak for a gateway: denied, nothing asked.
    let hook = start_remote_hook(&home, &server, &agent_file, &bash, "30");
    let denied = answer(hook).await;
    let (verdict, reason) = decision(&denied);
    assert_eq!(verdict, "deny", "{denied}");
    assert!(reason.contains("gateway scope"), "{reason}");
    assert!(remote_pending().await.is_empty());

    // The gateway's token: held on the server, approved there, allowed here.
    let hook = start_remote_hook(&home, &server, &gateway_file, &bash, "30");
    let mut held = Vec::new();
    for _ in 0..300 {
        held = remote_pending().await;
        if !held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0]["requested_by"], "token:laptop-gw");
    assert_eq!(held[0]["action_details"]["/command"], "\"npm test\"");
    let id = held[0]["request_id"].as_str().unwrap().to_string();
    let (status, body) = server.decide(&id, &approver, "approved").await;
    assert!(status.is_success(), "{body}");
    let allowed = answer(hook).await;
    let (verdict, reason) = decision(&allowed);
    assert_eq!(verdict, "allow", "{allowed}");
    assert!(reason.contains(&id), "{reason}");
    let view = server.request_view(&approver, &id).await;
    assert!(!view["used"].is_null(), "claimed for its one use: {view}");

    // A timeout withdraws the request on the server.
    let write = fixture("claude-code/pretooluse-write.json");
    let hook = start_remote_hook(&home, &server, &gateway_file, &write, "2");
    let late = answer(hook).await;
    let (verdict, reason) = decision(&late);
    assert_eq!(verdict, "deny", "{late}");
    assert!(reason.contains("not approved in time"), "{reason}");
    assert!(remote_pending().await.is_empty());

    // The hook opened no data directory of its own.
    assert!(!home.join("xdg").exists() && !home.join(".local").exists());
}
