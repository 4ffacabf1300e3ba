//! Outbound webhooks (Standard Webhooks) seen from outside, against the real `serve`
//! binary and an independent receiver, `tests/python/webhook_receiver.py`, which checks
//! every message with the `standardwebhooks` package (the spec's reference library) and
//! deduplicates by `webhook-id` as the spec asks receivers to:
//!
//! 1. request created, decided, timed out and action recorded arrive signed, and the
//!    reference library accepts them; a receiver holding the wrong secret rejects every
//!    one (the negative control), and the admin-only delivery history shows both;
//! 2. a receiver that fails gets the same message (same `webhook-id`, same bytes) again
//!    with backoff until it takes it, and one that never does ends `failed` after
//!    `[notify] max_attempts`;
//! 3. kill -9 right after a decision, five times over: the message arrives after the
//!    restart and the deduplicating receiver counts each exactly once;
//! 4. kill -9 while the receiver holds a delivery: after the lease expires the restarted
//!    server sends it again under the same `webhook-id` (raw count 2, deduplicated 1);
//! 5. a dead endpoint with hundreds of deliveries waiting does not hold up a healthy
//!    one;
//! 6. two instances on one PostgreSQL database: every message is sent exactly once in
//!    total, not even a raw duplicate, and the history lists each once.
//!
//! Python with `standardwebhooks` ([`common::python`], made by .ci/run from
//! tests/python/requirements.txt) and, for the last, PostgreSQL ([`TestDb`]) are needed;
//! without them the tests pass with a note on stderr, except with `CI=true`, where that is
//! a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::postgres::TestDb;
use crate::common::{self, PYTHON_SETUP, Server, create_token, in_ci, repo_root};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn skip(why: &str) {
    if in_ci() {
        panic!("CI=true and {why}");
    }
    eprintln!("SKIPPED: this test passes without running: {why} (with CI=true this is a failure)");
}

/// The suites' Python, if it has `standardwebhooks`; `None` after saying why not.
fn python() -> Option<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let (python, source) = common::python();
        let has_it = Command::new(&python)
            .args(["-c", "import standardwebhooks"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if has_it {
            Ok(python)
        } else {
            Err(format!(
                "{} (from {source}) cannot import the standardwebhooks package; install it: \
                 {PYTHON_SETUP}",
                python.display()
            ))
        }
    });
    match found {
        Ok(python) => Some(python.clone()),
        Err(why) => {
            skip(why);
            None
        }
    }
}

/// A fresh `whsec_` secret: 32 random bytes.
fn new_secret() -> String {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("randomness");
    format!("whsec_{}", STANDARD.encode(key))
}

fn pay(n: usize) -> Value {
    json!({
        "action_description": format!("Pay invoice INV-{n}"),
        "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
    })
}

// ---------------------------------------------------------------------------------------
// The receiver
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct Behaviour {
    /// Answer 500 to the first N deliveries of each message.
    fail_first: u32,
    /// Hold the first N taken deliveries of each message before answering.
    hang_first: u32,
}

/// `tests/python/webhook_receiver.py`, killed on drop. Its records arrive on stdout,
/// one JSON object a line, and are kept with the moment they were read.
struct Receiver {
    child: Child,
    url: String,
    records: Arc<Mutex<Vec<(Instant, Value)>>>,
}

impl Receiver {
    fn start(python: &Path, secret: &str, behaviour: Behaviour) -> Receiver {
        let script = repo_root().join("tests/python/webhook_receiver.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args(["--secret", secret])
            .args(["--fail-first", &behaviour.fail_first.to_string()])
            .args(["--hang-first", &behaviour.hang_first.to_string()])
            .args(["--hang-seconds", "60"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the webhook receiver");
        let stdout = child.stdout.take().expect("piped stdout");
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = records.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(value) = serde_json::from_str::<Value>(&line) else {
                    eprintln!("webhook receiver printed a non-JSON line: {line}");
                    continue;
                };
                if let Some(url) = value["listening"].as_str() {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(url.to_string());
                    }
                    continue;
                }
                sink.lock().unwrap().push((Instant::now(), value));
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("the webhook receiver did not say where it listens");
            }
        };
        Receiver {
            child,
            url,
            records,
        }
    }

