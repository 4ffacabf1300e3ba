//! Quorum and separation of duties in a running `serve` (docs/policies.md#quorum-and-separation-of-duties):
//! a policy's `@approvals` and `@approvers` make a request wait for that many distinct
//! accounts from a group; identities (tokens, the terminal's OS user) count as the
//! account the config maps them to; the requester's account never counts; each approval
//! is logged as it comes and the proof names every approver with its account; waiters
//! wake only on the outcome; the n-th approval racing a rejection gives one outcome.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Server};

const POLICIES: &str = r#"
@id("production-deploys")
@approvals("2")
@approvers("sre")
permit(principal, action == Action::"deploy", resource)
when { context.input has env && context.input.env == "production" };

@id("sre-transfers")
@approvers("sre")
permit(principal, action == Action::"transfer", resource)
when { context.input has large };

@id("finance-transfers")
@approvers("finance")
permit(principal, action == Action::"transfer", resource)
when { context.input has large };
"#;

/// alice holds two tokens and is the OS user at the terminal; bob and erin are in sre by
/// their tokens; carol is in no group; dave owns the agent that asks.
fn configure(data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(data.join("p.cedar"), POLICIES).unwrap();
    let config = format!(
        r#"[policy]
files = ["p.cedar"]

[groups]
sre = ["user:alice", "token:bob", "token:erin", "user:dave"]
finance = ["user:alice"]

[tokens]
accounts = {{ "alice-laptop" = "alice", "alice-ci" = "alice", "bot" = "dave", "dave-desk" = "dave" }}

[cli]
unattended_decisions = true
accounts = {{ "{}" = "alice" }}
"#,
        common::os_user()
    );
    std::fs::write(data.join("countersign.toml"), config).unwrap();
}

struct Tokens {
    bot: String,
    alice_laptop: String,
    alice_ci: String,
    bob: String,
    carol: String,
    dave: String,
    erin: String,
}

async fn tokens(data: &Path) -> Tokens {
    Tokens {
        bot: common::create_token(data, "agent", "bot").await,
        alice_laptop: common::create_token(data, "approver", "alice-laptop").await,
        alice_ci: common::create_token(data, "approver", "alice-ci").await,
        bob: common::create_token(data, "approver", "bob").await,
        carol: common::create_token(data, "approver", "carol").await,
        dave: common::create_token(data, "approver", "dave-desk").await,
        erin: common::create_token(data, "approver", "erin").await,
    }
}

async fn deploy(server: &Server, bot: &str, n: usize) -> String {
    server
        .create_request(
            bot,
            &json!({
                "action_description": format!("deploy web #{n} to production"),
                "action_details": {"tool": "deploy", "env": "production", "n": n.to_string()},
            }),
        )
        .await
}

