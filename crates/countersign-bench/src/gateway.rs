//! The latency the MCP gateway adds: the same tool calls of one client made directly to
//! an upstream MCP server and through the gateway in front of it, side by side in one
//! run. Over stdio, the client launches `countersign-bench upstream` itself, or
//! `countersign proxy -- countersign-bench upstream`; over Streamable HTTP, it calls the
//! upstream served with `--listen`, or `serve`'s gateway at `/mcp/gateway/bench` with
//! that upstream behind it. `echo` says it only reads, so the gateway passes it straight
//! through; `write` does not, and a Cedar policy approves it at once (a request, a
//! signed decision, the log, the claim and the outcome, all durable before the answer).
//! The rows are measured in turns of a block of calls each, so that what the machine
//! does meanwhile falls on every row alike.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, bail};
use countersign_core::evidence::OutcomeStatus;
use countersign_core::{AuthorizationType, Status};
use countersign_sqlite::SqliteStore;
use countersign_store::{RequestQuery, Store};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::client::{args, mcp_http};
use crate::figures::{Sample, load_average, micros};
use crate::instances::{Backend, Setup, listening_address};
use crate::scale::cpu_seconds;
use crate::upstream::{ECHO, WRITE, WRITTEN};

/// The upstream's name, as policies see it (`Server::"bench"`).
const UPSTREAM: &str = "bench";
/// The policy's id, which every approval of a `write` must name.
const POLICY_ID: &str = "bench-writes";
/// The gateway's policy: `write` on this upstream, through the gateway, needs no
/// person. `echo` is named by no policy, so it passes as a trusted read.
const POLICY: &str = r#"@id("bench-writes")
@reason("the benchmark's writes need no person")
permit(principal, action == Action::"write", resource == Server::"bench")
when { context.gateway };
"#;
const POLICY_FILE: &str = "gw.cedar";
/// Seconds a call may be held: a `write` the policy failed to approve fails the run
/// after this long instead of waiting for a person.
const HOLD_SECONDS: u64 = 5;

/// What `gateway` measures.
pub(crate) struct Plan {
    /// Measured calls per row.
    pub(crate) calls: usize,
    /// Calls per row before measuring.
    pub(crate) warmup: usize,
    /// Calls a row makes in its turn.
    pub(crate) block: usize,
    /// Also measure Streamable HTTP: the upstream directly, and `serve`'s gateway.
    pub(crate) http: bool,
}

/// One row: a client, the tool it calls, and what was measured.
struct Row {
    transport: &'static str,
    /// `direct` or `gateway`.
    path: &'static str,
    tool: &'static str,
    client: usize,
    /// The gateway's process, charged the CPU it spends during the row's calls.
    gateway_pid: Option<u32>,
    /// The direct row this one is compared with.
    baseline: Option<usize>,
    latencies: Vec<u64>,
    cpu_seconds: f64,
    calls_made: usize,
}

impl Row {
    fn phase(&self) -> String {
        let what = match (self.path, self.tool) {
            ("gateway", ECHO) => " (passes)",
            ("gateway", _) => " (policy)",
            _ => "",
        };
        format!("{} {} {}{what}", self.transport, self.path, self.tool)
    }

    /// The gateway's CPU per measured call, in microseconds.
    fn gateway_us(&self) -> Option<f64> {
        self.gateway_pid?;
        Some(self.cpu_seconds * 1e6 / self.latencies.len().max(1) as f64)
    }
}

/// One call of `tool`, numbered `n` (every call has arguments of its own); fails unless
/// the upstream's own answer came back.
async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &'static str,
    n: usize,
) -> anyhow::Result<()> {
    let text = format!("call {n}");
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args(json!({"text": text}))))
        .await
        .with_context(|| format!("{tool} call {n}"))?;
    let answer = first_text(&result);
    if result.is_error == Some(true) {
        bail!("{tool} call {n} answered an error: {answer}");
    }
    let expected = if tool == WRITE { WRITTEN } else { &text };
    if answer != expected {
        bail!("{tool} call {n} answered {answer:?}, not {expected:?}");
    }
    Ok(())
}

fn first_text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_default()
}

/// The data directory of a gateway, with the policy in its config.
fn data_dir(root: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join("proxy");
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    std::fs::write(
        dir.join("countersign.toml"),
        format!("[policy]\nfiles = [\"{POLICY_FILE}\"]\n"),
    )?;
    std::fs::write(dir.join(POLICY_FILE), POLICY)?;
    Ok(dir)
}

/// An MCP client over stdio of the process `cmd` starts; with its process id.
async fn stdio_client(mut cmd: Command) -> anyhow::Result<(RunningService<RoleClient, ()>, u32)> {
    cmd.env("COUNTERSIGN_LOG", "warn");
    let transport = TokioChildProcess::new(cmd)?;
    let pid = transport.id().context("no process id")?;
    Ok((().serve(transport).await?, pid))
}

