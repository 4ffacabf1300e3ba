//! Data directories written by earlier builds (`testdata/upgrade/`, every document kind;
//! see its README) open with this one, and everything in it still reads and works: accounts, sessions and an open
//! invitation, rooms, members and answered questions, deliveries and the outbox cursor,
//! Slack messages and a handled click, an email sent and its decision link, and the log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use countersign_core::rooms::Presence;
use countersign_core::{
    Channel, Clock, Decider, DecisionInput, FixedClock, Principal, Role, Status, Timestamp, Verdict,
};
use countersign_server::notify::{
    DeliveryChannel, EmailConfig, Notifier, NotifyConfig, WebhookConfig, history,
    slack::SlackConfig, smtp::SmtpUrl,
};
use countersign_server::rooms::HumanGate;
use countersign_server::{Gate, HttpConfig, Settings, links};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use serde_json::{Value, json};
use sha2::Sha256;

/// The fixtures, oldest first; each was made by `testdata/upgrade/make_fixture.py`.
const FIXTURES: [&str; 2] = ["before-typed-docs", "before-evidence-v2"];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/upgrade")
        .join(name)
}

/// Copies a data directory as an operator restores one: private to its owner (git
/// keeps no modes, and the key must not be readable by others).
fn copy_dir(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).unwrap();
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

