//! The outbox loop: plans deliveries from new events (moving a cursor through the log),
//! claims due ones with a compare-and-swap lease, sends them over their transport,
//! retries with backoff, retires them to the history, and prunes the history.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::Timestamp;
use countersign_store::{
    ChangeFeed, Collection, Docs, Store, StoreError, Stored, collection, kinds,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{
    Delivery, DeliveryChannel, DeliveryStatus, DoneDocs, NotifyConfig, Outbound,
    PENDING_SCAN_LIMIT, PERMANENT, PendingDocs, SendResult, email, history, plan, slack, webhook,
};
use crate::error::GateError;
use crate::gate::Gate;
use crate::metrics::{DeliveryOutcome, Metrics};

/// The longest one send may take.
const SEND_TIMEOUT_SECONDS: u64 = 10;
/// How often the history is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The most finished deliveries one pruning pass deletes (the next pass goes on).
const PRUNE_BATCH: usize = 10_000;

/// The outbox's position: the last event planned.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cursor {
    seq: u64,
}

collection!(
    CursorDocs: kinds::OUTBOX => Cursor
);
const CURSOR_ID: &str = "cursor";

/// Exponential backoff: 5 s, 10 s, 20 s, ... capped at an hour.
fn backoff(attempts: u32) -> u64 {
    let exp = attempts.saturating_sub(1).min(10);
    (5u64 << exp).min(3600)
}

/// Sends planned deliveries over the configured transports.
pub struct Notifier {
    out: Outbound,
    /// The last event this process planned (its stored cursor may lag behind it).
    planned_through: std::sync::atomic::AtomicU64,
    /// When this process last wrote its cursor.
    cursor_written: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// How long after a new event the outbox waits before planning, so that a burst of
/// requests is planned (and its reads made) once; a notification is that much later.
const SETTLE: Duration = Duration::from_millis(50);
/// How often the cursor is written when no delivery was planned: planning again from an
/// older cursor (after a restart, or on another instance) plans nothing twice (delivery
/// ids are deterministic), so it need not be written for every event, which would cost a
/// commit per request.
const CURSOR_EVERY: Duration = Duration::from_secs(5);

impl Notifier {
    pub fn new(gate: Arc<Gate>, config: NotifyConfig) -> Result<Self, GateError> {
        config.validate().map_err(GateError::BadInput)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(
                SEND_TIMEOUT_SECONDS.min(config.lease_seconds),
            ))
            .build()
            .map_err(|e| GateError::internal("HTTP client", e))?;
        Ok(Self {
            out: Outbound { gate, config, http },
            planned_through: std::sync::atomic::AtomicU64::new(0),
            cursor_written: std::sync::Mutex::new(None),
        })
    }

    fn store(&self) -> &dyn Store {
        &**self.out.gate.store()
    }

    fn metrics(&self) -> &Metrics {
        self.out.gate.metrics()
    }