/// The upstream served over Streamable HTTP; its base URL. Killed on drop.
async fn http_upstream(me: &Path) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(me)
        .args(["upstream", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let base = listening_address(&mut child).await?;
    Ok((child, base))
}

/// What the gateway's data directory holds after the run: one request per `write`,
/// each approved by the policy with a signed proof, claimed and its outcome
/// `succeeded`; and `log verify`'s verdict on it.
async fn check(bin: &Path, dir: &Path, writes: usize, who: &str) -> anyhow::Result<String> {
    let store = SqliteStore::open(&dir.join("countersign.db"))?;
    let requests = store
        .list_requests(&RequestQuery {
            limit: writes + 1_000,
            ..RequestQuery::default()
        })
        .await?;
    let good = requests
        .iter()
        .filter(|r| {
            r.status == Status::Approved
                && r.proof.is_some()
                && r.action.details.get("tool").map(String::as_str) == Some(WRITE)
                && r.action.details.get("upstream").map(String::as_str) == Some(UPSTREAM)
                && r.decision.as_ref().is_some_and(|d| {
                    d.authorization_type == AuthorizationType::Policy
                        && d.policy.as_ref().is_some_and(|p| p.id == POLICY_ID)
                })
                && r.action_record.is_some()
                && r.outcome
                    .as_ref()
                    .is_some_and(|o| o.status == OutcomeStatus::Succeeded)
        })
        .count();
    drop(store);
    if requests.len() != writes || good != writes {
        bail!(
            "{who}: {writes} writes made {} requests, {good} of them approved by {POLICY_ID} with a proof and forwarded",
            requests.len()
        );
    }
    let out = Command::new(bin)
        .arg("--data-dir")
        .arg(dir)
        .args(["log", "verify"])
        .env("COUNTERSIGN_LOG", "warn")
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "{who}: log verify failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let said = String::from_utf8_lossy(&out.stdout);
    let last = said.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    Ok(format!(
        "{who}: {writes} writes, {writes} requests approved by policy {POLICY_ID} (signed proof, claimed, outcome succeeded), echo made none; log verify: {}",
        last.trim()
    ))
}

/// The four rows of one transport: `echo` and `write`, each directly (client
/// `clients.0`) and through the gateway (client `clients.1`, process `gateway_pid`).
fn pair(
    rows: &mut Vec<Row>,
    transport: &'static str,
    clients: (usize, usize),
    gateway_pid: Option<u32>,
    calls: usize,
) {
    for tool in [ECHO, WRITE] {
        let baseline = rows.len();
        for (path, client, pid, base) in [
            ("direct", clients.0, None, None),
            ("gateway", clients.1, gateway_pid, Some(baseline)),
        ] {
            rows.push(Row {
                transport,
                path,
                tool,
                client,
                gateway_pid: pid,
                baseline: base,
                latencies: Vec::with_capacity(calls),
                cpu_seconds: 0.0,
                calls_made: 0,
            });
        }
    }
}

/// Measures the rows and prints a table, a JSON line per row, and what the gateways'
/// data directories hold afterwards.
pub(crate) async fn gateway(bin: &Path, plan: &Plan) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let root = tempfile::tempdir()?;
    let proxy_data = data_dir(root.path())?;
    let load_before = load_average();

    let mut clients = Vec::new();
    let mut rows = Vec::new();

    // stdio: the client launches the upstream, or the gateway in front of it.
    let mut upstream = Command::new(&me);
    upstream.arg("upstream");
    clients.push(stdio_client(upstream).await?.0);
    let mut proxy = Command::new(bin);
    proxy
        .arg("--data-dir")
        .arg(&proxy_data)
        .args(["proxy", "--name", UPSTREAM, "--hold"])
        .arg(HOLD_SECONDS.to_string())
        .arg("--")
        .arg(&me)
        .arg("upstream");
    let (client, proxy_pid) = stdio_client(proxy).await?;
    clients.push(client);
    pair(&mut rows, "stdio", (0, 1), Some(proxy_pid), plan.calls);

    // Streamable HTTP: the upstream served on loopback, directly and behind `serve`.
    let mut http = None;
    if plan.http {
        let (child, upstream_base) = http_upstream(&me).await?;
        let config = format!(
            "[policy]\nfiles = [\"{POLICY_FILE}\"]\n\n[[gateway]]\nname = \"{UPSTREAM}\"\nhold_seconds = {HOLD_SECONDS}\n\n[[gateway.upstream]]\nname = \"{UPSTREAM}\"\nurl = \"{upstream_base}/mcp\"\ntrusted = true\n"
        );
        let setup =
            Setup::start_with_files(bin, Backend::Sqlite, 1, &config, &[(POLICY_FILE, POLICY)])
                .await?;
        let direct = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{upstream_base}/mcp")),
        );
        clients.push(().serve(direct).await?);
        let url = format!("{}/mcp/gateway/{UPSTREAM}", setup.base(0));
        clients.push(mcp_http(&url, &setup.agent).await?);
        let serve_pid = setup.instances[0].child.id();
        pair(&mut rows, "http", (2, 3), serve_pid, plan.calls);
        http = Some((setup, child));
    }

    eprintln!(
        "gateway: {} rows, {} warm-up calls each, then {} calls each in turns of {} ...",
        rows.len(),
        plan.warmup,
        plan.calls,
        plan.block
    );
    for row in rows.iter_mut() {
        for _ in 0..plan.warmup {
            call(&clients[row.client], row.tool, row.calls_made).await?;
            row.calls_made += 1;
        }
    }
    let turns = plan.calls.div_ceil(plan.block);
    for turn in 0..turns {
        let calls = plan.block.min(plan.calls - turn * plan.block);
        // Each turn starts with the next row, so that no row always follows the same one.
        for k in 0..rows.len() {
            let i = (turn + k) % rows.len();
            let row = &mut rows[i];
            let client = &clients[row.client];
            let cpu_before = row.gateway_pid.and_then(|pid| cpu_seconds(pid).ok());
            for _ in 0..calls {
                let t = Instant::now();
                call(client, row.tool, row.calls_made).await?;
                row.latencies.push(micros(t.elapsed()));
                row.calls_made += 1;
            }
            if let (Some(pid), Some(before)) = (row.gateway_pid, cpu_before) {
                row.cpu_seconds += cpu_seconds(pid)? - before;
            }
        }
    }
    let load_after = load_average();

    // The clients close (the stdio gateway exits), then the data is checked.
    let writes = |transport: &str| {
        rows.iter()
            .find(|r| r.transport == transport && r.path == "gateway" && r.tool == WRITE)
            .map_or(0, |r| r.calls_made)
    };
    for client in clients {
        client.cancel().await?;
    }
    let mut checks = vec![check(bin, &proxy_data, writes("stdio"), "stdio gateway").await?];
    if let Some((mut setup, child)) = http {
        for instance in &mut setup.instances {
            instance.child.kill().await?;
        }
        drop(child);
        checks.push(check(bin, &setup.data_dir(0), writes("http"), "http gateway").await?);
    }

    print(&rows, plan, load_before, load_after)?;
    for line in checks {
        println!("{line}");
    }
    Ok(())
}

