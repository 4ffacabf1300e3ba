//! Figures at scale: many waiters at once, proof and log verification, start-up time and
//! idle memory, and push against the 1 s polling our peers use.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rmcp::model::CallToolRequestParams;
use serde_json::json;
use tokio::process::Command;

use crate::client::{Api, args, mcp_http, request_approval, structured};
use crate::figures::{Sample, load_average, micros};
use crate::instances::{Backend, Setup, listening_address};

// ---- process figures from /proc ----------------------------------------------------

/// Resident memory of `pid` in MiB (VmRSS), and its peak (VmHWM).
pub(crate) fn rss_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status (Linux only)"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .context("malformed")?
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU seconds (user + system) `pid` has used.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) closed by ')'.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).context("no utime")?.parse()?;
    let stime: f64 = fields.get(12).context("no stime")?.parse()?;
    // Clock ticks; 100 per second on every Linux we run on.
    Ok((utime + stime) / 100.0)
}

/// How many sockets `pid` holds (its listener, its database connections and one per
/// client connection).
pub(crate) fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Sockets the server may open or close on its own meanwhile (database connections
/// coming and going), not counted against the waiters.
const SOCKET_SLACK: usize = 64;

/// Raises this process's open-file limit to its hard limit (the servers it starts inherit
/// it): 10,000 waiters are 10,000 connections on each side.
pub(crate) fn raise_open_files(wanted: u64) -> anyhow::Result<u64> {
    rlimit::increase_nofile_limit(wanted).context("cannot raise the open-file limit")
}

// ---- many waiters ------------------------------------------------------------------

/// Runs `count` futures made by `op`, at most `parallel` at a time.
async fn bounded<F, Fut, T>(count: usize, parallel: usize, op: F) -> anyhow::Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    use futures_util::StreamExt;
    let results: Vec<anyhow::Result<T>> = futures_util::stream::iter(0..count)
        .map(op)
        .buffered(parallel)
        .collect()
        .await;
    results.into_iter().collect()
}

