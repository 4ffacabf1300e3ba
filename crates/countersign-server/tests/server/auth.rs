//! Authentication, roles and DNS-rebinding protection.

use serde_json::json;

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_and_revoked_tokens_get_401() {
    let server = start().await;
    for path in ["/api/v1/requests", "/mcp"] {
        let resp = server
            .http
            .post(server.url(path))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path} without a token");
        assert!(resp.headers().get("www-authenticate").is_some());
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthenticated");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Bearer")
        );

        let resp = server
            .http
            .post(server.url(path))
            .bearer_auth("cs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path} with an unknown token");
        let resp = server
            .http
            .post(server.url(path))
            .header("authorization", format!("Basic {}", server.agent))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path} with the wrong scheme");
    }
    // Revoke the second agent's token: it stops working at once.
    let (status, list) = server.get("/api/v1/tokens", &server.admin).await;
    assert_eq!(status, 200);
    let id = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "other-bot")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        list.to_string().find(&server.agent2).is_none(),
        "token secrets are never listed"
    );
    let (status, _) = server.get("/api/v1/requests/req_x", &server.agent2).await;
    assert_eq!(status, 404);
    let (status, revoked) = server
        .post(
            &format!("/api/v1/tokens/{id}/revoke"),
            &server.admin,
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{revoked}");
    let (status, _) = server.get("/api/v1/requests/req_x", &server.agent2).await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_403_on_every_decision_and_admin_path() {
    let server = start().await;
    let id = server.create_default().await;
    for decision in ["approved", "rejected"] {
        let (status, body) = server.decide(&server.agent, &id, decision).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"]["code"], "forbidden");
    }
    let (status, _) = server
        .get("/api/v1/requests?status=pending", &server.agent)
        .await;
    assert_eq!(status, 403);
    let (status, _) = server.get("/api/v1/tokens", &server.agent).await;
    assert_eq!(status, 403);
    let (status, _) = server
        .post(
            "/api/v1/tokens",
            &server.agent,
            json!({"name": "x", "role": "admin"}),
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = server
        .post(
            "/api/v1/tokens",
            &server.approver,
            json!({"name": "x", "role": "admin"}),
        )
        .await;
    assert_eq!(status, 403, "approvers do not manage tokens");
    let (status, state) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(status, 200);
    assert_eq!(state["status"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_one_approves_their_own_request() {
    let server = start().await;
    // An admin may ask, but then may not decide its own request.
    let id = server
        .create(
            &server.admin,
            json!({"action_description": "Drop table users"}),
        )
        .await;
    let (status, body) = server.decide(&server.admin, &id, "approved").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "self_approval");
    let (status, _) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_only_see_their_own_requests() {
    let server = start().await;
    let id = server.create_default().await;
    let (status, body) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent2)
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = server
        .post(
            &format!("/api/v1/requests/{id}/cancel"),
            &server.agent2,
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .get(&format!("/api/v1/requests/{id}"), &server.approver)
        .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hosts_and_origins_get_403() {
    let server = start().await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let port = server.base.rsplit(':').next().unwrap().to_string();
    for (header, value) in [
        ("host", "evil.example"),
        ("host", "localhost.evil.example"),
        ("origin", "http://evil.example"),
        ("origin", "null"),
        // localhost is allowed without a port: on this server's port, not on any other.
        ("origin", "http://localhost:9999"),
        ("origin", "http://localhost"),
    ] {
        for path in ["/mcp", "/api/v1/requests", "/healthz"] {
            let resp = server
                .http
                .post(server.url(path))
                .bearer_auth(&server.agent)
                .header("accept", "application/json, text/event-stream")
                .header(header, value)
                .json(&init)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 403, "{path} with {header}: {value}");
        }
    }
    // The server's own origin is fine.
    let resp = server
        .http
        .post(server.url("/mcp"))
        .bearer_auth(&server.agent)
        .header("accept", "application/json, text/event-stream")
        .header("origin", format!("http://localhost:{port}"))
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_jwks_are_public_and_correct() {
    let server = start().await;
    let health: serde_json::Value = server
        .http
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let jwks: serde_json::Value = server
        .http
        .get(server.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["kty"], "OKP");
    assert_eq!(keys[0]["crv"], "Ed25519");
    assert!(
        keys[0].get("d").is_none(),
        "the private key is never published"
    );
    let x = keys[0]["x"].as_str().unwrap();
    assert_eq!(
        keys[0]["kid"].as_str().unwrap(),
        countersign_core::keys::thumbprint(x)
    );
    assert_eq!(health["kid"], keys[0]["kid"]);
}
