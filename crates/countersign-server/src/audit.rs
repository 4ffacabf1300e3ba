//! The scheduled audit: `serve` holds the database to the log every `[audit] interval`
//! (what `countersign log verify` does, `countersign_store::audit`), keeps the last
//! result for `doctor` and the health endpoint's admin detail, and logs a mismatch as an
//! `audit_mismatch` entry, which the outbox notifies as the webhook event
//! `audit.mismatch`. A mismatch that stays the same is logged once, not every interval.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{Event, EventKind, Timestamp};
use countersign_store::{Docs, Step, collection, kinds};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::error::GateError;
use crate::gate::Gate;
use crate::ids::new_salt;

/// Differences kept in the last result (the count says how many there were).
const SHOWN: usize = 50;
/// Rows named (by table and id, never by their values) in an `audit_mismatch` entry.
const LOGGED: usize = 20;
const LAST: &str = "last";

/// The last audit's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditStatus {
    pub at: Timestamp,
    pub ok: bool,
    /// Entries replayed and rows compared.
    pub entries: u64,
    pub rows: u64,
    /// How many differences were found.
    pub differences: usize,
    /// The first of them, as `table id: what`.
    pub shown: Vec<String>,
    /// SHA-256 of every difference: an unchanged mismatch is logged once.
    pub digest: String,
}

collection!(
    /// The scheduled audit's last result (`last`).
    AuditDocs: kinds::AUDIT => AuditStatus
);

/// The last audit's result, if one ran.
pub async fn last(gate: &Gate) -> Result<Option<AuditStatus>, GateError> {
    Ok(Docs::<AuditDocs>::new(&**gate.store())
        .get(LAST)
        .await?
        .map(|d| d.body))
}

/// Runs the audit once and records its result; logs a new mismatch.
pub async fn run_once(gate: &Gate) -> Result<AuditStatus, GateError> {
    let report = countersign_store::audit::run(&**gate.store()).await?;
    let mut hasher = Sha256::new();
    for d in &report.differences {
        hasher.update(d.to_string().as_bytes());
        hasher.update(b"\n");
    }
    let digest = hex::encode(hasher.finalize());
    let now = gate.now();
    let mut tables: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &report.differences {
        *tables.entry(d.table).or_default() += 1;
    }
    let rows: Vec<String> = report
        .differences
        .iter()
        .map(|d| format!("{} {}", d.table, d.id))
        .take(LOGGED)
        .collect();
    let status = AuditStatus {
        at: now,
        ok: report.ok(),
        entries: report.entries,
        rows: report.rows,
        differences: report.differences.len(),
        shown: report
            .differences
            .iter()
            .take(SHOWN)
            .map(ToString::to_string)
            .collect(),
        digest,
    };
    let docs = Docs::<AuditDocs>::new(&**gate.store());
    let logged = docs
        .modify(LAST, now, |current| {
            let next = status.clone();
            // The same mismatch as last time: already logged.
            let same = current.is_some_and(|p| !p.body.ok && p.body.digest == next.digest);
            let event = if next.ok || same {
                None
            } else {
                let event = Event::system(
                    EventKind::AuditMismatch,
                    now,
                    None,
                    serde_json::json!({
                        "differences": next.differences,
                        "tables": tables,
                        "rows": rows,
                    }),
                );
                Some(event.seal(new_salt()?))
            };
            let logs = event.is_some();
            Ok::<_, GateError>(Step::Write {
                body: next,
                event,
                then: logs,
            })
        })
        .await?;
    if logged {
        gate.feed().poke();
        tracing::error!(
            differences = status.differences,
            "the database disagrees with the log: `countersign log verify` names each difference"
        );
    }
    Ok(status)
}

/// Runs the audit every `every`, the first time right away, until `shutdown`.
pub async fn run(gate: Arc<Gate>, every: Duration, shutdown: CancellationToken) {
    loop {
        match run_once(&gate).await {
            Ok(status) if status.ok => {
                tracing::debug!(entries = status.entries, rows = status.rows, "audit ok")
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "the scheduled audit could not run"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}