/// `count` agents wait at once (REST long polls, one connection each); then every request
/// is approved, 16 decisions in flight, and each wake-up is timed from its decision call
/// returning. With PostgreSQL the agents wait on instance A and the decisions are made on
/// instance B.
pub async fn waiters(bin: &Path, count: usize, database: Option<&str>) -> anyhow::Result<()> {
    let limit = raise_open_files(2 * count as u64 + 1024)?;
    if limit < count as u64 + 512 {
        bail!("the open-file limit is {limit}; {count} waiters need more (ulimit -n)");
    }
    // One token for every waiter: allow it as many waits (and connections) as there are.
    let config = format!(
        "[server]\nmax_waits_per_token = {}\nmax_connections = {}\n",
        count + 16,
        count + 4096
    );
    let (setup, label) = match database {
        None => (
            Setup::start_configured(bin, Backend::Sqlite, 1, &config).await?,
            "sqlite, one instance",
        ),
        Some(url) => (
            Setup::start_configured(bin, Backend::Postgres(url), 2, &config).await?,
            "postgres, wait on A, decide on B",
        ),
    };
    let api = Api::new(&setup)?.for_many(count)?;
    let (a, b) = (setup.base(0).to_string(), setup.base(1).to_string());
    let pid = setup.instances[0].child.id().context("no pid")?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle, _) = rss_mib(pid)?;

    let created = Instant::now();
    let ids = bounded(count, 64, |_| {
        let (api, a) = (api.clone(), a.clone());
        async move { api.create(&a).await }
    })
    .await?;
    let create_secs = created.elapsed().as_secs_f64();
    let (after_create, _) = rss_mib(pid)?;
    // The waiters get a client of their own, so that none reuses a connection left idle
    // by the creations: the server then holds exactly one new connection per waiter.
    let waiting = api.for_many(count)?;

    // Everyone waits.
    let sockets_before = sockets(pid);
    let mut tasks = Vec::with_capacity(count);
    let deadline = Instant::now() + Duration::from_secs(120);
    // Agents arrive in waves of 1,000 (as many at once as the kernel's accept queue is
    // sure to hold), each wave connected before the next.
    for wave in ids.chunks(1000) {
        for id in wave {
            let (api, a, id) = (waiting.clone(), a.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                // The longest wait the server allows: all must still be waiting when decided.
                let status = api.wait_up_to(&a, &id, 300).await?;
                anyhow::Ok((Instant::now(), status))
            }));
        }
        while sockets(pid) + SOCKET_SLACK < sockets_before + tasks.len()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Until the server holds a connection for every waiter (and a moment to park them).
    while sockets(pid) + SOCKET_SLACK < sockets_before + count {
        if let Some(done) = tasks.iter().position(|t| t.is_finished()) {
            let outcome = tasks.swap_remove(done).await?;
            bail!("waiter {done} returned before any decision: {outcome:?}");
        }
        if Instant::now() > deadline {
            bail!(
                "after 120 s the server holds {} connections, not {count}",
                sockets(pid).saturating_sub(sockets_before)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(done) = tasks.iter().position(|t| t.is_finished()) {
        bail!("waiter {done} returned before any decision");
    }
    let (rss_waiting, _) = rss_mib(pid)?;

    // Decide everything; time each wake-up from its decision call returning.
    let started = Instant::now();
    let decided = bounded(count, 16, |i| {
        let (api, b, id) = (api.clone(), b.clone(), ids[i].clone());
        async move {
            api.approve(&b, &id).await?;
            anyhow::Ok(Instant::now())
        }
    })
    .await?;
    let mut lat = Vec::with_capacity(count);
    for (task, decided_at) in tasks.into_iter().zip(decided) {
        let (woke, status) = task.await??;
        if status != "approved" {
            bail!("a waiter returned {status:?}");
        }
        lat.push(micros(woke.saturating_duration_since(decided_at)));
    }
    let all_secs = started.elapsed().as_secs_f64();
    let (_, peak) = rss_mib(pid)?;
    let sample = Sample::new(lat);
    let per_waiter_kib = (rss_waiting - after_create) * 1024.0 / count as f64;

    println!("{count} concurrent waiters ({label})");
    println!(
        "{:<44} {:>10}",
        "server RSS idle (MiB)",
        format!("{idle:.1}")
    );
    println!(
        "{:<44} {:>10}",
        format!("server RSS after {count} requests (MiB)"),
        format!("{after_create:.1}")
    );
    println!(
        "{:<44} {:>10}",
        format!("server RSS with {count} waiting (MiB)"),
        format!("{rss_waiting:.1}")
    );
    println!(
        "{:<44} {:>10}",
        "server RSS peak (MiB)",
        format!("{peak:.1}")
    );
    println!(
        "{:<44} {:>10}",
        "memory per waiter (KiB)",
        format!("{per_waiter_kib:.1}")
    );
    println!(
        "{:<44} {:>10}",
        "wake-up p50 / p99 / max (ms)",
        format!(
            "{:.2} / {:.2} / {:.2}",
            sample.pct(0.5),
            sample.pct(0.99),
            sample.max()
        )
    );
    println!(
        "{:<44} {:>10}",
        "all decided and woken in (s)",
        format!("{all_secs:.2}")
    );
    println!(
        "{:<44} {:>10}",
        "requests created in (s)",
        format!("{create_secs:.2}")
    );
    println!("load average {:.2}", load_average());
    println!(
        "{}",
        json!({
            "bench": "waiters", "backend": label, "waiters": count,
            "rss_idle_mib": idle, "rss_after_create_mib": after_create,
            "rss_waiting_mib": rss_waiting, "rss_peak_mib": peak,
            "per_waiter_kib": per_waiter_kib,
            "wake_p50_ms": sample.pct(0.5), "wake_p99_ms": sample.pct(0.99), "wake_max_ms": sample.max(),
            "all_woken_seconds": all_secs, "create_seconds": create_secs,
            "load_average": load_average(),
        })
    );
    Ok(())
}

// ---- verification ------------------------------------------------------------------

/// Proof verifications per second (one core and every core), and the time to verify a
/// log of `entries` entries with a signed checkpoint every 100,000, in this process with
/// countersign-core's verifier (the one `countersign log verify` and `verify-bundle` use).
pub fn verify(proofs: usize, entries: u64) -> anyhow::Result<()> {
    use countersign_core::proof::{VerifyOptions, verify as verify_proof};
    use countersign_core::{
        ApprovalRequest, Channel, DecisionInput, Jwks, Limits, NewRequest, Principal, Role, Signer,
        Verdict,
    };
    use std::collections::BTreeMap;

    let signer = Signer::from_seed(rand_seed()?);
    let jwks = Jwks {
        keys: vec![signer.jwk()],
    };
    let now = countersign_core::Clock::now(&countersign_core::SystemClock);
    let agent = Principal::from_token("bench-agent", Role::Agent);
    let approver = Principal::from_token("bench-approver", Role::Approver);
    let new = NewRequest {
        description: "Transfer EUR 12,450 to Globex Corp".into(),
        details: BTreeMap::from([
            ("amount".to_string(), "12450.00".to_string()),
            ("currency".to_string(), "EUR".to_string()),
            ("iban".to_string(), "DE89370400440532013000".to_string()),
        ]),
        ..NewRequest::default()
    };
    let request = ApprovalRequest::create("req_bench".into(), new, &agent, now, &Limits::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .request;
    let decided = request
        .decide(
            Verdict::Approved,
            DecisionInput::default(),
            &approver,
            Channel::Api,
            now,
            "bm9uY2Vub25jZQ".into(),
            &signer,
            &Limits::default(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let proof = decided
        .request
        .proof
        .clone()
        .context("an approval carries a proof")?;
    let action = request.action.clone();
    let options = VerifyOptions {
        now: Some(now),
        expected_action: Some(&action),
        used: None,
    };
    if !verify_proof(&proof, &jwks, &options).valid {
        bail!("the benchmark's own proof does not verify");
    }
    let started = Instant::now();
    for _ in 0..proofs {
        if !verify_proof(&proof, &jwks, &options).valid {
            bail!("a verification failed");
        }
    }
    let one_core = proofs as f64 / started.elapsed().as_secs_f64();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..proofs / threads {
                    let _ = verify_proof(&proof, &jwks, &options).valid;
                }
            });
        }
    });
    let all_cores = (proofs / threads * threads) as f64 / started.elapsed().as_secs_f64();

    // A log of realistic entries: each request created, decided, acted on and its outcome
    // recorded, with the request id, time and salted commitments varying.
    let (log, checkpoints, generated) = build_log(entries, &signer, &decided)?;
    let bytes: u64 = log.iter().map(|e| e.len() as u64).sum();
    let origin = "countersign/bench";
    let started = Instant::now();
    let report = countersign_core::logcheck::verify_log(
        log.iter().map(Vec::as_slice),
        &checkpoints,
        &jwks,
        origin,
    );
    let log_secs = started.elapsed().as_secs_f64();
    if !report.valid() {
        bail!("the generated log does not verify: {:?}", report.problems);
    }
    if report.entries != entries || report.checkpoints != checkpoints.len() {
        bail!(
            "verified {} entries, {} checkpoints",
            report.entries,
            report.checkpoints
        );
    }

    println!("verification (this process, countersign-core)");
    println!(
        "{:<52} {:>12}",
        "proof verifications per second, one core",
        format!("{one_core:.0}")
    );
    println!(
        "{:<52} {:>12}",
        format!("proof verifications per second, {threads} cores"),
        format!("{all_cores:.0}")
    );
    println!(
        "{:<52} {:>12}",
        format!(
            "log of {entries} entries ({:.0} MB), {} checkpoints (s)",
            bytes as f64 / 1e6,
            checkpoints.len()
        ),
        format!("{log_secs:.2}")
    );
    println!(
        "{:<52} {:>12}",
        "log entries verified per second",
        format!("{:.0}", entries as f64 / log_secs)
    );
    println!("(generating the log took {generated:.1} s, not counted)");
    println!(
        "{}",
        json!({
            "bench": "verify", "proofs": proofs,
            "proof_verifications_per_second_one_core": one_core,
            "proof_verifications_per_second_all_cores": all_cores, "cores": threads,
            "log_entries": entries, "log_bytes": bytes, "log_checkpoints": checkpoints.len(),
            "log_verify_seconds": log_secs,
        })
    );
    Ok(())
}

