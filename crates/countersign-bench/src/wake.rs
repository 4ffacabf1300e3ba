//! Wake-up latency: from the approver's decision call returning to the waiting agent's
//! wait returning, over REST long polls, MCP over HTTP and a stdio MCP process.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::process::Command;

use crate::client::{Api, args, mcp_http, request_approval, structured};
use crate::figures::{Sample, load_average, micros};
use crate::instances::{Backend, Setup};

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

/// `decisions` wake-ups of a REST long poll on `waiter`, each decided on `decider`.
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

/// `decisions` wake-ups of an MCP `wait_for_approval` through `client`, each decided on
/// `decider`; then the client is closed.
async fn mcp_wakes(
    api: &Api,
    client: RunningService<RoleClient, ()>,
    decider: &str,
    decisions: usize,
    settle: Duration,
) -> anyhow::Result<Sample> {
    let peer = client.peer();
    let mut sample = Vec::with_capacity(decisions);
    for _ in 0..decisions {
        let id = request_approval(peer, "bench").await?;
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
    let _ = client.cancel().await;
    Ok(Sample::new(sample))
}

/// Prints a table of the scenarios' latencies and the JSON line.
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
pub(crate) async fn wake(bin: &Path, decisions: usize) -> anyhow::Result<()> {
    let setup = Setup::start(bin, Backend::Sqlite, 1).await?;
    let api = Api::new(&setup)?;
    let base = setup.base(0).to_string();
    let mut results = Vec::new();

    // REST long poll on the process that decides.
    let rest = rest_wakes(&api, &base, &base, decisions, Duration::from_millis(2)).await?;
    results.push(("REST long poll, same process", rest));

    // MCP over Streamable HTTP on the same `serve`.
    let client = mcp_http(&format!("{base}/mcp"), &setup.agent).await?;
    let mcp = mcp_wakes(&api, client, &base, decisions, Duration::from_millis(2)).await?;
    results.push(("MCP over HTTP wait_for_approval, same process", mcp));

    // A stdio MCP process waiting on the shared database; the decision is made by
    // `serve`, another process.
    let mut cmd = Command::new(bin);
    cmd.arg("mcp")
        .arg("--data-dir")
        .arg(setup.data_dir(0))
        .env("COUNTERSIGN_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd)?).await?;
    let stdio = mcp_wakes(&api, client, &base, decisions, Duration::from_millis(5)).await?;
    results.push(("stdio MCP wait_for_approval, other process", stdio));

    print_wake(
        &format!("wake-up latency, {decisions} decisions per scenario (ms)"),
        &results,
        json!({"backend": "sqlite"}),
    )
}

/// PostgreSQL: two instances; the agent waits on A, the approver decides on B.
pub(crate) async fn wake_postgres(bin: &Path, decisions: usize, url: &str) -> anyhow::Result<()> {
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
    let mcp = mcp_wakes(&api, client, &b, decisions, settle).await?;
    results.push(("MCP over HTTP wait_for_approval on A, decision on B", mcp));

    print_wake(
        &format!(
            "wake-up latency, PostgreSQL, 2 instances, {decisions} decisions per scenario (ms)"
        ),
        &results,
        json!({"backend": "postgres", "instances": 2}),
    )
}