/// Milliseconds to the microsecond (a difference of two samples' percentiles).
fn micro(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

fn print(rows: &[Row], plan: &Plan, load_before: f64, load_after: f64) -> anyhow::Result<()> {
    println!(
        "gateway latency, one client, calls one at a time: {} calls per row (after {} warm-up calls), in turns of {}; load average {load_before:.2} before, {load_after:.2} after",
        plan.calls, plan.warmup, plan.block
    );
    println!(
        "  direct: the client talks to the upstream itself; gateway: through `countersign proxy` (stdio) or serve's /mcp/gateway/{UPSTREAM} (http); echo is read-only and passes, write is approved by a Cedar policy (signed, logged, claimed, outcome recorded); +p50/+p99: minus the direct row's; gw us/call: the gateway process's CPU"
    );
    println!(
        "{:<30} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>11}",
        "phase", "calls", "p50 ms", "p99 ms", "max ms", "+p50 ms", "+p99 ms", "gw us/call"
    );
    let samples: Vec<Sample> = rows
        .iter()
        .map(|r| Sample::new(r.latencies.clone()))
        .collect();
    let mut lines = Vec::new();
    for (row, sample) in rows.iter().zip(&samples) {
        let (p50, p99, max) = (sample.pct(0.5), sample.pct(0.99), sample.max());
        let added = row
            .baseline
            .map(|b| (p50 - samples[b].pct(0.5), p99 - samples[b].pct(0.99)));
        let cell = |v: Option<f64>, decimals: usize| {
            v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
        };
        println!(
            "{:<30} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>8} {:>8} {:>11}",
            row.phase(),
            sample.0.len(),
            p50,
            p99,
            max,
            cell(added.map(|a| a.0), 3),
            cell(added.map(|a| a.1), 3),
            cell(row.gateway_us(), 0),
        );
        lines.push(json!({
            "bench": "gateway",
            "phase": row.phase(),
            "transport": row.transport,
            "path": row.path,
            "tool": row.tool,
            "calls": sample.0.len(),
            "p50_ms": p50,
            "p99_ms": p99,
            "max_ms": max,
            "added_p50_ms": added.map(|a| micro(a.0)),
            "added_p99_ms": added.map(|a| micro(a.1)),
            "gateway_cpu_us_per_call": row.gateway_us().map(f64::round),
            "warmup": plan.warmup,
            "block": plan.block,
            "load_average_before": load_before,
            "load_average_after": load_after,
        }));
    }
    for line in lines {
        println!("{}", serde_json::to_string(&line)?);
    }
    Ok(())
}