fn rand_seed() -> anyhow::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(seed)
}

/// `entries` canonical log entries, and a signed checkpoint every 100,000 and at the end.
fn build_log(
    entries: u64,
    signer: &countersign_core::Signer,
    decided: &countersign_core::Transition,
) -> anyhow::Result<(Vec<Vec<u8>>, Vec<String>, f64)> {
    use countersign_core::checkpoint::Checkpoint;
    use countersign_core::merkle::{CompactRange, leaf_hash};
    use countersign_core::{Event, EventKind, Timestamp};

    let started = Instant::now();
    let created = Event::created(&decided.request);
    let templates = [
        created,
        decided.event.clone(),
        Event::system(
            EventKind::ActionRecorded,
            decided.event.at,
            Some("token:bench-agent".into()),
            json!({"version": 3, "tool": "bank.transfer", "action_digest": decided.request.action_digest}),
        ),
        Event::system(
            EventKind::OutcomeRecorded,
            decided.event.at,
            Some("token:bench-agent".into()),
            json!({"version": 4, "status": "succeeded"}),
        ),
    ];
    let base = decided.event.at.millis();
    let mut log = Vec::with_capacity(entries as usize);
    let mut checkpoints = Vec::new();
    let mut range = CompactRange::empty();
    for i in 0..entries {
        let mut event = templates[(i % 4) as usize].clone();
        event.subject = Some(format!("req_{:024x}", i / 4));
        event.at = Timestamp::from_millis(base + i as i64).context("time out of range")?;
        if event.payload.is_none() {
            event.payload = Some(json!({"n": i}));
        }
        let mut salt = [0u8; 32];
        salt[..8].copy_from_slice(&i.to_le_bytes());
        let sealed = event.seal(salt);
        range.append(leaf_hash(&sealed.bytes));
        log.push(sealed.bytes);
        let size = i + 1;
        if size % 100_000 == 0 || size == entries {
            checkpoints.push(
                Checkpoint {
                    origin: "countersign/bench".into(),
                    size,
                    root: range.root(),
                }
                .sign(signer),
            );
        }
    }
    Ok((log, checkpoints, started.elapsed().as_secs_f64()))
}