    fn records(&self) -> Vec<Value> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn timed(&self) -> Vec<(Instant, Value)> {
        self.records.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the records; false when `limit` passes first.
    async fn until(&self, limit: Duration, done: impl Fn(&[Value]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if done(&self.records()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn dump(&self) -> String {
        self.records()
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Records of the message (`type`, `request_id`): every delivery of it (raw).
fn raw<'a>(records: &'a [Value], ty: &str, request_id: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["type"] == ty && r["request_id"] == request_id)
        .collect()
}

/// How often the message was processed by a receiver that deduplicates by
/// `webhook-id`: deliveries it took (answered 2xx) and had not taken before.
fn taken(records: &[Value], ty: &str, request_id: &str) -> usize {
    raw(records, ty, request_id)
        .iter()
        .filter(|r| r["answer"] == 204 && r["duplicate"] == false)
        .count()
}

fn all_taken(records: &[Value], expected: &[(&str, String)]) -> bool {
    expected.iter().all(|(ty, id)| taken(records, ty, id) >= 1)
}

// ---------------------------------------------------------------------------------------
// The server side
// ---------------------------------------------------------------------------------------

/// A `[[webhooks]]` table.
fn webhook(name: &str, url: &str, secret: &str, events: &[&str]) -> String {
    format!(
        "[[webhooks]]\nname = {name:?}\nurl = {url:?}\nsecret = {secret:?}\nevents = {events:?}\n\n"
    )
}

fn write_config(data: &Path, toml: &str) {
    std::fs::create_dir_all(data).expect("create the data dir");
    std::fs::write(data.join("countersign.toml"), toml).expect("write countersign.toml");
}

/// Tokens for an agent, an approver and an admin.
struct Tokens {
    agent: String,
    approver: String,
    admin: String,
}

async fn tokens(data: &Path) -> Tokens {
    Tokens {
        agent: create_token(data, "agent", "bot").await,
        approver: create_token(data, "approver", "alice").await,
        admin: create_token(data, "admin", "root").await,
    }
}

/// `GET /api/v1/deliveries` as an admin.
async fn history(server: &Server, admin: &str) -> Vec<Value> {
    let (status, body) = server
        .get("/api/v1/deliveries?limit=1000", Some(admin))
        .await;
    assert_eq!(status, StatusCode::OK, "delivery history: {body}");
    body["deliveries"].as_array().expect("deliveries").clone()
}

fn of_channel<'a>(history: &'a [Value], channel: &str) -> Vec<&'a Value> {
    history.iter().filter(|d| d["channel"] == channel).collect()
}

/// Waits until the history has no pending delivery left; returns it.
async fn drained(server: &Server, admin: &str, limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let history = history(server, admin).await;
        if history.iter().all(|d| d["status"] != "pending") {
            return history;
        }
        assert!(
            Instant::now() < deadline,
            "deliveries still pending after {limit:?}: {history:#?}\nserver stderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------
// 1. Signed, verified by the reference library; a wrong secret fails
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_arrives_signed_and_the_reference_library_verifies_it() {
    let Some(python) = python() else { return };
    let secret = new_secret();
    let good = Receiver::start(&python, &secret, Behaviour::default());
    // Verifies with another key than the one countersign signs with.
    let wrong = Receiver::start(&python, &new_secret(), Behaviour::default());

    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    // The second endpoint's secret comes from a file, as a mounted secret would.
    let secret_file = tmp.path().join("whsec");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    write_config(
        &data,
        &format!(
            "{}[[webhooks]]\nname = \"mismatch\"\nurl = {:?}\nsecret_file = {:?}\n",
            webhook("audit", &good.url, &secret, &[]),
            wrong.url,
            secret_file.to_str().unwrap(),
        ),
    );
    let t = tokens(&data).await;
    let server = Server::start(&data);

    let approved = server.create_request(&t.agent, &pay(1)).await;
    let (status, _) = server.decide(&approved, &t.approver, "approved").await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{approved}/actions"),
            Some(&t.agent),
            &json!({"tool": "bank.transfer", "details": {"amount": "101"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "record the action: {body}");
    let rejected = server.create_request(&t.agent, &pay(2)).await;
    let (status, _) = server.decide(&rejected, &t.approver, "rejected").await;
    assert_eq!(status, StatusCode::OK);
    let mut short = pay(3);
    short["timeout_seconds"] = json!(1);
    let expiring = server.create_request(&t.agent, &short).await;

    let expected = vec![
        ("request.created", approved.clone()),
        ("request.decided", approved.clone()),
        ("action.recorded", approved.clone()),
        ("request.created", rejected.clone()),
        ("request.decided", rejected.clone()),
        ("request.created", expiring.clone()),
        ("request.timed_out", expiring.clone()),
    ];
    let arrived = good
        .until(Duration::from_secs(20), |r| all_taken(r, &expected))
        .await;
    assert!(
        arrived,
        "not every message arrived; received:\n{}\nserver stderr:\n{}",
        good.dump(),
        server.stderr()
    );

    // Exactly the expected messages, once each, each verified, each its own id.
    let records = good.records();
    assert_eq!(records.len(), expected.len(), "{}", good.dump());
    for (ty, id) in &expected {
        let copies = raw(&records, ty, id);
        assert_eq!(copies.len(), 1, "{ty} for {id}: {copies:?}");
        let r = copies[0];
        assert_eq!(r["valid"], true, "the reference library rejected {r}");
        assert_eq!(r["answer"], 204, "{r}");
        assert_eq!(r["attempt"], 1, "{r}");
        let ts: i64 = r["timestamp"].as_str().unwrap().parse().unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            (now - ts).abs() < 60,
            "webhook-timestamp {ts} is not now ({now})"
        );
    }
    let ids: BTreeSet<_> = records
        .iter()
        .map(|r| r["webhook_id"].to_string())
        .collect();
    assert_eq!(ids.len(), records.len(), "webhook ids are not distinct");
    // One sender, in log order: a request's messages arrive in the order of its events.
    let position = |ty: &str, id: &str| {
        records
            .iter()
            .position(|r| r["type"] == ty && r["request_id"] == id)
            .unwrap()
    };
    assert!(position("request.created", &approved) < position("request.decided", &approved));
    assert!(position("request.decided", &approved) < position("action.recorded", &approved));
    assert!(position("request.created", &expiring) < position("request.timed_out", &expiring));

    // The negative control: the same messages, signed with the real key, fail against
    // the wrong one (and the receiver answers 401, so countersign retries them).
    let seen = wrong
        .until(Duration::from_secs(10), |r| {
            expected.iter().all(|(ty, id)| !raw(r, ty, id).is_empty())
        })
        .await;
    assert!(
        seen,
        "the mismatched receiver missed messages:\n{}",
        wrong.dump()
    );
    for r in wrong.records() {
        assert_eq!(r["valid"], false, "verified with the wrong secret: {r}");
        assert!(
            r["error"]
                .as_str()
                .is_some_and(|e| e.contains("No matching signature")),
            "{r}"
        );
        assert_eq!(r["answer"], 401, "{r}");
    }

    // The history, for admins: the audit endpoint's messages sent on the first attempt
    // under the ids the receiver saw; the mismatched one's failing with the 401.
    // The receiver's answer may reach it before countersign has recorded the attempt:
    // read the history again (for up to 10 s) until every attempt it saw is recorded.
    let settled = |list: &[Value]| {
        of_channel(list, "webhook audit")
            .iter()
            .all(|d| d["status"] == "sent")
            && of_channel(list, "webhook mismatch")
                .iter()
                .all(|d| d["last_error"].is_string())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut list = history(&server, &t.admin).await;
    while !settled(&list) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        list = history(&server, &t.admin).await;
    }
    let audit = of_channel(&list, "webhook audit");
    assert_eq!(audit.len(), expected.len(), "{list:#?}");
    let received: BTreeSet<String> = records
        .iter()
        .map(|r| r["webhook_id"].as_str().unwrap().to_string())
        .collect();
    for d in &audit {
        assert_eq!(d["status"], "sent", "{d}");
        assert_eq!(d["attempts"], 1, "{d}");
        assert!(d["finished_at"].is_string(), "{d}");
        assert!(
            received.contains(d["message_id"].as_str().unwrap()),
            "history names a message the receiver never saw: {d}"
        );
        assert!(
            expected
                .iter()
                .any(|(ty, id)| d["event_type"] == *ty && d["subject"] == id.as_str()),
            "{d}"
        );
    }
    let mismatch = of_channel(&list, "webhook mismatch");
    assert_eq!(mismatch.len(), expected.len(), "{list:#?}");
    for d in &mismatch {
        assert_eq!(d["status"], "pending", "{d}");
        assert!(d["attempts"].as_u64().unwrap() >= 1, "{d}");
        assert!(
            d["last_error"].as_str().is_some_and(|e| e.contains("401")),
            "{d}"
        );
    }

    // Not for anyone else.
    for token in [&t.agent, &t.approver] {
        let (status, body) = server.get("/api/v1/deliveries", Some(token)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    }
    let (status, _) = server.get("/api/v1/deliveries", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

// ---------------------------------------------------------------------------------------
// 2. Retries with backoff; giving up after max_attempts
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_gets_the_same_message_again_until_it_takes_it() {
    let Some(python) = python() else { return };
    let secret = new_secret();
    let flaky = Receiver::start(
        &python,
        &secret,
        Behaviour {
            fail_first: 2,
            ..Behaviour::default()
        },
    );
    let down = Receiver::start(
        &python,
        &secret,
        Behaviour {
            fail_first: 1000,
            ..Behaviour::default()
        },
    );
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    write_config(
        &data,
        &format!(
            "{}{}[notify]\nmax_attempts = 3\n",
            webhook("flaky", &flaky.url, &secret, &["request.decided"]),
            webhook("down", &down.url, &secret, &["request.decided"]),
        ),
    );
    let t = tokens(&data).await;
    let server = Server::start(&data);
    let id = server.create_request(&t.agent, &pay(1)).await;
    let (status, _) = server.decide(&id, &t.approver, "approved").await;
    assert_eq!(status, StatusCode::OK);

    // After the first failure the history says so, and the message waits for its retry.
    assert!(
        flaky
            .until(Duration::from_secs(10), |r| !r.is_empty())
            .await
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = history(&server, &t.admin).await;
        let d = of_channel(&list, "webhook flaky");
        if let [d] = d.as_slice()
            && d["attempts"] == 1
            && d["last_error"].as_str().is_some_and(|e| e.contains("500"))
        {
            assert_eq!(d["status"], "pending", "{d}");
            assert!(d["finished_at"].is_null(), "{d}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "history after a failure: {list:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 500, 500 (after ~5 s), then taken (after another ~10 s).
    let took = flaky
        .until(Duration::from_secs(30), |r| {
            taken(r, "request.decided", &id) == 1
        })
        .await;
    assert!(
        took,
        "the flaky receiver never took the message:\n{}\nserver stderr:\n{}",
        flaky.dump(),
        server.stderr()
    );
    let timed = flaky.timed();
    let answers: Vec<_> = timed.iter().map(|(_, r)| r["answer"].clone()).collect();
    assert_eq!(
        answers,
        vec![json!(500), json!(500), json!(204)],
        "{}",
        flaky.dump()
    );
    let first_id = &timed[0].1["webhook_id"];
    for (_, r) in &timed {
        assert_eq!(
            &r["webhook_id"], first_id,
            "a retry changed the message id: {r}"
        );
        assert_eq!(r["valid"], true, "{r}");
        assert_eq!(r["request_id"], id.as_str(), "{r}");
    }
    let gap1 = timed[1].0 - timed[0].0;
    let gap2 = timed[2].0 - timed[1].0;
    eprintln!("retry gaps: {gap1:?}, {gap2:?} (backoff 5 s, 10 s)");
    assert!(
        gap1 >= Duration::from_millis(4500) && gap1 < Duration::from_secs(9),
        "first retry after {gap1:?}, not ~5 s"
    );
    assert!(
        gap2 >= Duration::from_millis(9500) && gap2 < Duration::from_secs(14),
        "second retry after {gap2:?}, not ~10 s"
    );

    // The endpoint that never takes it: three attempts, then `failed`, and no fourth.
    let list = drained(&server, &t.admin, Duration::from_secs(10)).await;
    let flaky_history = of_channel(&list, "webhook flaky");
    assert_eq!(flaky_history.len(), 1, "{list:#?}");
    let d = flaky_history[0];
    assert_eq!(d["status"], "sent", "{d}");
    assert_eq!(d["attempts"], 3, "{d}");
    assert!(d["last_error"].is_null(), "{d}");
    assert_eq!(&d["message_id"], first_id, "{d}");
    let down_history = of_channel(&list, "webhook down");
    assert_eq!(down_history.len(), 1, "{list:#?}");
    let d = down_history[0];
    assert_eq!(d["status"], "failed", "{d}");
    assert_eq!(d["attempts"], 3, "{d}");
    assert!(d["finished_at"].is_string(), "{d}");
    assert!(
        d["last_error"].as_str().is_some_and(|e| e.contains("500")),
        "{d}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let attempts = down.records();
    assert_eq!(attempts.len(), 3, "{}", down.dump());
    assert!(
        attempts
            .iter()
            .all(|r| r["webhook_id"] == attempts[0]["webhook_id"] && r["answer"] == 500)
    );
}

// ---------------------------------------------------------------------------------------
// 3, 4. Exactly once across kill -9
// ---------------------------------------------------------------------------------------

/// The lease the crash tests configure: short, so a delivery whose sender was killed
/// is sent again within seconds (the default is 60 s).
const TEST_LEASE_SECONDS: u64 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_right_after_the_decision_delays_the_message_but_never_doubles_it() {
    let Some(python) = python() else { return };
    let secret = new_secret();
    let receiver = Receiver::start(&python, &secret, Behaviour::default());
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    write_config(
        &data,
        &format!(
            "{}[notify]\nlease_seconds = {TEST_LEASE_SECONDS}\n",
            webhook("audit", &receiver.url, &secret, &[])
        ),
    );
    let t = tokens(&data).await;

    // The kill lands at different points: before planning, while claiming or sending,
    // after the receiver answered but before the delivery is moved to the history (the
    // request's messages go out some milliseconds after the decision returns).
    let delays_ms = [0u64, 5, 15, 30, 50];
    let mut ids = Vec::new();
    let mut arrived_before_kill = 0;
    for (cycle, delay) in delays_ms.iter().enumerate() {
        let mut server = Server::start(&data);
        let id = server.create_request(&t.agent, &pay(cycle)).await;
        let (status, _) = server.decide(&id, &t.approver, "approved").await;
        assert_eq!(status, StatusCode::OK);
        if *delay > 0 {
            std::thread::sleep(Duration::from_millis(*delay));
        }
        server.kill();
        let before = receiver.records();
        let (created, decided) = (
            raw(&before, "request.created", &id).len(),
            raw(&before, "request.decided", &id).len(),
        );
        eprintln!(
            "cycle {cycle}: killed {delay} ms after the decision; had arrived: created {created}, \
             decided {decided}"
        );
        if decided > 0 {
            arrived_before_kill += 1;
        }
        let restarted = Server::start(&data);
        let expected = [
            ("request.created", id.clone()),
            ("request.decided", id.clone()),
        ];
        let arrived = receiver
            .until(Duration::from_secs(20), |r| all_taken(r, &expected))
            .await;
        assert!(
            arrived,
            "cycle {cycle}: the decision's message never arrived after the restart:\n{}\n\
             server stderr:\n{}",
            receiver.dump(),
            restarted.stderr()
        );
        ids.push(id);
    }

    // Let anything still leased be sent again, then count.
    let server = Server::start(&data);
    let list = drained(
        &server,
        &t.admin,
        Duration::from_secs(TEST_LEASE_SECONDS + 10),
    )
    .await;
    let records = receiver.records();
    let mut raw_duplicates = 0;
    for id in &ids {
        for ty in ["request.created", "request.decided"] {
            assert_eq!(
                taken(&records, ty, id),
                1,
                "{ty} for {id} processed more than once:\n{}",
                receiver.dump()
            );
            let copies = raw(&records, ty, id);
            assert!(copies.iter().all(|r| r["valid"] == true));
            let message_ids: BTreeSet<_> =
                copies.iter().map(|r| r["webhook_id"].to_string()).collect();
            assert_eq!(message_ids.len(), 1, "one message, one id: {copies:?}");
            raw_duplicates += copies.len() - 1;
            let listed: Vec<_> = list
                .iter()
                .filter(|d| d["event_type"] == ty && d["subject"] == id.as_str())
                .collect();
            assert_eq!(listed.len(), 1, "{ty} for {id} in the history: {listed:?}");
            assert_eq!(listed[0]["status"], "sent", "{:?}", listed[0]);
        }
    }
    eprintln!(
        "{} kill -9 cycles: {arrived_before_kill} decisions delivered before the kill, \
         {raw_duplicates} raw redeliveries (deduplicated by webhook-id)",
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_the_receiver_holds_the_message_sends_it_again_under_the_same_id() {
    let Some(python) = python() else { return };
    let secret = new_secret();
    let receiver = Receiver::start(
        &python,
        &secret,
        Behaviour {
            hang_first: 1,
            ..Behaviour::default()
        },
    );
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    write_config(
        &data,
        &format!(
            "{}[notify]\nlease_seconds = {TEST_LEASE_SECONDS}\n",
            webhook("audit", &receiver.url, &secret, &["request.decided"])
        ),
    );
    let t = tokens(&data).await;
    let mut server = Server::start(&data);
    let id = server.create_request(&t.agent, &pay(1)).await;
    let (status, _) = server.decide(&id, &t.approver, "approved").await;
    assert_eq!(status, StatusCode::OK);
    let held = receiver
        .until(Duration::from_secs(10), |r| {
            r.iter().any(|r| r["held"] == true)
        })
        .await;
    assert!(
        held,
        "no delivery reached the receiver:\n{}",
        server.stderr()
    );
    server.kill();
    let killed = Instant::now();

    let restarted = Server::start(&data);
    let again = receiver
        .until(Duration::from_secs(TEST_LEASE_SECONDS + 10), |r| {
            r.len() >= 2
        })
        .await;
    assert!(
        again,
        "the held message was not sent again:\n{}\nserver stderr:\n{}",
        receiver.dump(),
        restarted.stderr()
    );
    let timed = receiver.timed();
    let (first, second) = (&timed[0].1, &timed[1].1);
    assert_eq!(
        first["webhook_id"],
        second["webhook_id"],
        "{}",
        receiver.dump()
    );
    assert_eq!(second["type"], "request.decided");
    assert_eq!(second["request_id"], id.as_str());
    assert_eq!(second["valid"], true);
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["duplicate"], true, "{second}");
    // Not before the killed sender's lease ran out.
    let waited = timed[1].0 - timed[0].0;
    assert!(
        waited >= Duration::from_millis(TEST_LEASE_SECONDS * 1000 - 300),
        "sent again after {waited:?}, inside the {TEST_LEASE_SECONDS} s lease"
    );
    eprintln!(
        "held message sent again {waited:?} after the first delivery ({:?} after the kill)",
        timed[1].0 - killed
    );

    let list = drained(&restarted, &t.admin, Duration::from_secs(10)).await;
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["status"], "sent");
    assert_eq!(list[0]["attempts"], 2);
    let records = receiver.records();
    assert_eq!(
        taken(&records, "request.decided", &id),
        1,
        "deduplicated count"
    );
    assert_eq!(raw(&records, "request.decided", &id).len(), 2, "raw count");
}

// ---------------------------------------------------------------------------------------
// 5. A dead endpoint with a long queue does not hold up a healthy one
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_with_a_long_queue_does_not_hold_up_a_healthy_one() {
    let Some(python) = python() else { return };
    let secret = new_secret();
    let healthy = Receiver::start(&python, &secret, Behaviour::default());
    // Nothing listens here: every delivery to it fails at once and waits for a retry.
    let dead_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    // "a-dead" sorts before "b-healthy": its deliveries come first in the outbox.
    write_config(
        &data,
        &format!(
            "{}{}",
            webhook(
                "a-dead",
                &format!("http://127.0.0.1:{dead_port}/"),
                &secret,
                &["request.created"]
            ),
            webhook("b-healthy", &healthy.url, &secret, &["request.decided"]),
        ),
    );
    let t = tokens(&data).await;
    let server = Server::start(&data);
    const QUEUED: usize = 520;
    let started = Instant::now();
    let client = server.http().clone();
    let mut tasks = Vec::new();
    for chunk in 0..8 {
        let (client, url, agent) = (
            client.clone(),
            server.url("/api/v1/requests"),
            t.agent.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for n in (chunk..QUEUED).step_by(8) {
                let resp = client
                    .post(&url)
                    .bearer_auth(&agent)
                    .json(&pay(n))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::CREATED);
                let body: Value = resp.json().await.unwrap();
                ids.push(body["request_id"].as_str().unwrap().to_string());
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.unwrap());
    }
    eprintln!("{QUEUED} requests created in {:?}", started.elapsed());
    // Every one of them queued for the dead endpoint (after its first failed attempt).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = history(&server, &t.admin).await;
        let tried = of_channel(&list, "webhook a-dead")
            .iter()
            .filter(|d| d["attempts"].as_u64().unwrap_or(0) >= 1)
            .count();
        if tried >= QUEUED {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {tried} of {QUEUED} deliveries to the dead endpoint were ever tried: \
             the ones past the first 500 waiting are never looked at"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Now a decision: its message goes to the healthy endpoint, and should not wait for
    // the dead endpoint's hundreds of retries.
    let decided_at = Instant::now();
    let (status, _) = server.decide(&ids[0], &t.approver, "approved").await;
    assert_eq!(status, StatusCode::OK);
    let arrived = healthy
        .until(Duration::from_secs(10), |r| {
            taken(r, "request.decided", &ids[0]) == 1
        })
        .await;
    assert!(
        arrived,
        "the healthy endpoint's message is stuck behind {QUEUED} deliveries to a dead one \
         ({:?} and counting)",
        decided_at.elapsed()
    );
    eprintln!(
        "healthy endpoint served {:?} after the decision, behind {QUEUED} queued deliveries",
        decided_at.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 6. Two instances on one PostgreSQL database
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_database_send_each_message_once() {
    let Some(python) = python() else { return };
    let Some(db) = TestDb::create().await else {
        return;
    };
    let secret = new_secret();
    let receiver = Receiver::start(&python, &secret, Behaviour::default());
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    let dirs: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("i{i}"))).collect();
    for dir in &dirs {
        write_config(
            dir,
            &format!(
                "database_url = {:?}\nkeys_dir = {:?}\n\n{}",
                db.url,
                keys.to_str().unwrap(),
                webhook("audit", &receiver.url, &secret, &[])
            ),
        );
    }
    // Tokens live in the database: made through one instance's directory, good on both.
    // The first command also makes the shared signing key.
    let t = tokens(&dirs[0]).await;
    let servers: Vec<Server> = dirs.iter().map(|d| Server::start(d)).collect();
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let client = servers[0].http().clone();

    const REQUESTS: usize = 30;
    let mut tasks = Vec::new();
    for n in 0..REQUESTS {
        let (client, bases, agent, approver) = (
            client.clone(),
            bases.clone(),
            t.agent.clone(),
            t.approver.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // Created on one instance, decided on the other.
            let resp = client
                .post(format!("{}/api/v1/requests", bases[n % 2]))
                .bearer_auth(&agent)
                .json(&pay(n))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::CREATED);
            let id = resp.json::<Value>().await.unwrap()["request_id"]
                .as_str()
                .unwrap()
                .to_string();
            let decision = if n % 3 == 0 { "rejected" } else { "approved" };
            let resp = client
                .post(format!(
                    "{}/api/v1/requests/{id}/decision",
                    bases[(n + 1) % 2]
                ))
                .bearer_auth(&approver)
                .json(&json!({"decision": decision}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            id
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap());
    }
    let expected: Vec<(&str, String)> = ids
        .iter()
        .flat_map(|id| {
            [
                ("request.created", id.clone()),
                ("request.decided", id.clone()),
            ]
        })
        .collect();
    let arrived = receiver
        .until(Duration::from_secs(30), |r| all_taken(r, &expected))
        .await;
    assert!(
        arrived,
        "messages missing:\n{}\ninstance 0:\n{}\ninstance 1:\n{}",
        receiver.dump(),
        servers[0].stderr(),
        servers[1].stderr()
    );
    let list = drained(&servers[1], &t.admin, Duration::from_secs(10)).await;
    // Give a second sender the time to show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let records = receiver.records();
    let mut per_id: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        assert_eq!(r["valid"], true, "{r}");
        *per_id
            .entry(r["webhook_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let doubled: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "messages sent more than once (raw, by webhook-id): {doubled:?}\n{}",
        receiver.dump()
    );
    assert_eq!(records.len(), expected.len(), "{}", receiver.dump());
    for (ty, id) in &expected {
        assert_eq!(raw(&records, ty, id).len(), 1, "{ty} for {id}");
    }
    assert_eq!(list.len(), expected.len(), "{list:#?}");
    let listed: BTreeSet<_> = list.iter().map(|d| d["id"].to_string()).collect();
    assert_eq!(
        listed.len(),
        list.len(),
        "the history lists a delivery twice"
    );
    for d in &list {
        assert_eq!(d["status"], "sent", "{d}");
        assert_eq!(d["attempts"], 1, "{d}");
        assert!(
            per_id.contains_key(d["message_id"].as_str().unwrap()),
            "{d}"
        );
    }
    // Both instances see the same history.
    assert_eq!(history(&servers[0], &t.admin).await.len(), list.len());
    drop(servers);
    drop(db);
}
