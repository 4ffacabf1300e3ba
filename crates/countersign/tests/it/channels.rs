//! Slack and email end to end, against the real `countersign` binary.
//!
//! - Slack: a fake Slack Web API on loopback (this file) that checks the bot token and
//!   the shape of every call; countersign's `[slack] api_base_url` points at it. Clicks
//!   are sent to countersign's `/slack/interactivity` as Slack sends them: form-encoded
//!   `payload=`, signed with an HMAC-SHA256 written here from the definition (not
//!   countersign's code).
//! - Email: a real SMTP server on loopback (Python's `aiosmtpd`, `tests/python/smtp_sink.py`)
//!   that parses each message with Python's `email` package; headless Chromium
//!   (`tests/email-browser/email-browser.cjs`, playwright-core from
//!   `tests/browser/node_modules`) opens every link in a message as a mail scanner
//!   would, then an approver decides on the pages.
//!
//! Python with `aiosmtpd` comes from `target/pyvenv` (or `COUNTERSIGN_TEST_PYTHON`);
//! without it, or without node, Chromium or playwright-core, the parts that need them
//! print why and pass, except under `CI=true`, where a skip is a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, PYTHON_SETUP, Server, in_ci, python, repo_root};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::HeaderMap;
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const BOT_TOKEN: &str = "xoxb-test-bot-token";
const SIGNING_SECRET: &str = "slack-signing-secret-for-tests";
const PASSWORD: &str = "correct horse battery staple";
const ALICE_SLACK: &str = "U0ALICE01";
const MALLORY_SLACK: &str = "U0MALLORY";

// ---- skipping ---------------------------------------------------------------------------

/// Passes with a printed reason, or fails under CI=true.
fn skip(what: &str, reason: &str) {
    let message = format!(
        "channels: {what} SKIPPED: {reason}\n  set up with: {PYTHON_SETUP}; npm ci --prefix tests/browser; apt-get install -y chromium"
    );
    if in_ci() {
        panic!("{message}\nCI=true: a skipped test is a failure");
    }
    eprintln!("{message}");
}

// ---- a fake Slack Web API -----------------------------------------------------------------

#[derive(Debug, Clone)]
struct Call {
    method: String,
    body: Value,
}

#[derive(Default)]
struct FakeState {
    calls: Mutex<Vec<Call>>,
    /// Channels that do not exist (`channel_not_found`).
    missing: Mutex<BTreeSet<String>>,
    next_ts: Mutex<u64>,
}

struct FakeSlack {
    base: String,
    state: Arc<FakeState>,
}

fn slack_error(code: &str) -> axum::Json<Value> {
    axum::Json(json!({"ok": false, "error": code}))
}

/// Checks what Slack itself would: the bot token, and the shape of each method's body.
async fn fake_api(
    State(state): State<Arc<FakeState>>,
    UrlPath(method): UrlPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::Json<Value> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if auth != format!("Bearer {BOT_TOKEN}") {
        return slack_error("invalid_auth");
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return slack_error("invalid_json");
    };
    state.calls.lock().unwrap().push(Call {
        method: method.clone(),
        body: body.clone(),
    });
    let blocks_ok = body["blocks"].as_array().is_some_and(|b| {
        !b.is_empty()
            && b.iter()
                .all(|block| block["type"].is_string() && block.to_string().len() < 3100 * 10)
    });
    match method.as_str() {
        "auth.test" => {
            axum::Json(json!({"ok": true, "team": "Fake Workspace", "user": "countersign"}))
        }
        "chat.postMessage" => {
            let Some(channel) = body["channel"].as_str() else {
                return slack_error("channel_not_found");
            };
            if !blocks_ok || !body["text"].is_string() {
                return slack_error("invalid_blocks");
            }
            if state.missing.lock().unwrap().contains(channel) {
                return slack_error("channel_not_found");
            }
            let mut ts = state.next_ts.lock().unwrap();
            *ts += 1;
            // A message to a user lands in the app's DM with them.
            let channel = match channel.strip_prefix('U') {
                Some(rest) => format!("D{rest}"),
                None => channel.to_string(),
            };
            axum::Json(
                json!({"ok": true, "channel": channel, "ts": format!("1700000000.{:06}", *ts)}),
            )
        }
        "chat.update" => {
            if !body["channel"].is_string() || !body["ts"].is_string() || !blocks_ok {
                return slack_error("invalid_arguments");
            }
            axum::Json(json!({"ok": true, "channel": body["channel"], "ts": body["ts"]}))
        }
        "views.open" => {
            if !body["trigger_id"].is_string() || body["view"]["type"] != "modal" {
                return slack_error("invalid_arguments");
            }
            axum::Json(json!({"ok": true, "view": {"id": "V0FAKE"}}))
        }
        _ => slack_error("unknown_method"),
    }
}