    fn pending(&self) -> Docs<'_, PendingDocs> {
        Docs::new(self.store())
    }

    fn done(&self) -> Docs<'_, DoneDocs> {
        Docs::new(self.store())
    }

    fn now(&self) -> Timestamp {
        self.out.now()
    }

    /// Plans deliveries for every event after the outbox cursor and moves the cursor.
    /// Safe to run in several processes at once.
    pub async fn plan_new_events(&self) -> Result<usize, GateError> {
        let cursors = Docs::<CursorDocs>::new(self.store());
        let mut planned = 0;
        loop {
            let Some(cursor) = cursors.get(CURSOR_ID).await? else {
                // A fresh outbox starts at the current end of the log: notifications are
                // for what happens from now on, not for history.
                let start = Cursor {
                    seq: self.store().last_event_seq().await?,
                };
                match cursors
                    .insert(CURSOR_ID, None, &start, self.now(), None)
                    .await
                {
                    Ok(()) | Err(StoreError::Duplicate(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            use std::sync::atomic::Ordering;
            let from = cursor
                .body
                .seq
                .max(self.planned_through.load(Ordering::Acquire));
            // Asked again from the last one until none are left.
            let events = self.store().follow_events(from, 200).await?.events;
            let Some(last) = events.last().map(|e| e.seq) else {
                // Caught up: write a cursor that lags behind what was planned, now and then.
                if cursor.body.seq < from && self.cursor_due() {
                    self.write_cursor(&cursors, &cursor, from).await?;
                }
                return Ok(planned);
            };
            let before = planned;
            for event in &events {
                for delivery in plan(&self.out.config, &self.out.gate, event, self.now()).await? {
                    planned += self.insert(&delivery).await? as usize;
                }
            }
            self.planned_through.fetch_max(last, Ordering::AcqRel);
            if planned > before || self.cursor_due() {
                self.write_cursor(&cursors, &cursor, last).await?;
            }
        }
    }

    /// Whether the cursor was last written [`CURSOR_EVERY`] ago (or never).
    fn cursor_due(&self) -> bool {
        let written = self
            .cursor_written
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        written.is_none_or(|at| at.elapsed() >= CURSOR_EVERY)
    }

    async fn write_cursor(
        &self,
        cursors: &Docs<'_, CursorDocs>,
        read: &Stored<Cursor>,
        seq: u64,
    ) -> Result<(), GateError> {
        match cursors
            .update(read, &Cursor { seq }, self.now(), None)
            .await
        {
            // Another process moved the cursor; its plans are the same as ours.
            Ok(_) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
        *self
            .cursor_written
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
        Ok(())
    }

    /// Inserts a planned delivery unless it exists (planned before, maybe elsewhere).
    pub(crate) async fn insert(&self, delivery: &Delivery) -> Result<bool, GateError> {
        if self.done().get(&delivery.id).await?.is_some() {
            return Ok(false);
        }
        let now = self.now();
        // A delivery planned as already finished (skipped) goes straight to the history.
        let inserted = if delivery.status == DeliveryStatus::Pending {
            self.pending()
                .insert(&delivery.id, None, delivery, now, None)
                .await
        } else {
            self.done()
                .insert(&delivery.id, None, delivery, now, None)
                .await
        };
        match inserted {
            Ok(()) => Ok(true),
            Err(StoreError::Duplicate(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Plans reminders and escalations for requests that waited too long.
    pub async fn plan_reminders(&self) -> Result<usize, GateError> {
        let Some(reminders) = &self.out.config.reminders else {
            return Ok(0);
        };
        let mut planned = 0;
        for delivery in
            plan::reminders(&self.out.config, reminders, &self.out.gate, self.now()).await?
        {
            planned += self.insert(&delivery).await? as usize;
        }
        Ok(planned)
    }

    /// Sends every due delivery this process can claim.
    pub async fn send_due(&self) -> Result<usize, GateError> {
        let now = self.now();
        let mut sent = 0;
        // Every pending delivery, not the first few hundred by id: those can all be
        // waiting for a retry (a dead endpoint), and a cut-off would starve the rest.
        for stored in self.pending().list("", PENDING_SCAN_LIMIT).await? {
            let delivery = &stored.body;
            if delivery.next_at > now || delivery.lease_until.is_some_and(|l| l > now) {
                continue;
            }
            // Claim it: only one process wins the version.
            let mut claimed = delivery.clone();
            claimed.lease_until = Some(now.plus_seconds(self.out.config.lease_seconds));
            claimed.attempts += 1;
            let version = match self.pending().update(&stored, &claimed, now, None).await {
                Ok(version) => version,
                Err(StoreError::Conflict(_) | StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            // Planned again after another process had already sent and retired it: the
            // history has it, so it must not go out twice.
            if self.done().get(&claimed.id).await?.is_some() {
                self.pending().delete(&claimed.id).await?;
                continue;
            }
            let result = self.send(&claimed).await;
            let claimed = Stored {
                version,
                body: claimed,
                ..stored
            };
            self.finish(claimed, result).await?;
            sent += 1;
        }
        Ok(sent)
    }

    /// Sends one delivery; deliveries the send found due meanwhile (a request that
    /// closed while its message went out) are planned at once.
    async fn send(&self, delivery: &Delivery) -> SendResult {
        let mut later = Vec::new();
        let result = self.transport(delivery, &mut later).await;
        for next in later {
            if let Err(e) = self.insert(&next).await {
                tracing::warn!(%e, delivery = %next.id, "could not plan a follow-up delivery");
            }
        }
        result
    }

    async fn transport(&self, delivery: &Delivery, later: &mut Vec<Delivery>) -> SendResult {
        if delivery.event_type == super::digest::EVENT_TYPE {
            return super::digest::send(&self.out, delivery).await;
        }
        match &delivery.channel {
            DeliveryChannel::Webhook { name, .. } => {
                let Some(config) = self.out.config.webhooks.iter().find(|w| &w.name == name) else {
                    return Err(format!("webhook {name} is no longer configured"));
                };
                let Some(body) = &delivery.body else {
                    return Err("the delivery has no body".into());
                };
                webhook::send(
                    &self.out.http,
                    config,
                    &delivery.message_id,
                    self.now(),
                    body.as_bytes(),
                )
                .await
            }
            DeliveryChannel::Slack { to, reminder } => {
                slack::send_post(&self.out, delivery, to, *reminder, later).await
            }
            DeliveryChannel::SlackUpdate { .. } => slack::send_update(&self.out, delivery).await,
            DeliveryChannel::Email { to, reminder } => {
                email::send(&self.out, delivery, to, *reminder, later).await
            }
        }
    }

    /// Records what a send came to: retired to the history when it went out (or was
    /// skipped, or failed for good, then with its fallback planned), else scheduled for
    /// a retry.
    async fn finish(&self, claimed: Stored<Delivery>, result: SendResult) -> Result<(), GateError> {
        let now = self.now();
        let mut delivery = claimed.body.clone();
        delivery.lease_until = None;
        match result {
            Ok(receipt) => {
                // A transport that chose not to send says why (e.g. the request closed).
                let skipped = receipt
                    .as_ref()
                    .and_then(|r| r.get("skipped"))
                    .and_then(|s| s.as_str())
                    .map(str::to_string);
                let (status, outcome) = if skipped.is_some() {
                    (DeliveryStatus::Skipped, DeliveryOutcome::Skipped)
                } else {
                    (DeliveryStatus::Sent, DeliveryOutcome::Sent)
                };
                delivery.status = status;
                self.metrics()
                    .delivered(delivery.channel.transport(), outcome);
                delivery.receipt = receipt;
                delivery.last_error = skipped;
                delivery.finished_at = Some(now);
                self.retire(&delivery).await
            }
            Err(error) => {
                tracing::warn!(delivery = %delivery.id, attempt = delivery.attempts, %error, "delivery failed");
                let transport = delivery.channel.transport();
                self.metrics().delivery_failed(transport);
                let given_up = error.starts_with(PERMANENT);
                delivery.last_error = Some(match error.strip_prefix(PERMANENT) {
                    Some(rest) => format!("{rest} (not retried)"),
                    None => error,
                });
                if given_up || delivery.attempts >= self.out.config.max_attempts {
                    delivery.status = DeliveryStatus::Failed;
                    delivery.finished_at = Some(now);
                    self.metrics().delivered(transport, DeliveryOutcome::Failed);
                    self.retire(&delivery).await?;
                    // A Slack message that cannot be delivered falls back to email.
                    for fallback in
                        plan::fallback(&self.out.config, &self.out.gate, &delivery, now).await?
                    {
                        self.insert(&fallback).await?;
                    }
                    return Ok(());
                }
                delivery.next_at = now.plus_seconds(backoff(delivery.attempts));
                match self.pending().update(&claimed, &delivery, now, None).await {
                    Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Moves a finished delivery to the history.
    async fn retire(&self, delivery: &Delivery) -> Result<(), GateError> {
        match self
            .done()
            .insert(&delivery.id, None, delivery, self.now(), None)
            .await
        {
            Ok(()) | Err(StoreError::Duplicate(_)) => {}
            Err(e) => return Err(e.into()),
        }
        self.pending().delete(&delivery.id).await?;
        Ok(())
    }

    /// Deletes what is older than `[notify] history_days`: finished deliveries, and the
    /// records of Slack messages posted and emails sent for requests (kept so a decision
    /// can update the message and send follow-ups; a request is closed long before, as
    /// no request waits more than 7 days). At most [`PRUNE_BATCH`] per kind and call;
    /// returns how many it deleted. Every instance may run it: deleting what another
    /// already deleted is a no-op.
    pub async fn prune_history(&self) -> Result<u64, GateError> {
        let keep_ms = i64::try_from(self.out.config.history_days.saturating_mul(86_400_000))
            .unwrap_or(i64::MAX);
        let now = self.now();
        let deleted = self.prune::<DoneDocs>(keep_ms, now).await?
            + self.prune::<slack::MessageDocs>(keep_ms, now).await?
            + self.prune::<email::SentDocs>(keep_ms, now).await?;
        if deleted > 0 {
            tracing::info!(
                deleted,
                days = self.out.config.history_days,
                "pruned the delivery history"
            );
        }
        Ok(deleted)
    }

    async fn prune<C: Collection>(&self, keep_ms: i64, now: Timestamp) -> Result<u64, GateError> {
        let docs = Docs::<C>::new(self.store());
        let mut deleted = 0;
        // Most ids start with something time-ordered (an event's zero-padded sequence
        // number, a request id), so the scan meets the oldest first.
        for (id, updated_at) in docs.updated("", PENDING_SCAN_LIMIT).await? {
            if deleted as usize >= PRUNE_BATCH {
                break;
            }
            if updated_at.millis_until(now) > keep_ms && docs.delete(&id).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Plans and sends until `shutdown`: woken by new events, and every second for
    /// retries and reminders; prunes the history every hour.
    pub async fn run(self: Arc<Self>, feed: ChangeFeed, shutdown: CancellationToken) {
        let mut events = feed.subscribe();
        let mut next_prune = tokio::time::Instant::now();
        loop {
            let work = async {
                self.plan_new_events().await?;
                self.plan_reminders().await?;
                self.send_due().await
            };
            if let Err(err) = work.await {
                tracing::warn!(%err, "notification outbox: will retry");
            }
            if tokio::time::Instant::now() >= next_prune {
                next_prune += PRUNE_EVERY;
                if let Err(err) = self.prune_history().await {
                    tracing::warn!(%err, "could not prune the delivery history; will retry");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = events.recv() => {
                    // Let a burst of requests land, then plan them together.
                    tokio::time::sleep(SETTLE).await;
                    while events.try_recv().is_ok() {}
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// The delivery history, newest first (for admins).
    pub async fn history(&self, limit: usize) -> Result<Vec<Delivery>, GateError> {
        history(self.out.gate.store(), limit).await
    }
}
