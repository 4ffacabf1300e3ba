//! Standing grants in a running `serve` (docs/policies.md#standing-grants): given with an
//! approval or on their own, they approve later requests of their agent and tool within
//! their bounds, for their time and uses, with `authorization_type: "grant"` naming the
//! grant and its maker; revoked at once; never wider than their maker (no quorum
//! bypassed, nothing granted to one's own agent); listed over REST and the CLI; logged
//! and held to the log by `log verify`.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Server};

const POLICIES: &str = r#"
@id("production-deploys")
@approvals("2")
permit(principal, action == Action::"deploy", resource)
when { context.input has env && context.input.env == "production" };
"#;

fn configure(data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(data.join("p.cedar"), POLICIES).unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        r#"[policy]
files = ["p.cedar"]

[tokens]
accounts = { "alice-laptop" = "alice", "bot" = "dave", "dave-desk" = "dave" }
"#,
    )
    .unwrap();
}

async fn ask(server: &Server, bot: &str, tool: &str, details: Value) -> Value {
    let mut details = details;
    details["tool"] = json!(tool);
    let id = server
        .create_request(
            bot,
            &json!({"action_description": format!("{tool} for a customer"), "action_details": details}),
        )
        .await;
    server.request_view(bot, &id).await
}

#[tokio::test]
async fn grants_approve_within_their_bounds_time_and_uses_and_never_beyond_their_maker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data);
    let bot = common::create_token(&data, "agent", "bot").await;
    let alice = common::create_token(&data, "approver", "alice-laptop").await;
    let bob = common::create_token(&data, "approver", "bob").await;
    let dave = common::create_token(&data, "approver", "dave-desk").await;
    let server = Server::start(&data);

    // alice approves a refund and grants more with it: EUR refunds up to 100, twice.
    let first = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "40", "currency": "EUR"}),
    )
    .await;
    assert_eq!(first["status"], "pending");
    let id = first["request_id"].as_str().unwrap();
    let (status, decided) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(&alice),
            &json!({"decision": "approved", "grant": {"for_seconds": 3600, "max_uses": 2, "exact": ["currency"], "max": {"amount": "100"}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["status"], "approved");
    let grant = &decided["grant"];
    assert_eq!(grant["status"], "active", "{decided}");
    assert_eq!(grant["agent"], "token:bot");
    assert_eq!(grant["tool"], "refund");
    assert_eq!(grant["exact"], json!({"currency": "EUR"}));
    assert_eq!(grant["from_request"], id);
    assert_eq!(grant["granted_by"]["account"], "user:alice");
    let grant_id = grant["id"].as_str().unwrap().to_string();

    // Inside: approved at once by the grant, its proof naming the grant and its maker.
    let inside = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "99.50", "currency": "EUR"}),
    )
    .await;
    assert_eq!(inside["status"], "approved", "{inside}");
    assert_eq!(inside["decision"]["authorization_type"], "grant");
    assert_eq!(inside["decision"]["grant"]["id"], grant_id.as_str());
    assert_eq!(
        inside["decision"]["grant"]["granted_by"]["id"],
        "token:alice-laptop"
    );
    let statement = common::statement(&inside["proof"]);
    assert_eq!(statement["authorization_type"], "grant");
    assert_eq!(statement["grant"]["id"], grant_id.as_str());
    assert_eq!(statement["approvers"], json!([]));
    let file = common::write_json(&data, "grant-proof.json", &inside["proof"]);
    let verified = common::run(&data, &["verify", common::path_str(&file)]).await;
    assert!(verified.ok(), "countersign verify: {verified}");

    // Outside its bounds: a person decides.
    let over = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "100.01", "currency": "EUR"}),
    )
    .await;
    assert_eq!(over["status"], "pending", "over the ceiling: {over}");
    let other = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "5", "currency": "USD"}),
    )
    .await;
    assert_eq!(other["status"], "pending", "another currency: {other}");
    let tool = ask(
        &server,
        &bot,
        "delete",
        json!({"amount": "5", "currency": "EUR"}),
    )
    .await;
    assert_eq!(tool["status"], "pending", "another tool: {tool}");
    // Its second use, then it is used up.
    let second = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "1", "currency": "EUR"}),
    )
    .await;
    assert_eq!(second["status"], "approved", "{second}");
    let third = ask(
        &server,
        &bot,
        "refund",
        json!({"amount": "1", "currency": "EUR"}),
    )
    .await;
    assert_eq!(
        third["status"], "pending",
        "a used-up grant approved: {third}"
    );

    // A grant on its own, revoked at once: by its maker, not by another approver.
    let (status, restart) = server
        .post(
            "/api/v1/grants",
            Some(&alice),
            &json!({"agent": "token:bot", "tool": "restart", "for_seconds": 600}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{restart}");
    let restart_id = restart["id"].as_str().unwrap().to_string();
    let before = ask(&server, &bot, "restart", json!({"service": "web"})).await;
    assert_eq!(before["status"], "approved", "{before}");
    let (status, body) = server
        .post(
            &format!("/api/v1/grants/{restart_id}/revoke"),
            Some(&bob),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/grants/{restart_id}/revoke"),
            Some(&alice),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "revoked");
    let after = ask(&server, &bot, "restart", json!({"service": "web"})).await;
    assert_eq!(
        after["status"], "pending",
        "a revoked grant approved: {after}"
    );

    // One that expires.
    let (status, brief) = server
        .post(
            "/api/v1/grants",
            Some(&alice),
            &json!({"agent": "token:bot", "tool": "ping", "for_seconds": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{brief}");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let late = ask(&server, &bot, "ping", json!({})).await;
    assert_eq!(
        late["status"], "pending",
        "an expired grant approved: {late}"
    );

    // A retried request (same idempotency key) is the earlier one: no second use.
    let (status, retried) = server
        .post(
            "/api/v1/grants",
            Some(&alice),
            &json!({"agent": "token:bot", "tool": "resend", "max_uses": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{retried}");
    let retried_id = retried["id"].as_str().unwrap().to_string();
    let body = json!({"action_description": "resend invoice 7", "action_details": {"tool": "resend"}, "idempotency_key": "resend-7"});
    let once = server.create_request(&bot, &body).await;
    let (status, again) = server.post("/api/v1/requests", Some(&bot), &body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the retry returns the earlier request: {again}"
    );
    assert_eq!(again["request_id"], once.as_str());
    assert_eq!(again["status"], "approved", "{again}");
    let (_, list) = server.get("/api/v1/grants", Some(&alice)).await;
    let uses = list["grants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["id"] == retried_id.as_str())
        .map(|g| g["uses"].clone());
    assert_eq!(uses, Some(json!(1)), "a retry spent a use: {list}");

    // Never wider than its maker: no quorum bypassed (and nothing decided), nothing
    // granted to one's own agent, nothing for an agent's request with no tool.
    let deploy = ask(&server, &bot, "deploy", json!({"env": "production"})).await;
    let deploy_id = deploy["request_id"].as_str().unwrap();
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{deploy_id}/decision"),
            Some(&alice),
            &json!({"decision": "approved", "grant": {"for_seconds": 600}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.to_string().contains("cannot bypass a quorum"),
        "{body}"
    );
    let (_, still) = server
        .get(&format!("/api/v1/requests/{deploy_id}"), Some(&alice))
        .await;
    assert_eq!(still["status"], "pending");
    assert!(
        still["quorum"]["approvals"].as_array().unwrap().is_empty(),
        "{still}"
    );
    let (status, body) = server
        .post(
            "/api/v1/grants",
            Some(&dave),
            &json!({"agent": "token:bot", "tool": "refund"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(common::error_code(&body), "self_approval", "{body}");
    let (status, body) = server
        .post(
            &format!(
                "/api/v1/requests/{}/decision",
                over["request_id"].as_str().unwrap()
            ),
            Some(&alice),
            &json!({"decision": "rejected", "grant": {}}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a grant with a rejection: {body}"
    );

    // Listed with their state, over REST and the CLI.
    let (status, list) = server.get("/api/v1/grants", Some(&bob)).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let states: Vec<(String, String)> = list["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["tool"].as_str().unwrap().to_string(),
                g["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for expected in [
        ("refund", "used_up"),
        ("restart", "revoked"),
        ("ping", "expired"),
    ] {
        assert!(
            states.contains(&(expected.0.to_string(), expected.1.to_string())),
            "{expected:?} in {states:?}"
        );
    }
    let (status, _) = server.get("/api/v1/grants", Some(&bot)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "an agent read the grants");
    let cli = common::run_ok(&data, &["grant", "list"]).await;
    assert!(cli.contains(&grant_id) && cli.contains("used_up"), "{cli}");
    let made = common::run_ok(
        &data,
        &[
            "grant",
            "create",
            "--agent",
            "token:bot",
            "--tool",
            "notify",
            "--max",
            "count=3",
            "--for",
            "10m",
            "--uses",
            "1",
        ],
    )
    .await;
    let cli_id = made.trim().to_string();
    let notify = ask(&server, &bot, "notify", json!({"count": "2"})).await;
    assert_eq!(notify["status"], "approved", "{notify}");
    assert_eq!(notify["decision"]["grant"]["id"], cli_id.as_str());
    let revoked = common::run(&data, &["grant", "revoke", &cli_id]).await;
    assert!(revoked.ok(), "{revoked}");
    let again = common::run(&data, &["grant", "revoke", &cli_id]).await;
    assert!(
        !again.ok() && again.stderr.contains("was revoked"),
        "{again}"
    );

    // Every grant, use and revocation is in the log, and the rows agree with it.
    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {out}");
    let mut kinds = Vec::new();
    for i in 0..200 {
        let (status, entry) = server
            .get(&format!("/api/v1/log/entries/{i}"), Some(&bob))
            .await;
        if status != StatusCode::OK {
            break;
        }
        let kind = entry["entry"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind.starts_with("grant_") {
            kinds.push(kind);
        }
    }
    let count = |k: &str| kinds.iter().filter(|x| x.as_str() == k).count();
    assert_eq!(count("grant_created"), 5, "{kinds:?}");
    assert_eq!(count("grant_used"), 5, "{kinds:?}");
    assert_eq!(count("grant_revoked"), 2, "{kinds:?}");
}
