//! Reviews, from outside: accepted only from the principal the operator named as the
//! reviewer (a token or a dashboard account), once per request, answered with the
//! review as recorded; the requester, another agent, an approver and an admin are all
//! refused, and only the reviewer is offered `record_review`.

use countersign_core::evidence::Reviewer;
use countersign_core::{Principal, Role};
use countersign_server::gate::ReviewerSettings;
use countersign_server::{HttpConfig, Settings};
use serde_json::{Value, json};

use crate::support::{TestServer, accept, err, ok, start, start_full};

async fn with_reviewer(principal: &str, label: Option<Reviewer>) -> TestServer {
    let settings = Settings {
        reviewer: Some(ReviewerSettings {
            principal: principal.into(),
            label,
        }),
        ..Settings::default()
    };
    start_full(HttpConfig::default(), settings).await
}

async fn decided(server: &TestServer) -> String {
    let id = server.create_default().await;
    let (status, body) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 200, "{body}");
    id
}

async fn review(server: &TestServer, token: &str, id: &str, verdict: &str) -> (u16, Value) {
    server
        .post(
            &format!("/api/v1/requests/{id}/review"),
            token,
            json!({"verdict": verdict, "notes": "amount looks high"}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_named_reviewer_reviews_and_only_once() {
    let server = with_reviewer("token:audit-bot", None).await;
    let setup = Principal::local_user("test-setup", Role::Admin);
    let (_, auditor) = server
        .gate
        .create_token("audit-bot", Role::Agent, &setup)
        .await
        .unwrap();
    let id = decided(&server).await;

    // The requester, another agent, an approver, an admin: refused, on REST and MCP.
    for token in [
        &server.agent,
        &server.agent2,
        &server.approver,
        &server.admin,
    ] {
        let (status, body) = review(&server, token, &id, "accepted").await;
        assert_eq!(status, 403, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not that reviewer"),
            "{body}"
        );
        let mcp = server.mcp(token).await;
        assert!(
            !mcp.tool_names()
                .await
                .contains(&"record_review".to_string())
        );
    }
    let requester = server.mcp(&server.agent).await;
    let refused = requester
        .service
        .call_tool(
            rmcp::model::CallToolRequestParams::new("record_review").with_arguments(
                json!({"request_id": id, "verdict": "accepted"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await;
    assert!(format!("{refused:?}").contains("reviewer"), "{refused:?}");

    // The reviewer (an agent token here) reviews another's request, and sees the review.
    let (status, body) = review(&server, &auditor, &id, "flagged").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["request_id"], id.as_str());
    assert_eq!(body["review"]["verdict"], "flagged");
    assert_eq!(body["review"]["notes"], "amount looks high");
    assert_eq!(body["review"]["reviewer_id"], "token:audit-bot");
    assert_eq!(body["review"]["recorded_by"], "token:audit-bot");

    // Once per request: a second is refused, over either surface.
    let (status, body) = review(&server, &auditor, &id, "accepted").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("reviews a request once"),
        "{body}"
    );
    let mcp = server.mcp(&auditor).await;
    assert!(
        mcp.tool_names()
            .await
            .contains(&"record_review".to_string())
    );
    let again = err(&mcp
        .call(
            "record_review",
            json!({"request_id": id, "verdict": "accepted"}),
        )
        .await);
    assert!(again.contains("reviews a request once"), "{again}");
    // The model cannot name the reviewer.
    let spoof = err(&mcp
        .call(
            "record_review",
            json!({"request_id": id, "verdict": "accepted", "reviewer": "me"}),
        )
        .await);
    assert!(spoof.contains("unknown field"), "{spoof}");

    // Another request, over MCP: the reply is the review as recorded.
    let other = decided(&server).await;
    let early = server.create_default().await;
    let pending = err(&mcp
        .call(
            "record_review",
            json!({"request_id": early, "verdict": "accepted"}),
        )
        .await);
    assert!(pending.contains("still pending"), "{pending}");
    let recorded = ok(&mcp
        .call(
            "record_review",
            json!({"request_id": other, "verdict": "accepted"}),
        )
        .await);
    assert_eq!(recorded["review"]["verdict"], "accepted");
    let kinds = server.event_kinds().await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "review_recorded").count(),
        2,
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_are_off_by_default_and_a_configured_label_is_shown() {
    let server = start().await;
    let id = decided(&server).await;
    let (status, body) = review(&server, &server.admin, &id, "accepted").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.to_string().contains("[review] reviewer"), "{body}");

    // The label from before `reviewer` existed is what reviews show; who recorded it is
    // still the reviewer principal.
    let label = Reviewer {
        id: "config:audit-team".into(),
        display_name: "Audit team".into(),
    };
    let server = with_reviewer("token:bob", Some(label)).await;
    let id = decided(&server).await;
    let (status, body) = review(&server, &server.approver2, &id, "accepted").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["review"]["reviewer_id"], "config:audit-team");
    assert_eq!(body["review"]["reviewer_name"], "Audit team");
    assert_eq!(body["review"]["recorded_by"], "token:bob");
    let events = server.gate.store().events_of_subject(&id).await.unwrap();
    let logged = events
        .iter()
        .find(|e| e.entry.kind.as_str() == "review_recorded")
        .unwrap();
    assert_eq!(logged.entry.actor.as_deref(), Some("token:bob"));
    assert_eq!(logged.entry.data["reviewer"]["id"], "config:audit-team");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_account_can_be_the_reviewer() {
    let server = with_reviewer("user:rita", None).await;
    let accounts = server.gate.accounts();
    let setup = Principal::local_user("test-setup", Role::Admin);
    let (_, invite) = accounts
        .invite("rita", Some("Rita Reviewer"), Role::Approver, &setup, 600)
        .await
        .unwrap();
    let (browser, me) = accept(
        &server,
        json!({"token": invite, "password": "correct horse battery"}),
    )
    .await;
    let csrf = me["csrf_token"].as_str().unwrap().to_string();
    let id = decided(&server).await;
    let post = |csrf: &str| {
        browser
            .post(server.url(&format!("/ui/api/requests/{id}/review")))
            .header("x-csrf-token", csrf)
            .json(&json!({"verdict": "accepted"}))
            .send()
    };
    assert_eq!(
        post("wrong").await.unwrap().status(),
        403,
        "CSRF is checked"
    );
    let resp = post(&csrf).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["review"]["reviewer_id"], "user:rita");
    assert_eq!(body["review"]["reviewer_name"], "Rita Reviewer");
    assert_eq!(post(&csrf).await.unwrap().status(), 400, "once");
}