// ---- start-up ----------------------------------------------------------------------

/// Time from spawning `serve` to its first 200 from `/healthz`, on a fresh data directory
/// (keys made, database created and migrated) and on an existing one; and its memory
/// idle after start-up.
pub async fn startup(bin: &Path, runs: usize, database: Option<&str>) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut fresh = Vec::new();
    let mut warm = Vec::new();
    let mut idle = Vec::new();
    for run in 0..runs {
        let dir = tempfile::tempdir()?;
        for (k, times) in [(0, &mut fresh), (1, &mut warm)] {
            let mut cmd = Command::new(bin);
            cmd.arg("serve")
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .args(["--listen", "127.0.0.1:0"])
                .env("COUNTERSIGN_LOG", "info")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            if let Some(url) = database {
                cmd.env("COUNTERSIGN_DATABASE_URL", url)
                    .env("COUNTERSIGN_KEYS_DIR", dir.path().join("keys"));
            }
            let started = Instant::now();
            let mut child = cmd.spawn()?;
            let base = listening_address(&mut child).await?;
            loop {
                if let Ok(r) = http.get(format!("{base}/healthz")).send().await
                    && r.status().is_success()
                {
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("no healthy /healthz within 30 s");
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            times.push(micros(started.elapsed()));
            if k == 1 && run == 0 {
                // Idle: started, healthy, nothing asked of it for two seconds.
                tokio::time::sleep(Duration::from_secs(2)).await;
                idle.push(rss_mib(child.id().context("no pid")?)?.0);
            }
            child.start_kill()?;
            child.wait().await?;
        }
    }
    let (fresh, warm) = (Sample::new(fresh), Sample::new(warm));
    let backend = if database.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    println!("start-up to a healthy /healthz, {runs} runs each ({backend}) (ms)");
    println!("{:<40} {:>8} {:>8}", "data directory", "p50", "max");
    println!(
        "{:<40} {:>8.1} {:>8.1}",
        "fresh (keys, database, migration)",
        fresh.pct(0.5),
        fresh.max()
    );
    println!(
        "{:<40} {:>8.1} {:>8.1}",
        "existing",
        warm.pct(0.5),
        warm.max()
    );
    let idle = idle.first().copied().unwrap_or(0.0);
    println!("idle memory after start-up: {idle:.1} MiB RSS");
    println!(
        "{}",
        json!({
            "bench": "startup", "backend": backend, "runs": runs,
            "fresh_p50_ms": fresh.pct(0.5), "fresh_max_ms": fresh.max(),
            "existing_p50_ms": warm.pct(0.5), "existing_max_ms": warm.max(),
            "idle_rss_mib": idle,
        })
    );
    Ok(())
}

// ---- polling against waiting ---------------------------------------------------------

/// The same workload twice over MCP Streamable HTTP: `agents` agents each ask for
/// approval `rounds` times; a person decides each request 0.5 to 3 s after it is asked.
/// Agents either poll `check_approval` every second (the best interval among our peers)
/// or call `wait_for_approval` once. Reports the delay from the decision to the agent
/// knowing, the calls agents made and the server's CPU time.
pub async fn poll(bin: &Path, agents: usize, rounds: usize) -> anyhow::Result<()> {
    let setup = Setup::start(bin, Backend::Sqlite, 1).await?;
    let api = Api::new(&setup)?;
    let base = setup.base(0).to_string();
    let pid = setup.instances[0].child.id().context("no pid")?;
    let mut rows = Vec::new();
    for mode in ["poll check_approval every 1 s", "wait_for_approval (push)"] {
        let polling = mode.starts_with("poll");
        let calls = Arc::new(AtomicU64::new(0));
        let cpu_before = cpu_seconds(pid)?;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for agent in 0..agents {
            let (api, base, calls) = (api.clone(), base.clone(), calls.clone());
            let client = mcp_http(&format!("{base}/mcp"), &setup.agent).await?;
            tasks.push(tokio::spawn(async move {
                let peer = client.peer().clone();
                let mut delays = Vec::new();
                for round in 0..rounds {
                    let id =
                        request_approval(&peer, &format!("agent {agent} step {round}")).await?;
                    // The person: decides after 0.5 to 3 s (spread evenly, no RNG).
                    let think = Duration::from_millis(
                        500 + ((agent * 7919 + round * 104_729) % 2500) as u64,
                    );
                    let decider = {
                        let (api, base, id) = (api.clone(), base.clone(), id.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(think).await;
                            api.approve(&base, &id).await?;
                            anyhow::Ok(Instant::now())
                        })
                    };
                    let knew = if polling {
                        loop {
                            calls.fetch_add(1, Ordering::Relaxed);
                            let r = peer
                                .call_tool(
                                    CallToolRequestParams::new("check_approval")
                                        .with_arguments(args(json!({"request_id": id}))),
                                )
                                .await?;
                            if structured(&r)["status"] != "pending" {
                                break Instant::now();
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    } else {
                        calls.fetch_add(1, Ordering::Relaxed);
                        let r = peer
                            .call_tool(
                                CallToolRequestParams::new("wait_for_approval").with_arguments(
                                    args(json!({"request_id": id, "timeout_seconds": 60})),
                                ),
                            )
                            .await?;
                        if structured(&r)["status"] != "approved" {
                            bail!("wait_for_approval returned {}", structured(&r));
                        }
                        Instant::now()
                    };
                    let decided = decider.await??;
                    delays.push(micros(knew.saturating_duration_since(decided)));
                }
                let _ = client.cancel().await;
                anyhow::Ok(delays)
            }));
        }
        let mut delays = Vec::new();
        for t in tasks {
            delays.extend(t.await??);
        }
        let secs = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(pid)? - cpu_before;
        let calls = calls.load(Ordering::Relaxed);
        let n = delays.len();
        rows.push((mode, Sample::new(delays), calls, n, secs, cpu));
    }
    println!(
        "polling against push: {agents} agents x {rounds} approvals each, decided 0.5-3 s after asking (MCP over HTTP, SQLite)"
    );
    println!(
        "{:<32} {:>9} {:>9} {:>9} {:>12} {:>10} {:>10}",
        "agents", "p50 ms", "p99 ms", "max ms", "calls/appr.", "calls/s", "server CPU"
    );
    let mut json_rows = Vec::new();
    for (mode, sample, calls, n, secs, cpu) in &rows {
        println!(
            "{:<32} {:>9.1} {:>9.1} {:>9.1} {:>12.2} {:>10.1} {:>9.2}s",
            mode,
            sample.pct(0.5),
            sample.pct(0.99),
            sample.max(),
            *calls as f64 / *n as f64,
            *calls as f64 / secs,
            cpu
        );
        json_rows.push(json!({
            "mode": mode, "approvals": n, "p50_ms": sample.pct(0.5), "p99_ms": sample.pct(0.99),
            "max_ms": sample.max(), "agent_calls": calls, "calls_per_approval": *calls as f64 / *n as f64,
            "calls_per_second": *calls as f64 / secs, "server_cpu_seconds": cpu, "seconds": secs,
        }));
    }
    println!("(calls: the agents' status calls only, besides one request_approval per approval)");
    println!("load average {:.2}", load_average());
    println!(
        "{}",
        json!({"bench": "poll", "agents": agents, "rounds": rounds, "results": json_rows})
    );
    Ok(())
}
