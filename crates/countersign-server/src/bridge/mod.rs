//! Bridges: the approval gate for long-running processes that speak no MCP and call no
//! API, on approval-gate-mcp's file contract (docs/bridge.md). A process writes
//! proposals to `pending.json`; each becomes a request, decided like any other (policies,
//! grants, people on the dashboard, Slack, email, the CLI); an approved proposal is moved
//! to `approved.json`, which the process reads and clears on its next cycle; a rejected
//! one is removed. `records.json`, the process's own record of what it did, gives the
//! outcomes.
//!
//! The order of a delivery is the seed's, with countersign's claim in the middle:
//! remove the proposal from `pending.json`, claim the approval (`record_action`: durable,
//! single-use), append it to `approved.json`. A crash before the claim delivers it after
//! the restart (the claim was never made, so it was never written); a crash after the
//! claim drops it (the file may or may not have been written, and writing it again could
//! act twice). Never twice.
//!
//! The file contract is `files.rs`; how the bridge reaches the gate is `asks.rs`. The
//! seed's operator tools over it are beside them: `proposals.rs` (the numbered listing
//! and decisions by number) and `records.rs` (the record summary and dashboard), served
//! by the approval-gate profile (`mcp/approval_gate.rs`), `countersign records` and the
//! dashboard.

pub mod asks;
pub mod files;
mod mapping;
pub mod proposals;
pub mod records;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use asks::{BridgeAsks, LocalAsks, Proposed, principal, transient};
use files::{FileError, IfEmpty, Paths, Proposal, Stamp};
pub use mapping::new_request;
use mapping::{outcome_of, same_proposal};

/// The detail that holds the proposal's exact JSON text (what is delivered).
pub const PROPOSAL_DETAIL: &str = "proposal";
/// The detail that names the bridge.
pub const BRIDGE_DETAIL: &str = "bridge";

/// How often the files are looked at for changes.
const POLL: Duration = Duration::from_millis(200);
/// A full pass this often even when nothing seems to have changed (an expiry, a change
/// the file's timestamp did not show).
const FULL_EVERY: Duration = Duration::from_secs(5);
/// How long a pass waits for a cooperating process to release the lock.
const LOCK_PATIENCE: Duration = Duration::from_secs(5);
/// The fewest time between two passes woken by the gate's change feed.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// One `[[bridge]]`: a process's files, and what its requests are made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// 1 to 64 of `a-z 0-9 - _`; the principal is `bridge:<name>`.
    pub name: String,
    pub paths: Paths,
    /// How long a proposal waits for a decision (default: the server's, 24 hours).
    pub timeout: Option<Duration>,
}

/// What the bridge knows of one proposal it has seen.
#[derive(Debug, Clone)]
struct Tracked {
    request_id: String,
    /// The proposal as it was asked for (what an approval delivers).
    raw: String,
    /// The process's own id, which its records carry.
    id: Option<String>,
    /// The request's last known status.
    status: String,
    /// The approval was claimed for its delivery (by this bridge, before or after a
    /// restart).
    claimed: bool,
    has_outcome: bool,
    /// In `pending.json` at the last read.
    in_pending: bool,
    /// This bridge removed it from `pending.json` after its decision.
    removed: bool,
    /// Its content changed under the same key, and that was said.
    told_changed: bool,
}

impl Tracked {
    fn from_view(view: &crate::views::ApprovalView) -> Option<(String, Self)> {
        let raw = view.action_details.get(PROPOSAL_DETAIL)?;
        let proposal = Proposal::parse(raw)?;
        Some((
            proposal.key.clone(),
            Self {
                request_id: view.request_id.clone(),
                raw: raw.clone(),
                id: proposal.id(),
                status: view.status.clone(),
                claimed: view.used.is_some(),
                has_outcome: view.outcome.is_some(),
                in_pending: false,
                removed: false,
                told_changed: false,
            },
        ))
    }

    fn closed(&self) -> bool {
        self.status != "pending"
    }
}

/// What a pass asks of the loop.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Wait for the next change.
    Wait,
    /// A file changed under a write, or the lock was busy: pass again soon.
    Again,
}

