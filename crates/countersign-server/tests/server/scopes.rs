//! Roles and scopes, from outside: an executor token reaches only verification and
//! redemption, on every REST route and MCP tool; a token narrowed to some scopes is
//! refused everything else and sees only its tools; an expired token is refused like an
//! unknown one; token names are unique forever and an agent may not take a person's.

use std::sync::Arc;

use countersign_core::{FixedClock, Principal, Role, Scope, Scopes, Timestamp};
use countersign_server::gate::{NewToken, ReviewerSettings};
use countersign_server::{HttpConfig, Settings};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::support::{TestServer, start, start_clocked, start_full};

/// Every REST route under `/api/v1` but the two proof routes, with a body each accepts
/// from the right caller: (method, path, body).
fn every_other_route(id: &str) -> Vec<(&'static str, String, Value)> {
    let r = |m, p: &str, b| (m, p.to_string(), b);
    vec![
        r(
            "POST",
            "/api/v1/requests",
            json!({"action_description": "x"}),
        ),
        r("GET", "/api/v1/requests", Value::Null),
        r("GET", &format!("/api/v1/requests/{id}"), Value::Null),
        r(
            "GET",
            &format!("/api/v1/requests/{id}/wait?timeout_seconds=0"),
            Value::Null,
        ),
        r(
            "POST",
            &format!("/api/v1/requests/{id}/decision"),
            json!({"decision": "approved"}),
        ),
        r("POST", &format!("/api/v1/requests/{id}/cancel"), json!({})),
        r(
            "POST",
            &format!("/api/v1/requests/{id}/actions"),
            json!({"tool": "t"}),
        ),
        r(
            "POST",
            &format!("/api/v1/requests/{id}/outcome"),
            json!({"status": "succeeded"}),
        ),
        r(
            "POST",
            &format!("/api/v1/requests/{id}/review"),
            json!({"verdict": "accepted"}),
        ),
        r("POST", "/api/v1/decisions", json!({"decision": "x"})),
        r("GET", &format!("/api/v1/evidence/{id}"), Value::Null),
        r("POST", "/api/v1/evidence/verify", json!({})),
        r("GET", "/api/v1/log/checkpoint", Value::Null),
        r("GET", "/api/v1/log/key", Value::Null),
        r("GET", "/api/v1/log/entries/0", Value::Null),
        r("GET", "/api/v1/log/proof/inclusion?index=0", Value::Null),
        r(
            "GET",
            "/api/v1/log/proof/consistency?first=1&second=2",
            Value::Null,
        ),
        r("GET", "/api/v1/tokens", Value::Null),
        r(
            "POST",
            "/api/v1/tokens",
            json!({"name": "sneaky", "role": "admin"}),
        ),
        r("POST", "/api/v1/tokens/tok_x/revoke", json!({})),
        r("GET", "/api/v1/deliveries", Value::Null),
        r("GET", "/api/v1/rooms", Value::Null),
        r("POST", "/api/v1/rooms", json!({"name": "ops"})),
        r("GET", "/api/v1/rooms/ops/messages", Value::Null),
        r("POST", "/api/v1/rooms/ops/messages", json!({"text": "hi"})),
        r("GET", "/api/v1/rooms/ops/members", Value::Null),
        r(
            "POST",
            "/api/v1/rooms/ops/questions/m1/answer",
            json!({"text": "yes"}),
        ),
        r(
            "POST",
            "/api/v1/rooms/ops/blockers/m1/resolve",
            json!({"reply": "done"}),
        ),
        r("POST", "/api/v1/rooms/ops/rename", json!({"title": "x"})),
        r("POST", "/api/v1/rooms/ops/delete", json!({})),
    ]
}

async fn call(
    server: &TestServer,
    token: &str,
    (method, path, body): &(&str, String, Value),
) -> (u16, Value) {
    match *method {
        "GET" => server.get(path, token).await,
        _ => server.post(path, token, body.clone()).await,
    }
}

