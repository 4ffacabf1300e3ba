//! The crash loop: start the server on a data directory, run a mixed load against it,
//! crash it (SIGKILL at a random moment, or a fail point inside a commit), restart it,
//! and check that everything it acknowledged survived and that the log and the outbox
//! are whole. One data directory for the whole run, so crashes compound.
//!
//! What counts as acknowledged: an HTTP answer the client received. A request in flight
//! when the server died has an unknown fate and is checked only for consistency (at most
//! one of everything, and the log agrees with the state).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use countersign_core::logcheck::verify_log;
use countersign_core::merkle;
use countersign_core::{ApprovalRequest, Clock, EventKind, Status, SystemClock};
use countersign_server::KeyRing;
use countersign_server::notify::{Delivery, DeliveryStatus};
use countersign_sqlite::SqliteStore;
use countersign_store::{RequestQuery, Store, StoredEvent};
use serde_json::{Value, json};

use crate::server;

/// The environment variable that arms the fail points (see `countersign-sqlite`'s
/// `failpoints` module).
pub const FAILPOINT_VAR: &str = "COUNTERSIGN_TEST_FAILPOINT";
/// The fail points, in the order a write batch passes them.
pub const FAILPOINTS: [&str; 4] = ["after_begin", "after_job", "before_commit", "after_commit"];
const SECRET: &str = "whsec_Y3Jhc2gtaGFybmVzcy13ZWJob29rLXNlY3JldA==";
/// Outbox document kinds (`countersign_server::notify`).
const PENDING_DELIVERY: &str = "delivery.pending";
const DONE_DELIVERY: &str = "delivery.done";

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct Options {
    pub cycles: u64,
    pub seed: u64,
    /// The `countersign-crash` binary (its `serve` and `init` subcommands).
    pub server: PathBuf,
    /// Where the data lives; a temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    pub agents: usize,
    pub approvers: usize,
    /// Each cycle's load lasts a random time up to this.
    pub max_load: Duration,
    /// The share of cycles that arm a fail point instead of killing with SIGKILL.
    pub failpoint_share: f64,
    /// The probability a fail point fires each time a batch passes it.
    pub failpoint_probability: f64,
    /// How long after a restart a delivery that is due (not leased by a dead sender, not
    /// backing off) may take to arrive, and the log to be integrated.
    pub settle: Duration,
    /// The outbox lease (`[notify] lease_seconds`; production's default is 60 s): how
    /// long a delivery claimed by a killed server waits before another send.
    pub lease_seconds: u64,
    /// After the last cycle, wait out the leases of deliveries claimed by killed
    /// processes so that every event's webhook is seen to arrive.
    pub final_drain: bool,
    /// Print every cycle.
    pub verbose: bool,
}

impl Options {
    pub fn new(server: PathBuf) -> Self {
        Self {
            cycles: 200,
            seed: 0x00c0_ffee,
            server,
            data_dir: None,
            agents: 3,
            approvers: 3,
            max_load: Duration::from_millis(300),
            failpoint_share: 0.5,
            failpoint_probability: 0.04,
            settle: Duration::from_secs(15),
            lease_seconds: 5,
            final_drain: true,
            verbose: false,
        }
    }
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub seed: u64,
    pub cycles: u64,
    /// How each server process ended, by kind.
    pub kills: BTreeMap<String, u64>,
    pub violations: Vec<String>,
    pub acked: Acked,
    /// Operations whose answer never came (in flight when the server died).
    pub unanswered: u64,
    pub requests: usize,
    pub log_entries: u64,
    pub checkpoints: usize,
    pub webhook_events: u64,
    pub webhook_posts: u64,
    /// Posts of a webhook-id already received (at-least-once redelivery after a crash).
    pub redeliveries: u64,
    /// Posts the receiver refused on purpose, to exercise retries.
    pub refused: u64,
    /// The longest wait after a restart for due deliveries and integration.
    pub slowest_settle: Duration,
    /// Deliveries still leased by a killed sender at the end (without a final drain).
    pub undrained: usize,
    /// From an event's commit to its webhook's first arrival: p50, p99, max.
    pub delivery_delay: [Duration; 3],
    /// Deliveries that had to wait out the lease of a killed sender.
    pub lease_waits: usize,
    /// Where the time went.
    pub phases: BTreeMap<&'static str, Duration>,
    pub elapsed: Duration,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Acked {
    pub created: u64,
    pub idempotent_replays: u64,
    pub decisions: u64,
    pub lost_races: u64,
    pub cancels: u64,
    pub actions: u64,
    pub outcomes: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.acked;
        writeln!(
            f,
            "crash harness: {} cycles, {} violations, {:.1} s (seed {:#x})",
            self.cycles,
            self.violations.len(),
            self.elapsed.as_secs_f64(),
            self.seed
        )?;
        writeln!(f, "  server processes ended by:")?;
        for (kind, n) in &self.kills {
            writeln!(f, "    {n:>6}  {kind}")?;
        }
        writeln!(
            f,
            "  acknowledged: {} requests created ({} idempotent replays), {} decisions, {} races lost (already_decided), {} cancels, {} actions, {} outcomes; {} operations unanswered (in flight at a crash)",
            a.created,
            a.idempotent_replays,
            a.decisions,
            a.lost_races,
            a.cancels,
            a.actions,
            a.outcomes,
            self.unanswered
        )?;
        writeln!(
            f,
            "  at the end: {} requests, {} log entries, {} checkpoints; {} events notified by webhook, {} posts received ({} redeliveries of a webhook-id, {} refused on purpose); slowest settle after a restart {:.2} s{}",
            self.requests,
            self.log_entries,
            self.checkpoints,
            self.webhook_events,
            self.webhook_posts,
            self.redeliveries,
            self.refused,
            self.slowest_settle.as_secs_f64(),
            if self.undrained > 0 {
                format!(
                    "; {} deliveries still leased by a killed sender (not drained)",
                    self.undrained
                )
            } else {
                String::new()
            }
        )?;
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|(k, v)| format!("{k} {:.1} s", v.as_secs_f64()))
            .collect();
        writeln!(f, "  time: {}", phases.join(", "))?;
        let [p50, p99, max] = self.delivery_delay;
        writeln!(
            f,
            "  webhook delay from commit to arrival: p50 {:.3} s, p99 {:.3} s, max {:.3} s; {} deliveries waited out the lease of a killed sender",
            p50.as_secs_f64(),
            p99.as_secs_f64(),
            max.as_secs_f64(),
            self.lease_waits
        )?;
        // The first ones say what broke; a lost write is then reported at every restart.
        for v in self.violations.iter().take(100) {
            writeln!(f, "  VIOLATION: {v}")?;
        }
        if self.violations.len() > 100 {
            writeln!(
                f,
                "  ... and {} more violations",
                self.violations.len() - 100
            )?;
        }
        Ok(())
    }
}

