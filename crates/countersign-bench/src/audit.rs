//! The audit at scale: writes a data directory of ENTRIES log entries through the store
//! API (requests created, decided and acted on, as the gate writes them, many at once so
//! that the writer batches them), integrates and signs the log, then times
//! `countersign log verify` on it: the tree recomputed, every payload opened, and every
//! row held to the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use countersign_core::{
    ApprovalRequest, Channel, Clock, DecisionInput, Limits, NewRequest, Principal, Role,
    SystemClock, Verdict,
};
use countersign_server::Gate;
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use tokio::process::Command;

/// Requests written at once: enough for the writer to batch its commits.
const IN_FLIGHT: usize = 256;
/// Each request is three entries: created, decided, acted on.
const ENTRIES_PER_REQUEST: u64 = 3;

/// Writes `entries` entries into a fresh data directory at `dir`.
async fn generate(dir: &Path, entries: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let db = dir.join("countersign.db");
    if db.exists() {
        bail!("{} already holds a database", db.display());
    }
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db)?);
    let gate = Gate::builder(store.clone(), dir.join("keys"))
        .build()
        .await
        .context("could not open the gate")?;
    let signer = gate.keys().signer();
    let requests = entries.div_ceil(ENTRIES_PER_REQUEST);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (store, signer, next) = (store.clone(), signer.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let agent = Principal::from_token("bench-agent", Role::Agent);
            let approver = Principal::from_token("bench-approver", Role::Approver);
            let limits = Limits::default();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= requests {
                    return Ok::<(), anyhow::Error>(());
                }
                let now = SystemClock.now();
                let new = NewRequest {
                    description: format!("Pay invoice INV-{n}"),
                    details: [
                        ("amount".to_string(), format!("{}.00", 100 + n % 9000)),
                        ("currency".to_string(), "EUR".to_string()),
                    ]
                    .into(),
                    ..NewRequest::default()
                };
                let created =
                    ApprovalRequest::create(format!("req_{n:032x}"), new, &agent, now, &limits)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                store.create_request(&created.seal(salt(n, 0))).await?;
                let decided = created
                    .request
                    .decide(
                        Verdict::Approved,
                        DecisionInput::default(),
                        &approver,
                        Channel::Api,
                        now,
                        format!("nonce{n}"),
                        &signer,
                        &limits,
                    )
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                store.apply(&decided.seal(salt(n, 1))).await?;
                let acted = decided
                    .request
                    .record_action(
                        "pay".into(),
                        [("ref".to_string(), format!("T-{n}"))].into(),
                        &agent,
                        now,
                        &limits,
                    )
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                store.apply(&acted.seal(salt(n, 2))).await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    let written = store.last_event_seq().await?;
    eprintln!(
        "wrote {written} entries ({requests} requests) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    gate.log().integrate().await?;
    eprintln!(
        "integrated and signed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Distinct salts without a random source per event: the benchmark's data is not secret.
fn salt(n: u64, step: u8) -> [u8; 32] {
    let mut salt = [0u8; 32];
    salt[..8].copy_from_slice(&n.to_le_bytes());
    salt[8] = step;
    salt
}

/// Generates (unless `dir` already holds a database) and times `log verify` `runs` times.
pub async fn audit(
    bin: &Path,
    entries: u64,
    dir: Option<PathBuf>,
    runs: usize,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| tmp.path().join("data"));
    if !dir.join("countersign.db").exists() {
        generate(&dir, entries).await?;
    }
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        let out = Command::new(bin)
            .arg("--data-dir")
            .arg(&dir)
            .arg("log")
            .arg("verify")
            .output()
            .await?;
        let took = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "log verify failed:\n{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprint!("{stdout}");
        times.push(took);
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "audit",
            "data_dir": dir.display().to_string(),
            "log_verify_seconds": times,
            "median_seconds": median,
        })
    );
    Ok(())
}