/// The channels as the fixture's server had them, sending nowhere.
fn channels(public_url: &str) -> NotifyConfig {
    NotifyConfig {
        webhooks: vec![WebhookConfig {
            name: "audit".into(),
            url: "http://127.0.0.1:9/hook".into(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            events: Vec::new(),
            format: Default::default(),
        }],
        slack: Some(SlackConfig {
            bot_token: "xoxb-fixture".into(),
            signing_secret: "fixture-signing-secret".into(),
            api_base_url: "http://127.0.0.1:9/api".into(),
            approvers: BTreeMap::from([("U0ALICE".into(), "alice".into())]),
        }),
        email: Some(EmailConfig {
            smtp: SmtpUrl::parse("smtp://127.0.0.1:9").unwrap(),
            from: "countersign <approvals@example.com>".into(),
            username: None,
            password: None,
            extra_roots: None,
            approvers: BTreeMap::from([("alice@example.com".into(), "alice".into())]),
            token_decisions: true,
            token_minutes: 30,
            follow_ups: true,
        }),
        public_url: public_url.into(),
        ..NotifyConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_from_before_typed_documents_opens_and_works() {
    opens_and_works(FIXTURES[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_from_before_evidence_v2_opens_and_works() {
    opens_and_works(FIXTURES[1]).await;
}

async fn opens_and_works(name: &str) {
    let fixture = || fixture_dir(name);
    let meta: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("fixture.json")).unwrap()).unwrap();
    let text = |path: &str| meta.pointer(path).unwrap().as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture().join("data"), dir.path());
    let made_at = Timestamp::parse(&text("/made_at")).unwrap();
    let clock = Arc::new(FixedClock::new(made_at.plus_seconds(60)));
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("countersign.db")).unwrap());
    let gate = Gate::builder(store.clone(), dir.path().join("keys"))
        .clock(clock.clone())
        .log_origin("countersign/not-this-one")
        .settings(Settings {
            backup_dir: Some(dir.path().join("backups")),
            ..Settings::default()
        })
        .build()
        .await
        .unwrap();
    assert_eq!(
        gate.log().origin(),
        "countersign/upgrade-fixture",
        "an existing log keeps its origin"
    );

    // The log, as it was written, still verifies against its signed checkpoints.
    gate.log().integrate().await.unwrap();
    let events = store.events_after(0, 100_000).await.unwrap();
    let notes: Vec<String> = store
        .checkpoints()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.note)
        .collect();
    let report = countersign_core::logcheck::verify_log(
        events.iter().map(|e| e.bytes.as_slice()),
        &notes,
        &gate.jwks().await.unwrap(),
        gate.log().origin(),
    );
    assert!(report.valid(), "{:?}", report.problems);
    assert!(report.entries >= 25, "{} entries", report.entries);

    // Accounts: sign-in, the session the fixture opened, the invitation it left open.
    let accounts = gate.accounts();
    let users = accounts.users().await.unwrap();
    let names: Vec<&str> = users.iter().map(|u| u.username.as_str()).collect();
    assert_eq!(users.len(), 3, "{names:?}");
    assert!(accounts.has_admin().await.unwrap());
    let password = text("/password");
    assert!(matches!(
        accounts.sign_in("alice", &password).await.unwrap(),
        countersign_server::accounts::SignIn::Ok { .. }
    ));
    let (user, _) = accounts.session(&text("/session")).await.unwrap().unwrap();
    assert_eq!(user.username, "alice");
    let carol = accounts
        .accept(&text("/open_invite"), None, None, &password)
        .await
        .unwrap();
    assert_eq!(
        (carol.username.as_str(), carol.role),
        ("carol", Role::Admin)
    );

    // Rooms: the roster, the history with its open and answered gates, the trash.
    let rooms = gate.rooms();
    let listed = rooms.list().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .any(|r| r.name == "month-end" && r.deleted_at.is_some())
    );
    let members = rooms.members("release-train").await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].status, Presence::Working);
    assert_eq!(members[0].note.as_deref(), Some("canary at 5%"));
    let reader = Principal::from_token("bob", Role::Approver);
    let messages = rooms.read(&reader, "release-train", 0, 1000).await.unwrap();
    let questions: Vec<_> = messages.iter().filter(|m| m.kind == "question").collect();
    assert_eq!(questions.len(), 2);
    assert_eq!(
        questions[0].open,
        Some(false),
        "answered before the upgrade"
    );
    assert_eq!(questions[1].open, Some(true));
    assert!(messages.iter().any(
        |m| m.kind == "approval" && m.reference.as_deref() == Some(&text("/requests/in_room"))
    ));
    let attention = rooms.attention(&listed).await.unwrap();
    assert_eq!(attention["release-train"].questions, 1);
    assert_eq!(attention["release-train"].blockers, 0);
    let bob = Decider::new(Principal::from_token("bob", Role::Approver)).unwrap();
    let again = rooms
        .close(
            &bob,
            "release-train",
            &questions[0].id,
            HumanGate::Question,
            "Again?",
        )
        .await
        .unwrap_err();
    assert!(again.to_string().contains("already answered"), "{again}");

    // The email decision link still opens (and is bound to its request and approver).
    let link = links::lookup(&gate, &text("/email_link_token"))
        .await
        .unwrap();
    assert_eq!(link.body.request_id, text("/requests/emailed"));
    assert_eq!(link.body.username, "alice");

    // The delivery history reads, and the outbox goes on from its cursor.
    let before = history(&store, 1000).await.unwrap();
    assert_eq!(before.len(), 12, "{before:#?}");
    let notifier = Notifier::new(gate.clone(), channels("http://127.0.0.1:8787")).unwrap();
    notifier.plan_new_events().await.unwrap();
    // Closing the requests planned before the upgrade: the Slack message the old server
    // posted is updated, the address it emailed gets a follow-up, the link is dropped.
    let agent = Principal::from_token("deploy-bot", Role::Agent);
    let slack_pending = text("/requests/slack_pending");
    let emailed = text("/requests/emailed");
    for id in [&slack_pending, &emailed] {
        gate.decide(
            &bob,
            id,
            Verdict::Rejected,
            DecisionInput::default(),
            Channel::Api,
        )
        .await
        .unwrap();
    }
    notifier.plan_new_events().await.unwrap();
    let after = history(&store, 1000).await.unwrap();
    let update = after
        .iter()
        .find(|d| d.id.starts_with(&format!("update.{slack_pending}.")))
        .expect("the Slack update of a message posted before the upgrade");
    assert_eq!(
        update.channel,
        DeliveryChannel::SlackUpdate {
            to: "C0FIXTURE".into()
        }
    );
    assert!(
        after
            .iter()
            .any(|d| d.id == format!("followup.{emailed}.email.alice@example.com"))
    );
    assert!(
        links::lookup(&gate, &text("/email_link_token"))
            .await
            .is_err()
    );
    assert_eq!(
        gate.get(&agent, &text("/requests/clicked"))
            .await
            .unwrap()
            .status,
        Status::Approved,
        "approved by the Slack click"
    );
    assert!(
        notifier.send_due().await.unwrap() > 0,
        "pending deliveries are claimed"
    );

    // A request stored before redemption existed is redeemed once, by an executor.
    let clicked = gate.get(&agent, &text("/requests/clicked")).await.unwrap();
    let executor = Principal::from_token("payments", Role::Executor);
    let proof = clicked.proof.clone().unwrap();
    let redeemed = gate
        .redeem_proof(&executor, &proof, &clicked.action)
        .await
        .unwrap();
    assert_eq!(
        redeemed.request.used().unwrap().1,
        "redeemed by token:payments"
    );
    let again = gate
        .redeem_proof(&executor, &proof, &clicked.action)
        .await
        .unwrap_err();
    assert_eq!(again.code(), "already_used", "{again}");

    // Slack: the click the old server handled is still known the next day, so a replay
    // of it does nothing.
    clock.advance_seconds(24 * 3600);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let app = countersign_server::router(gate.clone(), &HttpConfig::default(), shutdown.clone());
    let app = countersign_server::with_channels(app, &channels("http://127.0.0.1:8787")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(countersign_server::serve(listener, app, shutdown.clone()));
    let payload = json!({
        "type": "block_actions",
        "trigger_id": "fixture-trigger",
        "user": {"id": "U0ALICE"},
        "actions": [{"action_id": "countersign_approve", "value": text("/requests/clicked"), "action_ts": "1.0"}],
    });
    let body = format!(
        "payload={}",
        form_urlencoded::byte_serialize(payload.to_string().as_bytes()).collect::<String>()
    );
    let ts = (clock.now().millis() / 1000).to_string();
    let mut mac =
        <hmac::Hmac<Sha256> as hmac::Mac>::new_from_slice(b"fixture-signing-secret").unwrap();
    hmac::Mac::update(&mut mac, format!("v0:{ts}:{body}").as_bytes());
    let signature = format!("v0={}", hex::encode(hmac::Mac::finalize(mac).into_bytes()));
    let answer: Value = reqwest::Client::new()
        .post(format!("http://{addr}/slack/interactivity"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", signature)
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("already received"),
        "{answer}"
    );

    tokens_made_before_still_work(&meta, &format!("http://{addr}")).await;
    shutdown.cancel();
}

/// The fixture's tokens (made before tokens had an expiry, scopes or unique names) work
/// as they did: no expiry, everything their role may, and their names stay theirs.
async fn tokens_made_before_still_work(meta: &Value, base: &str) {
    let token = |name: &str| meta["tokens"][name].as_str().unwrap().to_string();
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: &str, who: &str, body: Option<Value>| {
        let mut request = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(token(who));
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, list) = call(reqwest::Method::GET, "/api/v1/tokens", "root", None).await;
    assert_eq!(status, 200, "{list}");
    for (name, role, scopes) in [
        (
            "root",
            "admin",
            json!(["request", "rooms", "evidence", "verify", "decide", "admin"]),
        ),
        (
            "deploy-bot",
            "agent",
            json!(["request", "rooms", "evidence", "verify"]),
        ),
        (
            "bob",
            "approver",
            json!(["request", "rooms", "evidence", "verify", "decide"]),
        ),
    ] {
        let listed = list["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {list}"));
        assert_eq!(listed["role"], role);
        assert_eq!(listed["status"], "active", "{listed}");
        assert_eq!(listed["expires_at"], Value::Null);
        assert_eq!(listed["scoped"], false);
        assert_eq!(listed["scopes"], scopes);
    }
    let ask = json!({"action_description": "After the upgrade"});
    let (status, created) = call(
        reqwest::Method::POST,
        "/api/v1/requests",
        "deploy-bot",
        Some(ask),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, _) = call(reqwest::Method::GET, "/api/v1/requests", "bob", None).await;
    assert_eq!(status, 200, "the approver still lists requests");
    let (status, _) = call(reqwest::Method::GET, "/api/v1/requests", "deploy-bot", None).await;
    assert_eq!(status, 403, "the agent still may not");
    let again = json!({"name": "Deploy-Bot", "role": "agent"});
    let (status, refused) =
        call(reqwest::Method::POST, "/api/v1/tokens", "root", Some(again)).await;
    assert_eq!(status, 400, "the name stays taken: {refused}");
}
