//! After a restart: every notifiable event's webhook arrives (once the lease of a killed
//! sender has run out), agrees with its log entry, and comes under one webhook-id.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use countersign_core::{Clock, EventKind, SystemClock};
use countersign_server::notify::{Delivery, DeliveryStatus};
use countersign_store::{Store, StoredEvent};

use super::Carry;
use crate::harness::receiver::Receiver;
use crate::harness::{DONE_DELIVERY, PENDING_DELIVERY, lock};
use crate::server;

/// The webhook `type` an event is notified under; none for events not notified.
fn webhook_type(kind: EventKind) -> Option<&'static str> {
    Some(match kind {
        EventKind::RequestCreated => "request.created",
        EventKind::RequestDecided => "request.decided",
        EventKind::RequestTimedOut => "request.timed_out",
        EventKind::RequestCancelled => "request.cancelled",
        EventKind::ActionRecorded => "action.recorded",
        EventKind::ProofRedeemed => "proof.redeemed",
        EventKind::OutcomeRecorded => "outcome.recorded",
        _ => return None,
    })
}

/// The outbox id of an event's webhook delivery (`countersign_server::notify`).
fn delivery_id(seq: u64) -> String {
    format!("{seq:012}.webhook.{}", server::WEBHOOK)
}

/// Pending deliveries by id.
async fn pending_deliveries(store: &dyn Store) -> anyhow::Result<HashMap<String, Delivery>> {
    Ok(store
        .doc_list(PENDING_DELIVERY, "", 100_000)
        .await?
        .into_iter()
        .filter_map(|d| serde_json::from_value::<Delivery>(d.body).ok())
        .map(|d| (d.id.clone(), d))
        .collect())
}

/// After a restart: waits (up to `settle`) for the log to be integrated up to where it
/// stood at the restart, and for every notifiable event's webhook, except deliveries a
/// killed sender still holds a lease on or that back off after a refusal (carried to
/// the next check). Reports what did not arrive in time, and webhooks that disagree
/// with the log or came under two ids.
pub(crate) async fn check_outbox(
    store: &dyn Store,
    events: &[StoredEvent],
    received: &Receiver,
    carry: &mut Carry,
    outbox_from: u64,
    settle: Duration,
    drain: bool,
) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.seq > carry.planned_upto.max(outbox_from))
    {
        if let Some(t) = webhook_type(e.entry.kind) {
            carry
                .expected
                .insert(e.seq, (t, e.entry.subject.clone(), e.entry.at.millis()));
        }
    }
    let last = events.last().map_or(0, |e| e.seq);
    carry.planned_upto = carry.planned_upto.max(last);
    let clock = SystemClock;
    let started = Instant::now();
    let mut deadline = started + settle;
    loop {
        // Arrived: check each against its event.
        {
            let r = lock(received);
            let delays = &mut carry.delays;
            carry.expected.retain(|seq, (kind, subject, at)| {
                let Some(ids) = r.by_index.get(&(seq - 1)) else {
                    return true;
                };
                if let Some(arrived) = r.first_at.get(&(seq - 1)) {
                    delays.push(arrived - *at);
                }
                for id in ids {
                    if let Some((k, s)) = r.meta.get(id)
                        && (k != kind || s != subject)
                    {
                        violations.push(format!(
                            "webhook {id} for log index {} says {k} {s:?}; the entry is {kind} {subject:?}",
                            seq - 1
                        ));
                    }
                }
                false
            });
        }
        let integrated = store.checkpoint(None).await?.map_or(0, |c| c.size);
        if carry.expected.is_empty() && integrated >= last {
            break;
        }
        let pending = pending_deliveries(store).await?;
        let now = clock.now();
        let excused = |seq: &u64| {
            pending.get(&delivery_id(*seq)).and_then(|d| {
                let until = d.lease_until.into_iter().chain([d.next_at]).max()?;
                (until > now).then_some(until)
            })
        };
        let due: Vec<u64> = carry
            .expected
            .keys()
            .filter(|s| excused(s).is_none())
            .copied()
            .collect();
        for seq in carry.expected.keys() {
            if pending
                .get(&delivery_id(*seq))
                .and_then(|d| d.lease_until)
                .is_some_and(|until| until > now)
            {
                carry.leased.insert(*seq);
            }
        }
        if drain && due.is_empty() {
            // Wait out the leases too.
            let latest = carry.expected.keys().filter_map(excused).max();
            if let Some(until) = latest {
                let wait = now.millis_until(until).max(0) as u64;
                deadline = deadline.max(Instant::now() + Duration::from_millis(wait) + settle);
            }
        }
        if (due.is_empty() && !drain && integrated >= last) || Instant::now() >= deadline {
            if integrated < last {
                violations.push(format!(
                    "the log was not integrated up to {last} entries within {settle:?} of the restart (checkpoint at {integrated})"
                ));
            }
            for seq in due {
                let (kind, subject, _) = carry.expected.remove(&seq).unwrap_or(("?", None, 0));
                let done = store.doc_get(DONE_DELIVERY, &delivery_id(seq)).await?;
                let state = match done.and_then(|d| serde_json::from_value::<Delivery>(d.body).ok())
                {
                    Some(d) if d.status == DeliveryStatus::Failed => {
                        format!("given up after {} attempts: {:?}", d.attempts, d.last_error)
                    }
                    Some(d) => format!("recorded as {:?} but never received", d.status),
                    None => match pending.get(&delivery_id(seq)) {
                        Some(d) => format!(
                            "pending, {} attempts, last error {:?}",
                            d.attempts, d.last_error
                        ),
                        None => "never planned".into(),
                    },
                };
                violations.push(format!(
                    "event {seq} ({kind} {subject:?}): no webhook within {settle:?} of the restart ({state})"
                ));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    carry.slowest_settle = carry.slowest_settle.max(started.elapsed());
    // Exactly one webhook-id per event (receivers deduplicate by id, so two ids would
    // be two notifications), and none for an event that does not exist.
    let end = store.last_event_seq().await?;
    let r = lock(received);
    for (index, ids) in &r.by_index {
        if ids.len() > 1 {
            violations.push(format!(
                "log index {index} was notified under {} webhook-ids: {ids:?}",
                ids.len()
            ));
        }
        if *index >= end {
            violations.push(format!(
                "a webhook for log index {index}, beyond the {end} entries"
            ));
        }
    }
    violations.extend(r.problems.iter().cloned());
    drop(r);
    lock(received).problems.clear();
    Ok(violations)
}
