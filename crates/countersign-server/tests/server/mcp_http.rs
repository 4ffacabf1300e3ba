//! The MCP tools over Streamable HTTP with rmcp's client.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_server::HttpConfig;
use serde_json::{Value, json};

use crate::support::{err, ok, start, start_with};

const AGENT_TOOLS: [&str; 20] = [
    "cancel_approval",
    "check_approval",
    "get_evidence",
    "join_room",
    "leave_room",
    "post_message",
    "read_messages",
    "record_action",
    "record_decision",
    "record_outcome",
    "report_blocker",
    "request_approval",
    "restrict_room",
    "set_presence",
    "verify_evidence",
    "verify_proof",
    "wait_for_approval",
    "wait_for_feedback",
    "wait_for_message",
    "wait_for_resolution",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_request_wait_decide_verify_use_once() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;

    let tools = agent.service.list_all_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(names, AGENT_TOOLS);
    for tool in &tools {
        assert!(
            tool.output_schema.is_some(),
            "{} has no output schema",
            tool.name
        );
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
    }
    let request_tool = tools.iter().find(|t| t.name == "request_approval").unwrap();
    let props = request_tool.input_schema.get("properties").unwrap();
    for field in [
        "action_description",
        "action_details",
        "timeout_hours",
        "timeout_seconds",
        "valid_for_seconds",
        "idempotency_key",
        "recipient_email",
        "recipient_slack",
    ] {
        assert!(props.get(field).is_some(), "request_approval lacks {field}");
    }

    let action = json!({"action_description": "Deploy v2.14.0 to production", "action_details": {"env": "production", "version": "v2.14.0"}});
    let created = ok(&agent.call("request_approval", action.clone()).await);
    assert_eq!(created["status"], "pending");
    assert!(
        created["message"]
            .as_str()
            .unwrap()
            .contains("do NOT perform")
    );
    assert!(
        created["action_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let id = created["request_id"].as_str().unwrap().to_string();

    let checked = ok(&agent
        .call("check_approval", json!({"request_id": id}))
        .await);
    assert_eq!(checked["status"], "pending");
    assert!(checked["proof"].is_null());

    // Wait in the background; decide over REST while it waits.
    let waiter = {
        let agent = server.mcp(&server.agent).await;
        let id = id.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let result = agent
                .call(
                    "wait_for_approval",
                    json!({"request_id": id, "timeout_seconds": 60}),
                )
                .await;
            (result, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, decided) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            &server.approver,
            json!({"decision": "approved", "comment": "ship it", "fields": {"change_ticket": "CHG-42"}}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    let (result, waited) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "the waiter was not woken by the decision ({waited:?})"
    );
    let approved = ok(&result);
    assert_eq!(approved["status"], "approved");
    assert_eq!(approved["decision"]["approvers"][0]["id"], "token:alice");
    assert_eq!(approved["decision"]["approvers"][0]["channel"], "api");
    assert_eq!(approved["decision"]["authorization_type"], "human");
    assert_eq!(approved["decision"]["fields"]["change_ticket"], "CHG-42");
    let proof = approved["proof"].clone();
    assert_eq!(
        proof["payloadType"],
        "application/vnd.countersign.decision+json"
    );
    let statement: Value =
        serde_json::from_slice(&STANDARD.decode(proof["payload"].as_str().unwrap()).unwrap())
            .unwrap();
    assert_eq!(statement["type"], "countersign.decision/v1");
    assert_eq!(statement["request_id"], id.as_str());
    assert_eq!(statement["requested_by"]["id"], "token:deploy-bot");
    assert_eq!(statement["comment"], "ship it");

    // verify_proof: valid for its action, invalid for another.
    let verified = ok(&agent.call("verify_proof", json!({"proof": proof, "action_description": action["action_description"], "action_details": action["action_details"]})).await);
    assert_eq!(verified["valid"], true, "{verified}");
    assert_eq!(verified["request_id"], id.as_str());
    let other = ok(&agent.call("verify_proof", json!({"proof": proof, "action_description": "Deploy v2.14.0 to production", "action_details": {"env": "staging", "version": "v2.14.0"}})).await);
    assert_eq!(other["valid"], false);
    assert_eq!(other["reasons"][0]["code"], "action_mismatch");

    // record_action consumes the approval: once.
    let used = ok(&agent
        .call(
            "record_action",
            json!({"request_id": id, "tool": "kubectl", "details": {"rollout": "deploy/web"}}),
        )
        .await);
    assert_eq!(used["tool"], "kubectl");
    let again = err(&agent
        .call(
            "record_action",
            json!({"request_id": id, "tool": "kubectl"}),
        )
        .await);
    assert!(again.starts_with("already_used:"), "{again}");
    assert!(again.contains("single use"), "{again}");
    let after = ok(&agent.call("verify_proof", json!({"proof": proof})).await);
    assert_eq!(after["valid"], false);
    assert_eq!(after["reasons"][0]["code"], "already_used");
    let checked = ok(&agent
        .call("check_approval", json!({"request_id": id}))
        .await);
    assert_eq!(checked["used"]["tool"], "kubectl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_proofs_are_refused_with_reasons() {
    let server = start().await;
    let id = server.create_default().await;
    let (_, decided) = server.decide(&server.approver, &id, "approved").await;
    let proof = decided["proof"].clone();
    let agent = server.mcp(&server.agent).await;

    let mut payload = STANDARD.decode(proof["payload"].as_str().unwrap()).unwrap();
    let position = payload.len() / 2;
    payload[position] ^= 0x01;
    let mut tampered = proof.clone();
    tampered["payload"] = json!(STANDARD.encode(&payload));
    let report = ok(&agent.call("verify_proof", json!({"proof": tampered})).await);
    assert_eq!(report["valid"], false);
    let codes: Vec<_> = report["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes.contains(&"bad_signature".to_string())
            || codes.contains(&"malformed_statement".to_string()),
        "{codes:?}"
    );

    let mut sig = STANDARD
        .decode(proof["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    sig[0] ^= 0x80;
    let mut tampered = proof.clone();
    tampered["signatures"][0]["sig"] = json!(STANDARD.encode(&sig));
    let report = ok(&agent.call("verify_proof", json!({"proof": tampered})).await);
    assert_eq!(report["reasons"][0]["code"], "bad_signature");

    // A rejection's proof is not an approval.
    let id = server.create_default().await;
    let (_, rejected) = server.decide(&server.approver, &id, "rejected").await;
    let report = ok(&agent
        .call("verify_proof", json!({"proof": rejected["proof"]}))
        .await);
    assert_eq!(report["reasons"][0]["code"], "not_approved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_reports_progress_and_returns_pending_when_nobody_decides() {
    let server = start().await;
    let id = server.create_default().await;
    let agent = server.mcp(&server.agent).await;
    let started = Instant::now();
    let result = agent
        .call_with_progress(
            "wait_for_approval",
            json!({"request_id": id, "timeout_seconds": 6}),
        )
        .await;
    let waited = started.elapsed();
    let view = ok(&result);
    assert_eq!(view["status"], "pending");
    assert!(waited >= Duration::from_secs(6), "{waited:?}");
    assert!(
        agent.progress.load(Ordering::SeqCst) >= 1,
        "no progress notification in a 6 s wait"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_request_wakes_its_waiter_as_timed_out_with_no_proof() {
    let server = start().await;
    let id = server
        .create(
            &server.agent,
            json!({"action_description": "Rotate credentials", "timeout_seconds": 1}),
        )
        .await;
    let agent = server.mcp(&server.agent).await;
    let started = Instant::now();
    let view = ok(&agent
        .call(
            "wait_for_approval",
            json!({"request_id": id, "timeout_seconds": 30}),
        )
        .await);
    assert_eq!(view["status"], "timed_out");
    assert!(view["proof"].is_null());
    assert!(view["message"].as_str().unwrap().contains("NOT approved"));
    assert!(started.elapsed() < Duration::from_secs(10));
    let (status, body) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 409, "{body}");
    let used = err(&agent
        .call("record_action", json!({"request_id": id, "tool": "x"}))
        .await);
    assert!(used.starts_with("not_approved:"), "{used}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_tools_are_off_by_default_and_never_for_agents() {
    let server = start().await;
    let id = server.create_default().await;
    let approver = server.mcp(&server.approver).await;
    let approver_tools = approver.tool_names().await;
    assert_eq!(
        approver_tools, AGENT_TOOLS,
        "an approver sees the agent tools, no operator tools and no kick (docs/rooms.md)"
    );
    let kick = approver
        .service
        .call_tool(
            rmcp::model::CallToolRequestParams::new("kick").with_arguments(
                json!({"room": "ops", "member": "token:deploy-bot"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await;
    let refused = match kick {
        Ok(result) => crate::support::text(&result),
        Err(e) => e.to_string(),
    };
    assert!(refused.contains("operator_tools"), "{refused}");
    let refused = approver
        .service
        .call_tool(
            rmcp::model::CallToolRequestParams::new("approve")
                .with_arguments(json!({"request_id": id}).as_object().unwrap().clone()),
        )
        .await;
    assert!(
        refused.is_err(),
        "approve must not be callable with operator tools off"
    );

    let server = start_with(HttpConfig {
        operator_tools: true,
        ..HttpConfig::default()
    })
    .await;
    let id = server.create_default().await;
    let agent = server.mcp(&server.agent).await;
    assert_eq!(agent.tool_names().await, AGENT_TOOLS);
    let refused = agent
        .service
        .call_tool(
            rmcp::model::CallToolRequestParams::new("approve")
                .with_arguments(json!({"request_id": id}).as_object().unwrap().clone()),
        )
        .await;
    let message = format!("{:?}", refused.unwrap_err());
    assert!(message.contains("operator tool"), "{message}");
    let (_, state) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(
        state["status"], "pending",
        "an agent's refused call changed nothing"
    );

    let operator = server.mcp(&server.approver).await;
    let names = operator.tool_names().await;
    for tool in ["list_pending_approvals", "approve", "reject"] {
        assert!(names.contains(&tool.to_string()), "{names:?}");
    }
    let pending = ok(&operator.call("list_pending_approvals", json!({})).await);
    assert_eq!(pending["requests"][0]["request_id"], id.as_str());
    // No argument can say who decides.
    let spoof = operator
        .call(
            "approve",
            json!({"request_id": id, "approver": "someone-else"}),
        )
        .await;
    assert!(
        crate::support::err(&spoof).contains("unknown field"),
        "{spoof:?}"
    );
    let approved = ok(&operator
        .call(
            "approve",
            json!({"request_id": id, "comment": "fine", "fields": {"po_number": "PO-9"}}),
        )
        .await);
    assert_eq!(approved["status"], "approved");
    assert_eq!(approved["decision"]["approvers"][0]["id"], "token:alice");
    assert_eq!(approved["decision"]["approvers"][0]["channel"], "mcp");
    let again = err(&operator.call("reject", json!({"request_id": id})).await);
    assert!(
        again.starts_with("already_decided:") && again.contains("alice via mcp"),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_input_errors_name_the_problem() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let missing = err(&agent
        .call("request_approval", json!({"action_details": {}}))
        .await);
    assert!(missing.contains("action_description"), "{missing}");
    let wrong_type = err(&agent
        .call(
            "request_approval",
            json!({"action_description": "x", "action_details": {"amount": 12}}),
        )
        .await);
    assert!(wrong_type.contains("invalid type"), "{wrong_type}");
    let too_long = err(&agent
        .call(
            "request_approval",
            json!({"action_description": "x", "timeout_hours": 169}),
        )
        .await);
    assert!(
        too_long.starts_with("invalid_input:") && too_long.contains("timeout_hours"),
        "{too_long}"
    );
    let unknown = err(&agent
        .call("check_approval", json!({"request_id": "req_nope"}))
        .await);
    assert!(unknown.starts_with("not_found:"), "{unknown}");
    let wait = err(&agent
        .call(
            "wait_for_approval",
            json!({"request_id": "req_nope", "timeout_seconds": 301}),
        )
        .await);
    assert!(wait.contains("at most 300"), "{wait}");
    assert!(
        server
            .event_kinds()
            .await
            .iter()
            .all(|k| k.starts_with("token_")),
        "failed calls wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retries_return_the_same_request() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let body = json!({"action_description": "Email 3,200 customers", "action_details": {"campaign": "welcome"}, "idempotency_key": "campaign-welcome-1"});
    let first = ok(&agent.call("request_approval", body.clone()).await);
    let second = ok(&agent.call("request_approval", body).await);
    assert_eq!(first["request_id"], second["request_id"]);
    assert_eq!(first["existing"], false);
    assert_eq!(second["existing"], true);
    let different = err(&agent.call("request_approval", json!({"action_description": "Email 3,200 customers", "action_details": {"campaign": "winback"}, "idempotency_key": "campaign-welcome-1"})).await);
    assert!(
        different.starts_with("idempotency_mismatch:"),
        "{different}"
    );
    let kinds = server.event_kinds().await;
    assert_eq!(kinds.iter().filter(|k| *k == "request_created").count(), 1);
}

/// The published output schemas name every channel a decision is made through and
/// every way an approver authenticates (docs and schema agree with the code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_schemas_list_every_channel_and_authentication() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let tools = agent.service.list_all_tools().await.unwrap();
    let schema = |name: &str| -> String {
        let tool = tools.iter().find(|t| t.name == name).unwrap();
        serde_json::to_string(tool.output_schema.as_ref().unwrap()).unwrap()
    };
    for tool in ["check_approval", "wait_for_approval"] {
        let text = schema(tool);
        for channel in ["api", "mcp", "cli", "dashboard", "slack", "email"] {
            assert!(
                text.contains(&format!("\"{channel}\"")),
                "{tool}'s schema lacks channel {channel}: {text}"
            );
        }
        for how in [
            "bearer_token",
            "local_os_user",
            "password_session",
            "slack_signature",
            "email_token",
        ] {
            assert!(
                text.contains(&format!("\"{how}\"")),
                "{tool}'s schema lacks authentication {how}"
            );
        }
        assert!(!text.contains("api, mcp or cli"), "{text}");
    }
}
