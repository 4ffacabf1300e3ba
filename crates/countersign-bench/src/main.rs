//! `countersign-bench`: starts real countersign processes on loopback and prints measured
//! figures as a table and as JSON.
//!
//! ```sh
//! cargo build --release -p countersign -p countersign-bench
//! target/release/countersign-bench wake --decisions 500
//! ```

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Debug, Parser)]
#[command(about = "countersign benchmarks")]
enum Bench {
    /// Wake-up latency: from the approver's decision call returning to the waiting
    /// agent's wait returning, for a REST long poll on the deciding server and for a
    /// stdio MCP process waiting on the shared database.
    Wake {
        /// Decisions per scenario.
        #[arg(long, default_value_t = 300)]
        decisions: usize,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Bench::parse() {
        Bench::Wake { decisions, bin } => {
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
            wake(&bin, decisions).await
        }
    }
}

struct Server {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
    agent: String,
    approver: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn token(bin: &Path, dir: &Path, role: &str, name: &str) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args([
            "token",
            "create",
            "--role",
            role,
            "--name",
            name,
            "--data-dir",
        ])
        .arg(dir)
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

async fn start(bin: &Path) -> anyhow::Result<Server> {
    let dir = tempfile::tempdir()?;
    let agent = token(bin, dir.path(), "agent", "bench-agent").await?;
    let approver = token(bin, dir.path(), "approver", "bench-approver").await?;
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("COUNTERSIGN_LOG", "warn")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
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
    Ok(Server {
        child,
        base,
        dir,
        agent,
        approver,
    })
}

impl Server {
    async fn create(&self, http: &reqwest::Client) -> anyhow::Result<String> {
        let body: Value = http
            .post(format!("{}/api/v1/requests", self.base))
            .bearer_auth(&self.agent)
            .json(&json!({"action_description": "bench", "action_details": {"n": "1"}}))
            .send()
            .await?
            .json()
            .await?;
        body["request_id"]
            .as_str()
            .map(str::to_string)
            .context("no request_id")
    }

    async fn approve(&self, http: &reqwest::Client, id: &str) -> anyhow::Result<()> {
        let resp = http
            .post(format!("{}/api/v1/requests/{id}/decision", self.base))
            .bearer_auth(&self.approver)
            .json(&json!({"decision": "approved"}))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("decision failed: {}", resp.text().await?);
        }
        Ok(())
    }
}

/// Latencies in microseconds, sorted.
struct Sample(Vec<u64>);

impl Sample {
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[i] as f64 / 1000.0
    }
    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(0) as f64 / 1000.0
    }
}

async fn wake(bin: &Path, decisions: usize) -> anyhow::Result<()> {
    let server = start(bin).await?;
    let http = reqwest::Client::new();
    let mut results = Vec::new();

    // REST long poll on the process that decides.
    let mut rest = Vec::with_capacity(decisions);
    for _ in 0..decisions {
        let id = server.create(&http).await?;
        let url = format!(
            "{}/api/v1/requests/{id}/wait?timeout_seconds=30",
            server.base
        );
        let waiter = {
            let http = http.clone();
            let token = server.agent.clone();
            tokio::spawn(async move {
                let resp = http.get(url).bearer_auth(token).send().await?;
                let body = resp.bytes().await?;
                anyhow::Ok((Instant::now(), body))
            })
        };
        // Let the long poll register before deciding.
        tokio::time::sleep(Duration::from_millis(2)).await;
        server.approve(&http, &id).await?;
        let decided = Instant::now();
        let (woke, _) = waiter.await??;
        rest.push(woke.saturating_duration_since(decided).as_micros() as u64);
    }
    rest.sort_unstable();
    results.push(("REST long poll, same process", Sample(rest)));

    // A stdio MCP process waiting on the shared database; the decision is made by
    // `serve`, another process.
    let mut cmd = Command::new(bin);
    cmd.args(["mcp", "--data-dir"])
        .arg(server.dir.path())
        .env("COUNTERSIGN_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd)?).await?;
    let mut stdio = Vec::with_capacity(decisions);
    for _ in 0..decisions {
        let created = client
            .call_tool(
                CallToolRequestParams::new("request_approval").with_arguments(
                    json!({"action_description": "bench", "action_details": {"n": "1"}})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                ),
            )
            .await?;
        let id = created
            .structured_content
            .as_ref()
            .and_then(|v| v["request_id"].as_str())
            .context("no request_id")?
            .to_string();
        let peer = client.peer().clone();
        let wait_id = id.clone();
        let waiter = tokio::spawn(async move {
            let r = peer
                .call_tool(
                    CallToolRequestParams::new("wait_for_approval").with_arguments(
                        json!({"request_id": wait_id, "timeout_seconds": 30})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    ),
                )
                .await?;
            anyhow::Ok((Instant::now(), r))
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        server.approve(&http, &id).await?;
        let decided = Instant::now();
        let (woke, result) = waiter.await??;
        let status = result
            .structured_content
            .as_ref()
            .and_then(|v| v["status"].as_str())
            .unwrap_or("");
        if status != "approved" {
            bail!("the stdio waiter returned {status:?}");
        }
        stdio.push(woke.saturating_duration_since(decided).as_micros() as u64);
    }
    stdio.sort_unstable();
    results.push((
        "stdio MCP waiter, other process (poll 50 ms)",
        Sample(stdio),
    ));
    let _ = client.cancel().await;

    println!("wake-up latency, {decisions} decisions per scenario (ms)");
    println!("{:<48} {:>8} {:>8} {:>8}", "scenario", "p50", "p99", "max");
    let mut json_rows = Vec::new();
    for (name, sample) in &results {
        println!(
            "{:<48} {:>8.2} {:>8.2} {:>8.2}",
            name,
            sample.pct(0.5),
            sample.pct(0.99),
            sample.max()
        );
        json_rows.push(json!({"scenario": name, "n": sample.0.len(), "p50_ms": sample.pct(0.5), "p99_ms": sample.pct(0.99), "max_ms": sample.max()}));
    }
    println!(
        "{}",
        serde_json::to_string(&json!({"bench": "wake", "results": json_rows}))?
    );
    Ok(())
}
