//! Several `countersign serve` instances on one PostgreSQL database, as they run behind a
//! load balancer:
//!
//! - an agent waiting on one instance (REST long poll, MCP `wait_for_approval`) wakes
//!   promptly when another instance records the decision; a key rotation reaches every
//!   instance sharing the keys directory;
//! - one instance killed (SIGKILL) while many clients create and decide, restarted, and
//!   killed again: clients retry on another instance (idempotency keys for creations, a
//!   re-read after a retried decision), and afterwards every acknowledged request and
//!   decision is there exactly once and the log verifies;
//! - MCP Streamable HTTP through a non-sticky round-robin TCP proxy, the calls of one
//!   client landing on several instances;
//! - `migrate-data` from SQLite to PostgreSQL: old requests, proofs, tokens, the account
//!   and the log's root survive;
//! - a first-admin setup link printed by one instance stops working once another
//!   instance's link has created the first admin.
//!
//! Each test gets a database of its own on `COUNTERSIGN_TEST_POSTGRES_URL`
//! ([`TestDb`]); if the server cannot be reached the tests pass with a note on stderr,
//! except with `CI=true`, where that is a failure.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::postgres::TestDb;
use crate::common::{self, McpClient, Output, Server, call, path_str, statement, write_json};
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

// ---------------------------------------------------------------------------------------
// Instances on one database
// ---------------------------------------------------------------------------------------

/// Instances with data directories of their own, one keys directory and one database.
struct Cluster {
    /// Declared first: the instances stop before their database is dropped.
    servers: Vec<Server>,
    db: TestDb,
    tmp: tempfile::TempDir,
}