#[tokio::test]
async fn two_accounts_from_the_group_approve_and_no_account_counts_twice() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data);
    let t = tokens(&data).await;
    let server = Server::start(&data);

    let id = deploy(&server, &t.bot, 1).await;
    let pending = server.request_view(&t.bob, &id).await;
    assert_eq!(pending["status"], "pending", "{pending}");
    assert_eq!(pending["quorum"]["required"], 2, "{pending}");
    assert_eq!(pending["quorum"]["group"], "sre");
    assert_eq!(pending["quorum"]["still_needed"], 2);
    assert_eq!(pending["policy"]["id"], "production-deploys");

    // An agent waiting on it hears nothing until the outcome.
    let waiter = {
        let http = server.http().clone();
        let url = server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=60"));
        let bot = t.bot.clone();
        tokio::spawn(async move { common::send(http.get(url).bearer_auth(bot)).await })
    };

    // Not in sre: not eligible.
    let (status, body) = server.decide(&id, &t.carol, "approved").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(common::error_code(&body), "not_eligible", "{body}");
    // dave owns the agent that asked: through his own token he is the requester.
    let (status, body) = server.decide(&id, &t.dave, "approved").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(common::error_code(&body), "self_approval", "{body}");
    assert!(
        body.to_string().contains("account user:dave"),
        "the refusal names the account: {body}"
    );
    // The view says so before anyone clicks.
    let seen = server.request_view(&t.dave, &id).await;
    assert_eq!(seen["can_decide"], false, "{seen}");

    // alice, through her laptop's token: recorded, still pending.
    let (status, first) = server.decide(&id, &t.alice_laptop, "approved").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "pending", "{first}");
    assert!(first["proof"].is_null(), "{first}");
    assert_eq!(first["quorum"]["still_needed"], 1, "{first}");
    assert_eq!(
        first["quorum"]["approvals"][0]["approver"]["account"],
        "user:alice"
    );
    assert!(
        first["message"]
            .as_str()
            .unwrap_or_default()
            .contains("1 of 2 approvals"),
        "{first}"
    );
    // alice again, through another token, and at the terminal: one account counts once.
    let (status, body) = server.decide(&id, &t.alice_ci, "approved").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(common::error_code(&body), "already_approved", "{body}");
    let cli = common::run(&data, &["approve", &id]).await;
    assert!(!cli.ok(), "the terminal's alice counted twice: {cli}");
    assert!(cli.stderr.contains("already approved"), "{cli}");
    let seen = server.request_view(&t.alice_ci, &id).await;
    assert_eq!(seen["can_decide"], false, "{seen}");
    assert!(
        seen["cannot_decide_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Your account approved this"),
        "{seen}"
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "a waiter woke on an approval short of the quorum"
    );

    // bob completes it: approved, a proof naming both with their accounts.
    let (status, done) = server.decide(&id, &t.bob, "approved").await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "approved", "{done}");
    let (status, woke) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter woke")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{woke}");
    assert_eq!(woke["status"], "approved", "{woke}");
    let statement = common::statement(&woke["proof"]);
    let approvers: Vec<(String, String)> = statement["approvers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap_or_default().to_string(),
                a["account"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        approvers,
        [
            ("token:alice-laptop".to_string(), "user:alice".to_string()),
            ("token:bob".to_string(), "token:bob".to_string()),
        ]
    );
    let file = common::write_json(&data, "proof.json", &woke["proof"]);
    let verified = common::run(&data, &["verify", common::path_str(&file)]).await;
    assert!(verified.ok(), "countersign verify: {verified}");

    // Any rejection rejects, from an eligible account; the approvals so far stay.
    let id = deploy(&server, &t.bot, 2).await;
    let cli = common::run(&data, &["approve", &id]).await;
    assert!(cli.ok(), "alice at the terminal: {cli}");
    assert!(cli.stdout.contains("1 of 2 approvals"), "{cli}");
    let (status, body) = server.decide(&id, &t.carol, "rejected").await;
    assert_eq!(common::error_code(&body), "not_eligible", "{status} {body}");
    let (status, rejected) = server.decide(&id, &t.erin, "rejected").await;
    assert_eq!(status, StatusCode::OK, "{rejected}");
    assert_eq!(rejected["status"], "rejected");
    assert_eq!(
        rejected["quorum"]["approvals"][0]["approver"]["id"],
        format!("local:{}", common::os_user())
    );

    // Two policies that want approvers from different groups: refused, signed, naming both.
    let id = server
        .create_request(
            &t.bot,
            &json!({"action_description": "a large transfer", "action_details": {"tool": "transfer", "large": "yes"}}),
        )
        .await;
    let refused = server.request_view(&t.bob, &id).await;
    assert_eq!(refused["status"], "rejected", "{refused}");
    assert_eq!(refused["decision"]["authorization_type"], "policy");
    assert_eq!(
        refused["decision"]["policy"]["id"],
        "finance-transfers,sre-transfers"
    );

    // This server does not let a request ask for its own quorum.
    let (status, body) = server
        .post(
            "/api/v1/requests",
            Some(&t.bot),
            &json!({"action_description": "anything", "approvals": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.to_string().contains("its own quorum"), "{body}");

    // The log has each approval as it came, and the database agrees with it.
    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {out}");
    let mut recorded = 0;
    for i in 0..60 {
        let (status, entry) = server
            .get(&format!("/api/v1/log/entries/{i}"), Some(&t.bob))
            .await;
        if status != StatusCode::OK {
            break;
        }
        if entry["entry"]["type"] == "request_approval_recorded" {
            recorded += 1;
        }
    }
    assert_eq!(
        recorded, 2,
        "one recorded approval per request short of its quorum"
    );
}

#[tokio::test]
async fn the_last_approval_and_a_rejection_at_once_give_one_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data);
    let t = tokens(&data).await;
    let server = Server::start(&data);
    let mut approved = 0;
    let mut rejected = 0;
    for n in 0..12 {
        let id = deploy(&server, &t.bot, n).await;
        let (status, body) = server.decide(&id, &t.alice_laptop, "approved").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (yes, no) = tokio::join!(
            server.decide(&id, &t.bob, "approved"),
            server.decide(&id, &t.erin, "rejected"),
        );
        let won: Vec<&(StatusCode, Value)> = [&yes, &no]
            .into_iter()
            .filter(|(s, _)| *s == StatusCode::OK)
            .collect();
        assert_eq!(won.len(), 1, "exactly one decision wins: {yes:?} {no:?}");
        let lost = if yes.0 == StatusCode::OK { &no } else { &yes };
        assert_eq!(lost.0, StatusCode::CONFLICT, "{lost:?}");
        assert_eq!(common::error_code(&lost.1), "already_decided", "{lost:?}");
        let end = server.request_view(&t.bob, &id).await;
        assert_eq!(end["status"], won[0].1["status"], "{end}");
        if end["status"] == "approved" {
            approved += 1;
        } else {
            rejected += 1;
        }
    }
    println!("12 races: {approved} approved, {rejected} rejected");
    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {out}");
}

