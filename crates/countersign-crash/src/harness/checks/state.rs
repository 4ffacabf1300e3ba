//! After a restart: everything the load saw acknowledged is stored unchanged, and the
//! log agrees with the state (one creation per request, at most one way it closed, at
//! most one use of an approval: an action or a redemption).
//!
//! Incremental: what was checked stays checked. Each restart folds only the entries
//! written since the last one into what it remembers of the log ([`Tracked`]), and
//! reads back only the requests those entries touched and those the load acknowledged
//! something for; the ledger is then held to the remembered rows, in memory. The last
//! cycle runs the whole check from scratch (`full`), over every entry and row.

use std::collections::{BTreeSet, HashMap};

use countersign_core::{ApprovalRequest, EventKind, Status};
use countersign_store::{Store, StoredEvent};
use serde_json::Value;

use super::all_requests;
use crate::harness::ledger::Shared;
use crate::harness::lock;

/// One request's entries, as counted so far.
#[derive(Debug, Default)]
struct SubjectLog {
    created: usize,
    /// Each decision: its actor and its `decision`.
    decided: Vec<(Option<String>, Option<String>)>,
    timed_out: usize,
    cancelled: usize,
    actions: usize,
    redemptions: usize,
    outcomes: usize,
}

/// What the state checks remember between restarts.
#[derive(Default)]
pub(crate) struct Tracked {
    /// Entries up to this number are folded into `logs`.
    seen: u64,
    logs: HashMap<String, SubjectLog>,
    /// The stored requests as last read back.
    stored: HashMap<String, ApprovalRequest>,
    /// (requester, idempotency key) → the request that holds it.
    keys: HashMap<(String, String), String>,
    /// Requests whose entries were folded in while another was re-read: checked at the
    /// next restart.
    retouch: BTreeSet<String>,
}

impl Tracked {
    /// How many requests are stored, as last read.
    pub(crate) fn requests(&self) -> usize {
        self.stored.len()
    }
}

/// Events after `after`, in order.
pub(crate) async fn events_after(
    store: &dyn Store,
    mut after: u64,
) -> anyhow::Result<Vec<StoredEvent>> {
    let mut events = Vec::new();
    loop {
        let page = store.events_after(after, 10_000).await?;
        let Some(last) = page.last() else {
            return Ok(events);
        };
        after = last.seq;
        events.extend(page);
    }
}

/// Reads the entries after those folded so far into `tracked.logs`, appends them to
/// `events`, and returns the requests they are about.
async fn fold(
    store: &dyn Store,
    tracked: &mut Tracked,
    events: &mut Vec<StoredEvent>,
    violations: &mut Vec<String>,
) -> anyhow::Result<BTreeSet<String>> {
    let new = events_after(store, tracked.seen).await?;
    let mut touched: BTreeSet<String> = BTreeSet::new();
    for e in &new {
        if e.seq != tracked.seen + 1 {
            violations.push(format!(
                "the event sequence has a gap: event {} follows {}",
                e.seq, tracked.seen
            ));
        }
        tracked.seen = e.seq;
        let Some(subject) = e.entry.subject.as_deref() else {
            continue;
        };
        if !subject.starts_with("req_") {
            continue;
        }
        touched.insert(subject.to_string());
        let log = tracked.logs.entry(subject.to_string()).or_default();
        match e.entry.kind {
            EventKind::RequestCreated => log.created += 1,
            EventKind::RequestDecided => log.decided.push((
                e.entry.actor.clone(),
                e.entry
                    .data
                    .get("decision")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            )),
            EventKind::RequestTimedOut => log.timed_out += 1,
            EventKind::RequestCancelled => log.cancelled += 1,
            EventKind::ActionRecorded => log.actions += 1,
            EventKind::ProofRedeemed => log.redemptions += 1,
            EventKind::OutcomeRecorded => log.outcomes += 1,
            _ => {}
        }
    }
    events.extend(new);
    Ok(touched)
}