async fn fake_response_url(
    State(state): State<Arc<FakeState>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> &'static str {
    state.calls.lock().unwrap().push(Call {
        method: format!("response_url/{id}"),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    "ok"
}

impl FakeSlack {
    async fn start() -> FakeSlack {
        let state = Arc::new(FakeState::default());
        let app = Router::new()
            .route("/api/{method}", post(fake_api))
            .route("/response/{id}", post(fake_response_url))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeSlack {
            base: format!("http://{addr}"),
            state,
        }
    }

    fn calls(&self, method: &str) -> Vec<Value> {
        self.state
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.method == method)
            .map(|c| c.body.clone())
            .collect()
    }

    /// Waits until some call to `method` matches.
    async fn wait_for(&self, method: &str, what: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(found) = self.calls(method).into_iter().find(|c| what(c)) {
                return found;
            }
            if Instant::now() > deadline {
                panic!(
                    "no matching {method} call within 15 s; calls: {:#?}",
                    self.state.calls.lock().unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// ---- signing and sending Slack interactions ------------------------------------------------

/// HMAC-SHA256 from its definition (RFC 2104), independent of countersign's code.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// `application/x-www-form-urlencoded`, as Slack sends it.
fn form_encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(byte as char)
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

struct Signed {
    /// Seconds added to the current time for the timestamp.
    age: i64,
    secret: &'static str,
    retry: Option<u32>,
}

impl Default for Signed {
    fn default() -> Self {
        Signed {
            age: 0,
            secret: SIGNING_SECRET,
            retry: None,
        }
    }
}

/// Posts an interaction payload to `/slack/interactivity`, signed as Slack signs it.
async fn interact(server: &Server, payload: &Value, how: Signed) -> (StatusCode, Value) {
    let body = format!("payload={}", form_encode(&payload.to_string()));
    let timestamp = (unix_now() - how.age).to_string();
    let base = format!("v0:{timestamp}:{body}");
    let signature = format!(
        "v0={}",
        hex::encode(hmac_sha256(how.secret.as_bytes(), base.as_bytes()))
    );
    let mut req = server
        .http()
        .post(server.url("/slack/interactivity"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", timestamp)
        .header("x-slack-signature", signature)
        .body(body);
    if let Some(n) = how.retry {
        req = req
            .header("x-slack-retry-num", n.to_string())
            .header("x-slack-retry-reason", "http_timeout");
    }
    common::send(req).await
}

fn click(fake: &FakeSlack, user: &str, action: &str, request_id: &str, trigger: &str) -> Value {
    json!({
        "type": "block_actions",
        "user": {"id": user, "username": user.to_lowercase(), "team_id": "T0TEST"},
        "api_app_id": "A0TEST",
        "team": {"id": "T0TEST"},
        "container": {"type": "message", "message_ts": "1700000000.000001", "channel_id": "C0APPROVE"},
        "trigger_id": trigger,
        "response_url": format!("{}/response/{trigger}", fake.base),
        "actions": [{
            "type": "button",
            "action_id": action,
            "block_id": "decision",
            "value": request_id,
            "action_ts": format!("{}.{}", unix_now(), trigger.len()),
        }],
    })
}

// ---- the server ---------------------------------------------------------------------------

struct Setup {
    _dir: tempfile::TempDir,
    data: PathBuf,
    server: Server,
    agent: String,
    approver_token: String,
    admin: String,
}

/// A data directory with `config`, an agent, an approver token and an admin token; then
/// `serve`, and the dashboard account `alice` (Alice Approver) with [`PASSWORD`].
async fn start(config: &str) -> Setup {
    start_with(config, &[]).await
}

/// [`start`], with more files (`(name, text)`, a policy file say) in the data directory.
async fn start_with(config: &str, files: &[(&str, &str)]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("countersign.toml"), config).unwrap();
    for (name, text) in files {
        std::fs::write(data.join(name), text).unwrap();
    }
    let agent = common::create_token(&data, "agent", "deploy-bot").await;
    let approver_token = common::create_token(&data, "approver", "ops-bot").await;
    let admin = common::create_token(&data, "admin", "root").await;
    let server = Server::start(&data);
    let setup = Setup {
        _dir: dir,
        data,
        server,
        agent,
        approver_token,
        admin,
    };
    add_approver(&setup, "alice", "Alice Approver").await;
    setup
}

/// A dashboard account that may decide, invited with `countersign user add` and active
/// (its invitation accepted with [`PASSWORD`]).
async fn add_approver(s: &Setup, username: &str, display_name: &str) {
    let link = common::run_ok(
        &s.data,
        &[
            "user",
            "add",
            "--username",
            username,
            "--role",
            "approver",
            "--display-name",
            display_name,
        ],
    )
    .await;
    let invite = link
        .trim()
        .split_once("token=")
        .map(|(_, t)| t.to_string())
        .expect("an invitation link");
    let (status, body) = s
        .server
        .post(
            "/ui/accept",
            None,
            &json!({"token": invite, "password": PASSWORD}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "accept the invitation: {body}");
}

/// Slack with Alice as its approver, and the team channels (and a Slack user who is not
/// an approver) that requests here may name as recipients.
fn slack_section(fake: &FakeSlack) -> String {
    format!(
        "[slack]\nbot_token = \"{BOT_TOKEN}\"\nsigning_secret = \"{SIGNING_SECRET}\"\napi_base_url = \"{}/api\"\n[slack.approvers]\n{ALICE_SLACK} = \"alice\"\n[notify]\nallowed_recipients = [\"slack:C0APPROVE\", \"slack:C0GONE\", \"slack:U0NOBODY1\"]\n",
        fake.base
    )
}

async fn get_request(s: &Setup, id: &str) -> Value {
    let (status, body) = s
        .server
        .get(&format!("/api/v1/requests/{id}"), Some(&s.agent))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn deliveries(s: &Setup) -> Vec<Value> {
    let (status, body) = s.server.get("/api/v1/deliveries", Some(&s.admin)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["deliveries"].as_array().unwrap().clone()
}

async fn wait_for_delivery(s: &Setup, what: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let all = deliveries(s).await;
        if let Some(found) = all.iter().find(|d| what(d)) {
            return found.clone();
        }
        if Instant::now() > deadline {
            panic!("no matching delivery within 15 s: {all:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn details() -> Value {
    json!({"amount": "12450.00", "currency": "GBP", "payee": "Globex <Corp> & Sons", "invoice": "INV-2291"})
}

// ---- Slack --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_clicks_decide_only_when_signed_fresh_first_and_from_an_approver() {
    let fake = FakeSlack::start().await;
    let s = start(&slack_section(&fake)).await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Pay invoice INV-2291 from Globex",
                "action_details": details(),
                "recipient_slack": "C0APPROVE",
            }),
        )
        .await;

    // The message: header, description, every detail as a field, who asked, expiry,
    // Approve and Reject buttons carrying the request id.
    let posted = fake
        .wait_for("chat.postMessage", |b| b.to_string().contains(&id))
        .await;
    assert_eq!(posted["channel"], "C0APPROVE");
    let blocks = posted["blocks"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "header");
    let text = posted.to_string();
    assert!(text.contains("Pay invoice INV-2291 from Globex"), "{text}");
    let fields: Vec<String> = blocks
        .iter()
        .flat_map(|b| b["fields"].as_array().cloned().unwrap_or_default())
        .map(|f| f["text"].as_str().unwrap().to_string())
        .collect();
    for (key, value) in [
        ("amount", "12450.00"),
        ("currency", "GBP"),
        ("invoice", "INV-2291"),
        ("payee", "Globex &lt;Corp&gt; &amp; Sons"),
    ] {
        assert!(
            fields.contains(&format!("*{key}*\n{value}")),
            "{key} in {fields:?}"
        );
    }
    assert!(text.contains("Asked by *deploy-bot*"), "{text}");
    assert!(text.contains("expires <!date^"), "{text}");
    let actions = blocks.iter().find(|b| b["type"] == "actions").unwrap();
    let buttons = actions["elements"].as_array().unwrap();
    assert_eq!(buttons.len(), 2);
    assert_eq!(buttons[0]["action_id"], "countersign_approve");
    assert_eq!(buttons[0]["value"], id.as_str());
    assert_eq!(buttons[1]["action_id"], "countersign_reject");
    assert_eq!(buttons[1]["value"], id.as_str());
    let sent = wait_for_delivery(&s, |d| {
        d["channel"] == "slack C0APPROVE" && d["status"] == "sent"
    })
    .await;
    assert_eq!(sent["event_type"], "request.created");
    assert_eq!(fake.calls("chat.postMessage").len(), 1);

    // A forged signature: 401, nothing decided.
    let approve = click(
        &fake,
        ALICE_SLACK,
        "countersign_approve",
        &id,
        "111.222.aaa",
    );
    let (status, body) = interact(
        &s.server,
        &approve,
        Signed {
            secret: "not-the-signing-secret",
            ..Signed::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // A correct signature over an old timestamp (a replay from 6 minutes ago): 401.
    let (status, body) = interact(
        &s.server,
        &approve,
        Signed {
            age: 6 * 60,
            ..Signed::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.to_string().contains("older than 5 minutes"), "{body}");
    // Unsigned: 401.
    let (status, _) = common::send(
        s.server
            .http()
            .post(s.server.url("/slack/interactivity"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("payload={}", form_encode(&approve.to_string()))),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // A click from a Slack user who is not an approver: told so, nothing decided.
    let stranger = click(
        &fake,
        MALLORY_SLACK,
        "countersign_approve",
        &id,
        "333.444.bbb",
    );
    let (status, body) = interact(&s.server, &stranger, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["response_type"], "ephemeral");
    assert!(
        body["text"].as_str().unwrap().contains("may not decide"),
        "{body}"
    );
    let told = fake.wait_for("response_url/333.444.bbb", |_| true).await;
    assert!(told["text"].as_str().unwrap().contains("may not decide"));
    assert_eq!(told["response_type"], "ephemeral");
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // Alice approves: decided as her dashboard account, through Slack.
    let started = Instant::now();
    let (status, body) = interact(&s.server, &approve, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "Slack wants an answer within 3 s"
    );
    let decided = get_request(&s, &id).await;
    assert_eq!(decided["status"], "approved", "{decided}");
    let approver = &decided["decision"]["approvers"][0];
    assert_eq!(approver["id"], "user:alice");
    assert_eq!(approver["display_name"], "Alice Approver");
    assert_eq!(approver["channel"], "slack");
    assert_eq!(approver["auth_method"], "slack_signature");
    // The proof says the same.
    let statement = common::statement(&decided["proof"]);
    assert_eq!(statement["approvers"][0]["channel"], "slack");
    assert_eq!(statement["approvers"][0]["auth_method"], "slack_signature");

    // The message is updated: who, via which channel, when; no buttons.
    let update = fake
        .wait_for("chat.update", |b| b.to_string().contains(&id))
        .await;
    assert_eq!(update["channel"], "C0APPROVE");
    assert_eq!(update["ts"], "1700000000.000001");
    let blocks = update["blocks"].as_array().unwrap();
    assert!(blocks.iter().all(|b| b["type"] != "actions"), "{update}");
    let shown = update.to_string();
    assert!(
        shown.contains("Approved by *Alice Approver* via slack <!date^"),
        "{shown}"
    );

    // Slack retries the same interaction (or someone replays it): answered, not acted on.
    let (status, body) = interact(
        &s.server,
        &approve,
        Signed {
            retry: Some(1),
            ..Signed::default()
        },
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["text"].as_str().unwrap().contains("already received"),
        "{body}"
    );
    let (_, body) = interact(&s.server, &approve, Signed::default()).await;
    assert!(body["text"].as_str().unwrap().contains("already received"));
    let after = get_request(&s, &id).await;
    assert_eq!(after["decision"], decided["decision"]);

    // A new click on the decided request says who decided.
    let late = click(&fake, ALICE_SLACK, "countersign_reject", &id, "555.666.ccc");
    let (status, body) = interact(&s.server, &late, Signed::default()).await;
    assert_eq!(status, StatusCode::OK);
    let text = body["text"].as_str().unwrap();
    assert!(text.contains("already closed"), "{text}");
    assert!(
        text.contains("Approved by Alice Approver via slack"),
        "{text}"
    );
    assert!(fake.calls("views.open").is_empty());

    // Exactly one update of the one message.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(fake.calls("chat.update").len(), 1);
    assert_eq!(fake.calls("chat.postMessage").len(), 1);
}

/// A request that asks for reply fields (e.g. a PO number): Approve in Slack opens a
/// dialog with one input per field; a submission missing one is refused next to it, and
/// a complete one approves with the fields in the signed proof.
/// Every string in a JSON value, however deep.
fn all_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| all_strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| all_strings(v, out)),
        _ => {}
    }
}

/// Fails if anything an agent or approver wrote reached Slack unescaped.
fn assert_escaped(body: &Value) {
    let mut strings = Vec::new();
    all_strings(body, &mut strings);
    for s in &strings {
        for raw in ["<!channel>", "<http://evil.example", "<!here>", "<@U0BOSS>"] {
            assert!(!s.contains(raw), "{raw} reached Slack unescaped in {s:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_text_reaches_slack_escaped_in_every_field_and_update() {
    let fake = FakeSlack::start().await;
    let s = start(&slack_section(&fake)).await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "<!channel> urgent: <http://evil.example/login|Approve here>",
                "action_details": {"note": "<@U0BOSS> <!here>"},
                "recipient_slack": "C0APPROVE",
            }),
        )
        .await;
    let posted = fake
        .wait_for("chat.postMessage", |b| b.to_string().contains(&id))
        .await;
    assert_escaped(&posted);
    // What phones show in the notification.
    assert_eq!(
        posted["text"],
        "Approval needed: &lt;!channel&gt; urgent: &lt;http://evil.example/login|Approve here&gt;"
    );
    // The update once decided (with a comment written to provoke the same) too.
    let (status, body) = s
        .server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(&s.approver_token),
            &json!({"decision": "rejected", "comment": "no <!here> <http://evil.example/x|see>"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let update = fake
        .wait_for("chat.update", |b| b.to_string().contains(&id))
        .await;
    assert_escaped(&update);
    assert!(
        update["text"]
            .as_str()
            .unwrap()
            .starts_with("Rejected: &lt;!channel&gt;"),
        "{update}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_approve_with_reply_fields_asks_for_them_and_signs_them() {
    let fake = FakeSlack::start().await;
    let s = start(&slack_section(&fake)).await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Pay invoice INV-88 to Globex",
                "action_details": {"amount": "950.00", "currency": "EUR"},
                "recipient_slack": "C0APPROVE",
                "requested_fields": ["po_number", "cost_center"],
            }),
        )
        .await;
    let posted = fake
        .wait_for("chat.postMessage", |b| b.to_string().contains(&id))
        .await;
    assert!(posted.to_string().contains("po_number"), "{posted}");

    let approve = click(
        &fake,
        ALICE_SLACK,
        "countersign_approve",
        &id,
        "121.212.aaa",
    );
    let (status, body) = interact(&s.server, &approve, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let opened = fake.wait_for("views.open", |_| true).await;
    assert_eq!(opened["trigger_id"], "121.212.aaa");
    let view = &opened["view"];
    assert_eq!(view["callback_id"], "countersign_approve");
    let blocks: Vec<String> = view["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["block_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        blocks,
        ["field:po_number", "field:cost_center", "comment"],
        "{view}"
    );
    // The click alone decides nothing.
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // Each submission has a trigger id of its own, as Slack sends them.
    let submission = |trigger: &str, values: Value| {
        json!({
            "type": "view_submission",
            "user": {"id": ALICE_SLACK},
            "team": {"id": "T0TEST"},
            "trigger_id": trigger,
            "view": {
                "id": "V0FIELDS",
                "callback_id": "countersign_approve",
                "private_metadata": view["private_metadata"],
                "hash": "1700000001.abc",
                "state": {"values": values},
            },
        })
    };
    let input = |value: &str| json!({"type": "plain_text_input", "value": value});

    // cost_center left empty: refused next to that input.
    let partial = submission(
        "343.434.bbb",
        json!({
            "field:po_number": {"value": input("PO-7781")},
            "field:cost_center": {"value": input("  ")},
            "comment": {"comment": input("")},
        }),
    );
    let (status, body) = interact(&s.server, &partial, Signed::default()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response_action"], "errors", "{body}");
    assert!(body["errors"]["field:cost_center"].is_string(), "{body}");
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    let complete = submission(
        "565.656.ccc",
        json!({
            "field:po_number": {"value": input("PO-7781")},
            "field:cost_center": {"value": input("CC-42")},
            "comment": {"comment": input("Matches the PO")},
        }),
    );
    let (status, body) = interact(&s.server, &complete, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let decided = get_request(&s, &id).await;
    assert_eq!(decided["status"], "approved", "{decided}");
    let expected = json!({"po_number": "PO-7781", "cost_center": "CC-42"});
    assert_eq!(decided["decision"]["fields"], expected);
    assert_eq!(decided["decision"]["comment"], "Matches the PO");
    let statement = common::statement(&decided["proof"]);
    assert_eq!(statement["fields"], expected);
    assert_eq!(statement["approvers"][0]["id"], "user:alice");
    assert_eq!(statement["approvers"][0]["channel"], "slack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_reject_asks_for_a_reason_and_other_channels_update_the_message() {
    let fake = FakeSlack::start().await;
    let s = start(&slack_section(&fake)).await;
    // To a user: the message goes to the app's DM with them.
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Delete the staging database",
                "action_details": {"database": "staging-eu-1"},
                "recipient_slack": ALICE_SLACK,
            }),
        )
        .await;
    fake.wait_for("chat.postMessage", |b| b.to_string().contains(&id))
        .await;

    // Reject opens a dialog asking for the reason.
    let reject = click(&fake, ALICE_SLACK, "countersign_reject", &id, "777.888.ddd");
    let (status, body) = interact(&s.server, &reject, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let opened = fake.wait_for("views.open", |_| true).await;
    assert_eq!(opened["trigger_id"], "777.888.ddd");
    let view = &opened["view"];
    assert_eq!(view["callback_id"], "countersign_reject");
    assert!(
        view.to_string().contains("\"block_id\":\"reason\""),
        "{view}"
    );
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // Submitting it rejects, with the reason the agent then sees.
    let submission = json!({
        "type": "view_submission",
        "user": {"id": ALICE_SLACK},
        "team": {"id": "T0TEST"},
        "trigger_id": "999.000.eee",
        "view": {
            "id": "V0FAKE",
            "callback_id": "countersign_reject",
            "private_metadata": view["private_metadata"],
            "hash": "1700000000.abc",
            "state": {"values": {"reason": {"reason": {"type": "plain_text_input", "value": "Staging is in use by the release train"}}}},
        },
    });
    // From someone else first: refused next to the input.
    let mut stranger = submission.clone();
    stranger["user"]["id"] = json!(MALLORY_SLACK);
    stranger["trigger_id"] = json!("999.000.fff");
    let (status, body) = interact(&s.server, &stranger, Signed::default()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response_action"], "errors", "{body}");
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    let (status, body) = interact(&s.server, &submission, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rejected = get_request(&s, &id).await;
    assert_eq!(rejected["status"], "rejected", "{rejected}");
    assert_eq!(
        rejected["decision"]["comment"],
        "Staging is in use by the release train"
    );
    assert_eq!(rejected["decision"]["approvers"][0]["id"], "user:alice");
    assert_eq!(rejected["decision"]["approvers"][0]["channel"], "slack");
    let update = fake
        .wait_for("chat.update", |b| b.to_string().contains(&id))
        .await;
    assert!(update["channel"].as_str().unwrap().starts_with('D'));
    assert!(
        update
            .to_string()
            .contains("Staging is in use by the release train")
    );

    // A decision from another channel (the REST API) updates the Slack message too.
    let other = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Restart the API servers", "recipient_slack": "C0APPROVE"}),
        )
        .await;
    fake.wait_for("chat.postMessage", |b| b.to_string().contains(&other))
        .await;
    let (status, body) = s.server.decide(&other, &s.approver_token, "approve").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let update = fake
        .wait_for("chat.update", |b| b.to_string().contains(&other))
        .await;
    assert!(
        update.to_string().contains("Approved by *ops-bot* via api"),
        "{update}"
    );

    // And so does a timeout: nobody decided, so not approved.
    let expiring = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Rotate the TLS keys", "recipient_slack": "C0APPROVE", "timeout_seconds": 2}),
        )
        .await;
    fake.wait_for("chat.postMessage", |b| b.to_string().contains(&expiring))
        .await;
    let update = fake
        .wait_for("chat.update", |b| b.to_string().contains(&expiring))
        .await;
    assert!(
        update.to_string().contains("Timed out: not approved"),
        "{update}"
    );
}

// ---- a real SMTP server ---------------------------------------------------------------------

struct SmtpSink {
    port: u16,
    dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl SmtpSink {
    /// Starts `tests/python/smtp_sink.py`; `Err` says why it cannot.
    async fn start() -> Result<SmtpSink, String> {
        SmtpSink::start_with(&[]).await
    }

    /// Starts `tests/python/smtp_sink.py` with more arguments (`--tls ...`, `--auth ...`).
    async fn start_with(args: &[&std::ffi::OsStr]) -> Result<SmtpSink, String> {
        use tokio::io::AsyncBufReadExt;
        let root = repo_root();
        let (python, _) = python();
        let probe = std::process::Command::new(&python)
            .args(["-c", "import aiosmtpd"])
            .stdin(Stdio::null())
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "{} cannot import aiosmtpd: {}",
                    python.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("cannot run {}: {e}", python.display())),
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(&python)
            .arg(root.join("tests/python/smtp_sink.py"))
            .arg(port.to_string())
            .arg(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start the SMTP sink: {e}"))?;
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        match tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
            Ok(Ok(Some(line))) if line.trim() == "READY" => {}
            other => panic!("the SMTP sink did not start: {other:?}"),
        }
        Ok(SmtpSink {
            port,
            dir,
            _child: child,
        })
    }

    fn messages(&self) -> Vec<Value> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        names
            .iter()
            .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
            .collect()
    }

    async fn wait_for(&self, what: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(found) = self.messages().into_iter().find(|m| what(m)) {
                return found;
            }
            if Instant::now() > deadline {
                panic!("no matching email within 15 s: {:#?}", self.messages());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn section(&self, extra: &str) -> String {
        format!(
            "[email]\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"countersign <approvals@example.com>\"\n{extra}\n[email.approvers]\n\"alice@example.com\" = \"alice\"\n",
            self.port
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_shows_a_quorum_k_of_n_and_updates_the_message_as_approvals_come() {
    let fake = FakeSlack::start().await;
    let config = format!("[policy]\nfiles = [\"p.cedar\"]\n{}", slack_section(&fake));
    let policy = "@id(\"two-for-payouts\")\n@approvals(\"2\")\npermit(principal, action == Action::\"payout\", resource);\n";
    let s = start_with(&config, &[("p.cedar", policy)]).await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Pay out 9,000 GBP",
                "action_details": {"tool": "payout", "amount": "9000"},
                "recipient_slack": "C0APPROVE",
            }),
        )
        .await;
    let posted = fake
        .wait_for("chat.postMessage", |b| b.to_string().contains(&id))
        .await;
    assert!(
        posted
            .to_string()
            .contains("0 of 2 approvals; 2 more needed"),
        "{posted}"
    );

    // One approval over the API: the message shows it and keeps its buttons.
    let (status, body) = s.server.decide(&id, &s.approver_token, "approve").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "pending");
    let progress = fake
        .wait_for("chat.update", |b| {
            b.to_string().contains(&id) && b.to_string().contains("1 of 2 approvals")
        })
        .await;
    let text = progress.to_string();
    assert!(text.contains("1 more needed"), "{text}");
    assert!(text.contains("approved by ops-bot via api"), "{text}");
    assert!(
        text.contains("countersign_approve"),
        "the buttons stay: {text}"
    );

    // Alice completes it from Slack: approved, both named.
    let approve = click(
        &fake,
        ALICE_SLACK,
        "countersign_approve",
        &id,
        "555.666.ccc",
    );
    let (status, body) = interact(&s.server, &approve, Signed::default()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done = get_request(&s, &id).await;
    assert_eq!(done["status"], "approved", "{done}");
    let approvers: Vec<&str> = done["decision"]["approvers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(approvers, ["token:ops-bot", "user:alice"]);
    let last = fake
        .wait_for("chat.update", |b| {
            b.to_string().contains(&id) && b.to_string().contains("Approved by")
        })
        .await;
    let text = last.to_string();
    assert!(
        text.contains("*ops-bot* via api") && text.contains("*Alice Approver* via slack"),
        "{text}"
    );
    assert!(
        !text.contains("countersign_approve"),
        "no buttons once decided: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_that_cannot_deliver_falls_back_to_email() {
    let smtp = match SmtpSink::start().await {
        Ok(s) => s,
        Err(reason) => return skip("Slack-to-email fallback", &reason),
    };
    let fake = FakeSlack::start().await;
    fake.state
        .missing
        .lock()
        .unwrap()
        .insert("C0GONE".to_string());
    let s = start(&format!("{}{}", slack_section(&fake), smtp.section(""))).await;

    // Slack answers channel_not_found (every time): email is the fallback.
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Refund order 1142",
                "action_details": {"order": "1142", "amount": "89.00"},
                "recipient_slack": "C0GONE",
                "recipient_email": "alice@example.com",
            }),
        )
        .await;
    let mail = smtp
        .wait_for(|m| m["text"].as_str().unwrap_or("").contains(&id))
        .await;
    assert_eq!(mail["rcpt_tos"], json!(["alice@example.com"]));
    assert!(
        mail["subject"]
            .as_str()
            .unwrap()
            .contains("Refund order 1142")
    );
    let failed = wait_for_delivery(&s, |d| d["channel"] == "slack C0GONE").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["attempts"], 1, "a permanent error is not retried");
    assert!(
        failed["last_error"]
            .as_str()
            .unwrap()
            .contains("channel_not_found"),
        "{failed}"
    );
    // The mail can arrive before its delivery is recorded as sent: wait for the record.
    let emailed = wait_for_delivery(&s, |d| {
        d["channel"] == "email alice@example.com"
            && d["subject"] == id.as_str()
            && d["status"] != "pending"
    })
    .await;
    assert_eq!(emailed["status"], "sent");
    assert!(emailed["id"].as_str().unwrap().starts_with("fallback."));
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // A Slack user who is not an approver, with an email given: emailed instead, and
    // the history says why.
    let id2 = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Raise the spending limit",
                "recipient_slack": "U0NOBODY1",
                "recipient_email": "alice@example.com",
            }),
        )
        .await;
    smtp.wait_for(|m| m["text"].as_str().unwrap_or("").contains(&id2))
        .await;
    let skipped = wait_for_delivery(&s, |d| {
        d["channel"] == "slack U0NOBODY1" && d["subject"] == id2.as_str()
    })
    .await;
    assert_eq!(skipped["status"], "skipped");
    assert!(
        skipped["last_error"]
            .as_str()
            .unwrap()
            .contains("not mapped to a countersign approver"),
        "{skipped}"
    );
    assert!(
        !fake
            .calls("chat.postMessage")
            .iter()
            .any(|c| c["channel"] == "U0NOBODY1")
    );
}

// ---- who is told ----------------------------------------------------------------------------

/// An agent chooses who is told only among the known approvers: an outside address or
/// Slack user is refused before anything exists or is sent (no open relay from the
/// server's From), and naming another known approver adds them but never keeps the
/// configured approvers from being told, by email or on Slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_name_only_known_approvers_and_the_configured_ones_are_always_told() {
    const BOB_SLACK: &str = "U0BOB0001";
    let smtp = match SmtpSink::start().await {
        Ok(s) => s,
        Err(reason) => return skip("recipients", &reason),
    };
    let fake = FakeSlack::start().await;
    // Alice and Bob are approvers on both channels; carol@ is mapped to an account
    // that does not exist. The configured route is `route`.
    let config = |route: &str| {
        format!(
            "[slack]\nbot_token = \"{BOT_TOKEN}\"\nsigning_secret = \"{SIGNING_SECRET}\"\napi_base_url = \"{}/api\"\n[slack.approvers]\n{ALICE_SLACK} = \"alice\"\n{BOB_SLACK} = \"bob\"\n[email]\nsmtp_url = \"smtp://127.0.0.1:{}\"\nfrom = \"countersign <approvals@example.com>\"\n[email.approvers]\n\"alice@example.com\" = \"alice\"\n\"bob@example.com\" = \"bob\"\n\"carol@example.com\" = \"carol\"\n[notify]\ndefault_routes = [\"{route}\"]\n",
            fake.base, smtp.port
        )
    };
    let emailed = |to: &'static str, id: String| {
        let smtp = &smtp;
        async move {
            smtp.wait_for(|m| {
                m["rcpt_tos"][0]
                    .as_str()
                    .is_some_and(|r| r.eq_ignore_ascii_case(to))
                    && m["text"].as_str().unwrap_or("").contains(&id)
            })
            .await
        }
    };
    let posted = |to: &'static str, id: String| {
        let fake = &fake;
        async move {
            fake.wait_for("chat.postMessage", |c| {
                c["channel"] == to && c.to_string().contains(&id)
            })
            .await
        }
    };

    // The configured route is Alice's email.
    let s = start(&config("email:alice@example.com")).await;
    add_approver(&s, "bob", "Bob Approver").await;
    for (field, to) in [
        ("recipient_email", "mallory@evil.example"),
        ("recipient_slack", MALLORY_SLACK),
        ("recipient_email", "carol@example.com"),
    ] {
        let mut ask =
            json!({"action_description": "Your account is locked: sign in at http://evil.example"});
        ask[field] = json!(to);
        let (status, body) = s
            .server
            .post("/api/v1/requests", Some(&s.agent), &ask)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{to}: {body}");
        assert_eq!(body["error"]["code"], "invalid_input");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains("not a known approver"),
            "{message}"
        );
    }
    // Bob named by email: both emailed. Bob named on Slack: his Slack message, and
    // Alice still gets her email.
    let by_email = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Rotate the payment provider's API key", "recipient_email": "Bob@Example.com"}),
        )
        .await;
    emailed("alice@example.com", by_email.clone()).await;
    emailed("bob@example.com", by_email).await;
    let on_slack = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Drop the staging database", "recipient_slack": BOB_SLACK}),
        )
        .await;
    posted(BOB_SLACK, on_slack.clone()).await;
    emailed("alice@example.com", on_slack).await;
    // Every event before this one has been planned and sent by now: the strangers got
    // nothing.
    let last = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Restart the queue"}),
        )
        .await;
    emailed("alice@example.com", last).await;
    let mails = smtp.messages();
    assert!(
        mails
            .iter()
            .all(|m| !m.to_string().to_lowercase().contains("mallory")),
        "{mails:#?}"
    );
    assert!(
        !fake
            .calls("chat.postMessage")
            .iter()
            .any(|c| c["channel"] == MALLORY_SLACK)
    );
    drop(s);

    // The configured route is Alice on Slack: Bob named by email is emailed, and Alice
    // still gets her Slack message (his email is no fallback of hers, nor hers of his).
    let s = start(&config(&format!("slack:{ALICE_SLACK}"))).await;
    add_approver(&s, "bob", "Bob Approver").await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Refund order 2291", "recipient_email": "bob@example.com"}),
        )
        .await;
    posted(ALICE_SLACK, id.clone()).await;
    emailed("bob@example.com", id.clone()).await;
    assert!(
        !deliveries(&s)
            .await
            .iter()
            .any(|d| d["channel"] == "email alice@example.com" && d["subject"] == id.as_str()),
        "Alice is told on Slack, as configured"
    );
}