/// One bridge at work: watches the files, asks, delivers, records.
pub struct Bridge {
    config: BridgeConfig,
    asks: Arc<dyn BridgeAsks>,
    tracked: HashMap<String, Tracked>,
    /// Claimed and not yet written to `approved.json` (retried until written; lost only
    /// with the process, which then drops them rather than risk writing them twice).
    undelivered: Vec<String>,
    /// Proposals the gate refused to take (too large, invalid): not asked again while
    /// their content stays the same.
    refused: HashMap<String, String>,
    /// The last problem said per kind, so that a file that stays broken is reported once.
    said: HashMap<&'static str, String>,
    loaded: bool,
}

impl Bridge {
    pub fn new(config: BridgeConfig, asks: Arc<dyn BridgeAsks>) -> Self {
        Self {
            config,
            asks,
            tracked: HashMap::new(),
            undelivered: Vec::new(),
            refused: HashMap::new(),
            said: HashMap::new(),
            loaded: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Runs until `shutdown`: a pass whenever a file changes, a request of the gate
    /// changes, or [`FULL_EVERY`] passes.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(bridge = %self.config.name, pending = %self.config.paths.pending.display(), "bridge watching");
        let mut stamps: Option<[Stamp; 3]> = None;
        let mut woke = true;
        let mut again = false;
        let mut last_pass: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let current = self.stamps();
            let due = again
                || stamps.as_ref() != Some(&current)
                || last_pass.is_none_or(|t| now.duration_since(t) >= FULL_EVERY)
                || (woke && last_pass.is_none_or(|t| now.duration_since(t) >= DEBOUNCE));
            if due {
                stamps = Some(current);
                last_pass = Some(now);
                woke = false;
                again = self.pass().await == Next::Again;
            }
            let wait = if again {
                Duration::from_millis(20)
            } else {
                POLL
            };
            // Only the requests still waiting for a decision: the rest of what a pass
            // does follows the files, which are looked at every POLL.
            let waiting: HashSet<&str> = self
                .tracked
                .values()
                .filter(|t| !t.closed())
                .map(|t| t.request_id.as_str())
                .collect();
            let concerns = |id: &str| waiting.contains(id);
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = self.asks.changed(wait, &concerns) => woke |= changed,
            }
        }
    }

    fn stamps(&self) -> [Stamp; 3] {
        let p = &self.config.paths;
        [
            files::stamp(&p.pending),
            files::stamp(&p.approved),
            files::stamp(&p.records),
        ]
    }

    /// Says `message` about `kind` (a warning), once while it stays the same.
    fn report(&mut self, kind: &'static str, message: String) {
        if self.said.get(kind) != Some(&message) {
            tracing::warn!(bridge = %self.config.name, "{message}");
            self.said.insert(kind, message);
        }
    }

    fn clear(&mut self, kind: &'static str) {
        if self.said.remove(kind).is_some() {
            tracing::info!(bridge = %self.config.name, "{kind}: fine again");
        }
    }

    /// One pass over the files. Never panics and never writes over a file it could not
    /// read; what fails is logged and retried at the next change.
    async fn pass(&mut self) -> Next {
        if !self.loaded {
            match self.asks.open_requests().await {
                Ok(views) => {
                    for view in views {
                        if let Some((key, tracked)) = Tracked::from_view(&view) {
                            self.tracked.insert(key, tracked);
                        }
                    }
                    self.loaded = true;
                    self.clear("requests");
                }
                Err(err) => {
                    self.report(
                        "requests",
                        format!("could not read this bridge's requests: {err}; retrying"),
                    );
                    return Next::Wait;
                }
            }
        }
        let lock_path = self.config.paths.lock.clone();
        let held = match blocking(move || files::lock(&lock_path, LOCK_PATIENCE)).await {
            Ok(Some(held)) => {
                self.clear("lock");
                Some(held)
            }
            Ok(None) => {
                self.report(
                    "lock",
                    format!(
                        "{} has been held by another process for {} s; waiting for it",
                        self.config.paths.lock.display(),
                        LOCK_PATIENCE.as_secs()
                    ),
                );
                return Next::Again;
            }
            Err(err) => {
                // Writing without it is what a process that does not take the lock
                // expects anyway.
                self.report(
                    "lock",
                    format!("the lock file cannot be used ({err}); writing without it"),
                );
                None
            }
        };
        let next = self.pass_locked().await;
        drop(held);
        if next == Next::Wait {
            self.records().await;
        }
        next
    }

    async fn pass_locked(&mut self) -> Next {
        let path = self.config.paths.pending.clone();
        let file = match blocking(move || files::read_proposals(&path, IfEmpty::Retry)).await {
            Ok(file) => {
                self.clear("pending");
                file
            }
            Err(FileError::Empty { .. }) => return Next::Again,
            Err(err) => {
                self.report("pending", err.to_string());
                return Next::Wait;
            }
        };
        let (proposals, not_objects) = file.proposals();
        if not_objects > 0 {
            self.report(
                "entries",
                format!(
                    "{} holds {not_objects} proposal(s) that are not JSON objects; they are left as they are",
                    self.config.paths.pending.display()
                ),
            );
        } else {
            self.clear("entries");
        }
        let mut present = HashSet::new();
        for proposal in &proposals {
            if present.insert(proposal.key.clone()) {
                self.seen(proposal).await;
            }
        }
        self.vanished(&present);
        self.refresh().await;
        if let Err(next) = self.remove_decided(&file, &proposals).await {
            return next;
        }
        self.deliver().await
    }

    /// A proposal in `pending.json` now.
    async fn seen(&mut self, proposal: &Proposal) {
        let name = self.config.name.clone();
        if let Some(tracked) = self.tracked.get_mut(&proposal.key) {
            if tracked.removed && !tracked.in_pending {
                tracing::warn!(bridge = %name, request = %tracked.request_id, key = %proposal.key,
                    "a proposal this bridge already removed from pending.json came back (the process rewrote it from an older copy?); its request is {}, so it is removed again and not asked for again", tracked.status);
            } else if !tracked.in_pending && !tracked.closed() {
                tracing::info!(bridge = %name, request = %tracked.request_id, key = %proposal.key, "a proposal is back in pending.json; its request is still pending");
            }
            if !tracked.told_changed && !same_proposal(&tracked.raw, proposal) {
                tracked.told_changed = true;
                tracing::warn!(bridge = %name, request = %tracked.request_id, key = %proposal.key,
                    "a proposal changed under the same id; its request stays bound to what was first asked, and that is what an approval delivers (give a changed proposal a new id)");
            }
            tracked.in_pending = true;
            return;
        }
        if self.refused.get(&proposal.key) == Some(&proposal.raw) {
            return;
        }
        let new = new_request(&self.config, proposal);
        match self.asks.propose(new).await {
            Ok(proposed) => {
                let view = &proposed.request;
                if proposed.differs {
                    tracing::warn!(bridge = %name, request = %view.request_id, key = %proposal.key,
                        "a proposal has the id of an earlier one with other content; the earlier request stands for it and stays bound to what was first asked (give a changed proposal a new id)");
                }
                let Some((key, mut tracked)) = Tracked::from_view(view) else {
                    return;
                };
                tracked.in_pending = true;
                tracked.told_changed = proposed.differs;
                tracing::info!(bridge = %name, request = %view.request_id, key = %key, status = %view.status, "proposal asked for");
                self.refused.remove(&key);
                self.tracked.insert(key, tracked);
            }
            Err(err) if transient(&err) => {
                self.report(
                    "ask",
                    format!("could not ask for a proposal: {err}; retrying"),
                );
            }
            Err(err) => {
                tracing::warn!(bridge = %name, key = %proposal.key, "a proposal cannot become a request and is left in pending.json: {}", err.public_message());
                self.refused
                    .insert(proposal.key.clone(), proposal.raw.clone());
            }
        }
    }

    /// The proposals that were in `pending.json` and are not any more, though this
    /// bridge did not remove them: said, and kept (their requests stay as they are).
    fn vanished(&mut self, present: &HashSet<String>) {
        for (key, tracked) in &mut self.tracked {
            if !tracked.in_pending || present.contains(key) {
                continue;
            }
            tracked.in_pending = false;
            if tracked.removed {
                continue;
            }
            if tracked.closed() {
                tracing::info!(bridge = %self.config.name, request = %tracked.request_id, key = %key, "a decided proposal left pending.json before this bridge removed it");
            } else {
                tracing::warn!(bridge = %self.config.name, request = %tracked.request_id, key = %key,
                    "a proposal vanished from pending.json while its request is pending; countersign keeps it (in its database and log), and delivers it to approved.json if it is approved");
            }
        }
    }

    /// Reads the state of every request still pending.
    async fn refresh(&mut self) {
        let open: Vec<(String, String)> = self
            .tracked
            .iter()
            .filter(|(_, t)| !t.closed())
            .map(|(k, t)| (k.clone(), t.request_id.clone()))
            .collect();
        for (key, id) in open {
            match self.asks.status(&id).await {
                Ok(view) => {
                    if let Some(tracked) = self.tracked.get_mut(&key) {
                        tracked.status = view.status.clone();
                        tracked.claimed = view.used.is_some();
                        tracked.has_outcome = view.outcome.is_some();
                    }
                }
                Err(err) => {
                    self.report("status", format!("could not read request {id}: {err}"));
                }
            }
        }
    }

    /// Removes the decided proposals from `pending.json` (first, as the seed does), in
    /// one atomic rewrite over exactly what was read. `Err`: the pass ends there.
    async fn remove_decided(
        &mut self,
        file: &files::ProposalFile,
        proposals: &[Proposal],
    ) -> Result<(), Next> {
        let decided: HashSet<String> = proposals
            .iter()
            .filter(|p| self.tracked.get(&p.key).is_some_and(Tracked::closed))
            .map(|p| p.key.clone())
            .collect();
        if decided.is_empty() {
            return Ok(());
        }
        let kept: Vec<Box<RawValue>> = file
            .entries
            .iter()
            .filter(|entry| Proposal::parse(entry.get()).is_none_or(|p| !decided.contains(&p.key)))
            .cloned()
            .collect();
        let text = file.render(&kept);
        let expected = file.bytes.clone();
        let path = self.config.paths.pending.clone();
        match blocking(move || files::replace(&path, &text, expected.as_deref())).await {
            Ok(()) => self.clear("write pending"),
            Err(FileError::Changed { .. }) => return Err(Next::Again),
            Err(err) => {
                self.report(
                    "write pending",
                    format!("could not rewrite pending.json: {err}"),
                );
                return Err(Next::Wait);
            }
        }
        let mut approved = false;
        for key in &decided {
            if let Some(tracked) = self.tracked.get_mut(key) {
                tracked.removed = true;
                tracked.in_pending = false;
                approved |= tracked.status == "approved";
                tracing::info!(bridge = %self.config.name, request = %tracked.request_id, key = %key, "{} proposal removed from pending.json", tracked.status);
            }
        }
        if approved {
            failpoint("bridge_after_pending");
        }
        Ok(())
    }

    /// Claims and appends every approved proposal no longer in `pending.json`.
    async fn deliver(&mut self) -> Next {
        let due: Vec<String> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.status == "approved" && !t.claimed && !t.in_pending)
            .map(|(k, _)| k.clone())
            .collect();
        if due.is_empty() && self.undelivered.is_empty() {
            return Next::Wait;
        }
        let path = self.config.paths.approved.clone();
        let approved =
            match blocking(move || files::read_proposals(&path, IfEmpty::NoProposals)).await {
                Ok(file) => {
                    self.clear("approved");
                    file
                }
                Err(err) => {
                    self.report("approved", format!("{err}; approvals wait until it reads"));
                    return Next::Wait;
                }
            };
        for key in due {
            let Some(tracked) = self.tracked.get(&key) else {
                continue;
            };
            let id = tracked.request_id.clone();
            let details = BTreeMap::from([(BRIDGE_DETAIL.to_string(), self.config.name.clone())]);
            match self.asks.claim(&id, details).await {
                Ok(()) => {
                    self.undelivered.push(key.clone());
                    if let Some(tracked) = self.tracked.get_mut(&key) {
                        tracked.claimed = true;
                    }
                }
                Err(err) if transient(&err) => {
                    self.report(
                        "claim",
                        format!("could not claim request {id}: {err}; retrying"),
                    );
                }
                Err(err) => {
                    // Expired before it could be delivered, or used elsewhere: never
                    // delivered, and said.
                    tracing::warn!(bridge = %self.config.name, request = %id, key = %key,
                        "an approved proposal is not delivered: {}", err.public_message());
                    if let Some(tracked) = self.tracked.get_mut(&key) {
                        tracked.claimed = true;
                    }
                }
            }
        }
        if self.undelivered.is_empty() {
            return Next::Wait;
        }
        failpoint("bridge_after_claim");
        let mut entries = approved.entries.clone();
        for key in &self.undelivered {
            let raw = self
                .tracked
                .get(key)
                .and_then(|t| RawValue::from_string(t.raw.clone()).ok());
            if let Some(raw) = raw {
                entries.push(raw);
            }
        }
        let text = approved.render(&entries);
        let expected = approved.bytes.clone();
        let path = self.config.paths.approved.clone();
        match blocking(move || files::replace(&path, &text, expected.as_deref())).await {
            Ok(()) => {
                self.clear("write approved");
                for key in std::mem::take(&mut self.undelivered) {
                    if let Some(tracked) = self.tracked.get(&key) {
                        tracing::info!(bridge = %self.config.name, request = %tracked.request_id, key = %key, "approved proposal delivered to approved.json");
                    }
                }
                failpoint("bridge_after_approved");
                Next::Wait
            }
            Err(FileError::Changed { .. }) => Next::Again,
            Err(err) => {
                self.report(
                    "write approved",
                    format!("could not write approved.json: {err}; retrying"),
                );
                Next::Wait
            }
        }
    }

    /// Records, as its request's outcome, each record of the process whose `id` is a
    /// delivered proposal's: once, when the record is resolved (or says nothing of it).
    async fn records(&mut self) {
        let waiting: HashMap<String, String> = self
            .tracked
            .iter()
            .filter(|(key, t)| {
                t.claimed
                    && !t.has_outcome
                    && t.status == "approved"
                    && !self.undelivered.contains(key)
            })
            .filter_map(|(_, t)| t.id.clone().map(|id| (id, t.request_id.clone())))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let path = self.config.paths.records.clone();
        let records = match blocking(move || files::read_records(&path)).await {
            Ok(records) => {
                self.clear("records");
                records
            }
            Err(err) => {
                self.report("records", err.to_string());
                return;
            }
        };
        for record in records {
            let Some(id) = files::id_text(record.get("id")) else {
                continue;
            };
            let Some(request_id) = waiting.get(&id) else {
                continue;
            };
            if record.get("resolved") == Some(&Value::Bool(false)) {
                continue;
            }
            let (status, summary, details) = outcome_of(&record, MAX_OUTCOME_DETAILS);
            match self
                .asks
                .outcome(request_id, status, summary.clone(), details)
                .await
            {
                Ok(()) => {
                    tracing::info!(bridge = %self.config.name, request = %request_id, "outcome recorded from records.json: {summary}");
                    self.mark_outcome(request_id);
                }
                Err(err) if transient(&err) => {
                    self.report(
                        "outcome",
                        format!("could not record the outcome of {request_id}: {err}; retrying"),
                    );
                }
                Err(err) => {
                    tracing::warn!(bridge = %self.config.name, request = %request_id, "the process's record is not recorded as the outcome: {}", err.public_message());
                    self.mark_outcome(request_id);
                }
            }
        }
    }

    fn mark_outcome(&mut self, request_id: &str) {
        for tracked in self.tracked.values_mut() {
            if tracked.request_id == request_id {
                tracked.has_outcome = true;
            }
        }
    }
}

/// How many of a record's fields go into an outcome's details (the rest are in the
/// process's own file).
const MAX_OUTCOME_DETAILS: usize = 50;

/// Runs blocking file work off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(err) => Err(FileError::Io {
            path: "(bridge task)".into(),
            source: std::io::Error::other(err.to_string()),
        }),
    }
}

/// A place where the crash tests stop the process as abruptly as a `SIGKILL`
/// (`COUNTERSIGN_TEST_BRIDGE_FAILPOINT=<name>`), with the `failpoints` feature only;
/// without it, nothing.
fn failpoint(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("COUNTERSIGN_TEST_BRIDGE_FAILPOINT").as_deref() == Ok(name) {
        eprintln!("countersign: fail point {name} hit");
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
