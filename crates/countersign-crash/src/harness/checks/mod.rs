//! The checks after each restart, one file per thing that must survive a crash: the
//! acknowledged state ([`state`]), the log and its checkpoints ([`log`]), and the
//! outbox's webhooks ([`outbox`]). What they remember between restarts is [`Carry`]:
//! each restart checks what was written since the last one, plus cheap global
//! invariants, and the last one checks everything from scratch, including
//! `countersign_store::audit` (every row held to the log).

mod log;
mod outbox;
mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use countersign_core::ApprovalRequest;
use countersign_store::{RequestQuery, Store};

pub(crate) use log::check_log;
pub(crate) use outbox::check_outbox;
pub(crate) use state::check_state;

/// Holds every row to the log (what `countersign log verify` does): the full check's
/// last part.
pub(crate) async fn check_audit(store: &dyn Store) -> anyhow::Result<Vec<String>> {
    let report = countersign_store::audit::run(store).await?;
    Ok(report
        .differences
        .iter()
        .map(|d| format!("audit: {d}"))
        .collect())
}

/// What the checks carry from one restart to the next.
#[derive(Default)]
pub(crate) struct Carry {
    /// Notifiable events whose webhook has not been seen yet: seq → (type, subject,
    /// commit time in Unix milliseconds).
    pub(crate) expected: BTreeMap<u64, (&'static str, Option<String>, i64)>,
    /// From an event's time to its webhook's first arrival, in milliseconds.
    pub(crate) delays: Vec<i64>,
    /// Events whose delivery waited, at some restart, for the lease of a killed sender.
    pub(crate) leased: BTreeSet<u64>,
    /// Events up to here are in `expected` or delivered.
    planned_upto: u64,
    /// Every checkpoint note seen so far, by size: none may vanish or change.
    checkpoints: BTreeMap<u64, String>,
    /// The stored Merkle nodes are checked once per checkpoint.
    nodes_checked: BTreeSet<u64>,
    /// The entries hashed so far.
    log: log::Tracked,
    /// The requests and entries checked so far.
    pub(crate) state: state::Tracked,
    pub(crate) slowest_settle: Duration,
    pub(crate) log_entries: u64,
    pub(crate) checkpoint_count: usize,
    pub(crate) requests: usize,
}

/// Every stored request, whatever its status.
pub(crate) async fn all_requests(store: &dyn Store) -> anyhow::Result<Vec<ApprovalRequest>> {
    Ok(store
        .list_requests(&RequestQuery {
            status: None,
            requested_by: None,
            limit: 10_000_000,
        })
        .await?)
}