// ---- email, scanners and the decision pages --------------------------------------------------

/// Every link in a message: `href`s in the HTML and URLs in the text.
fn links(mail: &Value) -> Vec<String> {
    let mut out = BTreeSet::new();
    let html = mail["html"].as_str().unwrap_or("");
    for part in html.split("href=\"").skip(1) {
        if let Some(end) = part.find('"') {
            out.insert(part[..end].replace("&amp;", "&"));
        }
    }
    for word in mail["text"].as_str().unwrap_or("").split_whitespace() {
        if word.starts_with("http://") || word.starts_with("https://") {
            out.insert(word.to_string());
        }
    }
    out.into_iter().collect()
}

/// What is missing to drive Chromium, if anything.
fn browser_missing(root: &Path) -> Option<String> {
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Some("`node` is not on PATH".into());
    }
    if !Path::new("/usr/bin/chromium").exists() {
        return Some("/usr/bin/chromium is missing".into());
    }
    if !root
        .join("tests/browser/node_modules/playwright-core/package.json")
        .exists()
    {
        return Some("tests/browser/node_modules/playwright-core is missing".into());
    }
    None
}

async fn browser(args: &[&str]) -> Value {
    let root = repo_root();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(root.join("tests/email-browser/email-browser.cjs"))
        .args(args)
        .env("NODE_PATH", root.join("tests/browser/node_modules"))
        .env("SCREENSHOT_DIR", {
            let dir = root.join("target/screenshots");
            std::fs::create_dir_all(&dir).unwrap();
            dir
        })
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("the browser script finished within 90 s")
        .expect("run node");
    assert!(
        out.status.success(),
        "email-browser.cjs {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        result["problems"],
        json!([]),
        "CSP violations or script errors"
    );
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_links_survive_scanners_and_approvers_decide_on_the_pages() {
    let smtp = match SmtpSink::start().await {
        Ok(s) => s,
        Err(reason) => return skip("email", &reason),
    };
    let s = start(&smtp.section("token_decisions = true\ntoken_minutes = 30")).await;
    let id = s
        .server
        .create_request(
            &s.agent,
            &json!({
                "action_description": "Wire GBP 12,450 to Globex Corp",
                "action_details": details(),
                "recipient_email": "alice@example.com",
            }),
        )
        .await;

    // The message: from the configured sender, multipart, every detail, who asked, the
    // expiry, and the links.
    let mail = smtp
        .wait_for(|m| m["text"].as_str().unwrap_or("").contains(&id))
        .await;
    assert_eq!(mail["from"], "countersign <approvals@example.com>");
    assert_eq!(mail["to"], "alice@example.com");
    assert_eq!(mail["content_type"], "multipart/alternative");
    assert_eq!(mail["auto_submitted"], "auto-generated");
    assert_eq!(
        mail["subject"],
        "Approval needed: Wire GBP 12,450 to Globex Corp"
    );
    let text = mail["text"].as_str().unwrap();
    let html = mail["html"].as_str().unwrap();
    for needle in [
        "amount: 12450.00",
        "currency: GBP",
        "payee: Globex <Corp> & Sons",
        "invoice: INV-2291",
        "Asked by: deploy-bot (token:deploy-bot)",
        "Expires at: ",
    ] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
    assert!(html.contains("Globex &lt;Corp&gt; &amp; Sons"), "{html}");
    let found = links(&mail);
    let token_link = found
        .iter()
        .find(|l| l.contains("/email/decide#t="))
        .expect("a one-time decision link")
        .clone();
    let dashboard_link = format!("{}/requests/{id}", s.server.base);
    assert!(found.contains(&dashboard_link), "{found:?}");
    // Only the token's hash is stored.
    let token = token_link.split_once("#t=").unwrap().1;
    let db = std::fs::read(s.data.join("countersign.db")).unwrap();
    assert!(
        !db.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token itself is in the database"
    );

    if let Some(reason) = browser_missing(&repo_root()) {
        return skip("email in a browser", &reason);
    }

    // A scanner opens every link (scripts on, no clicks): nothing changes.
    let scanned = browser(
        &["scan"]
            .into_iter()
            .chain(found.iter().map(String::as_str))
            .collect::<Vec<_>>(),
    )
    .await;
    for visit in scanned["visited"].as_array().unwrap() {
        let requests: Vec<&str> = visit["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        assert!(!requests.iter().any(|r| r.contains("/decision")), "{visit}");
    }
    let token_visit = scanned["visited"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["url"] == token_link.as_str())
        .unwrap();
    // The page showed the request, and the token left the address bar.
    assert!(
        token_visit["text"]
            .as_str()
            .unwrap()
            .contains("Wire GBP 12,450")
    );
    assert!(!token_visit["final_url"].as_str().unwrap().contains("#t="));
    assert_eq!(get_request(&s, &id).await["status"], "pending");

    // The approver opens the link and confirms: decided once, as her, through email.
    let confirmed = browser(&["confirm", &token_link]).await;
    assert!(
        confirmed["result"]
            .as_str()
            .unwrap()
            .contains("Approved by Alice Approver via email"),
        "{confirmed}"
    );
    assert!(!confirmed["address_bar"].as_str().unwrap().contains("#t="));
    assert!(
        confirmed["second"]
            .as_str()
            .unwrap()
            .contains("no longer works"),
        "{confirmed}"
    );
    assert_eq!(confirmed["second_buttons"], 0);
    let decided = get_request(&s, &id).await;
    assert_eq!(decided["status"], "approved");
    let approver = &decided["decision"]["approvers"][0];
    assert_eq!(approver["id"], "user:alice");
    assert_eq!(approver["channel"], "email");
    assert_eq!(approver["auth_method"], "email_token");
    assert_eq!(
        decided["decision"]["comment"],
        "Confirmed from the emailed link"
    );

    // The follow-up.
    let follow = smtp
        .wait_for(|m| {
            m["subject"]
                .as_str()
                .unwrap_or("")
                .starts_with("Approved: Wire GBP")
        })
        .await;
    assert!(
        follow["text"]
            .as_str()
            .unwrap()
            .contains("Approved by Alice Approver via email")
    );

    // The dashboard link: signed out it leads to sign-in, then back to the request,
    // where the approver decides with a POST.
    let id2 = s
        .server
        .create_request(
            &s.agent,
            &json!({"action_description": "Ship release 4.2 to production", "recipient_email": "alice@example.com"}),
        )
        .await;
    let mail = smtp
        .wait_for(|m| m["text"].as_str().unwrap_or("").contains(&id2))
        .await;
    let dashboard_link = links(&mail)
        .into_iter()
        .find(|l| l.ends_with(&format!("/requests/{id2}")))
        .expect("a dashboard link");
    let signed_in = browser(&["dashboard", &dashboard_link, "alice", PASSWORD]).await;
    assert!(
        signed_in["login_url"]
            .as_str()
            .unwrap()
            .contains(&format!("/login?next=/requests/{id2}")),
        "{signed_in}"
    );
    assert!(
        signed_in["after_login"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/requests/{id2}"))
    );
    let decided = get_request(&s, &id2).await;
    assert_eq!(decided["status"], "approved", "{decided}");
    assert_eq!(decided["decision"]["approvers"][0]["channel"], "dashboard");
    assert_eq!(
        decided["decision"]["approvers"][0]["auth_method"],
        "password_session"
    );
    // Its now-useless token was dropped with the decision.
    let token2 = links(&mail)
        .into_iter()
        .find(|l| l.contains("#t="))
        .unwrap();
    let token2 = token2.split_once("#t=").unwrap().1.to_string();
    let (status, body) = s
        .server
        .post("/email/api/request", None, &json!({"token": token2}))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
}

// ---- doctor and send-test-email ----------------------------------------------------------

/// Email over real TLS: STARTTLS, and TLS from the first byte, to an SMTP server whose
/// certificate chains to a private CA named by `[email] ca_file`, with the credentials
/// (which the server only takes under TLS). Without `ca_file` the certificate is refused
/// in words and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_over_starttls_and_implicit_tls_trusts_a_private_ca() {
    for (mode, url) in [
        ("starttls", "smtp://127.0.0.1:{port}?tls=starttls"),
        ("implicit", "smtps://127.0.0.1:{port}"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let args = [
            "--tls".as_ref(),
            mode.as_ref(),
            "--ca-out".as_ref(),
            ca.as_os_str(),
            "--auth".as_ref(),
            "approvals:s3cret-pw".as_ref(),
        ];
        let smtp = match SmtpSink::start_with(&args).await {
            Ok(s) => s,
            Err(reason) => return skip("email over TLS", &reason),
        };
        let config = dir.path().join("countersign.toml");
        let data = dir.path().join("data");
        let write = |ca_line: &str| {
            let url = url.replace("{port}", &smtp.port.to_string());
            std::fs::write(
                &config,
                format!(
                    "[email]\nsmtp_url = \"{url}\"\nfrom = \"countersign <approvals@example.com>\"\nusername = \"approvals\"\n{ca_line}\n"
                ),
            )
            .unwrap();
        };
        let send = |to: &'static str| {
            let mut cmd = common::bare_command();
            cmd.arg("--config")
                .arg(&config)
                .arg("--data-dir")
                .arg(&data)
                .args(["send-test-email", "--to", to])
                .env("COUNTERSIGN_SMTP_PASSWORD", "s3cret-pw");
            common::output(cmd)
        };

        // Without the CA: the server's certificate is not trusted, and nothing is sent.
        write("");
        let out = send("nobody@example.com").await;
        assert!(!out.ok(), "{mode}: sent without trusting the CA: {out}");
        assert!(
            out.stdout
                .contains("the server's certificate is not trusted")
                && out.stdout.contains("[email] ca_file"),
            "{mode}: {out}"
        );
        assert!(smtp.messages().is_empty(), "{mode}: {:?}", smtp.messages());

        // With it: delivered under TLS, authenticated.
        write(&format!("ca_file = \"{}\"", ca.display()));
        let out = send("ops@example.com").await;
        assert!(out.ok(), "{mode}: {out}");
        let mail = smtp
            .wait_for(|m| m["subject"] == "countersign test message")
            .await;
        assert_eq!(mail["rcpt_tos"], json!(["ops@example.com"]), "{mode}");
        assert_eq!(mail["tls"], json!(true), "{mode}: {mail}");
        assert_eq!(mail["login"], json!("approvals"), "{mode}: {mail}");
    }

    // ca_file on a plain connection is a mistake, said when the config is read.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("countersign.toml");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let check = |text: String| {
        std::fs::write(&config, text).unwrap();
        let mut cmd = common::bare_command();
        cmd.arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("doctor");
        common::output(cmd)
    };
    let out = check(format!(
        "[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"approvals@example.com\"\nca_file = \"{}\"\n",
        ca.display()
    ))
    .await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("plain (no TLS)"), "{out}");
    let out = check(format!(
        "[email]\nsmtp_url = \"smtps://mail.example.com\"\nfrom = \"approvals@example.com\"\nca_file = \"{}\"\n",
        ca.display()
    ))
    .await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("no PEM certificate"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_and_send_test_email_say_what_is_wrong() {
    let fake = FakeSlack::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("countersign.toml");
    let data = dir.path().join("data");
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let write = |text: &str| std::fs::write(&config, text).unwrap();
    let run = |args: &'static [&'static str]| {
        let mut cmd = common::bare_command();
        cmd.arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .args(args);
        common::output(cmd)
    };

    // A wrong bot token and an SMTP server that is not there: FAIL lines in words.
    write(&format!(
        "[slack]\nbot_token = \"xoxb-wrong\"\nsigning_secret = \"s\"\napi_base_url = \"{}/api\"\n[email]\nsmtp_url = \"smtp://127.0.0.1:{closed_port}\"\nfrom = \"approvals@example.com\"\n[[webhooks]]\nname = \"audit\"\nurl = \"https://audit.example.com/hooks\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        fake.base
    ));
    let out = run(&["doctor"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stdout
            .contains("FAIL  Slack: Slack refused auth.test: invalid_auth (the bot token is wrong"),
        "{out}"
    );
    assert!(
        out.stdout.contains(&format!(
            "FAIL  email: smtp://127.0.0.1:{closed_port} (plain, loopback)"
        )),
        "{out}"
    );
    assert!(
        out.stdout
            .contains("ok    webhook audit: https://audit.example.com/hooks"),
        "{out}"
    );
    assert!(out.stdout.contains("[slack.approvers] is empty"), "{out}");
    // What it checks of public_url, and says it cannot check (docs/channels.md).
    assert!(
        out.stdout
            .contains("public_url is http://127.0.0.1:8787, which Slack cannot reach"),
        "{out}"
    );
    let out = run(&["send-test-email", "--to", "alice@example.com"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stdout.contains("FAIL  smtp://127.0.0.1"), "{out}");

    // Refused configurations say why.
    write("[email]\nsmtp_url = \"smtp://mail.example.com\"\nfrom = \"approvals@example.com\"\n");
    let out = run(&["doctor"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("unencrypted"), "{out}");
    assert!(out.stderr.contains("smtps://mail.example.com"), "{out}");
    write(
        "[slack]\nbot_token = \"x\"\nsigning_secret = \"s\"\napi_base_url = \"http://slack.example.com/api\"\n",
    );
    let out = run(&["doctor"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("must be https://"), "{out}");
    write(
        "[slack]\nbot_token = \"x\"\nsigning_secret = \"s\"\n[slack.approvers]\nalice = \"alice\"\n",
    );
    let out = run(&["doctor"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("is not a Slack user id"), "{out}");
    write("[slack]\nbot_token = \"x\"\nsigning_secret = \"s\"\nsigning_secert = \"typo\"\n");
    let out = run(&["doctor"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("signing_secert"), "{out}");

    let smtp = match SmtpSink::start().await {
        Ok(s) => s,
        Err(reason) => return skip("send-test-email", &reason),
    };
    // Secrets from the environment; everything works.
    write(&format!(
        "[slack]\napi_base_url = \"{}/api\"\n[slack.approvers]\n{ALICE_SLACK} = \"alice\"\n{}",
        fake.base,
        smtp.section("")
    ));
    let mut cmd = common::bare_command();
    cmd.arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .arg("doctor")
        .env("COUNTERSIGN_SLACK_BOT_TOKEN", BOT_TOKEN)
        .env("COUNTERSIGN_SLACK_SIGNING_SECRET", SIGNING_SECRET);
    let out = common::output(cmd).await;
    assert!(
        out.stdout
            .contains("ok    Slack: the bot token works: workspace Fake Workspace as countersign"),
        "{out}"
    );
    assert!(
        out.stdout.contains(&format!(
            "ok    email: connected to smtp://127.0.0.1:{} (plain, loopback)",
            smtp.port
        )),
        "{out}"
    );
    let mut cmd = common::bare_command();
    cmd.arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .args(["send-test-email", "--to", "ops@example.com"])
        .env("COUNTERSIGN_SLACK_BOT_TOKEN", BOT_TOKEN)
        .env("COUNTERSIGN_SLACK_SIGNING_SECRET", SIGNING_SECRET);
    let out = common::output(cmd).await;
    assert!(out.ok(), "{out}");
    let mail = smtp
        .wait_for(|m| m["subject"] == "countersign test message")
        .await;
    assert_eq!(mail["rcpt_tos"], json!(["ops@example.com"]));
}
