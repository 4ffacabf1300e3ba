//! The dashboard over HTTP: accounts, sessions, CSRF, decisions, live updates, headers.

use std::time::Duration;

use countersign_core::{Principal, Role};
use serde_json::{Value, json};

use crate::support::{TestServer, accept, browser, start};

async fn setup_admin(server: &TestServer) -> (reqwest::Client, String) {
    let token = server.gate.accounts().setup_token(600).await.unwrap();
    let (client, me) = accept(
        server,
        json!({"token": token, "username": "Admin", "display_name": "Ada Admin", "password": "correct horse battery"}),
    )
    .await;
    assert_eq!(me["user"]["username"], "admin");
    assert_eq!(me["user"]["role"], "admin");
    (client, me["csrf_token"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_of_several_setup_links_makes_an_admin() {
    let server = start().await;
    let accounts = server.gate.accounts();
    let links: Vec<String> =
        futures_util::future::try_join_all((0..4).map(|_| accounts.setup_token(600)))
            .await
            .unwrap();
    // All four accepted at once: one admin, three told an admin exists.
    let results = futures_util::future::join_all(links.iter().enumerate().map(|(i, link)| {
        let name = format!("admin{i}");
        async move {
            accounts
                .accept(link, Some(&name), None, "correct horse battery")
                .await
        }
    }))
    .await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 1, "{results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            refused
                .to_string()
                .contains("an admin account already exists"),
            "{refused}"
        );
    }
    let admins = accounts.users().await.unwrap();
    assert_eq!(admins.len(), 1, "{admins:?}");
    // A link made after the first admin exists is dead too.
    let late = accounts.setup_token(600).await.unwrap();
    assert!(
        accounts
            .accept(&late, Some("late"), None, "correct horse battery")
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_link_works_once_and_creates_the_first_admin() {
    let server = start().await;
    assert!(!server.gate.accounts().has_admin().await.unwrap());
    let token = server.gate.accounts().setup_token(600).await.unwrap();
    let client = browser();
    let weak = client
        .post(server.url("/ui/accept"))
        .json(&json!({"token": token, "username": "admin", "password": "short"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        weak.status(),
        400,
        "a short password is refused before the link is spent"
    );
    let ok = client
        .post(server.url("/ui/accept"))
        .json(&json!({"token": token, "username": "admin", "password": "correct horse battery"}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let cookie = ok.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(server.gate.accounts().has_admin().await.unwrap());
    let again = browser()
        .post(server.url("/ui/accept"))
        .json(&json!({"token": token, "username": "second", "password": "correct horse battery"}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 401, "the link works once");
    let kinds = server.event_kinds().await;
    assert!(kinds.contains(&"user_created".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_fails_then_locks_and_never_says_which_part_was_wrong() {
    let server = start().await;
    let (_admin, _) = setup_admin(&server).await;
    let attempt = |username: &'static str, password: &'static str| {
        let client = browser();
        let url = server.url("/ui/login");
        async move {
            let resp = client
                .post(url)
                .json(&json!({"username": username, "password": password}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let (status, unknown) = attempt("nobody", "whatever password").await;
    assert_eq!(status, 401);
    let (_, wrong) = attempt("admin", "not the password").await;
    assert_eq!(
        unknown["error"]["message"], wrong["error"]["message"],
        "no username enumeration"
    );
    for _ in 0..4 {
        attempt("admin", "not the password").await;
    }
    let (status, locked) = attempt("admin", "correct horse battery").await;
    assert_eq!(status, 401, "locked: the right password is refused");
    // Locked, unknown and wrong are answered alike, so no answer tells them apart.
    assert_eq!(
        locked, unknown,
        "a locked account is answered like an unknown one"
    );
    assert!(
        locked["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many failed sign-ins"),
        "{locked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_changes_need_the_csrf_token_and_a_session() {
    let server = start().await;
    let (client, csrf) = setup_admin(&server).await;
    let id = server.create_default().await;
    let url = server.url(&format!("/ui/api/requests/{id}/decision"));
    // No token: refused, nothing decided.
    let resp = client
        .post(&url)
        .json(&json!({"decision": "approved"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let resp = client
        .post(&url)
        .header("x-csrf-token", "forged")
        .json(&json!({"decision": "approved"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    // A forged cross-site form post: wrong content type and a foreign Origin.
    let resp = client
        .post(&url)
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("decision=approved")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    // No session at all.
    let resp = browser()
        .post(&url)
        .header("x-csrf-token", &csrf)
        .json(&json!({"decision": "approved"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // Agents' bearer tokens do not open the dashboard.
    let resp = reqwest::Client::new()
        .get(server.url("/ui/api/me"))
        .bearer_auth(&server.approver)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (_, state) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(state["status"], "pending", "nothing above decided anything");

    // With the token: decided, through the dashboard channel, as the signed-in account.
    let resp = client
        .post(&url)
        .header("x-csrf-token", &csrf)
        .json(&json!({"decision": "approved", "comment": "ok from the UI", "expected_version": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let (_, state) = server
        .get(&format!("/api/v1/requests/{id}"), &server.agent)
        .await;
    assert_eq!(state["decision"]["approvers"][0]["id"], "user:admin");
    assert_eq!(state["decision"]["approvers"][0]["channel"], "dashboard");
    assert_eq!(
        state["decision"]["approvers"][0]["auth_method"],
        "password_session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_page_cannot_decide_again_and_learns_who_did() {
    let server = start().await;
    let (client, csrf) = setup_admin(&server).await;
    let id = server.create_default().await;
    let (status, _) = server.decide(&server.approver, &id, "rejected").await;
    assert_eq!(status, 200);
    let resp = client
        .post(server.url(&format!("/ui/api/requests/{id}/decision")))
        .header("x-csrf-token", &csrf)
        .json(&json!({"decision": "approved", "expected_version": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alice via api"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_out_everywhere_ends_every_session() {
    let server = start().await;
    let (first, csrf) = setup_admin(&server).await;
    let second = browser();
    let resp = second
        .post(server.url("/ui/login"))
        .json(&json!({"username": "admin", "password": "correct horse battery"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        second
            .get(server.url("/ui/api/me"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let resp = first
        .post(server.url("/ui/logout-all"))
        .header("x-csrf-token", &csrf)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        first
            .get(server.url("/ui/api/me"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        second
            .get(server.url("/ui/api/me"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    // Pages redirect to sign-in without a session.
    let resp = second.get(server.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/login");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_invite_approvers_who_then_decide() {
    let server = start().await;
    let (admin, csrf) = setup_admin(&server).await;
    let resp = admin
        .post(server.url("/ui/api/users/invite"))
        .header("x-csrf-token", &csrf)
        .json(&json!({"username": "bea", "display_name": "Bea Approver", "role": "approver"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let invite: Value = resp.json().await.unwrap();
    let link = invite["link"].as_str().unwrap();
    let token = link.split("token=").nth(1).unwrap();
    let (bea, me) = accept(
        &server,
        json!({"token": token, "password": "another long password"}),
    )
    .await;
    assert_eq!(me["user"]["role"], "approver");
    assert_eq!(me["user"]["display_name"], "Bea Approver");
    // Approvers do not manage accounts.
    assert_eq!(
        bea.get(server.url("/ui/api/users"))
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    // Disabling ends the session at once.
    let users: Value = admin
        .get(server.url("/ui/api/users"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = users["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["username"] == "bea")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let resp = admin
        .post(server.url(&format!("/ui/api/users/{id}/disable")))
        .header("x-csrf-token", &csrf)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        bea.get(server.url("/ui/api/me"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let kinds = server.event_kinds().await;
    assert!(
        kinds.contains(&"user_disabled".to_string())
            && kinds.contains(&"user_activated".to_string()),
        "{kinds:?}"
    );
    // Agents never get accounts.
    let err = server
        .gate
        .accounts()
        .invite(
            "bot",
            None,
            Role::Agent,
            &Principal::local_user("x", Role::Admin),
            60,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("token"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_carry_a_strict_content_security_policy() {
    let server = start().await;
    for path in ["/login", "/setup", "/assets/app.js"] {
        let resp = browser().get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let csp = resp.headers()["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert_eq!(resp.headers()["x-frame-options"], "DENY");
        assert_eq!(resp.headers()["referrer-policy"], "no-referrer");
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    }
    // No inline scripts or styles in any page.
    for path in ["/login", "/setup"] {
        let body = browser()
            .get(server.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !body.contains("<script>") && !body.contains("style=") && !body.contains("<style"),
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_updates_arrive_over_server_sent_events() {
    let server = start().await;
    let (client, _) = setup_admin(&server).await;
    let resp = client.get(server.url("/ui/events")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let id = server.create_default().await;
    let mut stream = resp;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !seen.contains(&id) {
        let chunk = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .expect("no event within 5 s")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        seen.contains("event: change") && seen.contains("request_created"),
        "{seen}"
    );
    // Without a session there is no stream.
    assert_eq!(
        browser()
            .get(server.url("/ui/events"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}