/// Whether request `id`'s row (`r`, or none stored) agrees with its entries (`log`).
fn consistency(id: &str, r: Option<&ApprovalRequest>, log: Option<&SubjectLog>) -> Vec<String> {
    let mut violations = Vec::new();
    let none = SubjectLog::default();
    let log = log.unwrap_or(&none);
    let Some(r) = r else {
        if log.created > 0 {
            violations.push(format!(
                "{id}: log entries for a request that is not stored"
            ));
        }
        return violations;
    };
    let decided = &log.decided;
    let (timed_out, cancelled) = (log.timed_out, log.cancelled);
    if log.created != 1 {
        violations.push(format!("{id}: {} request_created entries", log.created));
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
    if let (Some(d), Some((actor, decision))) = (&r.decision, decided.first()) {
        let first = d.approvers.first().map(|a| a.id.as_str());
        if actor.as_deref() != first || decision.as_deref() != Some(d.decision.as_str()) {
            violations.push(format!(
                "{id}: the state says {} by {first:?}, the log says {decision:?} by {actor:?}",
                d.decision.as_str(),
            ));
        }
    }
    let (actions, redemptions) = (log.actions, log.redemptions);
    if actions != usize::from(r.action_record.is_some()) || actions > 1 {
        violations.push(format!(
            "{id}: {actions} action entries, action recorded: {}",
            r.action_record.is_some()
        ));
    }
    if redemptions != usize::from(r.redemption.is_some()) || redemptions > 1 {
        violations.push(format!(
            "{id}: {redemptions} redemption entries, redeemed: {}",
            r.redemption.is_some()
        ));
    }
    if actions + redemptions > 1 {
        violations.push(format!(
            "{id}: the approval was used twice: {actions} actions, {redemptions} redemptions"
        ));
    }
    if log.outcomes != usize::from(r.outcome.is_some()) || log.outcomes > 1 {
        violations.push(format!(
            "{id}: {} outcome entries, outcome recorded: {}",
            log.outcomes,
            r.outcome.is_some()
        ));
    }
    violations
}

/// Checks the state the restarted server sees against what was acknowledged, and
/// refreshes what the load knows (unanswered writes may have landed). Returns the
/// entries it read (those after the last check; all of them when `full`).
pub(crate) async fn check_state(
    store: &dyn Store,
    ledger: &Shared,
    tracked: &mut Tracked,
    full: bool,
) -> anyhow::Result<(Vec<String>, Vec<StoredEvent>)> {
    let mut violations = Vec::new();
    if full {
        *tracked = Tracked::default();
    }
    let mut events = Vec::new();
    let mut touched = std::mem::take(&mut tracked.retouch);
    touched.extend(fold(store, tracked, &mut events, &mut violations).await?);

    // Read back what changed: every request when full, else those with new entries and
    // those the load knows of but the last read did not find.
    if full {
        tracked.stored = all_requests(store)
            .await?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        touched.extend(tracked.stored.keys().cloned());
    } else {
        {
            let l = lock(ledger);
            touched.extend(
                l.reqs
                    .keys()
                    .filter(|id| !tracked.stored.contains_key(*id))
                    .cloned(),
            );
        }
        for id in &touched {
            match store.get_request(id).await? {
                Some(r) => {
                    tracked.stored.insert(id.clone(), r);
                }
                None => {
                    tracked.stored.remove(id);
                }
            }
        }
    }

    // The log agrees with the state: one creation each, at most one way it closed, one
    // use and one outcome at most, each matching the request.
    for id in &touched {
        let mut found = consistency(id, tracked.stored.get(id), tracked.logs.get(id));
        // The restarted server works on while it is checked (its expiry sweeper times
        // requests out): a row and its entry committed between the two reads are not a
        // violation. Read both again until they agree, or for a while.
        let mut tries = 0;
        while !found.is_empty() && tries < 10 {
            tries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let newer = fold(store, tracked, &mut events, &mut violations).await?;
            tracked
                .retouch
                .extend(newer.into_iter().filter(|s| s != id));
            match store.get_request(id).await? {
                Some(r) => {
                    tracked.stored.insert(id.clone(), r);
                }
                None => {
                    tracked.stored.remove(id);
                }
            }
            found = consistency(id, tracked.stored.get(id), tracked.logs.get(id));
        }
        violations.extend(found);
        let Some(r) = tracked.stored.get(id) else {
            continue;
        };
        if let Some(key) = &r.idempotency_key {
            let holder = tracked
                .keys
                .entry((r.requested_by.id.clone(), key.clone()))
                .or_insert_with(|| id.clone());
            if holder != id {
                violations.push(format!(
                    "{} key {key}: two requests {holder} and {id}",
                    r.requested_by.id
                ));
            }
        }
    }
    let stored = &tracked.stored;

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
        if r.acted && s.action_record.is_none() {
            violations.push(format!("{id}: action acknowledged, none stored"));
        }
        if r.redeemed && s.redemption.is_none() {
            violations.push(format!("{id}: redemption acknowledged, none stored"));
        }
        if r.outcome.is_some() && s.outcome.is_none() {
            violations.push(format!("{id}: outcome acknowledged, none stored"));
        }
        // What the load works from next: the stored truth.
        if let Some(entry) = l.reqs.get_mut(&id) {
            entry.status = s.status.as_str().to_string();
            entry.used = s.action_record.is_some() || s.redemption.is_some();
            entry.has_outcome = s.outcome.is_some();
        }
    }
    drop(l);
    Ok((violations, events))
}