/// Every tool there is: an admin's list with the operator tools and reviews on.
async fn every_tool() -> Vec<String> {
    let settings = Settings {
        reviewer: Some(ReviewerSettings {
            principal: "token:root".into(),
            label: None,
        }),
        ..Settings::default()
    };
    let config = HttpConfig {
        operator_tools: true,
        ..HttpConfig::default()
    };
    let server = start_full(config, settings).await;
    server.mcp(&server.admin).await.tool_names().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_reaches_only_verification_and_redemption() {
    let config = HttpConfig {
        operator_tools: true,
        ..HttpConfig::default()
    };
    let settings = Settings {
        reviewer: Some(ReviewerSettings {
            principal: "token:root".into(),
            label: None,
        }),
        ..Settings::default()
    };
    let server = start_full(config, settings).await;
    let id = server.create_default().await;
    let before = server.event_kinds().await.len();
    for route in every_other_route(&id) {
        let (status, body) = call(&server, &server.executor, &route).await;
        assert_eq!(status, 403, "{} {}: {body}", route.0, route.1);
        assert_eq!(
            body["error"]["code"], "forbidden",
            "{} {}",
            route.0, route.1
        );
        assert!(
            body["error"]["message"].as_str().unwrap().contains("scope"),
            "{} {}: {body}",
            route.0,
            route.1
        );
    }
    assert_eq!(
        server.event_kinds().await.len(),
        before,
        "nothing was written"
    );
    // Over MCP: it is offered the two proof tools, and every other tool is refused.
    let mcp = server.mcp(&server.executor).await;
    assert_eq!(mcp.tool_names().await, ["redeem_proof", "verify_proof"]);
    let all = every_tool().await;
    assert!(all.len() > 20, "{all:?}");
    for tool in all.iter().filter(|t| !t.ends_with("_proof")) {
        let refused = mcp
            .service
            .call_tool(
                CallToolRequestParams::new(tool.clone()).with_arguments(
                    json!({"request_id": id, "room": "ops"})
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            )
            .await;
        let message = format!("{refused:?}");
        assert!(refused.is_err(), "{tool}: {message}");
        assert!(
            message.contains("scope")
                || message.contains("operator tool")
                || message.contains("reviewer"),
            "{tool}: {message}"
        );
    }
    assert_eq!(
        server.event_kinds().await.len(),
        before,
        "nothing was written"
    );

    // The same routes all let an admin through their scope check (so the refusals
    // above are the executor's, not broken routes); past it, a rule may still refuse
    // (only the requester records its action).
    for route in every_other_route(&id) {
        let (status, body) = call(&server, &server.admin, &route).await;
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            !(status == 403 && message.contains("scope")),
            "{} {}: {body}",
            route.0,
            route.1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowed_token_reaches_only_its_scopes_on_rest_and_mcp() {
    let server = start().await;
    let setup = Principal::local_user("test-setup", Role::Admin);
    let new = |name: &str, role, scopes: &[Scope]| NewToken {
        name: name.into(),
        role,
        expires: None,
        scopes: Some(Scopes::of(scopes.iter().copied())),
    };
    let (_, asker) = server
        .gate
        .create_token_as(new("ask-only", Role::Agent, &[Scope::Request]), &setup)
        .await
        .unwrap();
    let (_, chatter) = server
        .gate
        .create_token_as(new("rooms-only", Role::Agent, &[Scope::Rooms]), &setup)
        .await
        .unwrap();
    let (_, watcher) = server
        .gate
        .create_token_as(new("watch-only", Role::Approver, &[Scope::Rooms]), &setup)
        .await
        .unwrap();

    let id = server
        .create(&asker, json!({"action_description": "Restart nginx"}))
        .await;
    let (status, body) = server
        .post(
            "/api/v1/requests",
            &asker,
            json!({"action_description": "Restart nginx", "room": "ops"}),
        )
        .await;
    assert_eq!(
        status, 403,
        "a request shown in a room needs the rooms scope: {body}"
    );
    let (status, body) = server.get("/api/v1/rooms", &asker).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rooms scope")
    );
    let (status, _) = server
        .post(
            "/api/v1/proofs/verify",
            &asker,
            json!({"proof": {"payloadType": "x", "payload": "", "signatures": []}}),
        )
        .await;
    assert_eq!(status, 403, "verify is a scope of its own");
    let tools = server.mcp(&asker).await.tool_names().await;
    assert_eq!(
        tools,
        [
            "cancel_approval",
            "check_approval",
            "record_action",
            "record_outcome",
            "request_approval",
            "wait_for_approval"
        ]
    );

    let (status, _) = server
        .post(
            "/api/v1/requests",
            &chatter,
            json!({"action_description": "x"}),
        )
        .await;
    assert_eq!(status, 403);
    let (status, body) = server
        .post("/api/v1/rooms", &chatter, json!({"name": "ops"}))
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    let tools = server.mcp(&chatter).await.tool_names().await;
    assert!(tools.contains(&"post_message".to_string()), "{tools:?}");
    assert!(
        !tools.contains(&"request_approval".to_string()),
        "{tools:?}"
    );

    // An approver narrowed to rooms cannot decide, though its role could.
    let (status, body) = server.decide(&watcher, &id, "approved").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("decide scope"),
        "{body}"
    );
    let (status, _) = server.get("/api/v1/requests", &watcher).await;
    assert_eq!(status, 403);
    assert!(
        !server
            .mcp(&watcher)
            .await
            .tool_names()
            .await
            .contains(&"kick".to_string())
    );

    // Scopes beyond the role are refused when the token is made.
    let err = server
        .gate
        .create_token_as(new("greedy", Role::Agent, &[Scope::Decide]), &setup)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("agent token may have the scopes"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_and_are_listed_with_their_scopes() {
    let clock = Arc::new(FixedClock::new(
        Timestamp::parse("2026-11-29T09:00:00Z").unwrap(),
    ));
    let server = start_clocked(clock.clone()).await;
    let (status, created) = server
        .post(
            "/api/v1/tokens",
            &server.admin,
            json!({"name": "nightly-bot", "role": "agent", "expires": "2h", "scopes": ["request", "verify"]}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["expires_at"], "2026-11-29T11:00:00.000Z");
    assert_eq!(created["scopes"], json!(["request", "verify"]));
    assert_eq!(created["scoped"], true);
    let token = created["token"].as_str().unwrap().to_string();
    server
        .create(&token, json!({"action_description": "Run the nightly job"}))
        .await;

    clock.advance_seconds(2 * 3600);
    let (status, body) = server.get("/api/v1/requests/req_x", &token).await;
    assert_eq!(status, 401, "expired: {body}");
    let (_, unknown) = server
        .get(
            "/api/v1/requests/req_x",
            "cs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        )
        .await;
    assert_eq!(body, unknown, "refused exactly like an unknown token");
    let resp = server
        .http
        .post(server.url("/mcp"))
        .bearer_auth(&token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    let (_, list) = server.get("/api/v1/tokens", &server.admin).await;
    let tokens = list["tokens"].as_array().unwrap();
    let nightly = tokens.iter().find(|t| t["name"] == "nightly-bot").unwrap();
    assert_eq!(nightly["status"], "expired");
    let agent = tokens.iter().find(|t| t["name"] == "deploy-bot").unwrap();
    assert_eq!(agent["status"], "active");
    assert_eq!(agent["expires_at"], Value::Null);
    assert_eq!(agent["scoped"], false);
    assert_eq!(
        agent["scopes"],
        json!(["request", "rooms", "evidence", "verify"])
    );
    let executor = tokens.iter().find(|t| t["name"] == "payments").unwrap();
    assert_eq!(executor["role"], "executor");
    assert_eq!(executor["scopes"], json!(["verify", "redeem"]));

    // The log has what the token was made with, for anyone replaying it.
    let events = server.gate.store().events_after(0, 1000).await.unwrap();
    let made = events
        .iter()
        .find(|e| e.entry.kind.as_str() == "token_created" && e.entry.data["name"] == "nightly-bot")
        .unwrap();
    assert_eq!(made.entry.data["expires_at"], "2026-11-29T11:00:00.000Z");
    assert_eq!(made.entry.data["scopes"], json!(["request", "verify"]));
    let plain = events
        .iter()
        .find(|e| e.entry.kind.as_str() == "token_created" && e.entry.data["name"] == "deploy-bot")
        .unwrap();
    assert_eq!(plain.entry.data["expires_at"], Value::Null);
    assert_eq!(plain.entry.data["scopes"], Value::Null);

    for (body, says) in [
        (
            json!({"name": "x1", "role": "agent", "expires": "yesterday"}),
            "not an expiry",
        ),
        (
            json!({"name": "x2", "role": "agent", "expires": "2026-01-01T00:00:00Z"}),
            "not in the future",
        ),
        (
            json!({"name": "x3", "role": "agent", "scopes": ["request", "root"]}),
            "unknown scope",
        ),
        (
            json!({"name": "x4", "role": "executor", "scopes": ["request"]}),
            "executor token may have",
        ),
    ] {
        let (status, refused) = server.post("/api/v1/tokens", &server.admin, body).await;
        assert_eq!(status, 400, "{refused}");
        assert!(
            refused["error"]["message"].as_str().unwrap().contains(says),
            "{refused}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_names_are_unique_forever_and_agents_take_no_persons_name() {
    let server = start().await;
    let create = |name: &'static str, role: &'static str| {
        let server = &server;
        async move {
            server
                .post(
                    "/api/v1/tokens",
                    &server.admin,
                    json!({"name": name, "role": role}),
                )
                .await
        }
    };
    // A revoked name is not given out again, in any case of its letters.
    let (status, _) = server
        .post("/api/v1/tokens/other-bot/revoke", &server.admin, json!({}))
        .await;
    assert_eq!(status, 200);
    for name in ["other-bot", "Other-Bot", "deploy-bot"] {
        let (status, body) = create(name, "agent").await;
        assert_eq!(status, 400, "{name}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("never reused"),
            "{body}"
        );
    }
    // An agent or executor may not be named like a person: an approver's token, an
    // email address.
    for (name, role) in [
        ("alice", "agent"),
        ("Bob", "executor"),
        ("ops@example.com", "agent"),
    ] {
        let (status, body) = create(name, role).await;
        assert_eq!(status, 400, "{name}: {body}");
    }
    // A person's own token may carry their address.
    let (status, body) = create("carol@example.com", "approver").await;
    assert_eq!(status, 201, "{body}");
    // And then no agent can be named like her.
    let (status, _) = create("CAROL@example.com", "agent").await;
    assert_eq!(status, 400);
}

/// The remote gateway's routes (`/api/v1/gateway`): only a token created with the
/// `gateway` scope reaches them (no agent token by default, and no other role at all);
/// with it alone, a call is classified, held, waited on, claimed once, and its outcome
/// recorded, while the ordinary request routes stay closed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_gateway_token_speaks_for_a_gateway() {
    let server = start().await;
    let setup = Principal::local_user("test-setup", Role::Admin);
    let call = json!({
        "upstream": "payments", "tool": "refund", "arguments": {"amount": 40},
        "session": "s1", "hold_seconds": 60
    });
    for token in [
        &server.agent,
        &server.admin,
        &server.approver,
        &server.executor,
    ] {
        let (status, body) = server
            .post("/api/v1/gateway/calls", token, call.clone())
            .await;
        assert_eq!(status, 403, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("gateway"),
            "{body}"
        );
    }
    // No role but an agent's may be given it.
    let wider = NewToken {
        name: "gw-approver".into(),
        role: Role::Approver,
        expires: None,
        scopes: Some(Scopes::of([Scope::Gateway])),
    };
    assert!(server.gate.create_token_as(wider, &setup).await.is_err());
    let (_, gateway) = server
        .gate
        .create_token_as(
            NewToken {
                name: "laptop-gw".into(),
                role: Role::Agent,
                expires: None,
                scopes: Some(Scopes::of([Scope::Gateway])),
            },
            &setup,
        )
        .await
        .unwrap();

    // Checked input.
    let mut bad = call.clone();
    bad["hold_seconds"] = json!(0);
    let (status, body) = server.post("/api/v1/gateway/calls", &gateway, bad).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_input")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("hold_seconds")
    );
    let (status, body) = server
        .post(
            "/api/v1/gateway/calls",
            &gateway,
            json!({"upstream": "x", "tool": "t", "session": "s", "hold_seconds": 5, "extra": 1}),
        )
        .await;
    assert_eq!(status, 400, "unknown fields are refused: {body}");

    // A trusted read-only call that no policy speaks of passes, with nothing stored.
    let mut read = call.clone();
    read["read_only"] = json!(true);
    let (status, body) = server.post("/api/v1/gateway/calls", &gateway, read).await;
    assert_eq!(
        (status, body["result"].as_str()),
        (200, Some("pass")),
        "{body}"
    );

    // Held, and a retry joins it.
    let (status, held) = server
        .post("/api/v1/gateway/calls", &gateway, call.clone())
        .await;
    assert_eq!(
        (status, held["result"].as_str()),
        (200, Some("held")),
        "{held}"
    );
    let id = held["request"]["request_id"].as_str().unwrap().to_string();
    assert_eq!(held["request"]["status"], "pending");
    assert_eq!(held["request"]["action_details"]["/amount"], "40");
    // `claim_for` claims only an approval given at once (a policy's): a call that waits
    // for a person is not claimed, whoever asks to claim it.
    let mut claiming = call.clone();
    claiming["claim_for"] = json!("proxy-0");
    let (_, joined) = server
        .post("/api/v1/gateway/calls", &gateway, claiming.clone())
        .await;
    assert_eq!(joined["request"]["request_id"], id.as_str(), "{joined}");
    assert!(joined.get("claimed").is_none(), "{joined}");
    assert!(joined["request"]["used"].is_null(), "{joined}");
    claiming["claim_for"] = json!("");
    let (status, body) = server
        .post("/api/v1/gateway/calls", &gateway, claiming)
        .await;
    assert_eq!(status, 400, "an empty instance is refused: {body}");
    let (_, again) = server
        .post("/api/v1/gateway/calls", &gateway, call.clone())
        .await;
    assert_eq!(again["request"]["request_id"], id.as_str(), "{again}");
    let (status, waited) = server
        .get(
            &format!("/api/v1/gateway/calls/{id}/wait?timeout_seconds=0"),
            &gateway,
        )
        .await;
    assert_eq!(
        (status, waited["status"].as_str()),
        (200, Some("pending")),
        "{waited}"
    );
    // Its token reaches nothing else.
    let (status, _) = server
        .post(
            "/api/v1/requests",
            &gateway,
            json!({"action_description": "x"}),
        )
        .await;
    assert_eq!(status, 403);

    // Not claimable before approval; once after.
    let claim = format!("/api/v1/gateway/calls/{id}/claim");
    let (status, body) = server
        .post(&claim, &gateway, json!({"instance": "proxy-1"}))
        .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .post(&claim, &gateway, json!({"instance": "proxy-1"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(!body["used"].is_null(), "{body}");
    let (status, body) = server
        .post(&claim, &gateway, json!({"instance": "proxy-2"}))
        .await;
    assert_eq!(status, 409, "a second claim is refused: {body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/gateway/calls/{id}/outcome"),
            &gateway,
            json!({"status": "succeeded", "summary": "refunded"}),
        )
        .await;
    assert_eq!(
        (status, body["outcome"]["status"].as_str()),
        (200, Some("succeeded")),
        "{body}"
    );
    let (status, body) = server
        .post(
            "/api/v1/gateway/sweep",
            &gateway,
            json!({"upstream": "payments", "older_than_seconds": 1}),
        )
        .await;
    assert_eq!((status, body["swept"].as_u64()), (200, Some(0)), "{body}");
}
