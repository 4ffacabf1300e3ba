//! Batch decisions (docs/api.md, `POST /api/v1/requests/decisions`; `countersign approve`
//! with several ids or `--agent` / `--tool`): one confirmation, each request decided at the
//! version it was selected at with its own signed proof and log entry; a request that
//! changed meanwhile (decided, or an approval recorded toward its quorum) is reported with
//! why, never decided.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Server};

fn configure(data: &std::path::Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        data.join("p.cedar"),
        "@id(\"two-for-payouts\")\n@approvals(\"2\")\npermit(principal, action == Action::\"payout\", resource);\n",
    )
    .unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        "[policy]\nfiles = [\"p.cedar\"]\n\n[cli]\nunattended_decisions = true\n",
    )
    .unwrap();
}

async fn make(server: &Server, bot: &str, tool: &str, n: usize) -> String {
    server
        .create_request(
            bot,
            &json!({"action_description": format!("{tool} #{n}"), "action_details": {"tool": tool, "n": n.to_string()}}),
        )
        .await
}

#[tokio::test]
async fn a_batch_decides_each_request_at_its_version_and_reports_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    configure(&data);
    let bot = common::create_token(&data, "agent", "bot").await;
    let alice = common::create_token(&data, "approver", "alice").await;
    let bob = common::create_token(&data, "approver", "bob").await;
    let server = Server::start(&data);

    let a = make(&server, &bot, "export", 1).await;
    let b = make(&server, &bot, "export", 2).await;
    let decided_elsewhere = make(&server, &bot, "export", 3).await;
    let payout = make(&server, &bot, "payout", 4).await;
    // Between selection and confirmation: one is decided, one gets an approval recorded.
    let (s, _) = server.decide(&decided_elsewhere, &bob, "rejected").await;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = server.decide(&payout, &bob, "approved").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "pending");

    let selected: Vec<Value> = [&a, &b, &decided_elsewhere, &payout]
        .iter()
        .map(|id| json!({"id": id, "version": 1}))
        .collect();
    let (s, batch) = server
        .post(
            "/api/v1/requests/decisions",
            Some(&alice),
            &json!({"decision": "approved", "comment": "routine exports", "requests": selected}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{batch}");
    let decided: Vec<&str> = batch["decided"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(decided, [a.as_str(), b.as_str()], "{batch}");
    let not: Vec<(String, String)> = batch["not_decided"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["request_id"].as_str().unwrap().to_string(),
                n["code"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        not,
        [
            (decided_elsewhere.clone(), "already_decided".to_string()),
            (payout.clone(), "changed".to_string()),
        ],
        "{batch}"
    );
    // Each with its own proof; what changed is as it was.
    let mut nonces = Vec::new();
    for id in [&a, &b] {
        let view = server.request_view(&bot, id).await;
        assert_eq!(view["status"], "approved");
        assert_eq!(view["decision"]["comment"], "routine exports");
        nonces.push(common::statement(&view["proof"])["nonce"].clone());
    }
    assert_ne!(nonces[0], nonces[1]);
    assert_eq!(
        server.request_view(&bot, &decided_elsewhere).await["status"],
        "rejected"
    );
    let still = server.request_view(&bot, &payout).await;
    assert_eq!(still["status"], "pending");
    assert_eq!(still["quorum"]["approvals"].as_array().unwrap().len(), 1);

    // Bounds, and the agent's credential reaches no decision path.
    let (s, body) = server
        .post(
            "/api/v1/requests/decisions",
            Some(&alice),
            &json!({"decision": "approved", "requests": []}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    let (s, body) = server
        .post(
            "/api/v1/requests/decisions",
            Some(&alice),
            &json!({"decision": "approved", "requests": [{"id": &a, "version": 2}, {"id": &a, "version": 2}]}),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "a request selected twice: {body}"
    );
    let (s, _) = server
        .post(
            "/api/v1/requests/decisions",
            Some(&bot),
            &json!({"decision": "approved", "requests": [{"id": &payout, "version": 2}]}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // The terminal: every pending export of the bot, one confirmation (unattended here).
    let c = make(&server, &bot, "export", 5).await;
    let d = make(&server, &bot, "export", 6).await;
    let other = make(&server, &bot, "delete", 7).await;
    let out = common::run(
        &data,
        &[
            "reject",
            "--agent",
            "token:bot",
            "--tool",
            "export",
            "--comment",
            "not today",
        ],
    )
    .await;
    assert!(out.ok(), "{out}");
    for id in [&c, &d] {
        assert!(out.stdout.contains(&format!("{id} rejected")), "{out}");
        assert_eq!(server.request_view(&bot, id).await["status"], "rejected");
    }
    assert_eq!(server.request_view(&bot, &other).await["status"], "pending");
    // Named ids: one decided, one already closed (reported, exit status 2).
    let out = common::run(&data, &["approve", &other, &c]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stdout.contains(&format!("{other} approved")), "{out}");
    assert!(out.stdout.contains(&format!("{c} not decided")), "{out}");

    let out = common::run(&data, &["log", "verify"]).await;
    assert!(out.ok(), "log verify: {out}");
}
