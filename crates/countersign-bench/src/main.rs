//! `countersign-bench`: starts real countersign processes on loopback and prints measured
//! figures as a table and as JSON.
//!
//! ```sh
//! cargo build --release -p countersign -p countersign-bench
//! target/release/countersign-bench wake --decisions 500
//! target/release/countersign-bench wake --decisions 500 --database postgres://postgres@127.0.0.1/cs_bench
//! target/release/countersign-bench throughput --clients 32 --seconds 10 --database postgres://postgres@127.0.0.1/cs_bench
//! ```
//!
//! With `--database postgres://...` the benchmarks start two `serve` instances on that
//! database, each with a data directory of its own and one shared keys directory, as
//! several instances behind a load balancer run.

mod scale;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, model::CallToolResult};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Debug, Parser)]
#[command(about = "countersign benchmarks")]
enum Bench {
    /// Wake-up latency: from the approver's decision call returning to the waiting
    /// agent's wait returning. Without --database: a REST long poll on the deciding
    /// server and a stdio MCP process waiting on the shared SQLite database. With
    /// --database: two instances on PostgreSQL, the agent waiting on instance A (REST
    /// long poll and MCP over HTTP), the decision made on instance B.
    Wake {
        /// Decisions per scenario.
        #[arg(long, default_value_t = 300)]
        decisions: usize,
        /// Run two instances on this PostgreSQL database (postgres://...) instead of one
        /// on SQLite. An empty database is best; the benchmark leaves its data there.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Throughput of full cycles: each client creates a request, waits for it (REST long
    /// poll), has it approved, sees the decision and records the action; then the same
    /// clients only create requests. One instance on SQLite, and with --database two
    /// instances on PostgreSQL, each cycle waiting on one instance and deciding on the
    /// other.
    Throughput {
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// Seconds per measurement (cycles, then creations).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Also measure instances on this PostgreSQL database (postgres://...).
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// How many instances to run on PostgreSQL (clients spread over them).
        #[arg(long, default_value_t = 2)]
        instances: usize,
        /// Skip the SQLite measurement (with --database).
        #[arg(long, requires = "database")]
        no_sqlite: bool,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Many agents waiting at once: the server's memory (RSS) and open connections with
    /// COUNT REST long polls parked, then the wake-up latency when all are decided.
    Waiters {
        /// Agents waiting at once.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Run on this PostgreSQL database (postgres://...) instead of SQLite.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Verification speed, in-process: signed proofs verified per second, and the time
    /// to verify a log of ENTRIES entries against its signed checkpoints.
    Verify {
        /// Proofs to verify.
        #[arg(long, default_value_t = 100_000)]
        proofs: usize,
        /// Log entries to build and verify.
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
    },
    /// Start-up time from spawning `countersign serve` to a served /healthz, and the
    /// idle memory after start.
    Startup {
        /// Starts to time.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Start on this PostgreSQL database (postgres://...) instead of SQLite.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Push against polling: the same workload with agents polling check_approval every
    /// second (the best peer's interval) and with agents waiting on wait_for_approval,
    /// reporting both latencies and the requests each puts on the server.
    Poll {
        /// Agents, each with one request per round.
        #[arg(long, default_value_t = 50)]
        agents: usize,
        /// Rounds per mode.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
}

fn binary(bin: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match bin {
        Some(bin) => bin,
        None => std::env::current_exe()?
            .parent()
            .context("no parent directory")?
            .join("countersign"),
    };
    if !bin.exists() {
        bail!(
            "{} not found; build it with `cargo build --release -p countersign`",
            bin.display()
        );
    }
    Ok(bin)
}

fn check_database(url: &str) -> anyhow::Result<()> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        bail!("--database must be a postgres:// URL (SQLite is what runs without it)");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Bench::parse() {
        Bench::Wake {
            decisions,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            match database {
                None => wake(&bin, decisions).await,
                Some(url) => {
                    check_database(&url)?;
                    wake_postgres(&bin, decisions, &url).await
                }
            }
        }
        Bench::Throughput {
            clients,
            seconds,
            database,
            instances,
            no_sqlite,
            bin,
        } => {
            let bin = binary(bin)?;
            if clients == 0 || seconds == 0 || instances == 0 {
                bail!("--clients, --seconds and --instances must be at least 1");
            }
            if let Some(url) = &database {
                check_database(url)?;
            }
            let plan = Plan {
                clients,
                seconds,
                sqlite: !no_sqlite,
                postgres: database.as_deref().map(|url| (url, instances)),
            };
            throughput(&bin, &plan).await
        }
        Bench::Waiters {
            count,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            if let Some(url) = &database {
                check_database(url)?;
            }
            scale::waiters(&bin, count, database.as_deref()).await
        }
        Bench::Verify { proofs, entries } => scale::verify(proofs, entries),
        Bench::Startup {
            runs,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            if let Some(url) = &database {
                check_database(url)?;
            }
            scale::startup(&bin, runs, database.as_deref()).await
        }
        Bench::Poll {
            agents,
            rounds,
            bin,
        } => {
            let bin = binary(bin)?;
            scale::poll(&bin, agents, rounds).await
        }
    }
}

/// Reads a starting `serve`'s standard error (piped) until it says where it listens, and
/// returns that base URL; the rest of its output is drained in the background.
async fn listening_address(child: &mut Child) -> anyhow::Result<String> {
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next_line()
            .await?
            .context("serve exited before listening")?;
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .context("no address")?
                .to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(base)
}

/// Where the instances keep their data.
enum Backend<'a> {
    Sqlite,
    Postgres(&'a str),
}

/// A running `countersign serve`, killed on drop.
struct Instance {
    child: Child,
    base: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Instances on one backend, with an agent and an approver token.
struct Setup {
    // Declared before `dir`: the processes stop before their directory goes.
    instances: Vec<Instance>,
    dir: tempfile::TempDir,
    backend_env: Vec<(&'static str, String)>,
    agent: String,
    approver: String,
}

impl Setup {
    /// Data directory of instance `i`.
    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("instance-{i}"))
    }

    async fn start(bin: &Path, backend: Backend<'_>, count: usize) -> anyhow::Result<Setup> {
        let dir = tempfile::tempdir()?;
        let backend_env = match backend {
            Backend::Sqlite => Vec::new(),
            Backend::Postgres(url) => vec![
                ("COUNTERSIGN_DATABASE_URL", url.to_string()),
                (
                    "COUNTERSIGN_KEYS_DIR",
                    dir.path().join("keys").display().to_string(),
                ),
            ],
        };
        let mut setup = Setup {
            instances: Vec::new(),
            dir,
            backend_env,
            agent: String::new(),
            approver: String::new(),
        };
        // The first command creates the (shared) signing key, before any instance runs.
        setup.agent = setup.token(bin, "agent", "bench-agent").await?;
        setup.approver = setup.token(bin, "approver", "bench-approver").await?;
        for i in 0..count {
            let instance = setup.serve(bin, i).await?;
            setup.instances.push(instance);
        }
        Ok(setup)
    }

    fn command(&self, bin: &Path, instance: usize) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--data-dir")
            .arg(self.data_dir(instance))
            .env("COUNTERSIGN_LOG", "warn")
            .stdin(Stdio::null());
        for (key, value) in &self.backend_env {
            cmd.env(key, value);
        }
        cmd
    }

    async fn token(&self, bin: &Path, role: &str, name: &str) -> anyhow::Result<String> {
        let out = self
            .command(bin, 0)
            .args(["token", "create", "--role", role, "--name", name])
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "token create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    async fn serve(&self, bin: &Path, i: usize) -> anyhow::Result<Instance> {
        let mut child = self
            .command(bin, i)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let base = listening_address(&mut child).await?;
        Ok(Instance { child, base })
    }

    fn base(&self, i: usize) -> &str {
        &self.instances[i % self.instances.len()].base
    }
}

/// The REST calls a cycle makes.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    agent: Arc<str>,
    approver: Arc<str>,
}

impl Api {
    fn new(setup: &Setup) -> anyhow::Result<Api> {
        Ok(Api {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()?,
            agent: setup.agent.as_str().into(),
            approver: setup.approver.as_str().into(),
        })
    }

    /// Sends `request`; the response if it succeeded, else an error naming `what`.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let resp = request.send().await?;
        if !resp.status().is_success() {
            bail!("{what} failed: {}", resp.text().await?);
        }
        Ok(resp)
    }

    async fn create(&self, base: &str) -> anyhow::Result<String> {
        let request = self
            .http
            .post(format!("{base}/api/v1/requests"))
            .bearer_auth(&*self.agent)
            .json(&json!({"action_description": "bench", "action_details": {"n": "1"}}));
        let body: Value = self.send(request, "create").await?.json().await?;
        body["request_id"]
            .as_str()
            .map(str::to_string)
            .context("no request_id")
    }

    async fn approve(&self, base: &str, id: &str) -> anyhow::Result<()> {
        let request = self
            .http
            .post(format!("{base}/api/v1/requests/{id}/decision"))
            .bearer_auth(&*self.approver)
            .json(&json!({"decision": "approved"}));
        self.send(request, "decision").await?;
        Ok(())
    }

    /// A long poll of up to `timeout_seconds`; returns the request's status.
    async fn wait_up_to(
        &self,
        base: &str,
        id: &str,
        timeout_seconds: u64,
    ) -> anyhow::Result<String> {
        let request = self
            .http
            .get(format!(
                "{base}/api/v1/requests/{id}/wait?timeout_seconds={timeout_seconds}"
            ))
            .bearer_auth(&*self.agent);
        let body: Value = self.send(request, "wait").await?.json().await?;
        Ok(body["status"].as_str().unwrap_or("").to_string())
    }

    /// A long poll of up to 30 s; returns the request's status.
    async fn wait(&self, base: &str, id: &str) -> anyhow::Result<String> {
        self.wait_up_to(base, id, 30).await
    }

    async fn record_action(&self, base: &str, id: &str) -> anyhow::Result<()> {
        let request = self
            .http
            .post(format!("{base}/api/v1/requests/{id}/actions"))
            .bearer_auth(&*self.agent)
            .json(&json!({"tool": "bench"}));
        self.send(request, "record_action").await?;
        Ok(())
    }
}

/// Latencies in microseconds, sorted.
struct Sample(Vec<u64>);

impl Sample {
    fn new(mut micros: Vec<u64>) -> Sample {
        micros.sort_unstable();
        Sample(micros)
    }
    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i] as f64 / 1000.0
    }
    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(0) as f64 / 1000.0
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