impl Cluster {
    fn new(db: TestDb) -> Cluster {
        Cluster {
            servers: Vec::new(),
            db,
            tmp: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn keys_dir(&self) -> PathBuf {
        self.tmp.path().join("keys")
    }

    fn data_dir(&self, instance: usize) -> PathBuf {
        self.tmp.path().join(format!("instance-{instance}"))
    }

    /// `countersign --data-dir <instance's> ARGS... --database URL`, sharing the keys.
    fn cli(&self, instance: usize, args: &[&str]) -> tokio::process::Command {
        let mut cmd = common::command(&self.data_dir(instance), args);
        cmd.arg("--database")
            .arg(&self.db.url)
            .env("COUNTERSIGN_KEYS_DIR", self.keys_dir());
        cmd
    }

    async fn run(&self, instance: usize, args: &[&str]) -> Output {
        common::output(self.cli(instance, args)).await
    }

    async fn run_ok(&self, instance: usize, args: &[&str]) -> String {
        let out = self.run(instance, args).await;
        assert!(
            out.ok(),
            "countersign {args:?} on instance {instance}:\n{out}"
        );
        out.stdout
    }

    /// A token created through `instance`'s data directory: tokens live in the
    /// database, so it works on every instance.
    async fn token(&self, instance: usize, role: &str, name: &str) -> String {
        self.run_ok(
            instance,
            &["token", "create", "--role", role, "--name", name],
        )
        .await
        .trim()
        .to_string()
    }

    /// Starts `count` `serve` instances at once, configured through the environment
    /// (`COUNTERSIGN_DATABASE_URL`, `COUNTERSIGN_KEYS_DIR`, plus `env`). The keys
    /// directory must exist already (created by the first CLI command), or each instance
    /// would make a key of its own.
    async fn start(&mut self, count: usize, env: &[(&str, &str)]) {
        assert!(
            self.keys_dir().join("signing-key.json").exists(),
            "create the shared key first (any CLI command that opens the gate does)"
        );
        let starting: Vec<_> = (0..count)
            .map(|i| {
                let cmd = self.serve_command(i, "127.0.0.1:0", env);
                tokio::task::spawn_blocking(move || Server::spawn(cmd))
            })
            .collect();
        for server in starting {
            match server.await {
                Ok(server) => self.servers.push(server),
                Err(err) => std::panic::resume_unwind(err.into_panic()),
            }
        }
    }

    fn serve_command(
        &self,
        instance: usize,
        listen: &str,
        env: &[(&str, &str)],
    ) -> std::process::Command {
        let mut cmd = common::serve_command();
        cmd.arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(self.data_dir(instance))
            .env("COUNTERSIGN_DATABASE_URL", &self.db.url)
            .env("COUNTERSIGN_KEYS_DIR", self.keys_dir())
            .env("COUNTERSIGN_LOG", "warn");
        for (key, value) in env {
            cmd.env(key, value);
        }
        cmd
    }

    /// Starts a killed instance again on its old address, as a supervisor would.
    async fn restart(&mut self, instance: usize) {
        let listen = self.servers[instance].addr.to_string();
        let cmd = self.serve_command(instance, &listen, &[]);
        let server = match tokio::task::spawn_blocking(move || Server::spawn(cmd)).await {
            Ok(server) => server,
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        };
        self.servers[instance] = server;
    }
}

/// A client that never panics on a transport error, so callers can retry elsewhere.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(40))
        .build()
        .expect("reqwest client")
}

/// An MCP client over Streamable HTTP at `url` (…/mcp) with a bearer token. rmcp's
/// default HTTP client keeps no idle connections: every call opens a new one.
async fn mcp_http(url: &str, token: &str) -> McpClient {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    tokio::time::timeout(Duration::from_secs(20), ().serve(transport))
        .await
        .expect("MCP initialize timed out")
        .expect("MCP initialize failed")
}

fn object(value: &Value) -> String {
    value.to_string()
}

fn median(sorted: &[Duration]) -> Duration {
    sorted[sorted.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------------------------------
// 1. Cross-instance wake-up
// ---------------------------------------------------------------------------------------

/// The longest a cross-instance wake-up may take: far under the waits' 30 s, and above
/// the 1 s fallback poll that covers a lost NOTIFY.
const WAKE_LIMIT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_on_one_instance_wakes_when_another_decides() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let mut cluster = Cluster::new(db);
    // Tokens created through different instances' directories: one database holds them.
    let agents = [
        ("agent-a", cluster.token(0, "agent", "agent-a").await),
        ("agent-b", cluster.token(1, "agent", "agent-b").await),
    ];
    let approvers = [
        ("alice", cluster.token(2, "approver", "alice").await),
        ("bob", cluster.token(0, "approver", "bob").await),
    ];
    cluster.start(3, &[]).await;
    let servers = &cluster.servers;

    // One signing key for all: every instance publishes the same JWKS.
    let (status, jwks) = servers[0].get("/.well-known/jwks.json", None).await;
    assert_eq!(status, StatusCode::OK);
    for server in &servers[1..] {
        assert_eq!(server.get("/.well-known/jwks.json", None).await.1, jwks);
    }

    // REST: created and waited on instance `on`, decided on instance `by`.
    let mut rest = Vec::new();
    let mut first_proof = Value::Null;
    for round in 0..6 {
        let (on, by) = (round % 3, (round + 1) % 3);
        let (agent_name, agent) = &agents[round % 2];
        let (approver_name, approver) = &approvers[(round / 2) % 2];
        let verdict = if round % 3 == 2 {
            "rejected"
        } else {
            "approved"
        };
        let id = servers[on]
            .create_request(
                agent,
                &json!({"action_description": format!("deploy build {round}"),
                        "action_details": {"build": round.to_string()}}),
            )
            .await;
        let waiter = {
            let request = servers[on]
                .http()
                .get(servers[on].url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=30")))
                .bearer_auth(agent);
            tokio::spawn(async move {
                let answer = common::send(request).await;
                (Instant::now(), answer)
            })
        };
        // Let the long poll reach its instance and start waiting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "the long poll returned undecided");
        let (status, decided) = servers[by].decide(&id, approver, verdict).await;
        let decided_at = Instant::now();
        assert_eq!(
            status,
            StatusCode::OK,
            "decision on instance {by}: {decided}"
        );
        let (woke, (status, waited)) = waiter.await.expect("waiter");
        let latency = woke.saturating_duration_since(decided_at);
        assert_eq!(status, StatusCode::OK, "{waited}");
        assert_eq!(waited["status"], verdict, "{waited}");
        assert_eq!(
            waited["decision"]["approvers"][0]["display_name"], *approver_name,
            "{waited}"
        );
        assert_eq!(waited["proof"], decided["proof"]);
        if first_proof.is_null() && verdict == "approved" {
            first_proof = waited["proof"].clone();
        }
        assert_eq!(
            statement(&waited["proof"])["requested_by"]["display_name"],
            *agent_name
        );
        assert!(
            latency < WAKE_LIMIT,
            "REST waiter on instance {on} woke {} after the decision on {by}",
            ms(latency)
        );
        rest.push(latency);
    }

    // MCP over HTTP: request_approval and wait_for_approval on `on`, decided on `by`,
    // the proof checked on the third instance.
    let mut mcp = Vec::new();
    for round in 0..4 {
        let (on, by, third) = (round % 3, (round + 2) % 3, (round + 1) % 3);
        let (_, agent) = &agents[round % 2];
        let (approver_name, approver) = &approvers[round % 2];
        let client = mcp_http(&servers[on].url("/mcp"), agent).await;
        let action = json!({"description": format!("pay invoice {round}"),
                            "details": {"invoice": format!("INV-{round}"), "amount": "120.00"}});
        let created = call(
            client.peer(),
            "request_approval",
            json!({"action_description": action["description"],
                   "action_details": action["details"]}),
        )
        .await
        .expect("request_approval");
        let id = created["request_id"]
            .as_str()
            .expect("request_id")
            .to_string();
        let waiter = {
            let peer = client.peer().clone();
            let id = id.clone();
            tokio::spawn(async move {
                let result = call(
                    &peer,
                    "wait_for_approval",
                    json!({"request_id": id, "timeout_seconds": 30}),
                )
                .await;
                (Instant::now(), result)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiter.is_finished(),
            "wait_for_approval returned undecided"
        );
        let (status, decided) = servers[by].decide(&id, approver, "approved").await;
        let decided_at = Instant::now();
        assert_eq!(status, StatusCode::OK, "{decided}");
        let (woke, waited) = waiter.await.expect("waiter");
        let waited = waited.expect("wait_for_approval");
        let latency = woke.saturating_duration_since(decided_at);
        assert_eq!(waited["status"], "approved", "{waited}");
        assert_eq!(
            waited["decision"]["approvers"][0]["display_name"],
            *approver_name
        );
        assert!(
            latency < WAKE_LIMIT,
            "MCP waiter on instance {on} woke {} after the decision on {by}",
            ms(latency)
        );
        mcp.push(latency);
        let _ = client.cancel().await;

        // The proof verifies on yet another instance (one key, one database).
        let checker = mcp_http(&servers[third].url("/mcp"), agent).await;
        let report = call(
            checker.peer(),
            "verify_proof",
            json!({"proof": waited["proof"], "action_description": action["description"],
                   "action_details": action["details"]}),
        )
        .await
        .expect("verify_proof");
        assert_eq!(report["valid"], true, "{report}");
        assert_eq!(report["request_id"], id.as_str());
        let _ = checker.cancel().await;
    }

    // Rotating the shared key from any instance's directory reaches every instance: each
    // signs with the new key soon after (the rotation is an event in the shared log), and
    // proofs signed before still verify everywhere.
    let old_kid = first_proof["signatures"][0]["keyid"]
        .as_str()
        .expect("keyid")
        .to_string();
    let new_kid = cluster
        .run_ok(1, &["keys", "rotate"])
        .await
        .trim()
        .to_string();
    assert_ne!(new_kid, old_kid);
    let (_, agent) = &agents[0];
    let (_, approver) = &approvers[0];
    for (i, server) in servers.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let id = server
                .create_request(
                    agent,
                    &json!({"action_description": "after the rotation", "action_details": {}}),
                )
                .await;
            let (status, decided) = server.decide(&id, approver, "approved").await;
            assert_eq!(status, StatusCode::OK, "{decided}");
            let kid = &decided["proof"]["signatures"][0]["keyid"];
            if kid == new_kid.as_str() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "instance {i} still signs with {kid} 5 s after the rotation to {new_kid}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_, jwks) = server.get("/.well-known/jwks.json", None).await;
        for kid in [&old_kid, &new_kid] {
            assert!(object(&jwks).contains(kid.as_str()), "instance {i}: {jwks}");
        }
        let (status, report) = server
            .post(
                "/api/v1/proofs/verify",
                Some(agent),
                &json!({"proof": first_proof}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{report}");
        assert_eq!(report["valid"], true, "instance {i}: {report}");
    }

    rest.sort();
    mcp.sort();
    println!(
        "cross-instance wake-up, REST long poll: median {}, max {} ({:?})",
        ms(median(&rest)),
        ms(rest[rest.len() - 1]),
        rest.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    println!(
        "cross-instance wake-up, MCP wait_for_approval: median {}, max {} ({:?})",
        ms(median(&mcp)),
        ms(mcp[mcp.len() - 1]),
        mcp.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    // Pushed (NOTIFY), not found by the 1 s fallback poll: that would put the median
    // near 500 ms.
    for (what, sample) in [("REST", &rest), ("MCP", &mcp)] {
        assert!(
            median(sample) < Duration::from_millis(250),
            "{what} cross-instance wake-ups are slow (median {}): is NOTIFY working?",
            ms(median(sample))
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. An instance killed under load
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct CreatedAck {
    key: String,
    id: String,
    /// The 2xx was a replay (200, `existing`): an earlier attempt had committed.
    replay: bool,
}

#[derive(Debug, Clone)]
struct DecisionAck {
    id: String,
    approver: String,
    verdict: &'static str,
    comment: String,
    /// Acknowledged by a re-read after a retried call answered `already_decided`.
    recovered: bool,
}

#[derive(Default)]
struct Tally {
    created: Mutex<Vec<CreatedAck>>,
    decided: Mutex<Vec<DecisionAck>>,
    /// Calls that failed with no HTTP answer (connection refused or cut).
    transport_errors: AtomicUsize,
    /// `already_decided` without a retry: another approver was first.
    lost_races: AtomicUsize,
    /// Long polls cut off, and taken up again on another instance.
    waits_resumed: AtomicUsize,
}

/// An HTTP call's answer, or `None` when no complete answer arrived.
async fn try_send(request: reqwest::RequestBuilder) -> Option<(StatusCode, Value)> {
    let response = request.send().await.ok()?;
    let status = response.status();
    let text = response.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

const MAX_ATTEMPTS: usize = 30;

/// An agent: creates requests (each with an idempotency key) on its instance, hands
/// them to the approvers and waits for each decision; whatever fails for want of an
/// answer is retried on the next instance.
#[allow(clippy::too_many_arguments)]
async fn agent_client(
    bases: Arc<Vec<String>>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    approvers: mpsc::UnboundedSender<String>,
    name: String,
    token: String,
    client_no: usize,
    mut at: usize,
) {
    let http = http_client();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        // Like a non-sticky load balancer: each call to the next instance.
        at = (at + 1) % bases.len();
        let key = format!("{name}-c{client_no}-{n}");
        let body = json!({"action_description": format!("pay invoice {key}"),
                          "action_details": {"key": key, "amount": "10.00"},
                          "idempotency_key": key});
        let mut attempts = 0;
        let (id, replay) = loop {
            attempts += 1;
            assert!(attempts <= MAX_ATTEMPTS, "{key}: no instance took it");
            let request = http
                .post(format!("{}/api/v1/requests", bases[at]))
                .bearer_auth(&token)
                .json(&body);
            match try_send(request).await {
                Some((StatusCode::CREATED | StatusCode::OK, created)) => {
                    let id = created["request_id"].as_str().expect("request_id");
                    break (id.to_string(), created["existing"] == true);
                }
                Some((StatusCode::SERVICE_UNAVAILABLE, _)) | None => {
                    tally.transport_errors.fetch_add(1, Ordering::SeqCst);
                    at = (at + 1) % bases.len();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some((status, answer)) => panic!("creating {key}: {status} {answer}"),
            }
        };
        tally.created.lock().expect("tally").push(CreatedAck {
            key,
            id: id.clone(),
            replay,
        });
        // Every fourth request goes to two approvers at once: first decision wins.
        if n % 4 == 0 {
            let _ = approvers.send(id.clone());
        }
        let _ = approvers.send(id.clone());

        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(
                attempts <= MAX_ATTEMPTS,
                "waiting for {id}: no instance answered"
            );
            let request = http
                .get(format!(
                    "{}/api/v1/requests/{id}/wait?timeout_seconds=20",
                    bases[at]
                ))
                .bearer_auth(&token);
            match try_send(request).await {
                Some((StatusCode::OK, request)) if request["status"] != "pending" => {
                    let status = request["status"].as_str().unwrap_or("?");
                    assert!(
                        status == "approved" || status == "rejected",
                        "{id} ended {status}"
                    );
                    break;
                }
                Some((StatusCode::OK, _)) => {}
                Some((StatusCode::SERVICE_UNAVAILABLE, _)) | None => {
                    tally.waits_resumed.fetch_add(1, Ordering::SeqCst);
                    at = (at + 1) % bases.len();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some((status, answer)) => panic!("waiting for {id}: {status} {answer}"),
            }
        }
        n += 1;
    }
}

/// An approver: decides the requests handed over; a decision whose call got no answer is
/// retried on the next instance, and if that answers `already_decided`, the request is
/// re-read to learn whether the first call had gone through.
async fn approver_client(
    bases: Arc<Vec<String>>,
    tally: Arc<Tally>,
    inbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>>,
    name: String,
    token: String,
    client_no: usize,
) {
    let http = http_client();
    let mut at = client_no % bases.len();
    let mut decided = 0usize;
    loop {
        let Some(id) = inbox.lock().await.recv().await else {
            break;
        };
        let verdict = if decided % 3 == 2 {
            "rejected"
        } else {
            "approved"
        };
        // Unique to this call: a re-read tells this call's decision from any other's.
        let comment = format!("by {name}, client {client_no}, call {decided}");
        decided += 1;
        at = (at + 1) % bases.len();
        let mut retried = false;
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(
                attempts <= MAX_ATTEMPTS,
                "deciding {id}: no instance answered"
            );
            let request = http
                .post(format!("{}/api/v1/requests/{id}/decision", bases[at]))
                .bearer_auth(&token)
                .json(&json!({"decision": verdict, "comment": comment}));
            match try_send(request).await {
                Some((StatusCode::OK, _)) => {
                    tally.decided.lock().expect("tally").push(DecisionAck {
                        id: id.clone(),
                        approver: name.clone(),
                        verdict,
                        comment: comment.clone(),
                        recovered: false,
                    });
                    break;
                }
                Some((StatusCode::CONFLICT, error)) => {
                    assert_eq!(error["error"]["code"], "already_decided", "{id}: {error}");
                    if !retried {
                        tally.lost_races.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    // The call that got no answer may have gone through: re-read.
                    let request = loop {
                        let read = http
                            .get(format!("{}/api/v1/requests/{id}", bases[at]))
                            .bearer_auth(&token);
                        match try_send(read).await {
                            Some((StatusCode::OK, request)) => break request,
                            _ => at = (at + 1) % bases.len(),
                        }
                    };
                    let decision = &request["decision"];
                    if decision["comment"] == comment.as_str() {
                        assert_eq!(decision["decision"], verdict, "{request}");
                        assert_eq!(decision["approvers"][0]["display_name"], name.as_str());
                        tally.decided.lock().expect("tally").push(DecisionAck {
                            id: id.clone(),
                            approver: name.clone(),
                            verdict,
                            comment: comment.clone(),
                            recovered: true,
                        });
                    } else {
                        tally.lost_races.fetch_add(1, Ordering::SeqCst);
                    }
                    break;
                }
                Some((StatusCode::SERVICE_UNAVAILABLE, _)) | None => {
                    tally.transport_errors.fetch_add(1, Ordering::SeqCst);
                    retried = true;
                    at = (at + 1) % bases.len();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some((status, answer)) => panic!("deciding {id}: {status} {answer}"),
            }
        }
    }
}

/// Waits until `tally` has `target` acknowledged creations, or `limit` passes.
async fn until_created(tally: &Tally, target: usize, limit: Duration) -> usize {
    let start = Instant::now();
    loop {
        let created = tally.created.lock().expect("tally").len();
        if created >= target || start.elapsed() > limit {
            return created;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_an_instance_under_load_loses_nothing_acknowledged() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let mut cluster = Cluster::new(db);
    let mut agents = Vec::new();
    for (i, name) in ["deploy-bot", "billing-bot", "mail-bot", "ops-bot"]
        .into_iter()
        .enumerate()
    {
        agents.push((name.to_string(), cluster.token(i % 3, "agent", name).await));
    }
    let mut approvers = Vec::new();
    for (i, name) in ["alice", "bob", "carol"].into_iter().enumerate() {
        approvers.push((
            name.to_string(),
            cluster.token(i % 3, "approver", name).await,
        ));
    }
    cluster.start(3, &[]).await;
    let bases = Arc::new(
        cluster
            .servers
            .iter()
            .map(|s| s.base.clone())
            .collect::<Vec<_>>(),
    );

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (to_approvers, inbox) = mpsc::unbounded_channel();
    let inbox = Arc::new(tokio::sync::Mutex::new(inbox));
    let mut agent_tasks = Vec::new();
    for client_no in 0..12 {
        let (name, token) = agents[client_no % agents.len()].clone();
        agent_tasks.push(tokio::spawn(agent_client(
            bases.clone(),
            tally.clone(),
            stop.clone(),
            to_approvers.clone(),
            name,
            token,
            client_no,
            client_no % 3,
        )));
    }
    drop(to_approvers);
    let mut approver_tasks = Vec::new();
    for client_no in 0..6 {
        let (name, token) = approvers[client_no % approvers.len()].clone();
        approver_tasks.push(tokio::spawn(approver_client(
            bases.clone(),
            tally.clone(),
            inbox.clone(),
            name,
            token,
            client_no,
        )));
    }

    // Instance 1 crashes, is restarted on its address, crashes again and stays down,
    // each time while the clients are busy.
    let started = Instant::now();
    let mut kills = Vec::new();
    let mut created_at_kill = 0;
    for round in 0..2 {
        created_at_kill =
            until_created(&tally, created_at_kill + 50, Duration::from_secs(10)).await;
        cluster.servers[1].kill();
        kills.push(format!(
            "{} ({created_at_kill} requests)",
            ms(started.elapsed())
        ));
        if round == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.restart(1).await;
        }
    }
    let after = until_created(&tally, created_at_kill + 50, Duration::from_secs(10)).await;
    assert!(
        after > created_at_kill,
        "no request was created after the kill: the other instances do not serve"
    );
    stop.store(true, Ordering::SeqCst);
    for task in agent_tasks {
        tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .expect("an agent client hangs")
            .expect("an agent client failed");
    }
    for task in approver_tasks {
        tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .expect("an approver client hangs")
            .expect("an approver client failed");
    }
    let run_time = started.elapsed();
    let created = tally.created.lock().expect("tally").clone();
    let decided = tally.decided.lock().expect("tally").clone();
    println!(
        "kill test: instance 1 killed at {kills:?}; {} \
         requests ({} acknowledged as replays of a cut-off attempt), {} decisions ({} \
         recovered by a re-read), {} calls without answer, {} long polls resumed elsewhere, \
         {} decisions lost to another approver, {:.1} s",
        created.len(),
        created.iter().filter(|c| c.replay).count(),
        decided.len(),
        decided.iter().filter(|d| d.recovered).count(),
        tally.transport_errors.load(Ordering::SeqCst),
        tally.waits_resumed.load(Ordering::SeqCst),
        tally.lost_races.load(Ordering::SeqCst),
        run_time.as_secs_f64()
    );

    // The survivors are healthy; the dead one does not answer.
    let http = http_client();
    for (i, base) in bases.iter().enumerate() {
        let health = try_send(http.get(format!("{base}/healthz"))).await;
        if i == 1 {
            assert!(health.is_none(), "the killed instance answered: {health:?}");
        } else {
            assert_eq!(health.map(|h| h.0), Some(StatusCode::OK), "instance {i}");
        }
    }

    // Every acknowledged creation: one request per idempotency key, there to read.
    let mut by_key: BTreeMap<&str, &str> = BTreeMap::new();
    for ack in &created {
        assert!(
            by_key.insert(&ack.key, &ack.id).is_none(),
            "{} acknowledged twice",
            ack.key
        );
    }
    let (_, approver) = &approvers[0];
    let survivor = &cluster.servers[2];
    for ack in &created {
        let (status, request) = survivor
            .get(&format!("/api/v1/requests/{}", ack.id), Some(approver))
            .await;
        assert_eq!(status, StatusCode::OK, "{}: {request}", ack.id);
        assert_eq!(request["action_details"]["key"], ack.key.as_str());
    }
    let db = &cluster.db;
    assert_eq!(
        db.count("SELECT count(*) FROM requests").await,
        created.len() as i64,
        "the database holds requests no client had acknowledged, or lacks some"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM (SELECT 1 FROM requests GROUP BY requested_by, \
             idempotency_key HAVING count(*) > 1) d"
        )
        .await,
        0,
        "an idempotency key has two requests"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM requests WHERE status NOT IN ('approved', 'rejected')")
            .await,
        0,
        "a request was left undecided"
    );

    // Every acknowledged decision: recorded, once, as acknowledged.
    let mut acked_decisions: HashMap<&str, &DecisionAck> = HashMap::new();
    for ack in &decided {
        if let Some(other) = acked_decisions.insert(&ack.id, ack) {
            panic!(
                "two decisions acknowledged for {}: {other:?} and {ack:?}",
                ack.id
            );
        }
    }
    for ack in &decided {
        let (status, request) = survivor
            .get(&format!("/api/v1/requests/{}", ack.id), Some(approver))
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(request["status"], ack.verdict, "{ack:?}: {request}");
        let approvers = request["decision"]["approvers"]
            .as_array()
            .expect("approvers");
        assert_eq!(approvers.len(), 1, "{request}");
        assert_eq!(approvers[0]["display_name"], ack.approver.as_str());
        assert_eq!(request["decision"]["comment"], ack.comment.as_str());
    }
    assert_eq!(
        decided.len(),
        created.len(),
        "each request was decided by exactly one acknowledged call"
    );
    // The log: one creation and one decision entry per request, no gap.
    for (kind, expected) in [
        ("request_created", created.len()),
        ("request_decided", decided.len()),
    ] {
        let entries = db
            .count(&format!(
                "SELECT count(*) FROM events WHERE kind = '{kind}'"
            ))
            .await;
        let subjects = db
            .count(&format!(
                "SELECT count(DISTINCT subject) FROM events WHERE kind = '{kind}'"
            ))
            .await;
        assert_eq!(
            (entries, subjects),
            (expected as i64, expected as i64),
            "{kind} entries"
        );
    }
    let events = db.count("SELECT count(*) FROM events").await;
    assert_eq!(
        db.count("SELECT coalesce(max(seq), 0) FROM events").await,
        events,
        "the event sequence has a gap"
    );

    // Verified from the entries alone, through another instance's directory.
    let checkpoint = cluster.run_ok(0, &["log", "checkpoint"]).await;
    let size: i64 = checkpoint
        .lines()
        .nth(1)
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no size in the checkpoint:\n{checkpoint}"));
    assert_eq!(size, events, "the checkpoint does not cover every event");
    let verified = cluster.run(2, &["log", "verify"]).await;
    assert!(verified.ok(), "log verify:\n{verified}");
    assert!(
        verified.stdout.starts_with(&format!("{events} entries")),
        "{verified}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. MCP behind a non-sticky load balancer
// ---------------------------------------------------------------------------------------

/// A round-robin TCP proxy: each new connection goes to the next backend.
struct Proxy {
    addr: SocketAddr,
    connections: Arc<Vec<AtomicUsize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(backends: Vec<SocketAddr>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let connections: Arc<Vec<AtomicUsize>> =
            Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect());
        let counts = connections.clone();
        let task = tokio::spawn(async move {
            let mut next = 0;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let i = next % backends.len();
                next += 1;
                counts[i].fetch_add(1, Ordering::SeqCst);
                let backend = backends[i];
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Proxy {
            addr,
            connections,
            task,
        }
    }

    fn counts(&self) -> Vec<usize> {
        self.connections
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_over_http_works_behind_a_round_robin_proxy() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let mut cluster = Cluster::new(db);
    let agent = cluster.token(0, "agent", "deploy-bot").await;
    let approver = cluster.token(1, "approver", "alice").await;
    cluster
        .start(3, &[("COUNTERSIGN_OPERATOR_TOOLS", "true")])
        .await;
    // Instances 0 and 1 behind the proxy; 2 is reached directly, to decide elsewhere
    // than wherever the waiting call landed.
    let proxy = Proxy::start(vec![cluster.servers[0].addr, cluster.servers[1].addr]).await;
    let url = format!("http://{}/mcp", proxy.addr);

    let client = mcp_http(&url, &agent).await;
    let tools = tokio::time::timeout(Duration::from_secs(20), client.peer().list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    let names: BTreeSet<String> = tools.iter().map(|t| t.name.to_string()).collect();
    for tool in [
        "request_approval",
        "wait_for_approval",
        "verify_proof",
        "record_action",
    ] {
        assert!(names.contains(tool), "{tool} missing from {names:?}");
    }
    assert!(
        !names.contains("approve"),
        "an agent was offered the operator tools"
    );

    let action = json!({"description": "deploy web 2.3.1 to production",
                        "details": {"service": "web", "version": "2.3.1"}});
    let created = call(
        client.peer(),
        "request_approval",
        json!({"action_description": action["description"],
               "action_details": action["details"], "idempotency_key": "deploy-2.3.1"}),
    )
    .await
    .expect("request_approval");
    let id = created["request_id"]
        .as_str()
        .expect("request_id")
        .to_string();
    // A retry (landing on the other instance) returns the same request.
    let again = call(
        client.peer(),
        "request_approval",
        json!({"action_description": action["description"],
               "action_details": action["details"], "idempotency_key": "deploy-2.3.1"}),
    )
    .await
    .expect("request_approval again");
    assert_eq!(again["request_id"], id.as_str());
    assert_eq!(again["existing"], true);

    let waiter = {
        let peer = client.peer().clone();
        let id = id.clone();
        tokio::spawn(async move {
            let result = call(
                &peer,
                "wait_for_approval",
                json!({"request_id": id, "timeout_seconds": 30}),
            )
            .await;
            (Instant::now(), result)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "wait_for_approval returned undecided"
    );
    let (status, decided) = cluster.servers[2]
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(&approver),
            &json!({"decision": "approved", "comment": "ship it"}),
        )
        .await;
    let decided_at = Instant::now();
    assert_eq!(status, StatusCode::OK, "{decided}");
    let (woke, waited) = waiter.await.expect("waiter");
    let waited = waited.expect("wait_for_approval");
    println!(
        "MCP through the proxy: woke {} after the decision on the third instance",
        ms(woke.saturating_duration_since(decided_at))
    );
    assert!(woke.saturating_duration_since(decided_at) < WAKE_LIMIT);
    assert_eq!(waited["status"], "approved", "{waited}");
    let proof = &waited["proof"];
    assert_eq!(proof, &decided["proof"]);
    let signed = statement(proof);
    assert_eq!(signed["request_id"], id.as_str());
    assert_eq!(signed["approvers"][0]["display_name"], "alice");
    assert_eq!(signed["action"], action);

    // The proof checks out through the proxy, is used once, and is then spent, whichever
    // instance each call reaches.
    let report = call(
        client.peer(),
        "verify_proof",
        json!({"proof": proof, "action_description": action["description"],
               "action_details": action["details"]}),
    )
    .await
    .expect("verify_proof");
    assert_eq!(report["valid"], true, "{report}");
    let used = call(
        client.peer(),
        "record_action",
        json!({"request_id": id, "tool": "kubectl"}),
    )
    .await
    .expect("record_action");
    assert_eq!(used["tool"], "kubectl", "{used}");
    let spent = call(client.peer(), "verify_proof", json!({"proof": proof}))
        .await
        .expect("verify_proof");
    assert_eq!(spent["valid"], false, "{spent}");
    assert!(
        object(&spent["reasons"]).contains("already_used"),
        "{spent}"
    );
    let again = call(
        client.peer(),
        "record_action",
        json!({"request_id": id, "tool": "kubectl"}),
    )
    .await;
    assert!(
        again.as_ref().is_err_and(|e| e.starts_with("already_used")),
        "{again:?}"
    );

    // An approver in an MCP client, also through the proxy, rejects with the operator
    // tools; the agent's wait (through the proxy) sees it.
    let operator = mcp_http(&url, &approver).await;
    let second = call(
        client.peer(),
        "request_approval",
        json!({"action_description": "drop table users", "action_details": {"db": "prod"}}),
    )
    .await
    .expect("request_approval");
    let second_id = second["request_id"]
        .as_str()
        .expect("request_id")
        .to_string();
    let pending = call(operator.peer(), "list_pending_approvals", json!({}))
        .await
        .expect("list_pending_approvals");
    assert!(object(&pending).contains(&second_id), "{pending}");
    let waiter = {
        let peer = client.peer().clone();
        let id = second_id.clone();
        tokio::spawn(async move {
            call(
                &peer,
                "wait_for_approval",
                json!({"request_id": id, "timeout_seconds": 30}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    call(
        operator.peer(),
        "reject",
        json!({"request_id": second_id, "comment": "not on a Friday"}),
    )
    .await
    .expect("reject");
    let rejected = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the wait did not wake")
        .expect("waiter")
        .expect("wait_for_approval");
    assert_eq!(rejected["status"], "rejected", "{rejected}");
    assert_eq!(rejected["decision"]["approvers"][0]["channel"], "mcp");
    let _ = operator.cancel().await;
    let _ = client.cancel().await;

    let counts = proxy.counts();
    println!("MCP through the proxy: connections per instance {counts:?}");
    assert!(
        counts.iter().all(|&c| c >= 3),
        "the calls did not spread over both instances: {counts:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 4. From SQLite to PostgreSQL
// ---------------------------------------------------------------------------------------

/// The parts of a request view that must survive a move unchanged.
fn durable(request: &Value) -> Value {
    let mut kept = serde_json::Map::new();
    for key in [
        "request_id",
        "status",
        "action_description",
        "action_details",
        "action_digest",
        "requested_by",
        "requested_at",
        "expires_at",
        "requested_fields",
        "decision",
        "proof",
        "used",
        "outcome",
    ] {
        kept.insert(key.to_string(), request[key].clone());
    }
    Value::Object(kept)
}

/// The checkpoint's body: origin, size and root (what its signatures sign).
fn checkpoint_body(note: &str) -> Vec<&str> {
    note.lines().take(3).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_data_moves_a_sqlite_installation_to_postgres() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    let old_dir = tmp.path().join("sqlite");

    // An installation on SQLite: tokens, an account, requests in every state.
    let agent = common::create_token(&old_dir, "agent", "deploy-bot").await;
    let approver = common::create_token(&old_dir, "approver", "alice").await;
    let admin = common::create_token(&old_dir, "admin", "root").await;
    let mut old = Server::start(&old_dir);
    let setup = setup_token(&old).await;
    let password = "correct horse battery staple";
    let (status, body) = old
        .post(
            "/ui/accept",
            None,
            &json!({"token": setup, "username": "ops", "password": password}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let mut ids = BTreeMap::new();
    for (label, extra) in [
        ("approved", json!({"requested_fields": ["po_number"]})),
        ("rejected", json!({})),
        ("used", json!({})),
        ("cancelled", json!({})),
        ("pending", json!({"idempotency_key": "pending-1"})),
    ] {
        let mut body = json!({"action_description": format!("{label} request"),
                              "action_details": {"label": label}});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        ids.insert(label, old.create_request(&agent, &body).await);
    }
    for (label, body) in [
        (
            "approved",
            json!({"decision": "approved", "fields": {"po_number": "PO-7"}}),
        ),
        ("rejected", json!({"decision": "rejected", "comment": "no"})),
        ("used", json!({"decision": "approved"})),
    ] {
        let (status, answer) = old
            .post(
                &format!("/api/v1/requests/{}/decision", ids[label]),
                Some(&approver),
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{label}: {answer}");
    }
    let (status, body) = old
        .post(
            &format!("/api/v1/requests/{}/actions", ids["used"]),
            Some(&agent),
            &json!({"tool": "deploy"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = old
        .post(
            &format!("/api/v1/requests/{}/outcome", ids["used"]),
            Some(&agent),
            &json!({"status": "succeeded"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = old
        .post(
            &format!("/api/v1/requests/{}/cancel", ids["cancelled"]),
            Some(&agent),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut before = BTreeMap::new();
    for (label, id) in &ids {
        let (status, request) = old
            .get(&format!("/api/v1/requests/{id}"), Some(&agent))
            .await;
        assert_eq!(status, StatusCode::OK);
        before.insert(*label, request);
    }
    let (_, old_jwks) = old.get("/.well-known/jwks.json", None).await;
    // Stop the old server, then take its last checkpoint.
    old.kill();
    let old_note = common::run_ok(&old_dir, &["log", "checkpoint"]).await;

    // Move it.
    let from = format!("sqlite://{}", old_dir.join("countersign.db").display());
    let moved = common::run(
        &old_dir,
        &["migrate-data", "--from", &from, "--to", &db.url],
    )
    .await;
    assert!(moved.ok(), "migrate-data:\n{moved}");
    assert!(moved.stdout.contains("the moved log verifies"), "{moved}");
    // Into a fresh database only: a second copy is refused.
    let again = common::run(
        &old_dir,
        &["migrate-data", "--from", &from, "--to", &db.url],
    )
    .await;
    assert!(
        !again.ok(),
        "a second migrate-data into the same database:\n{again}"
    );

    // The new instance: its own data directory, a copy of the keys.
    let new_dir = tmp.path().join("postgres");
    copy_keys(&old_dir.join("keys"), &new_dir.join("keys"));
    let pg = |args: &[&str]| {
        let mut cmd = common::command(&new_dir, args);
        cmd.arg("--database").arg(&db.url);
        common::output(cmd)
    };
    let new_note = pg(&["log", "checkpoint"]).await;
    assert!(new_note.ok(), "{new_note}");
    assert_eq!(
        checkpoint_body(&new_note.stdout),
        checkpoint_body(&old_note),
        "the moved log has another root at the same size"
    );
    let migrate = pg(&["migrate"]).await;
    assert!(
        migrate.ok() && migrate.stdout.contains("up to date"),
        "{migrate}"
    );

    let mut serve = common::serve_command();
    serve
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(&new_dir)
        .env("COUNTERSIGN_DATABASE_URL", &db.url);
    let new = Server::spawn(serve);
    assert_eq!(new.get("/.well-known/jwks.json", None).await.1, old_jwks);

    // The old requests, as they were; their proofs verify against the new server.
    for (label, id) in &ids {
        let (status, request) = new
            .get(&format!("/api/v1/requests/{id}"), Some(&agent))
            .await;
        assert_eq!(status, StatusCode::OK, "{label}: {request}");
        assert_eq!(durable(&request), durable(&before[label]), "{label}");
    }
    let approved = write_json(tmp.path(), "approved.json", &before["approved"]);
    let verified = common::output({
        let mut cmd = common::bare_command();
        cmd.args(["verify", path_str(&approved), "--server", &new.base]);
        cmd
    })
    .await;
    assert!(verified.ok(), "verify --server:\n{verified}");
    let verified = pg(&["verify", path_str(&approved)]).await;
    assert!(verified.ok(), "verify against the database:\n{verified}");
    let used = write_json(tmp.path(), "used.json", &before["used"]["proof"]);
    let spent = pg(&["verify", path_str(&used)]).await;
    assert_eq!(spent.code, 1, "a used approval verified:\n{spent}");
    assert!(spent.stdout.contains("already_used"), "{spent}");

    // The tokens work: the pending request is decided, its idempotency key still holds,
    // the admin still manages tokens.
    let (status, replay) = new
        .post(
            "/api/v1/requests",
            Some(&agent),
            &json!({"action_description": "pending request",
                    "action_details": {"label": "pending"}, "idempotency_key": "pending-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["request_id"], ids["pending"].as_str());
    let (status, body) = new.decide(&ids["pending"], &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, tokens) = new.get("/api/v1/tokens", Some(&admin)).await;
    assert_eq!(status, StatusCode::OK, "{tokens}");
    assert_eq!(
        tokens["tokens"].as_array().map(Vec::len),
        Some(3),
        "{tokens}"
    );
    let fresh = new
        .create_request(
            &agent,
            &json!({"action_description": "after the move", "action_details": {}}),
        )
        .await;
    assert_eq!(
        new.decide(&fresh, &approver, "rejected").await.0,
        StatusCode::OK
    );

    // The account moved: its password signs in on the new server.
    let (status, body) = new
        .post(
            "/ui/login",
            None,
            &json!({"username": "ops", "password": password}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let users = pg(&["user", "list"]).await;
    assert!(
        users.ok()
            && users
                .stdout
                .lines()
                .any(|l| l.starts_with("ops ") && l.contains("active")),
        "{users}"
    );

    // The log grew on from the moved one: it verifies, and its new checkpoint is
    // consistent with the SQLite installation's last one.
    drop(new);
    let verified = pg(&["log", "verify"]).await;
    assert!(verified.ok(), "log verify:\n{verified}");
    let newest = pg(&["log", "checkpoint"]).await;
    assert!(newest.ok(), "{newest}");
    let old_path = tmp.path().join("old.checkpoint");
    let new_path = tmp.path().join("new.checkpoint");
    std::fs::write(&old_path, &old_note).expect("write");
    std::fs::write(&new_path, &newest.stdout).expect("write");
    let consistent = pg(&[
        "log",
        "consistency",
        path_str(&old_path),
        path_str(&new_path),
    ])
    .await;
    assert!(consistent.ok(), "log consistency:\n{consistent}");
}

/// The token of the first-admin setup link a `serve` prints just after its address.
async fn setup_token(server: &Server) -> String {
    for _ in 0..100 {
        let token = server.stderr().lines().find_map(|l| {
            l.split_once("/setup?token=")
                .map(|(_, t)| t.trim().to_string())
        });
        if let Some(token) = token {
            return token;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no setup link:\n{}", server.stderr())
}

/// Copies a keys directory as the docs say (directory 0700, files 0600).
fn copy_keys(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).expect("create keys dir");
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for entry in std::fs::read_dir(from).expect("read keys dir") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("file type").is_file() {
            let target = to.join(entry.file_name());
            std::fs::copy(entry.path(), &target).expect("copy key");
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))
                .expect("chmod");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5. The first admin, with several instances
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_setup_link_stops_working_once_the_first_admin_exists() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let mut cluster = Cluster::new(db);
    cluster.token(0, "agent", "deploy-bot").await;
    cluster.start(2, &[]).await;
    // Two instances start without an admin: one setup link between them, the other
    // says one is pending.
    let link = tokio::select! {
        link = setup_token(&cluster.servers[0]) => link,
        link = setup_token(&cluster.servers[1]) => link,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !cluster
        .servers
        .iter()
        .all(|s| s.stderr().contains("no admin account yet"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "an instance said nothing of the admin"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let printed: Vec<bool> = cluster
        .servers
        .iter()
        .map(|s| s.stderr().contains("/setup?token="))
        .collect();
    assert_eq!(
        printed.iter().filter(|p| **p).count(),
        1,
        "one setup link for both instances: {printed:?}"
    );
    assert!(cluster.servers.iter().any(|s| {
        s.stderr()
            .contains("the setup link printed earlier works until")
    }),);
    let password = "correct horse battery staple";
    let (status, body) = cluster.servers[1]
        .post(
            "/ui/accept",
            None,
            &json!({"token": link, "username": "first", "password": password}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the first admin: {body}");
    // The link worked once; on the other instance it creates no second admin.
    let (status, body) = cluster.servers[0]
        .post(
            "/ui/accept",
            None,
            &json!({"token": link, "username": "second", "password": password}),
        )
        .await;
    assert_ne!(
        status,
        StatusCode::OK,
        "a second setup link created another admin after the first: {body}"
    );
}
