//! The approval-gate profile's process tools (docs/bridge.md), driven by rmcp's client
//! over Streamable HTTP and stdio against a real local process (operate.rs's worker):
//! status and logs of the running script; a restart held until another approver
//! approves over REST, then run once; run_command pending, then joined and run, its
//! output recorded; set_param refused when invalid, held, then applied; probes and
//! parameter tools listed only when configured; agent credentials refused; an operation
//! waiting for its decision sends the client MCP progress notifications.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::approval_gate::{PROFILE_PATH, call, ok, over_http, over_stdio};
use crate::common::{self, Server, create_token, path_str};
use crate::operate::{Reaper, configure, outcome, starts, worker};

const BASE_TOOLS: [&str; 5] = [
    "approve",
    "list_pending_approvals",
    "record_dashboard",
    "record_summary",
    "reject",
];
const PROCESS_TOOLS: [&str; 4] = [
    "process_logs",
    "process_status",
    "restart_process",
    "run_command",
];

async fn tool_names(client: &common::McpClient) -> Vec<String> {
    let mut names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    names
}

fn sorted(parts: &[&[&str]]) -> Vec<String> {
    let mut all: Vec<String> = parts
        .iter()
        .flat_map(|p| p.iter().map(|s| s.to_string()))
        .collect();
    all.sort();
    all
}