fn args(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

fn structured(result: &CallToolResult) -> &Value {
    result.structured_content.as_ref().unwrap_or(&Value::Null)
}

/// One wake-up: `wait` starts waiting, after `settle` the request is approved on
/// `decider`; returns the time from the decision call returning to the wait returning.
async fn one_wake<F>(
    api: &Api,
    decider: &str,
    id: &str,
    settle: Duration,
    wait: F,
) -> anyhow::Result<u64>
where
    F: std::future::Future<Output = anyhow::Result<String>> + Send + 'static,
{
    let waiter = tokio::spawn(async move {
        let status = wait.await?;
        anyhow::Ok((Instant::now(), status))
    });
    // Let the wait reach its server and register before deciding.
    tokio::time::sleep(settle).await;
    if waiter.is_finished() {
        bail!("the wait for {id} returned before the decision");
    }
    api.approve(decider, id).await?;
    let decided = Instant::now();
    let (woke, status) = waiter.await??;
    if status != "approved" {
        bail!("the waiter for {id} returned {status:?}");
    }
    Ok(micros(woke.saturating_duration_since(decided)))
}

async fn rest_wakes(
    api: &Api,
    waiter: &str,
    decider: &str,
    decisions: usize,
    settle: Duration,
) -> anyhow::Result<Sample> {
    let mut sample = Vec::with_capacity(decisions);
    for _ in 0..decisions {
        let id = api.create(waiter).await?;
        let wait = {
            let (api, base, id) = (api.clone(), waiter.to_string(), id.clone());
            async move { api.wait(&base, &id).await }
        };
        sample.push(one_wake(api, decider, &id, settle, wait).await?);
    }
    Ok(Sample::new(sample))
}

async fn mcp_wakes(
    api: &Api,
    peer: &Peer<RoleClient>,
    decider: &str,
    decisions: usize,
    settle: Duration,
) -> anyhow::Result<Sample> {
    let mut sample = Vec::with_capacity(decisions);
    for _ in 0..decisions {
        let created = peer
            .call_tool(
                CallToolRequestParams::new("request_approval").with_arguments(args(
                    json!({"action_description": "bench", "action_details": {"n": "1"}}),
                )),
            )
            .await?;
        let id = structured(&created)["request_id"]
            .as_str()
            .context("no request_id")?
            .to_string();
        let wait = {
            let (peer, id) = (peer.clone(), id.clone());
            async move {
                let result = peer
                    .call_tool(
                        CallToolRequestParams::new("wait_for_approval")
                            .with_arguments(args(json!({"request_id": id, "timeout_seconds": 30}))),
                    )
                    .await?;
                Ok(structured(&result)["status"]
                    .as_str()
                    .unwrap_or("")
                    .to_string())
            }
        };
        sample.push(one_wake(api, decider, &id, settle, wait).await?);
    }
    Ok(Sample::new(sample))
}

fn print_wake(title: &str, results: &[(&str, Sample)], extra: Value) -> anyhow::Result<()> {
    println!("{title}");
    println!("{:<56} {:>8} {:>8} {:>8}", "scenario", "p50", "p99", "max");
    let mut json_rows = Vec::new();
    for (name, sample) in results {
        println!(
            "{:<56} {:>8.2} {:>8.2} {:>8.2}",
            name,
            sample.pct(0.5),
            sample.pct(0.99),
            sample.max()
        );
        json_rows.push(json!({"scenario": name, "n": sample.0.len(), "p50_ms": sample.pct(0.5), "p99_ms": sample.pct(0.99), "max_ms": sample.max()}));
    }
    let load = load_average();
    println!("load average {load:.2}");
    let mut line = json!({"bench": "wake", "load_average": load, "results": json_rows});
    if let (Some(line), Some(extra)) = (line.as_object_mut(), extra.as_object()) {
        line.extend(extra.clone());
    }
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// SQLite: one `serve`, and stdio `countersign mcp` processes on its data directory.
async fn wake(bin: &Path, decisions: usize) -> anyhow::Result<()> {
    let setup = Setup::start(bin, Backend::Sqlite, 1).await?;
    let api = Api::new(&setup)?;
    let base = setup.base(0).to_string();
    let mut results = Vec::new();

    // REST long poll on the process that decides.
    let rest = rest_wakes(&api, &base, &base, decisions, Duration::from_millis(2)).await?;
    results.push(("REST long poll, same process", rest));

    // MCP over Streamable HTTP on the same `serve`.
    let client = mcp_http(&format!("{base}/mcp"), &setup.agent).await?;
    let mcp = mcp_wakes(
        &api,
        client.peer(),
        &base,
        decisions,
        Duration::from_millis(2),
    )
    .await?;
    results.push(("MCP over HTTP wait_for_approval, same process", mcp));
    let _ = client.cancel().await;

    // A stdio MCP process waiting on the shared database; the decision is made by
    // `serve`, another process.
    let mut cmd = Command::new(bin);
    cmd.arg("mcp")
        .arg("--data-dir")
        .arg(setup.data_dir(0))
        .env("COUNTERSIGN_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd)?).await?;
    let stdio = mcp_wakes(
        &api,
        client.peer(),
        &base,
        decisions,
        Duration::from_millis(5),
    )
    .await?;
    results.push(("stdio MCP wait_for_approval, other process", stdio));
    let _ = client.cancel().await;

    print_wake(
        &format!("wake-up latency, {decisions} decisions per scenario (ms)"),
        &results,
        json!({"backend": "sqlite"}),
    )
}

/// An MCP client over Streamable HTTP (rmcp's default client: a new connection per call).
async fn mcp_http(url: &str, token: &str) -> anyhow::Result<RunningService<RoleClient, ()>> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    Ok(().serve(transport).await?)
}

/// PostgreSQL: two instances; the agent waits on A, the approver decides on B.
async fn wake_postgres(bin: &Path, decisions: usize, url: &str) -> anyhow::Result<()> {
    let setup = Setup::start(bin, Backend::Postgres(url), 2).await?;
    let api = Api::new(&setup)?;
    let (a, b) = (setup.base(0).to_string(), setup.base(1).to_string());
    // Long enough for the wait to be registered on A before B decides.
    let settle = Duration::from_millis(10);
    let mut results = Vec::new();

    let same = rest_wakes(&api, &a, &a, decisions, settle).await?;
    results.push(("REST long poll on A, decision on A", same));
    let cross = rest_wakes(&api, &a, &b, decisions, settle).await?;
    results.push(("REST long poll on A, decision on B", cross));
    let client = mcp_http(&format!("{a}/mcp"), &setup.agent).await?;
    let mcp = mcp_wakes(&api, client.peer(), &b, decisions, settle).await?;
    results.push(("MCP over HTTP wait_for_approval on A, decision on B", mcp));
    let _ = client.cancel().await;

    print_wake(
        &format!(
            "wake-up latency, PostgreSQL, 2 instances, {decisions} decisions per scenario (ms)"
        ),
        &results,
        json!({"backend": "postgres", "instances": 2}),
    )
}

/// One measured phase: how many operations the clients completed, in how long, and
/// each operation's latency.
struct Phase {
    ops: usize,
    elapsed: Duration,
    latency: Sample,
    /// CPU seconds the countersign server processes used during the phase.
    server_cpu: f64,
    /// CPU seconds this process (the clients) used during the phase.
    client_cpu: f64,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Server CPU time per operation, in microseconds.
    fn server_us(&self) -> f64 {
        self.server_cpu * 1e6 / self.ops.max(1) as f64
    }

    /// Client CPU time per operation, in microseconds.
    fn client_us(&self) -> f64 {
        self.client_cpu * 1e6 / self.ops.max(1) as f64
    }
}

/// CPU seconds used so far by the server processes `pids` and by this process.
fn cpu_now(pids: &[u32]) -> (f64, f64) {
    let server = pids
        .iter()
        .map(|pid| scale::cpu_seconds(*pid).unwrap_or(0.0))
        .sum();
    let client = scale::cpu_seconds(std::process::id()).unwrap_or(0.0);
    (server, client)
}

/// Runs `phase` and charges it the CPU the servers and the clients used meanwhile.
async fn with_cpu<Fut>(pids: &[u32], phase: Fut) -> anyhow::Result<Phase>
where
    Fut: std::future::Future<Output = anyhow::Result<Phase>>,
{
    let (server0, client0) = cpu_now(pids);
    let mut phase = phase.await?;
    let (server1, client1) = cpu_now(pids);
    phase.server_cpu = server1 - server0;
    phase.client_cpu = client1 - client0;
    Ok(phase)
}

/// Runs `clients` clients for `seconds`, each repeating `op(client, iteration)`.
async fn run_clients<F, Fut>(clients: usize, seconds: u64, op: F) -> anyhow::Result<Phase>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(client, i).await?;
                latencies.push(micros(t.elapsed()));
                i += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(Phase {
        ops: all.len(),
        elapsed: start.elapsed(),
        latency: Sample::new(all),
        server_cpu: 0.0,
        client_cpu: 0.0,
    })
}

/// A full cycle: create on one instance and wait there, approve on the next instance
/// (the same one when there is only one), see the decision, record the action.
async fn cycle(api: &Api, setup_bases: &[String], client: usize, i: usize) -> anyhow::Result<()> {
    let n = setup_bases.len();
    let here = &setup_bases[(client + i) % n];
    let there = &setup_bases[(client + i + 1) % n];
    let id = api.create(here).await?;
    let waiter = {
        let (api, base, id) = (api.clone(), here.clone(), id.clone());
        tokio::spawn(async move { api.wait(&base, &id).await })
    };
    api.approve(there, &id).await?;
    let status = waiter.await??;
    if status != "approved" {
        bail!("the waiter for {id} returned {status:?}");
    }
    api.record_action(here, &id).await
}

struct Row {
    backend: &'static str,
    instances: usize,
    cycles: Phase,
    decisions: Phase,
    creates: Phase,
}

async fn measure(
    bin: &Path,
    backend: Backend<'_>,
    name: &'static str,
    instances: usize,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Row> {
    let setup = Setup::start(bin, backend, instances).await?;
    let api = Api::new(&setup)?;
    let bases: Arc<Vec<String>> =
        Arc::new(setup.instances.iter().map(|i| i.base.clone()).collect());
    let pids: Vec<u32> = setup
        .instances
        .iter()
        .filter_map(|i| i.child.id())
        .collect();
    eprintln!("{name}: {clients} clients, full cycles for {seconds} s ...");
    let cycles = {
        let (api, bases) = (api.clone(), bases.clone());
        with_cpu(
            &pids,
            run_clients(clients, seconds, move |client, i| {
                let (api, bases) = (api.clone(), bases.clone());
                async move { cycle(&api, &bases, client, i).await }
            }),
        )
        .await?
    };
    eprintln!("{name}: {clients} clients, decisions (create, approve) for {seconds} s ...");
    let decisions = {
        let (api, bases) = (api.clone(), bases.clone());
        with_cpu(
            &pids,
            run_clients(clients, seconds, move |client, i| {
                let (api, bases) = (api.clone(), bases.clone());
                async move {
                    let n = bases.len();
                    let id = api.create(&bases[(client + i) % n]).await?;
                    api.approve(&bases[(client + i + 1) % n], &id).await
                }
            }),
        )
        .await?
    };
    eprintln!("{name}: {clients} clients, creations for {seconds} s ...");
    let creates = {
        let (api, bases) = (api.clone(), bases.clone());
        with_cpu(
            &pids,
            run_clients(clients, seconds, move |client, i| {
                let (api, bases) = (api.clone(), bases.clone());
                async move {
                    api.create(&bases[(client + i) % bases.len()]).await?;
                    Ok(())
                }
            }),
        )
        .await?
    };
    drop(setup);
    Ok(Row {
        backend: name,
        instances,
        cycles,
        decisions,
        creates,
    })
}

/// What `throughput` measures.
struct Plan<'a> {
    clients: usize,
    seconds: u64,
    sqlite: bool,
    /// The database and how many instances to run on it.
    postgres: Option<(&'a str, usize)>,
}

/// The 1-minute load average, to tell a quiet machine from a busy one.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

async fn throughput(bin: &Path, plan: &Plan<'_>) -> anyhow::Result<()> {
    let (clients, seconds) = (plan.clients, plan.seconds);
    let load_before = load_average();
    let mut rows = Vec::new();
    if plan.sqlite {
        rows.push(measure(bin, Backend::Sqlite, "sqlite", 1, clients, seconds).await?);
    }
    if let Some((url, instances)) = plan.postgres {
        rows.push(
            measure(
                bin,
                Backend::Postgres(url),
                "postgres",
                instances,
                clients,
                seconds,
            )
            .await?,
        );
    }
    let load_after = load_average();
    println!(
        "throughput, {clients} clients, {seconds} s per phase; load average {load_before:.2} before, {load_after:.2} after"
    );
    println!(
        "  cycle: create, wait (REST long poll), approve, woken, record_action; decision: create, approve (signed proof, log append, durable); create: create only"
    );
    println!(
        "{:<10} {:>4} {:<9} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "backend", "inst", "phase", "per s", "p50 ms", "p99 ms", "server us/op", "client us/op"
    );
    let mut json_rows = Vec::new();
    for row in &rows {
        let mut phases = serde_json::Map::new();
        for (phase, data) in [
            ("cycle", &row.cycles),
            ("decision", &row.decisions),
            ("create", &row.creates),
        ] {
            println!(
                "{:<10} {:>4} {:<9} {:>9.0} {:>9.2} {:>9.2} {:>12.0} {:>12.0}",
                row.backend,
                row.instances,
                phase,
                data.rate(),
                data.latency.pct(0.5),
                data.latency.pct(0.99),
                data.server_us(),
                data.client_us(),
            );
            phases.insert(
                phase.to_string(),
                json!({
                    "ops": data.ops,
                    "per_s": data.rate(),
                    "p50_ms": data.latency.pct(0.5),
                    "p99_ms": data.latency.pct(0.99),
                    "server_cpu_us_per_op": data.server_us(),
                    "client_cpu_us_per_op": data.client_us(),
                }),
            );
        }
        json_rows.push(json!({
            "backend": row.backend,
            "instances": row.instances,
            "phases": phases,
        }));
    }
    println!(
        "{}",
        serde_json::to_string(&json!({
            "bench": "throughput", "clients": clients, "seconds": seconds,
            "load_average_before": load_before, "load_average_after": load_after,
            "results": json_rows,
        }))?
    );
    Ok(())
}
