//! Bad input gets a clear error naming the problem; nothing panics, nothing is half-written.

use serde_json::json;

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_rest_bodies_are_named() {
    let server = start().await;
    let raw = |body: &'static str| {
        let http = server.http.clone();
        let url = server.url("/api/v1/requests");
        let token = server.agent.clone();
        async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, body) = raw("{\"action_description\": ").await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["code"], "invalid_input");
    let (status, body) = raw("{\"action_details\": {}}").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("action_description"),
        "{body}"
    );
    let (status, body) =
        raw("{\"action_description\": \"x\", \"action_details\": {\"amount\": 12}}").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid type"),
        "{body}"
    );
    let (status, body) = raw("{\"action_description\": \"x\", \"approver\": \"me\"}").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approver"),
        "{body}"
    );
    let (status, body) = raw("{\"action_description\": \"\"}").await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("action_description"),
        "{body}"
    );

    // Not JSON at all.
    let resp = server
        .http
        .post(server.url("/api/v1/requests"))
        .bearer_auth(&server.agent)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);

    // Oversized. The server answers before reading the whole body and closes that
    // connection, so send it on a client of its own rather than the shared pool.
    let big = "x".repeat(2 * 1024 * 1024);
    let resp = reqwest::Client::new()
        .post(server.url("/api/v1/requests"))
        .bearer_auth(&server.agent)
        .json(&json!({"action_description": big}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);

    let (status, body) = server
        .get("/api/v1/requests/req_unknown", &server.agent)
        .await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("req_unknown")
    );
    let (status, body) = server
        .post(
            "/api/v1/requests/req_unknown/decision",
            &server.approver,
            json!({"decision": "approved"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let id = server.create_default().await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            &server.approver,
            json!({"decision": "maybe"}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("maybe"));
    let (status, body) = server
        .get(
            &format!("/api/v1/requests/{id}/wait?timeout_seconds=301"),
            &server.agent,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server.get("/api/v1/nothing-here", &server.agent).await;
    assert_eq!(status, 404);

    // Only the one valid request was written.
    let kinds = server.event_kinds().await;
    assert_eq!(kinds.iter().filter(|k| *k == "request_created").count(), 1);
    let (_, state) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(state["status"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_gets_an_error_not_a_crash() {
    let server = start().await;
    let post = |body: &'static str| {
        let http = server.http.clone();
        let url = server.url("/mcp");
        let token = server.agent.clone();
        async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-06-18")
                .body(body)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let (status, body) = post("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ").await;
    assert!((400..500).contains(&status), "{status} {body}");
    let (status, body) = post("{\"hello\": \"world\"}").await;
    assert!((400..500).contains(&status), "{status} {body}");
    let (status, body) = post("[]").await;
    assert!((400..500).contains(&status), "{status} {body}");
    // The server still works.
    let agent = server.mcp(&server.agent).await;
    assert_eq!(agent.tool_names().await.len(), 20);
}