/// The one request pending now (the operation a call waits on), as `token` sees it.
async fn pending_one(server: &Server, token: &str) -> Value {
    for _ in 0..300 {
        let (code, body) = server
            .get("/api/v1/requests?status=pending", Some(token))
            .await;
        assert_eq!(code, StatusCode::OK, "{body}");
        if let Some(first) = body["requests"].as_array().and_then(|r| r.first()) {
            return first.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending request within 15 s");
}

async fn no_pending(server: &Server, token: &str) {
    let (_, body) = server
        .get("/api/v1/requests?status=pending", Some(token))
        .await;
    assert_eq!(body["requests"], json!([]), "nothing was asked");
}

/// Calls `tool` in the background (it waits for a decision).
fn in_background(
    client: &common::McpClient,
    tool: &'static str,
    args: Value,
) -> tokio::task::JoinHandle<Result<(String, Value), String>> {
    let peer = client.peer().clone();
    tokio::spawn(async move { call(&peer, tool, args).await })
}

/// `id` approved by `bob` over REST, after `alice` (its requester) was refused.
async fn approve_as_bob(server: &Server, id: &str, alice: &str, bob: &str) {
    let (code, body) = server.decide(id, alice, "approved").await;
    assert_ne!(
        code,
        StatusCode::OK,
        "alice approved her own request: {body}"
    );
    let (code, body) = server.decide(id, bob, "approved").await;
    assert_eq!(code, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn approval_gate_operations_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    configure(&data, &work, &script, "host = \"local\"", "");
    let alice = create_token(&data, "approver", "alice").await;
    let bob = create_token(&data, "approver", "bob").await;
    let agent = create_token(&data, "agent", "worker-bot").await;
    let server = Server::start(&data);
    let url = server.url(PROFILE_PATH);

    // An agent sees none of them and is refused.
    let as_agent = over_http(&url, &agent).await;
    assert!(tool_names(&as_agent).await.is_empty());
    for tool in ["process_status", "restart_process", "chatty"] {
        let refused = call(as_agent.peer(), tool, json!({})).await.unwrap_err();
        assert!(
            refused.contains("the approval-gate tools are an operator's"),
            "{tool}: {refused}"
        );
    }
    no_pending(&server, &alice).await;

    // Everything configured is listed: the process tools, the parameters, each probe.
    let client = over_http(&url, &alice).await;
    assert_eq!(
        tool_names(&client).await,
        sorted(&[
            &BASE_TOOLS,
            &PROCESS_TOOLS,
            &["list_params", "set_param", "clear_param", "chatty", "stuck"]
        ])
    );

    let (text, status) = ok(&client, "process_status", json!({})).await;
    assert_eq!(status["running"], false, "{status}");
    assert!(
        text.starts_with("Process worker (local) NOT RUNNING"),
        "{text}"
    );

    // restart_process: held until bob approves over REST, then run once.
    let restart = in_background(&client, "restart_process", json!({"wait_seconds": 60}));
    let request = pending_one(&server, &bob).await;
    let id = request["request_id"].as_str().unwrap().to_string();
    assert_eq!(request["action_details"]["tool"], "restart_process");
    assert_eq!(request["requested_by"], "token:alice", "{request}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(starts(&work).is_empty(), "restarted before its approval");
    approve_as_bob(&server, &id, &alice, &bob).await;
    let (text, answer) = restart.await.unwrap().expect("restart_process");
    assert_eq!(answer["state"], "done", "{answer}");
    assert_eq!(answer["request"]["request_id"], id.as_str());
    assert_eq!(answer["executed"]["status"], "succeeded", "{answer}");
    assert!(
        text.starts_with("Done: restart process worker on local"),
        "{text}"
    );
    assert!(text.contains("  Approved: bob\n"), "{text}");
    assert!(text.contains("started: "), "{text}");
    assert_eq!(starts(&work).len(), 1, "started once");

    // The seed's status of the running process, and its log.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (text, status) = ok(&client, "process_status", json!({"process": "worker"})).await;
    assert_eq!(status["running"], true, "{status}");
    let pid = status["pid"].as_u64().expect("a pid");
    assert!(
        text.starts_with("Process worker (local) RUNNING\n"),
        "{text}"
    );
    assert!(text.contains(&format!("  PID:      {pid}\n")), "{text}");
    assert!(text.contains("  Uptime:   "), "{text}");
    assert!(text.contains("  Last log: cycle "), "{text}");
    let (log, logs) = ok(&client, "process_logs", json!({"lines": 2})).await;
    assert_eq!(log.lines().count(), 2, "{log}");
    assert!(log.lines().all(|l| l.starts_with("cycle ")), "{log}");
    assert_eq!(logs["lines"], 2);
    let unknown = call(client.peer(), "process_status", json!({"process": "nope"}))
        .await
        .unwrap_err();
    assert!(unknown.contains("configured: worker"), "{unknown}");

    // run_command: pending when the wait ends, with who decides and how to check back;
    // the same call again joins the request and, once approved, runs it once.
    let cmd = "echo in $(basename $PWD); echo oops >&2; exit 3";
    let (text, answer) = ok(
        &client,
        "run_command",
        json!({"cmd": cmd, "wait_seconds": 1}),
    )
    .await;
    assert_eq!(answer["state"], "pending", "{answer}");
    let id = answer["request"]["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.starts_with("Waiting for a decision: run `"), "{text}");
    assert!(text.contains("another approver, not you"), "{text}");
    assert!(text.contains("Call run_command again"), "{text}");
    approve_as_bob(&server, &id, &alice, &bob).await;
    let (text, answer) = ok(&client, "run_command", json!({"cmd": cmd})).await;
    assert_eq!(answer["state"], "done", "{answer}");
    assert_eq!(answer["request"]["request_id"], id.as_str(), "joined");
    assert_eq!(answer["executed"]["exit_code"], 3, "{answer}");
    assert!(text.starts_with("Ran once, and it failed: "), "{text}");
    assert!(text.contains("in work\noops\n"), "{text}");
    let recorded = outcome(&data, &id);
    assert_eq!(recorded["status"], "failed", "{recorded}");
    assert_eq!(recorded["details"]["exit_code"], "3", "{recorded}");
    assert_eq!(recorded["details"]["output"], "in work\noops\n");
    // Asked again after it ran: a new request, never a second run of the first.
    let (_, again) = ok(
        &client,
        "run_command",
        json!({"cmd": cmd, "wait_seconds": 0}),
    )
    .await;
    assert_eq!(again["state"], "pending", "{again}");
    assert_ne!(again["request"]["request_id"], id.as_str());
    let (code, body) = server
        .post(
            &format!(
                "/api/v1/requests/{}/decision",
                again["request"]["request_id"].as_str().unwrap()
            ),
            Some(&bob),
            &json!({"decision": "rejected", "comment": "once is enough"}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (text, refused) = ok(
        &client,
        "run_command",
        json!({"cmd": cmd, "wait_seconds": 0}),
    )
    .await;
    assert_eq!(refused["state"], "refused", "{refused}");
    assert!(text.starts_with("Refused: "), "{text}");
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("once is enough"),
        "{refused}"
    );

    // set_param: what the manifest refuses is refused, nothing asked.
    for (value, says) in [(json!("thirty"), "not a valid int"), (json!(0), "below")] {
        let err = call(
            client.peer(),
            "set_param",
            json!({"name": "poll_interval_seconds", "value": value}),
        )
        .await
        .unwrap_err();
        assert!(err.contains(says), "{err}");
    }
    no_pending(&server, &alice).await;
    let file = work.join("params.json");
    // A valid one is held, then applied once approved.
    let set = in_background(
        &client,
        "set_param",
        json!({"name": "poll_interval_seconds", "value": "30", "wait_seconds": 60}),
    );
    let request = pending_one(&server, &bob).await;
    assert_eq!(request["action_details"]["value"], "30");
    assert_eq!(request["action_details"]["before"], "null");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!file.exists(), "written before its approval");
    approve_as_bob(
        &server,
        request["request_id"].as_str().unwrap(),
        &alice,
        &bob,
    )
    .await;
    let (text, answer) = set.await.unwrap().expect("set_param");
    assert_eq!(answer["state"], "done", "{answer}");
    assert!(
        text.contains("  Before:   unset\n  After:    30\n"),
        "{text}"
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, json!({"poll_interval_seconds": 30}));
    let (text, list) = ok(&client, "list_params", json!({})).await;
    let poll = list["declared"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "poll_interval_seconds")
        .unwrap();
    assert_eq!(poll["value"], 30, "{list}");
    assert!(text.starts_with("3 parameter(s) declared"), "{text}");
    let none = call(client.peer(), "clear_param", json!({"name": "dry_run"}))
        .await
        .unwrap_err();
    assert!(none.contains("no override to clear"), "{none}");

    // A probe by its name: its output, capped.
    let (text, probe) = ok(&client, "chatty", json!({})).await;
    assert_eq!(probe["truncated"], true, "{probe}");
    assert!(text.starts_with("probe\nprobe\n"), "{text}");
    assert!(
        text.contains("[output cut at the probe's max_output_bytes]"),
        "{text}"
    );
    let args = call(client.peer(), "chatty", json!({"x": 1}))
        .await
        .unwrap_err();
    assert!(args.contains("takes no arguments"), "{args}");
}

/// A config with one `[[process]]` and nothing else.
fn process_only(data: &Path, work: &Path, script: &Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        format!(
            "[cli]\nunattended_decisions = true\n\n[[process]]\nname = \"worker\"\nhost = \"local\"\ndir = \"{work}\"\nstart = \"sh {script}\"\nmatch = \"{script}\"\nlog = \"worker.log\"\n",
            work = path_str(work),
            script = path_str(script),
        ),
    )
    .unwrap();
}

#[tokio::test]
async fn approval_gate_operations_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    process_only(&data, &work, &script);
    let alice = create_token(&data, "approver", "alice").await;
    let bob = create_token(&data, "approver", "bob").await;
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, format!("{alice}\n")).unwrap();
    let server = Server::start(&data);

    // The local agent (no token) is refused.
    let as_agent = over_stdio(&data, None).await;
    assert!(tool_names(&as_agent).await.is_empty());
    let refused = call(as_agent.peer(), "run_command", json!({"cmd": "true"}))
        .await
        .unwrap_err();
    assert!(refused.contains("--token-file"), "{refused}");
    no_pending(&server, &alice).await;

    // Without [params] or [[probe]], neither their tools nor any probe is listed.
    let client = over_stdio(&data, Some(&token_file)).await;
    assert_eq!(
        tool_names(&client).await,
        sorted(&[&BASE_TOOLS, &PROCESS_TOOLS])
    );
    let missing = call(client.peer(), "list_params", json!({}))
        .await
        .unwrap_err();
    assert!(missing.contains("no tool list_params"), "{missing}");

    let (text, status) = ok(&client, "process_status", json!({})).await;
    assert_eq!(status["running"], false, "{status}");
    assert!(text.contains("NOT RUNNING"), "{text}");

    // run_command held until bob approves, then run once, its output recorded.
    let run = in_background(
        &client,
        "run_command",
        json!({"cmd": "echo hello from $(basename $PWD)", "wait_seconds": 60}),
    );
    let request = pending_one(&server, &bob).await;
    let id = request["request_id"].as_str().unwrap().to_string();
    assert_eq!(
        request["action_details"]["cmd"],
        "echo hello from $(basename $PWD)"
    );
    approve_as_bob(&server, &id, &alice, &bob).await;
    let (text, answer) = run.await.unwrap().expect("run_command");
    assert_eq!(answer["state"], "done", "{answer}");
    assert_eq!(answer["executed"]["exit_code"], 0, "{answer}");
    assert!(text.ends_with("\nhello from work\n"), "{text}");
    let recorded = outcome(&data, &id);
    assert_eq!(recorded["status"], "succeeded", "{recorded}");
    assert_eq!(recorded["details"]["output"], "hello from work\n");
    assert_eq!(recorded["recorded_by"], "token:alice", "{recorded}");
}

/// `/api/v1/operate` and `countersign process|params|probe --server URL --token-file F`:
/// the CLI runs in a data directory of its own (no config, no database), so everything
/// it shows comes from the server.
#[tokio::test]
async fn approval_gate_operations_over_rest_and_the_remote_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    configure(&data, &work, &script, "host = \"local\"", "");
    let alice = create_token(&data, "approver", "alice").await;
    let bob = create_token(&data, "approver", "bob").await;
    let agent = create_token(&data, "agent", "worker-bot").await;
    let server = Server::start(&data);
    let alice_file = dir.path().join("alice.token");
    std::fs::write(&alice_file, format!("{alice}\n")).unwrap();
    // The flags after the command's name (before a trailing `-- CMD`), as a user types.
    let remote = |args: &[&str]| {
        let mut all: Vec<String> = vec![args[0].to_string()];
        all.extend([
            "--server".into(),
            server.base.clone(),
            "--token-file".into(),
            path_str(&alice_file).into(),
        ]);
        all.extend(args[1..].iter().map(|s| s.to_string()));
        all
    };

    // An agent's token: refused, nothing asked.
    let (code, body) = server
        .get("/api/v1/operate/processes/worker/status", Some(&agent))
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    let (code, body) = server
        .post(
            "/api/v1/operate/processes/worker/restart",
            Some(&agent),
            &json!({}),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    no_pending(&server, &alice).await;

    // Reads.
    let args = remote(&["process", "status", "worker", "--json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status: Value = serde_json::from_str(&common::run_ok(&elsewhere, &args).await).unwrap();
    assert_eq!(status["running"], false, "{status}");
    assert_eq!(status["process"], "worker");
    let args = remote(&["params", "list", "--json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let list: Value = serde_json::from_str(&common::run_ok(&elsewhere, &args).await).unwrap();
    assert_eq!(list["declared"].as_array().unwrap().len(), 3, "{list}");
    let args = remote(&["probe", "run", "chatty", "--json"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::run(&elsewhere, &args).await;
    let probe: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(probe["truncated"], true, "{out}");

    // A command through the server: held until bob approves, run once, recorded.
    let args = remote(&[
        "process",
        "run",
        "worker",
        "--json",
        "--",
        "echo",
        "remote $(basename $PWD)",
    ]);
    let mut cmd = common::command(
        &elsewhere,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    let request = pending_one(&server, &bob).await;
    let id = request["request_id"].as_str().unwrap().to_string();
    assert_eq!(request["requested_by"], "token:alice");
    assert_eq!(
        request["action_details"]["cmd"],
        "echo remote $(basename $PWD)"
    );
    approve_as_bob(&server, &id, &alice, &bob).await;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["request"]["request_id"], id.as_str());
    assert_eq!(answer["executed"]["output"], "remote work\n", "{answer}");
    assert_eq!(outcome(&data, &id)["details"]["output"], "remote work\n");

    // A parameter the manifest refuses: 400, nothing asked.
    let (code, body) = server
        .post(
            "/api/v1/operate/params/set",
            Some(&alice),
            &json!({"name": "mode", "value": "reckless"}),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    no_pending(&server, &alice).await;
    // A valid one, not waited for: pending; rejected by bob; asked again: refused.
    let (code, body) = server
        .post(
            "/api/v1/operate/params/set",
            Some(&alice),
            &json!({"name": "mode", "value": "safe", "hold_seconds": 0}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "pending", "{body}");
    let id = body["request"]["request_id"].as_str().unwrap();
    let (code, _) = server.decide(id, &bob, "rejected").await;
    assert_eq!(code, StatusCode::OK);
    let (_, body) = server
        .post(
            "/api/v1/operate/params/set",
            Some(&alice),
            &json!({"name": "mode", "value": "safe", "hold_seconds": 0}),
        )
        .await;
    assert_eq!(body["state"], "refused", "{body}");
    assert_eq!(body["request"]["request_id"], id);
    assert!(!work.join("params.json").exists());
}

/// A client that keeps every progress notification it receives.
struct Progress(tokio::sync::mpsc::UnboundedSender<rmcp::model::ProgressNotificationParam>);

impl rmcp::ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

/// An operation waiting for its decision tells the client so, through MCP progress
/// notifications on the call's progress token (as the native wait tools do): the first
/// as soon as the request exists, naming it, before any decision; the call then ends
/// with the approved operation done.
#[tokio::test]
async fn approval_gate_operation_reports_progress_while_it_waits() {
    use rmcp::ServiceExt;
    use rmcp::model::{CallToolRequestParams, NumberOrString, ProgressToken, RequestParamsMeta};
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    configure(&data, &work, &script, "host = \"local\"", "");
    let alice = create_token(&data, "approver", "alice").await;
    let bob = create_token(&data, "approver", "bob").await;
    let server = Server::start(&data);

    let (sent, mut received) = tokio::sync::mpsc::unbounded_channel();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url(PROFILE_PATH))
            .auth_header(alice.clone()),
    );
    let client = tokio::time::timeout(Duration::from_secs(20), Progress(sent).serve(transport))
        .await
        .expect("MCP initialize timed out")
        .expect("MCP initialize failed");

    let mut params = CallToolRequestParams::new("run_command").with_arguments(
        json!({"cmd": "echo ran", "wait_seconds": 60})
            .as_object()
            .unwrap()
            .clone(),
    );
    // rmcp's client gives each call a progress token of its own (replacing one set here).
    params.set_progress_token(ProgressToken(NumberOrString::Number(1)));
    let peer = client.peer().clone();
    let running = tokio::spawn(async move { peer.call_tool(params).await });

    let first = tokio::time::timeout(Duration::from_secs(15), received.recv())
        .await
        .expect("no progress notification while the operation waits")
        .unwrap();
    let token = first.progress_token.clone();
    let request = pending_one(&server, &bob).await;
    let id = request["request_id"].as_str().unwrap().to_string();
    let message = first.message.clone().unwrap_or_default();
    assert_eq!(
        message,
        format!("request {id} waits for another approver's decision"),
        "{first:?}"
    );
    assert_eq!(first.total, Some(60.0), "{first:?}");
    assert!(!running.is_finished(), "the call ended before any decision");

    approve_as_bob(&server, &id, &alice, &bob).await;
    let result = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the call did not end after the approval")
        .unwrap()
        .expect("run_command");
    let answer = result.structured_content.unwrap_or(Value::Null);
    assert_eq!(answer["state"], "done", "{answer}");
    assert_eq!(answer["executed"]["output"], "ran\n", "{answer}");
    // Every notification was for this one call.
    while let Ok(more) = received.try_recv() {
        assert_eq!(more.progress_token, token, "{more:?}");
    }
    client.cancel().await.unwrap();
}