#[tokio::test]
async fn a_request_asks_for_its_own_quorum_where_the_operator_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data);
    let mut config = std::fs::read_to_string(data.join("countersign.toml")).unwrap();
    config.push_str("\n[limits]\nrequest_quorum = true\n");
    std::fs::write(data.join("countersign.toml"), config).unwrap();
    let t = tokens(&data).await;
    let server = Server::start(&data);

    let (status, made) = server
        .post(
            "/api/v1/requests",
            Some(&t.bot),
            &json!({"action_description": "rotate the root keys", "approvals": 3, "approvers": "sre"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["quorum"]["required"], 3, "{made}");
    assert_eq!(made["quorum"]["group"], "sre");
    let id = made["request_id"].as_str().unwrap();
    let (status, body) = server.decide(id, &t.carol, "approved").await;
    assert_eq!(common::error_code(&body), "not_eligible", "{status} {body}");
    for token in [&t.alice_laptop, &t.bob] {
        let (status, body) = server.decide(id, token, "approved").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "pending", "{body}");
    }
    let (_, done) = server.decide(id, &t.erin, "approved").await;
    assert_eq!(done["status"], "approved", "{done}");
    assert_eq!(done["decision"]["approvers"].as_array().unwrap().len(), 3);

    // A policy's quorum and the request's combine: the larger count applies.
    let (status, made) = server
        .post(
            "/api/v1/requests",
            Some(&t.bot),
            &json!({"action_description": "deploy", "action_details": {"tool": "deploy", "env": "production"}, "approvals": 1, "approvers": "sre"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["quorum"]["required"], 2, "{made}");
    // A group the config lacks, and a count out of range, are refused.
    let (status, body) = server
        .post(
            "/api/v1/requests",
            Some(&t.bot),
            &json!({"action_description": "x", "approvers": "nobody"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = server
        .post(
            "/api/v1/requests",
            Some(&t.bot),
            &json!({"action_description": "x", "approvals": 11}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {out}");
}
