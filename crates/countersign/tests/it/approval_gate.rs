//! The approval-gate profile (docs/bridge.md): approval-gate-mcp's operator tools, driven
//! by a real MCP client (rmcp's) over Streamable HTTP (`/mcp/profile/approval-gate` on
//! `serve`) and over stdio (`countersign mcp --profile approval-gate`), against a real
//! process on the file contract (tests/python/approval_process.py). "approve 0, reject
//! 1" makes the process act once on the first and never on the second; an agent's
//! credential is refused; a number whose proposal was decided elsewhere is refused; the
//! record tools' numbers match the records.json the test writes, as does `countersign
//! records`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::bridge::{
    BRIDGE, eventually, job, pending_ids, pending_request, serve, setup, start_process, times_acted,
};
use crate::common::{self, McpClient, create_token};

pub(crate) const PROFILE_PATH: &str = "/mcp/profile/approval-gate";

pub(crate) async fn over_http(url: &str, token: &str) -> McpClient {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP initialize timed out")
        .expect("MCP initialize failed")
}

/// `countersign mcp --profile approval-gate [--token-file FILE]` on `data`.
pub(crate) async fn over_stdio(data: &Path, token_file: Option<&Path>) -> McpClient {
    let mut cmd = common::command(data, &["mcp", "--profile", "approval-gate"]);
    if let Some(file) = token_file {
        cmd.arg("--token-file").arg(file);
    }
    let (transport, _stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn countersign mcp --profile approval-gate");
    tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed")
}

/// A tool's answer: `Ok((text, structured))`, or `Err` with the text of a tool error or
/// the message of a protocol error.
pub(crate) async fn call(
    client: &rmcp::service::Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<(String, Value), String> {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .map_err(|e| e.to_string())?;
    let text: String = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        return Err(text);
    }
    Ok((text, result.structured_content.unwrap_or(Value::Null)))
}

pub(crate) async fn ok(client: &McpClient, tool: &str, args: Value) -> (String, Value) {
    call(client.peer(), tool, args)
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The process's proposals in `ids` are all requests awaiting a decision.
async fn asked(server: &common::Server, approver: &str, ids: &[&str]) {
    for id in ids {
        pending_request(server, approver, id).await;
    }
}

/// "approve 0, reject 1" through `client`, with the listing checked first: the process
/// acts on the first once, never on the second.
async fn approve_0_reject_1(client: &McpClient, proc_dir: &Path, first: &str, second: &str) {
    let (text, listed) = ok(client, "list_pending_approvals", json!({})).await;
    assert_eq!(listed["count"], 2, "{listed}");
    let proposals = listed["proposals"].as_array().unwrap();
    assert_eq!(proposals[0]["index"], 0);
    assert_eq!(proposals[0]["proposal"]["id"], first);
    assert_eq!(proposals[1]["proposal"]["id"], second);
    assert_eq!(proposals[0]["bridge"], BRIDGE);
    assert_eq!(proposals[0]["label"], format!("reindex {first}"));
    let names: Vec<&str> = proposals[0]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["id", "label", "action", "cost", "created_at"],
        "as written"
    );
    // The seed's layout.
    assert!(
        text.starts_with("2 proposal(s) awaiting approval\n\n--- Proposal #0 ---"),
        "{text}"
    );
    assert!(
        text.contains(&format!("    id:           {first}\n")),
        "{text}"
    );
    assert!(text.contains("    cost:         6.0\n"), "{text}");
    assert!(
        text.contains(&format!("(bridge {BRIDGE}, request req_")),
        "{text}"
    );
    assert!(text.contains("--- Proposal #1 ---"), "{text}");
    assert!(
        text.ends_with("Use approve(index) or reject(index) to decide."),
        "{text}"
    );

    let (text, approved) = ok(client, "approve", json!({"index": 0})).await;
    assert_eq!(
        text,
        format!("Approved and queued for execution: reindex {first}")
    );
    assert_eq!(approved["request"]["status"], "approved");
    assert_eq!(
        approved["request"]["decision"]["approvers"][0]["channel"],
        "mcp"
    );
    assert!(
        approved["request"]["proof"]["payload"].is_string(),
        "a signed proof"
    );
    // #1 still means what the listing showed, though the list is shorter now.
    let (text, rejected) = ok(client, "reject", json!({"index": 1})).await;
    assert_eq!(text, format!("Rejected and removed: reindex {second}"));
    assert_eq!(rejected["request"]["status"], "rejected");
    // Deciding #0 again is refused: it is no longer awaiting a decision.
    let again = call(client.peer(), "approve", json!({"index": 0}))
        .await
        .unwrap_err();
    assert!(
        again.starts_with("changed: proposal #0 of your last listing")
            && again.contains("was already approved"),
        "{again}"
    );

    eventually("the process acted on the approved proposal", async || {
        (times_acted(proc_dir, first) == 1).then_some(())
    })
    .await;
    eventually("both proposals left pending.json", async || {
        pending_ids(proc_dir).is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(times_acted(proc_dir, first), 1, "acted once");
    assert_eq!(
        times_acted(proc_dir, second),
        0,
        "a rejection is never acted on"
    );
}

#[tokio::test]
async fn approval_gate_profile_over_http() {
    let (_dir, data, proc_dir) = setup();
    let server = serve(&data, None);
    let alice = create_token(&data, "approver", "alice").await;
    let bob = create_token(&data, "approver", "bob").await;
    let agent = create_token(&data, "agent", "worker").await;
    let url = server.url(PROFILE_PATH);
    let jobs = [
        job("job-1042"),
        job("job-1043"),
        job("job-1044"),
        job("job-1045"),
    ];
    let _process = start_process(&proc_dir, &jobs[..2], &["--per-cycle", "2"]);
    asked(&server, &alice, &["job-1042", "job-1043"]).await;

    // An agent's token: no tools shown, and approve refused, deciding nothing.
    let as_agent = over_http(&url, &agent).await;
    let tools = as_agent.peer().list_all_tools().await.unwrap();
    assert!(tools.is_empty(), "{tools:?}");
    let refused = call(as_agent.peer(), "approve", json!({"index": 0}))
        .await
        .unwrap_err();
    assert!(
        refused.contains("the approval-gate tools are an operator's")
            && refused.contains("token:worker"),
        "{refused}"
    );
    let refused = call(as_agent.peer(), "list_pending_approvals", json!({}))
        .await
        .unwrap_err();
    assert!(refused.contains("approver"), "{refused}");

    // The approver: the seed's tools, by name, and its example session.
    let client = over_http(&url, &alice).await;
    let mut names: Vec<String> = client
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "approve",
            "list_pending_approvals",
            "record_dashboard",
            "record_summary",
            "reject"
        ]
    );
    // No listing yet: a number means nothing.
    let before = call(client.peer(), "approve", json!({"index": 0}))
        .await
        .unwrap_err();
    assert!(
        before.contains("call list_pending_approvals first"),
        "{before}"
    );
    approve_0_reject_1(&client, &proc_dir, "job-1042", "job-1043").await;

    // A stale number: the listing showed job-1044 as #0, then bob approved it over REST.
    std::fs::write(
        proc_dir.join("pending.json"),
        json!({"proposals": [jobs[2], jobs[3]]}).to_string(),
    )
    .unwrap();
    let third = pending_request(&server, &alice, "job-1044").await;
    pending_request(&server, &alice, "job-1045").await;
    let (_, listed) = ok(&client, "list_pending_approvals", json!({})).await;
    assert_eq!(listed["proposals"][0]["proposal"]["id"], "job-1044");
    let (code, body) = server
        .decide(third["request_id"].as_str().unwrap(), &bob, "approve")
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let stale = call(client.peer(), "reject", json!({"index": 0}))
        .await
        .unwrap_err();
    assert!(
        stale.starts_with("changed: ") && stale.contains("was already approved by bob"),
        "{stale}"
    );
    let view = server
        .request_view(&alice, third["request_id"].as_str().unwrap())
        .await;
    assert_eq!(
        view["status"], "approved",
        "the stale reject decided nothing"
    );
    // Out of range.
    let beyond = call(client.peer(), "approve", json!({"index": 7}))
        .await
        .unwrap_err();
    assert!(beyond.contains("no proposal #7"), "{beyond}");
    // A fresh listing (kept in the database, read by a new connection) renumbers.
    let other_connection = over_http(&url, &alice).await;
    let (_, listed) = ok(&other_connection, "list_pending_approvals", json!({})).await;
    assert_eq!(listed["count"], 1);
    assert_eq!(listed["proposals"][0]["proposal"]["id"], "job-1045");
    let (text, _) = ok(
        &client,
        "reject",
        json!({"index": 0, "comment": "not tonight"}),
    )
    .await;
    assert_eq!(text, "Rejected and removed: reindex job-1045");

    // Records: the process is stopped, and records.json is what the test writes.
    std::fs::write(proc_dir.join("stop"), "").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let first = pending_request_any(&server, &alice, "job-1042").await;
    write_records(&proc_dir);
    let (text, summary) = ok(&client, "record_summary", json!({"n": 2})).await;
    check_totals(&summary["totals"]);
    let b = &summary["bridges"][0];
    assert_eq!(b["bridge"], BRIDGE);
    assert_eq!(b["recent"].as_array().unwrap().len(), 2);
    assert_eq!(b["recent"][0]["id"], "job-9", "newest first");
    assert_eq!(b["recent"][1]["id"], "job-1042");
    assert_eq!(b["recent"][1]["request"]["request_id"], first);
    assert_eq!(b["recent"][1]["request"]["status"], "approved");
    let types: Vec<(String, u64, u64)> = b["by_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["record_type"].as_str().unwrap().to_string(),
                t["records"].as_u64().unwrap(),
                t["open"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        types,
        [("backup".to_string(), 2, 1), ("reindex".to_string(), 2, 1)]
    );
    assert!(text.contains("Records: 4 (2 resolved, 2 open)"), "{text}");
    assert!(text.contains("2 most recent:"), "{text}");

    let (text, dashboard) = ok(&client, "record_dashboard", json!({})).await;
    check_totals(&dashboard["totals"]);
    let open: Vec<&str> = dashboard["bridges"][0]["open"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(open, ["job-1042", "job-9"]);
    assert!(text.contains("Open records: 2, exposure 8.5"), "{text}");
    let unknown = call(client.peer(), "record_dashboard", json!({"bridge": "nope"}))
        .await
        .unwrap_err();
    assert!(unknown.contains("bridge \"nope\""), "{unknown}");

    // The same numbers from the CLI.
    let out = common::run_ok(&data, &["records", "--json"]).await;
    let cli: Value = serde_json::from_str(&out).unwrap();
    check_totals(&cli["totals"]);
    assert_eq!(cli["bridges"][0]["open"][0]["request"]["request_id"], first);
}

/// The request id of proposal `id` in any state.
async fn pending_request_any(server: &common::Server, token: &str, id: &str) -> String {
    let (code, body) = server
        .get(
            &format!("/api/v1/requests?requested_by=bridge:{BRIDGE}&limit=1000"),
            Some(token),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            let p: Value =
                serde_json::from_str(r["action_details"]["proposal"].as_str().unwrap()).unwrap();
            p["id"] == id
        })
        .map(|r| r["request_id"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("no request for {id}"))
}

/// Four records: two resolved, two open (costs 6 and 2.5: exposure 8.5), one of them the
/// approved job-1042's.
fn write_records(proc_dir: &Path) {
    let records = json!([
        {"id": "job-1041", "record_type": "reindex", "resolved": true, "outcome": "win",
         "cost": 4.25, "result": 11.80, "label": "nightly reindex, shard 3"},
        {"id": "job-7", "record_type": "backup", "resolved": true, "outcome": "loss",
         "cost": 1, "result": -1},
        {"id": "job-1042", "record_type": "reindex", "resolved": false, "cost": 6.00},
        {"id": "job-9", "record_type": "backup", "resolved": false, "cost": 2.5}
    ]);
    std::fs::write(proc_dir.join("records.json"), records.to_string()).unwrap();
}

fn check_totals(totals: &Value) {
    assert_eq!(totals["records"], 4, "{totals}");
    assert_eq!(totals["resolved"], 2, "{totals}");
    assert_eq!(totals["open"], 2, "{totals}");
    assert_eq!(totals["exposure"], 8.5, "{totals}");
    assert_eq!(totals["cost"], 13.75, "{totals}");
    assert_eq!(totals["result"], 10.8, "{totals}");
    assert_eq!(totals["countersign_approved"], 1, "{totals}");
    assert_eq!(totals["outcomes"], json!({"win": 1, "loss": 1}), "{totals}");
}

#[tokio::test]
async fn approval_gate_profile_over_stdio() {
    let (dir, data, proc_dir) = setup();
    let server = serve(&data, None);
    let alice = create_token(&data, "approver", "alice").await;
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, format!("{alice}\n")).unwrap();
    let _process = start_process(
        &proc_dir,
        &[job("job-1"), job("job-2")],
        &["--per-cycle", "2"],
    );
    asked(&server, &alice, &["job-1", "job-2"]).await;

    // Without a token the caller is the local agent: refused.
    let as_agent = over_stdio(&data, None).await;
    assert!(as_agent.peer().list_all_tools().await.unwrap().is_empty());
    let refused = call(as_agent.peer(), "approve", json!({"index": 0}))
        .await
        .unwrap_err();
    assert!(
        refused.contains("an operator's") && refused.contains("--token-file"),
        "{refused}"
    );

    let client = over_stdio(&data, Some(&token_file)).await;
    approve_0_reject_1(&client, &proc_dir, "job-1", "job-2").await;
    let (_, view) = ok(&client, "list_pending_approvals", json!({})).await;
    assert_eq!(view["count"], 0);

    // A revoked token stops working mid-session.
    let out = common::run_ok(&data, &["token", "list", "--json"]).await;
    let list: Value = serde_json::from_str(&out).unwrap();
    let id = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "alice")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    common::run_ok(&data, &["token", "revoke", &id]).await;
    let revoked = call(client.peer(), "list_pending_approvals", json!({}))
        .await
        .unwrap_err();
    assert!(revoked.contains("not valid"), "{revoked}");
}
