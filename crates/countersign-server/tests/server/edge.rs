//! The network edge under abuse, from outside: raw sockets that never finish, too many
//! connections, zip bombs, parallel wrong passwords, forwarded addresses, too many waits.

use std::io::Write;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_server::http::client::TrustedProxies;
use countersign_server::{HttpConfig, Settings};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestServer, accept, ok, start, start_full, start_with};

fn short_timeouts() -> HttpConfig {
    HttpConfig {
        header_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(2),
        ..HttpConfig::default()
    }
}

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; how long that took. Whatever the
/// server answered before closing is returned too.
async fn until_closed(mut stream: TcpStream, within: Duration) -> (Duration, String) {
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (start.elapsed(), String::from_utf8_lossy(&seen).into_owned());
            }
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "still open after {within:?}; it sent {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_are_closed_while_long_polls_stay_open() {
    let server = start_with(short_timeouts()).await;
    let id = server.create_default().await;
    let host = server.base.trim_start_matches("http://").to_string();

    let silent = connect(&server).await;
    let mut one_byte = connect(&server).await;
    one_byte.write_all(b"G").await.unwrap();
    let mut half_headers = connect(&server).await;
    half_headers
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n").as_bytes())
        .await
        .unwrap();
    let mut half_body = connect(&server).await;
    half_body
        .write_all(
            format!(
                "POST /api/v1/requests HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"action_description\": ",
                server.agent
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut half_preface = connect(&server).await;
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    // A keep-alive connection that asked once and then went quiet.
    let mut idle = connect(&server).await;
    idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();

    // Meanwhile an agent's long poll lasts longer than any of those timeouts.
    let poll = {
        let http = server.http.clone();
        let url = server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=6"));
        let token = server.agent.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let resp = http.get(url).bearer_auth(token).send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            (start.elapsed(), status, body)
        })
    };

    let within = Duration::from_secs(15);
    let closed = futures_util::future::join_all(
        [
            silent,
            one_byte,
            half_headers,
            half_body,
            half_preface,
            idle,
        ]
        .into_iter()
        .map(|s| until_closed(s, within)),
    )
    .await;
    let names = [
        "silent",
        "one byte",
        "half the headers",
        "half a body",
        "half an HTTP/2 preface",
        "idle keep-alive",
    ];
    for ((took, said), name) in closed.iter().zip(names) {
        assert!(
            *took >= Duration::from_millis(1500) && *took < Duration::from_secs(6),
            "{name}: closed after {took:?}"
        );
        if name == "idle keep-alive" {
            assert!(said.starts_with("HTTP/1.1 200"), "{name}: {said}");
        }
        if name == "half a body" {
            // The handler was told the body never came, and said so.
            assert!(said.starts_with("HTTP/1.1 4"), "{name}: {said}");
        }
    }
    let (took, status, body) = poll.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "pending", "{body}");
    assert!(
        took >= Duration::from_secs(6),
        "the long poll lasted {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_are_refused_until_some_close() {
    let server = start_with(HttpConfig {
        max_connections: 4,
        ..HttpConfig::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(&server).await);
    }
    // Let the server accept all four.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let extra = connect(&server).await;
    let (took, said) = until_closed(extra, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(2), "refused after {took:?}");
    assert!(
        said.is_empty() || said.starts_with("HTTP/1.1 503"),
        "refused with {said:?}"
    );
    drop(held);
    // Slots come back as connections close.
    let start = Instant::now();
    loop {
        let resp = server.http.get(server.url("/healthz")).send().await;
        if resp.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never accepted again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A ZIP of a few dozen KB whose one file expands to `size` bytes of zeros.
fn bomb(size: usize) -> Vec<u8> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file("manifest.json", options).unwrap();
    let chunk = vec![0u8; 1024 * 1024];
    for _ in 0..size / chunk.len() {
        zip.write_all(&chunk).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zip_bomb_is_refused_and_a_real_bundle_still_verifies() {
    let server = start().await;
    let bomb = bomb(256 * 1024 * 1024);
    assert!(bomb.len() < 512 * 1024, "{} bytes", bomb.len());

    let resp = server
        .http
        .post(server.url("/api/v1/evidence/verify"))
        .bearer_auth(&server.agent)
        .body(bomb.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let verdict: Value = resp.json().await.unwrap();
    assert_eq!(verdict["valid"], false, "{verdict}");
    let reason = verdict["reasons"][0].as_str().unwrap();
    assert!(
        reason.contains("manifest.json expands to more than"),
        "{verdict}"
    );

    let agent = server.mcp(&server.agent).await;
    let verdict = ok(&agent
        .call(
            "verify_evidence",
            json!({"bundle_base64": STANDARD.encode(&bomb)}),
        )
        .await);
    assert_eq!(verdict["valid"], false, "{verdict}");
    assert_eq!(verdict["reasons"][0].as_str(), Some(reason), "{verdict}");

    // A real bundle still verifies, over both.
    let id = server.create_default().await;
    server.decide(&server.approver, &id, "approved").await;
    let zip = server
        .http
        .get(server.url(&format!("/api/v1/evidence/{id}")))
        .bearer_auth(&server.approver)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let resp = server
        .http
        .post(server.url("/api/v1/evidence/verify"))
        .bearer_auth(&server.agent)
        .body(zip.to_vec())
        .send()
        .await
        .unwrap();
    let verdict: Value = resp.json().await.unwrap();
    assert_eq!(verdict["valid"], true, "{verdict}");
    let verdict = ok(&agent
        .call(
            "verify_evidence",
            json!({"bundle_base64": STANDARD.encode(&zip)}),
        )
        .await);
    assert_eq!(verdict["valid"], true, "{verdict}");
}

fn behind_a_proxy() -> HttpConfig {
    HttpConfig {
        trusted_proxies: TrustedProxies::parse(&["127.0.0.1".into()]).unwrap(),
        ..HttpConfig::default()
    }
}

async fn sign_in(server: &TestServer, from: &str, username: &str, password: &str) -> (u16, Value) {
    let resp = server
        .http
        .post(server.url("/ui/login"))
        .header("x-forwarded-for", from)
        .json(&json!({"username": username, "password": password}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_passwords_lock_the_account() {
    let server = start_with(behind_a_proxy()).await;
    let token = server.gate.accounts().setup_token(600).await.unwrap();
    let password = "correct horse battery";
    accept(
        &server,
        json!({"token": token, "username": "admin", "password": password}),
    )
    .await;
    // Twenty at once, each from its own address (so the per-address throttle is not
    // what stops them).
    let attempts = (0..20).map(|i| {
        let from = format!("203.0.113.{i}");
        let server = &server;
        async move { sign_in(server, &from, "admin", "not the password").await }
    });
    for (status, _) in futures_util::future::join_all(attempts).await {
        assert_eq!(status, 401);
    }
    let (status, locked) = sign_in(&server, "198.51.100.1", "admin", password).await;
    assert_eq!(
        status, 401,
        "the right password after 20 failures: {locked}"
    );
    // Locked and unknown are answered alike.
    let (status, unknown) = sign_in(&server, "198.51.100.2", "nobody", password).await;
    assert_eq!(status, 401);
    assert_eq!(locked, unknown);
    assert_eq!(
        locked["error"]["message"],
        countersign_server::accounts::SIGN_IN_REFUSED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_throttle_counts_the_forwarded_client_ipv6_by_64() {
    let server = start_with(behind_a_proxy()).await;
    for i in 0..20 {
        let (status, _) = sign_in(&server, &format!("2001:db8:1:2::{i}"), "nobody", "pw").await;
        assert_eq!(status, 401);
    }
    // Another address of the same /64 is the same client.
    let (status, body) = sign_in(&server, "2001:db8:1:2:ffff::1", "nobody", "pw").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    // Another /64, or a forwarded IPv4 address, is someone else.
    let (status, _) = sign_in(&server, "2001:db8:1:3::1", "nobody", "pw").await;
    assert_eq!(status, 401);
    // A client's own header is not believed: the proxy appended the real address.
    let (status, _) = sign_in(&server, "192.0.2.50, 2001:db8:1:2::77", "nobody", "pw").await;
    assert_eq!(status, 429);

    // Without trusted proxies the header is ignored: rotating it changes nothing.
    let direct = start().await;
    for i in 0..20 {
        let (status, _) = sign_in(&direct, &format!("203.0.113.{i}"), "nobody", "pw").await;
        assert_eq!(status, 401);
    }
    let (status, _) = sign_in(&direct, "203.0.113.99", "nobody", "pw").await;
    assert_eq!(status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_may_hold_only_so_many_waits_at_once() {
    let server = start_full(
        HttpConfig::default(),
        Settings {
            max_waits_per_token: 2,
            ..Settings::default()
        },
    )
    .await;
    let id = server.create_default().await;
    let other = server
        .create(&server.agent2, json!({"action_description": "Other"}))
        .await;
    let wait_on = |token: String, id: String| {
        let http = server.http.clone();
        let url = server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=2"));
        async move {
            let resp = http.get(url).bearer_auth(token).send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let wait = |token: String| wait_on(token, id.clone());
    let first = tokio::spawn(wait(server.agent.clone()));
    let second = tokio::spawn(wait(server.agent.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = wait(server.agent.clone()).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already has 2 waits open"),
        "{body}"
    );
    // Another token is not affected; the first token waits again once one finished.
    let (status, body) = wait_on(server.agent2.clone(), other).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    let (status, body) = wait(server.agent.clone()).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_shows_why_the_database_fails_only_to_an_admin() {
    let server = start().await;
    std::fs::remove_file(server.data_dir().join("countersign.db")).unwrap();
    let resp = server
        .http
        .get(server.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "unavailable");
    let public = body["error"].as_str().unwrap();
    assert!(!public.contains("countersign.db"), "{public}");
    assert!(public.contains("admin token"), "{public}");
    // An agent's token sees no more than anyone.
    let (status, body) = server.get("/healthz", &server.agent).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"].as_str(), Some(public));
    let (status, body) = server.get("/healthz", &server.admin).await;
    assert_eq!(status, 503);
    let detail = body["error"].as_str().unwrap();
    assert!(
        detail.contains("countersign.db") && detail.contains("gone"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_an_admin_mints_one_setup_link_at_a_time() {
    use countersign_server::accounts::SetupLink;
    let server = start().await;
    let accounts = server.gate.accounts();
    let SetupLink::New(token) = accounts.setup_link_once(600).await.unwrap() else {
        panic!("the first start mints a link");
    };
    // Restarts meanwhile mint none.
    for _ in 0..3 {
        assert!(matches!(
            accounts.setup_link_once(600).await.unwrap(),
            SetupLink::Pending { .. }
        ));
    }
    let (_, me) = accept(
        &server,
        json!({"token": token, "username": "admin", "password": "correct horse battery"}),
    )
    .await;
    assert_eq!(me["user"]["role"], "admin");
    // Used: a later start (were there still no admin) could mint a fresh one.
    assert!(matches!(
        accounts.setup_link_once(600).await.unwrap(),
        SetupLink::New(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_past_max_sessions_ends_the_oldest_session() {
    let server = start_full(
        HttpConfig::default(),
        Settings {
            max_sessions_per_account: 2,
            ..Settings::default()
        },
    )
    .await;
    let token = server.gate.accounts().setup_token(600).await.unwrap();
    let password = "correct horse battery";
    let (first, _) = accept(
        &server,
        json!({"token": token, "username": "admin", "password": password}),
    )
    .await;
    let me = |client: reqwest::Client| {
        let url = server.url("/ui/api/me");
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    };
    assert_eq!(me(first.clone()).await, 200);
    let mut others = Vec::new();
    for _ in 0..2 {
        // Created apart in time, so "oldest" is well defined.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let client = crate::support::browser();
        let resp = client
            .post(server.url("/ui/login"))
            .json(&json!({"username": "admin", "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        others.push(client);
    }
    // Three sign-ins, two sessions kept: the first (the oldest) ended.
    assert_eq!(me(first).await, 401, "the oldest session was ended");
    for client in others {
        assert_eq!(me(client).await, 200, "the newer sessions work");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_past_the_verification_lane_are_told_busy_before_being_read() {
    let server = start().await;
    // Both turns taken (as two long verifications would).
    let turns = [
        server.gate.evidence_turn().await.unwrap(),
        server.gate.evidence_turn().await.unwrap(),
    ];
    // Built once, outside the timed part (a debug build takes a while to make one).
    let body = axum::body::Bytes::from(bomb(8 * 1024 * 1024));
    let upload = || {
        let http = server.http.clone();
        let (url, token) = (server.url("/api/v1/evidence/verify"), server.agent.clone());
        let body = body.clone();
        async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // Eight wait their turn.
    let queued: Vec<_> = (0..8).map(|_| tokio::spawn(upload())).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let begun = Instant::now();
    let (status, body) = upload().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("busy with evidence verifications"),
        "{body}"
    );
    // Refused without waiting: one that queued would wait out the lane's 10 s patience.
    assert!(
        begun.elapsed() < Duration::from_secs(5),
        "told after {:?}, not at once",
        begun.elapsed()
    );
    // Turns free: the queued ones are verified (and refused as bombs).
    drop(turns);
    for task in queued {
        let (status, verdict) = task.await.unwrap();
        assert_eq!(status, 200, "{verdict}");
        assert_eq!(verdict["valid"], false, "{verdict}");
    }
}
