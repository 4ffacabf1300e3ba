//! After a restart: everything the load saw acknowledged is stored unchanged, and the
//! log agrees with the state (one creation per request, at most one way it closed).

use std::collections::HashMap;

use countersign_core::{ApprovalRequest, EventKind, Status};
use countersign_store::{Store, StoredEvent};
use serde_json::Value;

use super::all_requests;
use crate::harness::ledger::Shared;
use crate::harness::lock;

/// Checks the state the restarted server sees against what was acknowledged, and
/// refreshes what the load knows (unanswered writes may have landed).
pub(crate) async fn check_state(
    store: &dyn Store,
    ledger: &Shared,
    events: &[StoredEvent],
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let stored: HashMap<String, ApprovalRequest> = all_requests(store)
        .await?
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();

    // Per request, the events of each kind.
    let mut by_subject: HashMap<&str, Vec<&StoredEvent>> = HashMap::new();
    for (n, e) in events.iter().enumerate() {
        if e.seq != n as u64 + 1 {
            violations.push(format!(
                "the event sequence has a gap: event {} at position {}",
                e.seq,
                n + 1
            ));
        }
        if let Some(s) = &e.entry.subject {
            by_subject.entry(s).or_default().push(e);
        }
    }

    // The log agrees with the state: one creation each, at most one way it closed, one
    // action and one outcome at most, each matching the request.
    let mut keys: HashMap<(String, String), Vec<&str>> = HashMap::new();
    for (id, r) in &stored {
        if let Some(key) = &r.idempotency_key {
            keys.entry((r.requested_by.id.clone(), key.clone()))
                .or_default()
                .push(id);
        }
        let evs = by_subject
            .get(id.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let count = |k: EventKind| evs.iter().filter(|e| e.entry.kind == k).count();
        let created = count(EventKind::RequestCreated);
        let decided: Vec<&&StoredEvent> = evs
            .iter()
            .filter(|e| e.entry.kind == EventKind::RequestDecided)
            .collect();
        let timed_out = count(EventKind::RequestTimedOut);
        let cancelled = count(EventKind::RequestCancelled);
        let actions = count(EventKind::ActionRecorded);
        let outcomes = count(EventKind::OutcomeRecorded);
        if created != 1 {
            violations.push(format!("{id}: {created} request_created entries"));
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
        if let (Some(d), Some(e)) = (&r.decision, decided.first()) {
            let first = d.approvers.first().map(|a| a.id.as_str());
            if e.entry.actor.as_deref() != first
                || e.entry.data.get("decision").and_then(Value::as_str) != Some(d.decision.as_str())
            {
                violations.push(format!(
                    "{id}: the state says {} by {first:?}, the log says {:?} by {:?}",
                    d.decision.as_str(),
                    e.entry.data.get("decision"),
                    e.entry.actor
                ));
            }
        }
        if actions != usize::from(r.action_record.is_some()) || actions > 1 {
            violations.push(format!(
                "{id}: {actions} action entries, action recorded: {}",
                r.action_record.is_some()
            ));
        }
        if outcomes != usize::from(r.outcome.is_some()) || outcomes > 1 {
            violations.push(format!(
                "{id}: {outcomes} outcome entries, outcome recorded: {}",
                r.outcome.is_some()
            ));
        }
    }
    for ((who, key), ids) in &keys {
        if ids.len() > 1 {
            violations.push(format!("{who} key {key}: {} requests {ids:?}", ids.len()));
        }
    }
    for subject in by_subject.keys() {
        if subject.starts_with("req_") && !stored.contains_key(*subject) {
            violations.push(format!(
                "{subject}: log entries for a request that is not stored"
            ));
        }
    }

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
        if r.action && s.action_record.is_none() {
            violations.push(format!("{id}: action acknowledged, none stored"));
        }
        if r.outcome.is_some() && s.outcome.is_none() {
            violations.push(format!("{id}: outcome acknowledged, none stored"));
        }
        // What the load works from next: the stored truth.
        if let Some(entry) = l.reqs.get_mut(&id) {
            entry.status = s.status.as_str().to_string();
            entry.used = s.action_record.is_some();
            entry.has_outcome = s.outcome.is_some();
        }
    }
    drop(l);
    Ok(violations)
}