/// splitmix64: deterministic choices from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------
// The server process

struct ServerProc {
    child: Child,
    base: String,
    lines: Arc<Mutex<Vec<String>>>,
}

enum Started {
    Up(ServerProc),
    /// It died before listening (a fail point during start-up).
    Died(Vec<String>),
}

impl ServerProc {
    async fn start(
        bin: &Path,
        data_dir: &Path,
        webhook_url: &str,
        lease_seconds: u64,
        failpoint: Option<&str>,
    ) -> anyhow::Result<Started> {
        let mut cmd = Command::new(bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("COUNTERSIGN_") {
                cmd.env_remove(key);
            }
        }
        if let Some(spec) = failpoint {
            cmd.env(FAILPOINT_VAR, spec);
        }
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--webhook-url")
            .arg(webhook_url)
            .arg("--webhook-secret")
            .arg(SECRET)
            .arg("--lease-seconds")
            .arg(lease_seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("could not start {}", bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let addr = line
                    .split_once("listening on http://")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .map(str::to_string);
                let mut kept = lock(&sink);
                if kept.len() < 200 {
                    kept.push(line);
                }
                drop(kept);
                if let Some(addr) = addr
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr);
                }
            }
        });
        let started = Instant::now();
        loop {
            if let Ok(addr) = rx.try_recv() {
                return Ok(Started::Up(ServerProc {
                    child,
                    base: format!("http://{addr}"),
                    lines,
                }));
            }
            if child.try_wait()?.is_some() {
                // Let the reader take the last lines.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Ok(Started::Died(lock(&lines).clone()));
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the server did not start within 60 s:\n{}",
                    lock(&lines).join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL, and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stderr(&self) -> Vec<String> {
        lock(&self.lines).clone()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fail point a dead server reported, if any.
fn failpoint_hit(lines: &[String]) -> Option<String> {
    lines.iter().find_map(|l| {
        l.split_once("fail point ")
            .and_then(|(_, rest)| rest.strip_suffix(" hit"))
            .map(str::to_string)
    })
}

// ---------------------------------------------------------------------------------------
// The webhook receiver

#[derive(Default)]
struct Received {
    /// webhook-id → the first body received, and how many times it came.
    by_id: HashMap<String, (Bytes, u64)>,
    /// log index → every webhook-id that carried it.
    by_index: BTreeMap<u64, BTreeSet<String>>,
    /// webhook-id → (type, request id) as its body says.
    meta: HashMap<String, (String, Option<String>)>,
    refused_once: HashSet<String>,
    /// log index → when its webhook first arrived (Unix milliseconds).
    first_at: HashMap<u64, i64>,
    posts: u64,
    redeliveries: u64,
    refused: u64,
    problems: Vec<String>,
}

type Receiver = Arc<Mutex<Received>>;

async fn receive(State(received): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let mut r = lock(&received);
    r.posts += 1;
    let expected = timestamp
        .parse::<i64>()
        .ok()
        .and_then(|ts| countersign_server::notify::webhook::signature(SECRET, &id, ts, &body).ok());
    if expected.as_deref() != Some(signature.as_str()) {
        r.problems
            .push(format!("webhook {id:?} has a bad signature {signature:?}"));
        return StatusCode::BAD_REQUEST;
    }
    if let Some((first, count)) = r.by_id.get_mut(&id) {
        *count += 1;
        let same = *first == body;
        r.redeliveries += 1;
        if !same {
            r.problems.push(format!(
                "webhook {id} was redelivered with a different body"
            ));
        }
        return StatusCode::NO_CONTENT;
    }
    // Refuse one in 40 new messages once, so retries (same id, same bytes) are exercised.
    let refuse = id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 40
        == 0;
    if refuse && r.refused_once.insert(id.clone()) {
        r.refused += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(index) = parsed["data"]["log_index"].as_u64() else {
        r.problems
            .push(format!("webhook {id} has no data.log_index: {parsed}"));
        return StatusCode::BAD_REQUEST;
    };
    let kind = parsed["type"].as_str().unwrap_or_default().to_string();
    let subject = parsed["data"]["request_id"].as_str().map(str::to_string);
    r.by_index.entry(index).or_default().insert(id.clone());
    r.first_at
        .entry(index)
        .or_insert_with(|| SystemClock.now().millis());
    r.meta.insert(id.clone(), (kind, subject));
    r.by_id.insert(id, (body, 1));
    StatusCode::NO_CONTENT
}

async fn start_receiver() -> anyhow::Result<(String, Receiver)> {
    let received: Receiver = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/hook"), received))
}

// ---------------------------------------------------------------------------------------
// What was acknowledged

#[derive(Debug, Clone)]
struct AckedDecision {
    status: String,
    approver: String,
    /// The proof as returned: `payload` and the signatures.
    proof: Value,
}

#[derive(Debug, Clone, Default)]
struct Req {
    agent: usize,
    key: String,
    digest: String,
    /// The acknowledged decision (at most one may ever be acknowledged).
    decision: Option<AckedDecision>,
    /// `already_decided` answers: (status, "name via channel").
    lost: Vec<(String, String)>,
    cancelled: bool,
    action: bool,
    outcome: Option<String>,
    /// Last known status (acknowledged or read back after a restart).
    status: String,
    used: bool,
    has_outcome: bool,
}

#[derive(Default)]
struct Ledger {
    reqs: BTreeMap<String, Req>,
    by_key: HashMap<(usize, String), String>,
    /// Creations never answered, with their bodies, to retry with the same key.
    unanswered: Vec<(usize, String, Value)>,
    pending: VecDeque<String>,
    next_key: Vec<u64>,
    acked: Acked,
    unanswered_ops: u64,
    violations: Vec<String>,
}

impl Ledger {
    fn violation(&mut self, v: String) {
        self.violations.push(v);
    }

    fn set_status(&mut self, id: &str, status: &str) {
        if let Some(r) = self.reqs.get_mut(id) {
            r.status = status.to_string();
        }
    }
}

type Shared = Arc<Mutex<Ledger>>;

/// An HTTP answer, or none (the connection died with the server).
enum Answer {
    Got(u16, Value),
    None,
}

async fn post(http: &reqwest::Client, url: String, token: &str, body: &Value) -> Answer {
    match http.post(url).bearer_auth(token).json(body).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            match resp.bytes().await {
                Ok(bytes) => Answer::Got(
                    status,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                ),
                Err(_) => Answer::None,
            }
        }
        Err(_) => Answer::None,
    }
}

struct Load {
    http: reqwest::Client,
    base: String,
    agents: Vec<String>,
    approvers: Vec<String>,
    ledger: Shared,
    stop: Arc<AtomicBool>,
}

fn digest_of(v: &Value) -> String {
    v["action_digest"].as_str().unwrap_or_default().to_string()
}

impl Load {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn agent(self: Arc<Self>, agent: usize, mut rng: Rng) {
        let token = self.agents[agent].clone();
        while !self.stop.load(Ordering::Relaxed) {
            let roll = rng.below(100);
            let alive = if roll < 55 {
                self.create(agent, &token, &mut rng).await
            } else if roll < 80 {
                self.act(agent, &token).await
            } else if roll < 92 {
                self.outcome(agent, &token).await
            } else {
                self.cancel(agent, &token, &mut rng).await
            };
            if !alive {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Creates a request (or retries an unanswered creation with its key). Returns false
    /// when the server did not answer.
    async fn create(&self, agent: usize, token: &str, rng: &mut Rng) -> bool {
        let retry = {
            let mut l = lock(&self.ledger);
            let at = l.unanswered.iter().position(|(a, _, _)| *a == agent);
            at.map(|at| l.unanswered.swap_remove(at))
        };
        let retried = retry.is_some();
        let (key, body) = match retry {
            Some((_, key, body)) => (key, body),
            None => {
                let mut l = lock(&self.ledger);
                let n = l.next_key[agent];
                l.next_key[agent] += 1;
                let key = format!("a{agent}-k{n}");
                let mut body = json!({
                    "action_description": format!("Deploy build {n} of agent {agent}"),
                    "action_details": {"build": n.to_string(), "agent": agent.to_string()},
                    "idempotency_key": key,
                });
                // Some expire almost at once, racing the expiry sweeper against deciders.
                if rng.chance(0.1) {
                    body["timeout_seconds"] = json!(1 + rng.below(2));
                }
                (key, body)
            }
        };
        let replay = rng.chance(0.05);
        let mut alive = true;
        for attempt in 0..(1 + usize::from(replay)) {
            let answer = post(&self.http, self.url("/api/v1/requests"), token, &body).await;
            let mut l = lock(&self.ledger);
            match answer {
                Answer::Got(code @ (200 | 201), v) => {
                    let id = v["request_id"].as_str().unwrap_or_default().to_string();
                    let known = l.by_key.get(&(agent, key.clone())).cloned();
                    match (code, known) {
                        (201, Some(earlier)) => l.violation(format!(
                            "agent {agent} key {key}: a second request {id} was created (the key already named {earlier})"
                        )),
                        (200, Some(earlier)) if earlier != id => l.violation(format!(
                            "agent {agent} key {key}: a retry returned {id}, the key names {earlier}"
                        )),
                        // A key never sent before cannot name an existing request.
                        (200, None) if attempt == 0 && !retried => l.violation(format!(
                            "agent {agent} key {key}: a first attempt returned an existing request {id}"
                        )),
                        _ => {}
                    }
                    if code == 201 {
                        l.acked.created += 1;
                    } else {
                        l.acked.idempotent_replays += 1;
                    }
                    if !l.reqs.contains_key(&id) {
                        l.by_key.insert((agent, key.clone()), id.clone());
                        l.reqs.insert(
                            id.clone(),
                            Req {
                                agent,
                                key: key.clone(),
                                digest: digest_of(&v),
                                status: "pending".into(),
                                ..Req::default()
                            },
                        );
                        l.pending.push_back(id);
                    }
                }
                Answer::Got(code, v) => {
                    l.violation(format!(
                        "create as agent {agent} (key {key}): unexpected HTTP {code}: {v}"
                    ));
                }
                Answer::None => {
                    l.unanswered_ops += 1;
                    l.unanswered.push((agent, key.clone(), body.clone()));
                    alive = false;
                    break;
                }
            }
        }
        alive
    }

    /// Records the action of one of this agent's approved, unused requests.
    async fn act(&self, agent: usize, token: &str) -> bool {
        let id = {
            let l = lock(&self.ledger);
            l.reqs
                .iter()
                .find(|(_, r)| r.agent == agent && r.status == "approved" && !r.used)
                .map(|(id, _)| id.clone())
        };
        let Some(id) = id else { return true };
        let body = json!({"tool": "deploy", "details": {"target": "production"}});
        let answer = post(
            &self.http,
            self.url(&format!("/api/v1/requests/{id}/actions")),
            token,
            &body,
        )
        .await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, _) => {
                l.acked.actions += 1;
                if let Some(r) = l.reqs.get_mut(&id) {
                    if r.action {
                        let v = format!("{id}: a second action was acknowledged");
                        l.violation(v);
                    } else {
                        r.action = true;
                        r.used = true;
                    }
                }
            }
            // An earlier, unanswered attempt was recorded; or, in a long run, the
            // approval's validity (15 minutes) ran out before its agent got to it.
            Answer::Got(409, v)
                if v["error"]["code"] == "already_used"
                    || v["error"]["code"] == "approval_expired" =>
            {
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.used = true;
                }
            }
            Answer::Got(code, v) => {
                l.violation(format!("action on {id}: unexpected HTTP {code}: {v}"))
            }
            Answer::None => {
                l.unanswered_ops += 1;
                // Try again later: it may or may not have been recorded.
                return false;
            }
        }
        true
    }

    async fn outcome(&self, agent: usize, token: &str) -> bool {
        let id = {
            let l = lock(&self.ledger);
            l.reqs
                .iter()
                .find(|(_, r)| r.agent == agent && r.used && !r.has_outcome)
                .map(|(id, _)| id.clone())
        };
        let Some(id) = id else { return true };
        let body = json!({"status": "succeeded", "summary": "deployed"});
        let answer = post(
            &self.http,
            self.url(&format!("/api/v1/requests/{id}/outcome")),
            token,
            &body,
        )
        .await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, _) => {
                l.acked.outcomes += 1;
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.outcome = Some("succeeded".into());
                    r.has_outcome = true;
                }
            }
            // Already recorded by an earlier, unanswered attempt.
            Answer::Got(400, v)
                if v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("already recorded")) =>
            {
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.has_outcome = true;
                }
            }
            Answer::Got(code, v) => {
                l.violation(format!("outcome of {id}: unexpected HTTP {code}: {v}"))
            }
            Answer::None => {
                l.unanswered_ops += 1;
                return false;
            }
        }
        true
    }

    async fn cancel(&self, agent: usize, token: &str, rng: &mut Rng) -> bool {
        let id = {
            let l = lock(&self.ledger);
            let mine: Vec<&String> = l
                .pending
                .iter()
                .take(16)
                .filter(|id| {
                    l.reqs
                        .get(*id)
                        .is_some_and(|r| r.agent == agent && r.status == "pending")
                })
                .collect();
            if mine.is_empty() {
                None
            } else {
                Some(mine[rng.below(mine.len() as u64) as usize].clone())
            }
        };
        let Some(id) = id else { return true };
        let answer = post(
            &self.http,
            self.url(&format!("/api/v1/requests/{id}/cancel")),
            token,
            &json!({}),
        )
        .await;
        let mut l = lock(&self.ledger);
        match answer {
            Answer::Got(200, v) => {
                l.acked.cancels += 1;
                if v["status"] != "cancelled" {
                    l.violation(format!(
                        "cancel of {id} answered 200 with status {}",
                        v["status"]
                    ));
                }
                if let Some(r) = l.reqs.get_mut(&id) {
                    r.cancelled = true;
                    r.status = "cancelled".into();
                }
            }
            Answer::Got(409, v) => lost_race(&mut l, &id, &v),
            Answer::Got(code, v) => {
                l.violation(format!("cancel of {id}: unexpected HTTP {code}: {v}"))
            }
            Answer::None => {
                l.unanswered_ops += 1;
                return false;
            }
        }
        true
    }

    async fn approver(self: Arc<Self>, approver: usize, mut rng: Rng) {
        let token = self.approvers[approver].clone();
        while !self.stop.load(Ordering::Relaxed) {
            // Among the oldest few pending requests, so approvers collide often.
            let id = {
                let mut l = lock(&self.ledger);
                while let Some(front) = l.pending.front() {
                    if l.reqs.get(front).is_some_and(|r| r.status == "pending") {
                        break;
                    }
                    l.pending.pop_front();
                }
                let open: Vec<String> = l
                    .pending
                    .iter()
                    .filter(|id| l.reqs.get(*id).is_some_and(|r| r.status == "pending"))
                    .take(4)
                    .cloned()
                    .collect();
                if open.is_empty() {
                    None
                } else {
                    Some(open[rng.below(open.len() as u64) as usize].clone())
                }
            };
            let Some(id) = id else {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            };
            let verdict = if rng.chance(0.6) {
                "approved"
            } else {
                "rejected"
            };
            let answer = post(
                &self.http,
                self.url(&format!("/api/v1/requests/{id}/decision")),
                &token,
                &json!({"decision": verdict, "comment": format!("by approver {approver}")}),
            )
            .await;
            if self.record_decision(approver, verdict, &id, answer) {
                continue;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Books a decision's answer; false when there was none.
    fn record_decision(&self, approver: usize, verdict: &str, id: &str, answer: Answer) -> bool {
        let mut l = lock(&self.ledger);
        {
            match answer {
                Answer::Got(200, v) => {
                    l.acked.decisions += 1;
                    let decision = AckedDecision {
                        status: v["status"].as_str().unwrap_or_default().to_string(),
                        approver: v["decision"]["approvers"][0]["id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        proof: v["proof"].clone(),
                    };
                    if decision.status != verdict
                        || decision.approver != format!("token:approver-{approver}")
                    {
                        l.violation(format!(
                            "{id}: decided {verdict} as approver-{approver}, answered {} by {}",
                            decision.status, decision.approver
                        ));
                    }
                    if let Some(r) = l.reqs.get_mut(id) {
                        if let Some(earlier) = &r.decision {
                            let v = format!(
                                "{id}: two decisions acknowledged: {} by {} and {} by {}",
                                earlier.status,
                                earlier.approver,
                                decision.status,
                                decision.approver
                            );
                            l.violation(v);
                        } else {
                            r.status = decision.status.clone();
                            r.decision = Some(decision);
                        }
                    }
                }
                Answer::Got(409, v) => lost_race(&mut l, id, &v),
                Answer::Got(code, v) => {
                    l.violation(format!("decision on {id}: unexpected HTTP {code}: {v}"));
                }
                Answer::None => {
                    l.unanswered_ops += 1;
                    return false;
                }
            }
        }
        true
    }
}

/// A 409 for a decision or cancellation: someone else closed the request first. That
/// answer is itself an acknowledgement of the winner's write.
fn lost_race(l: &mut Ledger, id: &str, v: &Value) {
    let code = v["error"]["code"].as_str().unwrap_or_default();
    let message = v["error"]["message"].as_str().unwrap_or_default();
    match code {
        "already_decided" => {
            l.acked.lost_races += 1;
            // "request ID is already STATUS (by NAME via CHANNEL at TIME)"
            let status = message
                .split(" is already ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_default()
                .to_string();
            let by = message
                .split("(by ")
                .nth(1)
                .and_then(|rest| rest.split(" at ").next())
                .unwrap_or_default()
                .to_string();
            if let Some(r) = l.reqs.get_mut(id) {
                r.status = status.clone();
                r.lost.push((status, by));
            }
        }
        "expired" => l.set_status(id, "timed_out"),
        _ => l.violation(format!("{id}: unexpected conflict {v}")),
    }
}

// ---------------------------------------------------------------------------------------
// The checks

/// What the checks carry from one restart to the next.
#[derive(Default)]
struct Carry {
    /// Notifiable events whose webhook has not been seen yet: seq → (type, subject,
    /// commit time in Unix milliseconds).
    expected: BTreeMap<u64, (&'static str, Option<String>, i64)>,
    /// From an event's time to its webhook's first arrival, in milliseconds.
    delays: Vec<i64>,
    /// Events whose delivery waited, at some restart, for the lease of a killed sender.
    leased: BTreeSet<u64>,
    /// Events up to here are in `expected` or delivered.
    planned_upto: u64,
    /// Every checkpoint note seen so far, by size: none may vanish or change.
    checkpoints: BTreeMap<u64, String>,
    /// The stored Merkle nodes are checked once per checkpoint.
    nodes_checked: BTreeSet<u64>,
    slowest_settle: Duration,
    log_entries: u64,
    checkpoint_count: usize,
    requests: usize,
}

fn webhook_type(kind: EventKind) -> Option<&'static str> {
    Some(match kind {
        EventKind::RequestCreated => "request.created",
        EventKind::RequestDecided => "request.decided",
        EventKind::RequestTimedOut => "request.timed_out",
        EventKind::RequestCancelled => "request.cancelled",
        EventKind::ActionRecorded => "action.recorded",
        EventKind::OutcomeRecorded => "outcome.recorded",
        _ => return None,
    })
}

fn delivery_id(seq: u64) -> String {
    format!("{seq:012}.webhook.{}", server::WEBHOOK)
}

async fn all_events(store: &dyn Store) -> anyhow::Result<Vec<StoredEvent>> {
    let mut events = Vec::new();
    loop {
        let after = events.last().map_or(0, |e: &StoredEvent| e.seq);
        let page = store.events_after(after, 10_000).await?;
        if page.is_empty() {
            return Ok(events);
        }
        events.extend(page);
    }
}

/// Checks the state the restarted server sees against what was acknowledged, and
/// refreshes what the load knows (unanswered writes may have landed).
async fn check_state(
    store: &dyn Store,
    ledger: &Shared,
    events: &[StoredEvent],
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let stored: HashMap<String, ApprovalRequest> = store
        .list_requests(&RequestQuery {
            status: None,
            requested_by: None,
            limit: 10_000_000,
        })
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();

    // Per request, the events of each kind.
    let mut by_subject: HashMap<&str, Vec<&StoredEvent>> = HashMap::new();
    for (n, e) in events.iter().enumerate() {
        if e.seq != n as u64 + 1 {
            violations.push(format!(
                "the event sequence has a gap: event {} at position {}",
                e.seq,
                n + 1
            ));
        }
        if let Some(s) = &e.entry.subject {
            by_subject.entry(s).or_default().push(e);
        }
    }

    // The log agrees with the state: one creation each, at most one way it closed, one
    // action and one outcome at most, each matching the request.
    let mut keys: HashMap<(String, String), Vec<&str>> = HashMap::new();
    for (id, r) in &stored {
        if let Some(key) = &r.idempotency_key {
            keys.entry((r.requested_by.id.clone(), key.clone()))
                .or_default()
                .push(id);
        }
        let evs = by_subject
            .get(id.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let count = |k: EventKind| evs.iter().filter(|e| e.entry.kind == k).count();
        let created = count(EventKind::RequestCreated);
        let decided: Vec<&&StoredEvent> = evs
            .iter()
            .filter(|e| e.entry.kind == EventKind::RequestDecided)
            .collect();
        let timed_out = count(EventKind::RequestTimedOut);
        let cancelled = count(EventKind::RequestCancelled);
        let actions = count(EventKind::ActionRecorded);
        let outcomes = count(EventKind::OutcomeRecorded);
        if created != 1 {
            violations.push(format!("{id}: {created} request_created entries"));
        }
        if decided.len() > 1 {
            violations.push(format!(
                "{id}: {} request_decided entries (two decisions)",
                decided.len()
            ));
        }
        if decided.len() + timed_out + cancelled > 1 {
            violations.push(format!(
                "{id}: closed more than once: {} decided, {timed_out} timed out, {cancelled} cancelled",
                decided.len()
            ));
        }
        let closing_ok = match r.status {
            Status::Approved | Status::Rejected => decided.len() == 1,
            Status::TimedOut => timed_out == 1,
            Status::Cancelled => cancelled == 1,
            Status::Pending => decided.is_empty() && timed_out == 0 && cancelled == 0,
        };
        if !closing_ok {
            violations.push(format!(
                "{id}: status {} but the log has {} decided, {timed_out} timed out, {cancelled} cancelled",
                r.status,
                decided.len()
            ));
        }
        if let (Some(d), Some(e)) = (&r.decision, decided.first()) {
            let first = d.approvers.first().map(|a| a.id.as_str());
            if e.entry.actor.as_deref() != first
                || e.entry.data.get("decision").and_then(Value::as_str) != Some(d.decision.as_str())
            {
                violations.push(format!(
                    "{id}: the state says {} by {first:?}, the log says {:?} by {:?}",
                    d.decision.as_str(),
                    e.entry.data.get("decision"),
                    e.entry.actor
                ));
            }
        }
        if actions != usize::from(r.action_record.is_some()) || actions > 1 {
            violations.push(format!(
                "{id}: {actions} action entries, action recorded: {}",
                r.action_record.is_some()
            ));
        }
        if outcomes != usize::from(r.outcome.is_some()) || outcomes > 1 {
            violations.push(format!(
                "{id}: {outcomes} outcome entries, outcome recorded: {}",
                r.outcome.is_some()
            ));
        }
    }
    for ((who, key), ids) in &keys {
        if ids.len() > 1 {
            violations.push(format!("{who} key {key}: {} requests {ids:?}", ids.len()));
        }
    }
    for subject in by_subject.keys() {
        if subject.starts_with("req_") && !stored.contains_key(*subject) {
            violations.push(format!(
                "{subject}: log entries for a request that is not stored"
            ));
        }
    }

    // Everything acknowledged is there, unchanged.
    let mut l = lock(ledger);
    let ids: Vec<String> = l.reqs.keys().cloned().collect();
    for id in ids {
        let Some(r) = l.reqs.get(&id).cloned() else {
            continue;
        };
        let Some(s) = stored.get(&id) else {
            violations.push(format!(
                "{id} (agent {} key {}): acknowledged as created, missing after the restart",
                r.agent, r.key
            ));
            continue;
        };
        if s.action_digest.to_string() != r.digest
            || s.requested_by.id != format!("token:agent-{}", r.agent)
            || s.idempotency_key.as_deref() != Some(r.key.as_str())
        {
            violations.push(format!(
                "{id}: stored as {} by {} key {:?}, acknowledged as {} by agent-{} key {}",
                s.action_digest, s.requested_by.id, s.idempotency_key, r.digest, r.agent, r.key
            ));
        }
        if let Some(acked) = &r.decision {
            match &s.decision {
                None => violations.push(format!(
                    "{id}: acknowledged {} by {}, but the request is {} with no decision after the restart",
                    acked.status, acked.approver, s.status
                )),
                Some(d) => {
                    let approver = d.approvers.first().map(|a| a.id.clone()).unwrap_or_default();
                    if s.status.as_str() != acked.status || approver != acked.approver {
                        violations.push(format!(
                            "{id}: acknowledged {} by {}, stored {} by {approver}",
                            acked.status, acked.approver, s.status
                        ));
                    }
                    let same_proof = s.proof.as_ref().is_some_and(|p| {
                        Value::String(p.payload.clone()) == acked.proof["payload"]
                            && p.signatures.len() == acked.proof["signatures"].as_array().map_or(0, Vec::len)
                            && p.signatures.iter().zip(acked.proof["signatures"].as_array().into_iter().flatten()).all(
                                |(a, b)| Value::String(a.sig.clone()) == b["sig"] && Value::String(a.keyid.clone()) == b["keyid"],
                            )
                    });
                    if !same_proof {
                        violations.push(format!("{id}: the stored proof differs from the acknowledged one"));
                    }
                }
            }
        }
        for (status, by) in &r.lost {
            let winner = s
                .decision
                .as_ref()
                .and_then(|d| d.approvers.first())
                .map(|a| format!("{} via {}", a.display_name, a.channel.as_str()));
            if s.status.as_str() != status
                || (!by.is_empty() && winner.as_deref() != Some(by.as_str()))
            {
                violations.push(format!(
                    "{id}: a loser was told it is already {status} (by {by}); stored {} by {winner:?}",
                    s.status
                ));
            }
        }
        if r.cancelled && s.status != Status::Cancelled {
            violations.push(format!(
                "{id}: cancellation acknowledged, stored {}",
                s.status
            ));
        }
        if r.action && s.action_record.is_none() {
            violations.push(format!("{id}: action acknowledged, none stored"));
        }
        if r.outcome.is_some() && s.outcome.is_none() {
            violations.push(format!("{id}: outcome acknowledged, none stored"));
        }
        // What the load works from next: the stored truth.
        if let Some(entry) = l.reqs.get_mut(&id) {
            entry.status = s.status.as_str().to_string();
            entry.used = s.action_record.is_some();
            entry.has_outcome = s.outcome.is_some();
        }
    }
    drop(l);
    Ok(violations)
}

/// Recomputes the log from its entries against every stored checkpoint, checks the
/// stored tree, and that no checkpoint seen before vanished or changed.
async fn check_log(
    store: &dyn Store,
    data_dir: &Path,
    events: &[StoredEvent],
    carry: &mut Carry,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let keys = KeyRing::open_existing(&server::keys_dir(data_dir))?;
    let jwks = countersign_server::keyring::published_jwks(store, &keys).await?;
    let origin = store.log_origin("").await?;
    let checkpoints = store.checkpoints().await?;
    let notes: Vec<String> = checkpoints.iter().map(|c| c.note.clone()).collect();
    let report = verify_log(
        events.iter().map(|e| e.bytes.as_slice()),
        &notes,
        &jwks,
        &origin,
    );
    violations.extend(report.problems.iter().map(|p| format!("log: {p}")));
    let now: BTreeMap<u64, &str> = checkpoints
        .iter()
        .map(|c| (c.size, c.note.as_str()))
        .collect();
    for (size, note) in &carry.checkpoints {
        match now.get(size) {
            Some(n) if n == note => {}
            Some(_) => violations.push(format!(
                "the checkpoint of size {size} changed across a restart"
            )),
            None => violations.push(format!(
                "the checkpoint of size {size} vanished across a restart"
            )),
        }
    }
    for c in &checkpoints {
        carry.checkpoints.insert(c.size, c.note.clone());
        if c.size <= report.entries && carry.nodes_checked.insert(c.size) {
            let nodes = store.log_nodes(&merkle::root_nodes(c.size)).await?;
            let root = merkle::root(c.size, &mut |id| nodes.get(&id).copied()).ok();
            if root.is_none() || root.as_ref() != report.roots.get(&c.size) {
                violations.push(format!(
                    "the stored Merkle nodes of size {} do not match the entries",
                    c.size
                ));
            }
        }
    }
    carry.log_entries = report.entries;
    carry.checkpoint_count = checkpoints.len();
    Ok(violations)
}

/// Pending deliveries by id.
async fn pending_deliveries(store: &dyn Store) -> anyhow::Result<HashMap<String, Delivery>> {
    Ok(store
        .doc_list(PENDING_DELIVERY, "", 100_000)
        .await?
        .into_iter()
        .filter_map(|d| serde_json::from_value::<Delivery>(d.body).ok())
        .map(|d| (d.id.clone(), d))
        .collect())
}

/// After a restart: waits (up to `settle`) for the log to be integrated up to where it
/// stood at the restart, and for every notifiable event's webhook, except deliveries a
/// killed sender still holds a lease on or that back off after a refusal (carried to
/// the next check). Reports what did not arrive in time, and webhooks that disagree
/// with the log or came under two ids.
async fn check_outbox(
    store: &dyn Store,
    events: &[StoredEvent],
    received: &Receiver,
    carry: &mut Carry,
    outbox_from: u64,
    settle: Duration,
    drain: bool,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.seq > carry.planned_upto.max(outbox_from))
    {
        if let Some(t) = webhook_type(e.entry.kind) {
            carry
                .expected
                .insert(e.seq, (t, e.entry.subject.clone(), e.entry.at.millis()));
        }
    }
    let last = events.last().map_or(0, |e| e.seq);
    carry.planned_upto = carry.planned_upto.max(last);
    let clock = SystemClock;
    let started = Instant::now();
    let mut deadline = started + settle;
    loop {
        // Arrived: check each against its event.
        {
            let r = lock(received);
            let delays = &mut carry.delays;
            carry.expected.retain(|seq, (kind, subject, at)| {
                let Some(ids) = r.by_index.get(&(seq - 1)) else {
                    return true;
                };
                if let Some(arrived) = r.first_at.get(&(seq - 1)) {
                    delays.push(arrived - *at);
                }
                for id in ids {
                    if let Some((k, s)) = r.meta.get(id)
                        && (k != kind || s != subject)
                    {
                        violations.push(format!(
                            "webhook {id} for log index {} says {k} {s:?}; the entry is {kind} {subject:?}",
                            seq - 1
                        ));
                    }
                }
                false
            });
        }
        let integrated = store.checkpoint(None).await?.map_or(0, |c| c.size);
        if carry.expected.is_empty() && integrated >= last {
            break;
        }
        let pending = pending_deliveries(store).await?;
        let now = clock.now();
        let excused = |seq: &u64| {
            pending.get(&delivery_id(*seq)).and_then(|d| {
                let until = d.lease_until.into_iter().chain([d.next_at]).max()?;
                (until > now).then_some(until)
            })
        };
        let due: Vec<u64> = carry
            .expected
            .keys()
            .filter(|s| excused(s).is_none())
            .copied()
            .collect();
        for seq in carry.expected.keys() {
            if pending
                .get(&delivery_id(*seq))
                .and_then(|d| d.lease_until)
                .is_some_and(|until| until > now)
            {
                carry.leased.insert(*seq);
            }
        }
        if drain && due.is_empty() {
            // Wait out the leases too.
            let latest = carry.expected.keys().filter_map(excused).max();
            if let Some(until) = latest {
                let wait = now.millis_until(until).max(0) as u64;
                deadline = deadline.max(Instant::now() + Duration::from_millis(wait) + settle);
            }
        }
        if (due.is_empty() && !drain && integrated >= last) || Instant::now() >= deadline {
            if integrated < last {
                violations.push(format!(
                    "the log was not integrated up to {last} entries within {settle:?} of the restart (checkpoint at {integrated})"
                ));
            }
            for seq in due {
                let (kind, subject, _) = carry.expected.remove(&seq).unwrap_or(("?", None, 0));
                let done = store.doc_get(DONE_DELIVERY, &delivery_id(seq)).await?;
                let state = match done.and_then(|d| serde_json::from_value::<Delivery>(d.body).ok())
                {
                    Some(d) if d.status == DeliveryStatus::Failed => {
                        format!("given up after {} attempts: {:?}", d.attempts, d.last_error)
                    }
                    Some(d) => format!("recorded as {:?} but never received", d.status),
                    None => match pending.get(&delivery_id(seq)) {
                        Some(d) => format!(
                            "pending, {} attempts, last error {:?}",
                            d.attempts, d.last_error
                        ),
                        None => "never planned".into(),
                    },
                };
                violations.push(format!(
                    "event {seq} ({kind} {subject:?}): no webhook within {settle:?} of the restart ({state})"
                ));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    carry.slowest_settle = carry.slowest_settle.max(started.elapsed());
    // Exactly one webhook-id per event (receivers deduplicate by id, so two ids would
    // be two notifications), and none for an event that does not exist.
    let end = store.last_event_seq().await?;
    let r = lock(received);
    for (index, ids) in &r.by_index {
        if ids.len() > 1 {
            violations.push(format!(
                "log index {index} was notified under {} webhook-ids: {ids:?}",
                ids.len()
            ));
        }
        if *index >= end {
            violations.push(format!(
                "a webhook for log index {index}, beyond the {end} entries"
            ));
        }
    }
    violations.extend(r.problems.iter().cloned());
    drop(r);
    lock(received).problems.clear();
    Ok(violations)
}

// ---------------------------------------------------------------------------------------
// The loop

/// How a cycle ends its server.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// SIGKILL this many milliseconds into the cycle (possibly after the load ended).
    Kill(u64),
    /// Arm a fail point; SIGKILL at the end of the window if it never fired.
    FailPoint(&'static str),
}

pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let data_dir = options
        .data_dir
        .clone()
        .unwrap_or_else(|| tmp.path().join("data"));
    if server::db_path(&data_dir).exists() {
        bail!(
            "{} already holds a database; the harness starts from an empty data directory",
            data_dir.display()
        );
    }
    let (webhook_url, received) = start_receiver().await?;

    // Tokens and the outbox cursor.
    let out = tokio::process::Command::new(&options.server)
        .arg("init")
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--agents")
        .arg(options.agents.to_string())
        .arg("--approvers")
        .arg(options.approvers.to_string())
        .arg("--webhook-url")
        .arg(&webhook_url)
        .arg("--webhook-secret")
        .arg(SECRET)
        .env_remove(FAILPOINT_VAR)
        .output()
        .await?;
    if !out.status.success() {
        bail!("init failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let init: Value = serde_json::from_slice(&out.stdout)?;
    let token = |name: String| {
        init["tokens"][&name]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let agents: Vec<String> = (0..options.agents)
        .map(|n| token(format!("agent-{n}")))
        .collect();
    let approvers: Vec<String> = (0..options.approvers)
        .map(|n| token(format!("approver-{n}")))
        .collect();
    let outbox_from = init["outbox_from_seq"].as_u64().unwrap_or(0);

    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()?;
    let ledger: Shared = Arc::new(Mutex::new(Ledger {
        next_key: vec![0; options.agents],
        ..Ledger::default()
    }));
    let mut rng = Rng::new(options.seed);
    let mut report = Report {
        seed: options.seed,
        ..Report::default()
    };
    let mut carry = Carry::default();
    let mut current: Option<ServerProc> = None;
    let mut violations: Vec<String> = Vec::new();

    for cycle in 1..=options.cycles {
        let load_ms = 20 + rng.below(options.max_load.as_millis() as u64);
        let crash = if rng.chance(options.failpoint_share) {
            Crash::FailPoint(FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize])
        } else {
            Crash::Kill(rng.below(load_ms + 150))
        };
        // The server for this cycle: the one that passed the last checks, or a fresh one
        // with a fail point armed.
        let mut kind = String::new();
        let phase = Instant::now();
        let server = match (crash, current.take()) {
            (Crash::Kill(_), Some(s)) => Some(s),
            (_, previous) => {
                if let Some(mut s) = previous {
                    s.kill();
                    *report
                        .kills
                        .entry("SIGKILL, idle (before an armed restart)".into())
                        .or_default() += 1;
                }
                let spec = match crash {
                    Crash::FailPoint(name) => {
                        Some(format!("{name}:{}", options.failpoint_probability))
                    }
                    Crash::Kill(_) => None,
                };
                match ServerProc::start(
                    &options.server,
                    &data_dir,
                    &webhook_url,
                    options.lease_seconds,
                    spec.as_deref(),
                )
                .await?
                {
                    Started::Up(s) => Some(s),
                    Started::Died(lines) => {
                        kind = match failpoint_hit(&lines) {
                            Some(point) => format!("fail point {point}, during start-up"),
                            None => {
                                violations.push(format!(
                                    "cycle {cycle}: the server died starting:\n{}",
                                    lines.join("\n")
                                ));
                                "died starting (no fail point)".into()
                            }
                        };
                        None
                    }
                }
            }
        };

        *report.phases.entry("starting servers").or_default() += phase.elapsed();
        let phase = Instant::now();
        if let Some(mut server) = server {
            let stop = Arc::new(AtomicBool::new(false));
            let load = Arc::new(Load {
                http: http.clone(),
                base: server.base.clone(),
                agents: agents.clone(),
                approvers: approvers.clone(),
                ledger: ledger.clone(),
                stop: stop.clone(),
            });
            let mut tasks = Vec::new();
            for a in 0..options.agents {
                tasks.push(tokio::spawn(
                    load.clone().agent(a, Rng::new(rng.next_u64())),
                ));
            }
            for p in 0..options.approvers {
                tasks.push(tokio::spawn(
                    load.clone().approver(p, Rng::new(rng.next_u64())),
                ));
            }
            let t0 = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let ms = t0.elapsed().as_millis() as u64;
                if ms >= load_ms {
                    stop.store(true, Ordering::Relaxed);
                }
                if server.exited() {
                    stop.store(true, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let lines = server.stderr();
                    kind = match failpoint_hit(&lines) {
                        Some(point) => format!("fail point {point}"),
                        None => {
                            violations.push(format!(
                                "cycle {cycle}: the server exited on its own:\n{}",
                                lines.join("\n")
                            ));
                            "exited on its own".into()
                        }
                    };
                    break;
                }
                match crash {
                    Crash::Kill(at) if ms >= at => {
                        server.kill();
                        kind = if ms < load_ms {
                            "SIGKILL during the load".into()
                        } else {
                            "SIGKILL after the load (outbox and log catching up)".into()
                        };
                        break;
                    }
                    Crash::FailPoint(point) if ms >= load_ms + 150 => {
                        server.kill();
                        kind = format!("SIGKILL (fail point {point} armed, never hit)");
                        break;
                    }
                    _ => {}
                }
            }
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                let _ = t.await;
            }
        }
        *report.kills.entry(kind.clone()).or_default() += 1;

        *report.phases.entry("load and crash").or_default() += phase.elapsed();
        // Restart, clean, and check.
        let phase = Instant::now();
        let server = match ServerProc::start(
            &options.server,
            &data_dir,
            &webhook_url,
            options.lease_seconds,
            None,
        )
        .await?
        {
            Started::Up(s) => s,
            Started::Died(lines) => {
                violations.push(format!(
                    "cycle {cycle}: the server did not restart after {kind}:\n{}",
                    lines.join("\n")
                ));
                report.cycles = cycle;
                break;
            }
        };
        *report.phases.entry("starting servers").or_default() += phase.elapsed();
        let phase = Instant::now();
        let before = violations.len();
        let store = SqliteStore::open(&server::db_path(&data_dir))?;
        let events = all_events(&store).await?;
        violations.extend(
            check_state(&store, &ledger, &events)
                .await?
                .into_iter()
                .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        *report.phases.entry("checking").or_default() += phase.elapsed();
        let phase = Instant::now();
        let last_cycle = cycle == options.cycles;
        violations.extend(
            check_outbox(
                &store,
                &events,
                &received,
                &mut carry,
                outbox_from,
                options.settle,
                last_cycle && options.final_drain,
            )
            .await?
            .into_iter()
            .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        *report
            .phases
            .entry("waiting for deliveries and integration")
            .or_default() += phase.elapsed();
        let phase = Instant::now();
        // The log as it stands now, integrated.
        let events = all_events(&store).await?;
        violations.extend(
            check_log(&store, &data_dir, &events, &mut carry)
                .await?
                .into_iter()
                .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        carry.requests = store
            .list_requests(&RequestQuery {
                status: None,
                requested_by: None,
                limit: 10_000_000,
            })
            .await?
            .len();
        drop(store);
        *report.phases.entry("checking").or_default() += phase.elapsed();
        {
            let mut l = lock(&ledger);
            violations.extend(
                l.violations
                    .drain(..)
                    .map(|v| format!("cycle {cycle} ({kind}), during the load: {v}")),
            );
        }
        if options.verbose || violations.len() > before {
            let l = lock(&ledger);
            eprintln!(
                "cycle {cycle}: {kind}; {} requests, {} log entries, {} webhooks outstanding, {} new violations",
                l.reqs.len(),
                carry.log_entries,
                carry.expected.len(),
                violations.len() - before
            );
            for v in &violations[before..] {
                eprintln!("  {v}");
            }
        }
        report.cycles = cycle;
        current = Some(server);
    }
    if let Some(mut s) = current.take() {
        s.kill();
    }

    let l = lock(&ledger);
    report.acked = l.acked;
    report.unanswered = l.unanswered_ops;
    drop(l);
    let r = lock(&received);
    report.webhook_events = r.by_index.len() as u64;
    report.webhook_posts = r.posts;
    report.redeliveries = r.redeliveries;
    report.refused = r.refused;
    drop(r);
    report.requests = carry.requests;
    report.log_entries = carry.log_entries;
    report.checkpoints = carry.checkpoint_count;
    report.slowest_settle = carry.slowest_settle;
    report.undrained = carry.expected.len();
    let mut delays = carry.delays.clone();
    delays.sort_unstable();
    let at = |q: f64| {
        let i = ((delays.len() as f64 - 1.0) * q).round() as usize;
        Duration::from_millis(delays.get(i).copied().unwrap_or(0).max(0) as u64)
    };
    report.delivery_delay = [at(0.5), at(0.99), at(1.0)];
    report.lease_waits = carry.leased.len();
    report.violations = violations;
    report.elapsed = started.elapsed();
    Ok(report)
}
