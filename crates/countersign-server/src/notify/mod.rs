//! Notifications: Slack, email and webhooks, delivered through a durable outbox.
//!
//! The outbox is the event log itself. Every event is committed before it is
//! acknowledged, so a planner that reads events in order and turns each into
//! deliveries can never miss one: a crash between a decision and its notification only
//! delays the notification. Deliveries are documents with deterministic ids (the event's
//! position, the channel and the target), so planning twice, in two processes or after a
//! restart, plans each message once. Sending claims a delivery with a compare-and-swap
//! lease, so with several instances each message is sent by one of them; a sender that
//! dies mid-send leaves the lease to expire and another sends it again with the same
//! message id (webhook receivers deduplicate by `webhook-id`).

pub mod email;
mod plan;
pub mod slack;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use countersign_core::Timestamp;
use countersign_store::{ChangeFeed, Doc, Store, StoreError};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::GateError;
use crate::gate::Gate;

pub use plan::plan;

/// Who a request goes to: its recipients, or the default routes.
pub fn plan_routes(
    config: &NotifyConfig,
    request: &countersign_core::ApprovalRequest,
) -> Vec<Route> {
    let mut routes = Vec::new();
    if let Some(slack) = &request.recipient_slack {
        routes.push(Route::Slack(slack.clone()));
    }
    if let Some(email) = &request.recipient_email {
        routes.push(Route::Email(email.clone()));
    }
    if routes.is_empty() {
        routes = config.default_routes.clone();
    }
    routes
}

/// Where a notification goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "to", rename_all = "snake_case")]
pub enum Route {
    /// A Slack user (`U...`) or channel (`#name` or `C...`).
    Slack(String),
    Email(String),
}

impl std::str::FromStr for Route {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("slack", to)) if !to.is_empty() => Ok(Route::Slack(to.to_string())),
            Some(("email", to)) if to.contains('@') => Ok(Route::Email(to.to_string())),
            _ => Err(format!(
                "route {s:?} must be slack:<user or channel> or email:<address>"
            )),
        }
    }
}

/// One outbound webhook endpoint (Standard Webhooks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// A short name for history and logs.
    pub name: String,
    pub url: String,
    /// `whsec_` + base64 of the signing key.
    pub secret: String,
    /// Event types to send (e.g. `request.created`); empty means all.
    pub events: Vec<String>,
}

/// Re-notify a pending request after a quiet period, then escalate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReminderConfig {
    pub after_seconds: u64,
    pub escalate_after_seconds: Option<u64>,
    pub escalate_to: Vec<Route>,
}

/// Everything the operator configured about notifications. `NotifyConfig::default()`
/// states each default once; the binary's config starts from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyConfig {
    pub webhooks: Vec<WebhookConfig>,
    /// Where requests without a recipient go.
    pub default_routes: Vec<Route>,
    pub reminders: Option<ReminderConfig>,
    /// How often a failed delivery is retried before it is given up.
    pub max_attempts: u32,
    /// How long a claimed delivery is left to its sender before another process may
    /// send it again. A send is cut off after this long (at most 10 s), so a live sender
    /// never outlasts its lease.
    pub lease_seconds: u64,
    /// How many days finished deliveries stay in the history before they are deleted.
    /// At least [`MIN_HISTORY_DAYS`]: a request can wait a week, and its Slack message
    /// is updated using the history's record of the post.
    pub history_days: u64,
    /// The Slack app requests are posted as, if configured.
    pub slack: Option<slack::SlackConfig>,
    /// The SMTP server emails go through, if configured.
    pub email: Option<email::EmailConfig>,
    /// How people reach this server, for links in messages.
    pub public_url: String,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            webhooks: Vec::new(),
            default_routes: Vec::new(),
            reminders: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lease_seconds: DEFAULT_LEASE_SECONDS,
            history_days: DEFAULT_HISTORY_DAYS,
            slack: None,
            email: None,
            public_url: String::new(),
        }
    }
}

impl NotifyConfig {
    /// Checks the settings that have bounds; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("[notify] max_attempts must be at least 1".into());
        }
        if self.lease_seconds == 0 {
            return Err("[notify] lease_seconds must be at least 1".into());
        }
        if self.history_days < MIN_HISTORY_DAYS {
            return Err(format!(
                "[notify] history_days is {}; at least {MIN_HISTORY_DAYS} are needed (a request \
                 can wait up to 7 days, and its Slack message is updated from the delivery history)",
                self.history_days
            ));
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.webhooks.is_empty()
            && self.default_routes.is_empty()
            && self.slack.is_none()
            && self.email.is_none()
    }
}

/// What the interactive endpoints (`/slack/interactivity`, `/email/...`) need; put on
/// the router by [`attach`].
pub struct Channels {
    pub config: NotifyConfig,
    pub http: reqwest::Client,
}

/// Makes the configured channels' interactive endpoints work on `router`.
pub fn attach(router: axum::Router, config: &NotifyConfig) -> Result<axum::Router, GateError> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| GateError::Store(StoreError::Backend(format!("HTTP client: {e}"))))?;
    let channels = Arc::new(Channels {
        config: config.clone(),
        http,
    });
    Ok(router.layer(axum::Extension(channels)))
}

/// Marks a delivery error that retrying cannot fix (an unknown Slack channel, a refused
/// address): the outbox gives the delivery up at once instead of backing off.
pub(crate) fn permanent(message: impl std::fmt::Display) -> String {
    format!("{PERMANENT}{message}")
}

const PERMANENT: &str = "permanent: ";

/// A message to send, as planned from an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Deterministic: `<seq>.<channel>.<target>` (or a reminder's own key).
    pub id: String,
    /// The event it was planned from (0 for reminders).
    pub seq: u64,
    pub subject: Option<String>,
    /// `request.created`, `request.decided`, `request.timed_out`, `action.recorded`, ...
    pub event_type: String,
    pub channel: DeliveryChannel,
    /// The message id receivers see (`webhook-id`), stable across retries.
    pub message_id: String,
    pub attempts: u32,
    pub next_at: Timestamp,
    pub lease_until: Option<Timestamp>,
    pub last_error: Option<String>,
    pub status: DeliveryStatus,
    pub created_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// What the receiving side answered (e.g. Slack's message `ts`), for follow-ups.
    #[serde(default)]
    pub receipt: Option<serde_json::Value>,
    /// The exact body to send, fixed when planned, so every retry sends the same bytes.
    #[serde(default)]
    pub body: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeliveryChannel {
    Webhook { name: String, url: String },
    Slack { to: String, reminder: bool },
    SlackUpdate { to: String },
    Email { to: String, reminder: bool },
}

impl DeliveryChannel {
    pub fn label(&self) -> String {
        match self {
            DeliveryChannel::Webhook { name, .. } => format!("webhook {name}"),
            DeliveryChannel::Slack { to, .. } => format!("slack {to}"),
            DeliveryChannel::SlackUpdate { to } => format!("slack update {to}"),
            DeliveryChannel::Email { to, .. } => format!("email {to}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Sent,
    Failed,
    /// Not sent, on purpose; `last_error` says why (e.g. a Slack user who is not an
    /// approver, emailed instead; a request already closed).
    Skipped,
}

pub(crate) const PENDING: &str = "delivery.pending";
pub(crate) const DONE: &str = "delivery.done";
const CURSOR_KIND: &str = "outbox";
const CURSOR_ID: &str = "cursor";
/// How many times a delivery is tried before it is given up, unless configured otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 12;
/// How long a claimed delivery is left to its sender before another may take it, unless
/// configured otherwise.
pub const DEFAULT_LEASE_SECONDS: u64 = 60;
/// The longest one send may take.
const SEND_TIMEOUT_SECONDS: u64 = 10;
/// How long finished deliveries are kept, unless configured otherwise.
pub const DEFAULT_HISTORY_DAYS: u64 = 30;
/// The shortest history allowed: longer than the longest a request may wait (168 h).
pub const MIN_HISTORY_DAYS: u64 = 8;
/// How often the history is pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The most finished deliveries one pruning pass deletes (the next pass goes on).
const PRUNE_BATCH: usize = 10_000;
/// How many pending deliveries one pass looks at (as many as the history lists).
const PENDING_SCAN_LIMIT: usize = 100_000;

/// What a transport reports after trying to send.
pub type SendResult = Result<Option<serde_json::Value>, String>;

/// Sends planned deliveries over the configured transports.
pub struct Notifier {
    gate: Arc<Gate>,
    config: NotifyConfig,
    http: reqwest::Client,
}

fn doc_of(delivery: &Delivery, kind: &str, version: u64, at: Timestamp) -> Result<Doc, GateError> {
    Ok(Doc {
        kind: kind.to_string(),
        id: delivery.id.clone(),
        version,
        key: None,
        body: serde_json::to_value(delivery).map_err(|e| {
            GateError::Store(StoreError::Backend(format!("encode a delivery: {e}")))
        })?,
        updated_at: at,
    })
}

fn delivery_of(doc: &Doc) -> Result<Delivery, GateError> {
    serde_json::from_value(doc.body.clone())
        .map_err(|e| GateError::Store(StoreError::Corrupt(format!("delivery {}: {e}", doc.id))))
}

/// Exponential backoff: 5 s, 10 s, 20 s, ... capped at an hour.
fn backoff(attempts: u32) -> u64 {
    let exp = attempts.saturating_sub(1).min(10);
    (5u64 << exp).min(3600)
}

impl Notifier {
    pub fn new(gate: Arc<Gate>, config: NotifyConfig) -> Result<Self, GateError> {
        config.validate().map_err(GateError::BadInput)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(
                SEND_TIMEOUT_SECONDS.min(config.lease_seconds),
            ))
            .build()
            .map_err(|e| GateError::Store(StoreError::Backend(format!("HTTP client: {e}"))))?;
        Ok(Self { gate, config, http })
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.gate.store()
    }

    fn now(&self) -> Timestamp {
        self.gate.clock().now()
    }

    /// Plans deliveries for every event after the outbox cursor and moves the cursor.
    /// Safe to run in several processes at once.
    pub async fn plan_new_events(&self) -> Result<usize, GateError> {
        let mut planned = 0;
        loop {
            let cursor_doc = self.store().doc_get(CURSOR_KIND, CURSOR_ID).await?;
            let (cursor, version) = match &cursor_doc {
                Some(doc) => (
                    doc.body.get("seq").and_then(|v| v.as_u64()).unwrap_or(0),
                    doc.version,
                ),
                None => {
                    // A fresh outbox starts at the current end of the log: notifications are
                    // for what happens from now on, not for history.
                    let start = self.store().last_event_seq().await?;
                    let doc = Doc {
                        kind: CURSOR_KIND.into(),
                        id: CURSOR_ID.into(),
                        version: 1,
                        key: None,
                        body: serde_json::json!({"seq": start}),
                        updated_at: self.now(),
                    };
                    match self.store().doc_insert(&doc, None).await {
                        Ok(()) | Err(StoreError::Duplicate(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            let events = self.store().events_after(cursor, 200).await?;
            let Some(last) = events.last().map(|e| e.seq) else {
                return Ok(planned);
            };
            for event in &events {
                for delivery in plan(&self.config, &self.gate, event, self.now()).await? {
                    planned += self.insert(&delivery).await? as usize;
                }
            }
            let advanced = Doc {
                kind: CURSOR_KIND.into(),
                id: CURSOR_ID.into(),
                version: version + 1,
                key: None,
                body: serde_json::json!({"seq": last}),
                updated_at: self.now(),
            };
            match self.store().doc_update(&advanced, None).await {
                // Another process moved the cursor; its plans are the same as ours.
                Ok(()) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Inserts a planned delivery unless it exists (planned before, maybe elsewhere).
    pub(crate) async fn insert(&self, delivery: &Delivery) -> Result<bool, GateError> {
        if self.store().doc_get(DONE, &delivery.id).await?.is_some() {
            return Ok(false);
        }
        // A delivery planned as already finished (skipped) goes straight to the history.
        let kind = if delivery.status == DeliveryStatus::Pending {
            PENDING
        } else {
            DONE
        };
        match self
            .store()
            .doc_insert(&doc_of(delivery, kind, 1, self.now())?, None)
            .await
        {
            Ok(()) => Ok(true),
            Err(StoreError::Duplicate(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Plans reminders and escalations for requests that waited too long.
    pub async fn plan_reminders(&self) -> Result<usize, GateError> {
        let Some(reminders) = &self.config.reminders else {
            return Ok(0);
        };
        let mut planned = 0;
        for delivery in plan::reminders(&self.config, reminders, &self.gate, self.now()).await? {
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
        for doc in self
            .store()
            .doc_list(PENDING, "", PENDING_SCAN_LIMIT)
            .await?
        {
            let delivery = delivery_of(&doc)?;
            if delivery.next_at > now || delivery.lease_until.is_some_and(|l| l > now) {
                continue;
            }
            // Claim it: only one process wins the version.
            let mut claimed = delivery.clone();
            claimed.lease_until = Some(now.plus_seconds(self.config.lease_seconds));
            claimed.attempts += 1;
            match self
                .store()
                .doc_update(&doc_of(&claimed, PENDING, doc.version + 1, now)?, None)
                .await
            {
                Ok(()) => {}
                Err(StoreError::Conflict(_) | StoreError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            // Planned again after another process had already sent and retired it: the
            // history has it, so it must not go out twice.
            if self.store().doc_get(DONE, &claimed.id).await?.is_some() {
                self.store().doc_delete(PENDING, &claimed.id).await?;
                continue;
            }
            let result = self.send(&claimed).await;
            self.finish(claimed, doc.version + 2, result).await?;
            sent += 1;
        }
        Ok(sent)
    }

    async fn send(&self, delivery: &Delivery) -> SendResult {
        match &delivery.channel {
            DeliveryChannel::Webhook { name, url } => {
                let Some(config) = self.config.webhooks.iter().find(|w| &w.name == name) else {
                    return Err(format!("webhook {name} is no longer configured"));
                };
                let Some(body) = &delivery.body else {
                    return Err("the delivery has no body".into());
                };
                webhook::send(
                    &self.http,
                    url,
                    &config.secret,
                    &delivery.message_id,
                    self.now(),
                    body.as_bytes(),
                )
                .await
            }
            DeliveryChannel::Slack { to, reminder } => {
                slack::send_post(self, delivery, to, *reminder).await
            }
            DeliveryChannel::SlackUpdate { .. } => slack::send_update(self, delivery).await,
            DeliveryChannel::Email { to, reminder } => {
                email::send(self, delivery, to, *reminder).await
            }
        }
    }

    async fn finish(
        &self,
        mut delivery: Delivery,
        version: u64,
        result: SendResult,
    ) -> Result<(), GateError> {
        let now = self.now();
        delivery.lease_until = None;
        match result {
            Ok(receipt) => {
                // A transport that chose not to send says why (e.g. the request closed).
                let skipped = receipt
                    .as_ref()
                    .and_then(|r| r.get("skipped"))
                    .and_then(|s| s.as_str())
                    .map(str::to_string);
                delivery.status = if skipped.is_some() {
                    DeliveryStatus::Skipped
                } else {
                    DeliveryStatus::Sent
                };
                delivery.receipt = receipt;
                delivery.last_error = skipped;
                delivery.finished_at = Some(now);
                self.retire(&delivery, now).await
            }
            Err(error) => {
                tracing::warn!(delivery = %delivery.id, attempt = delivery.attempts, %error, "delivery failed");
                let given_up = error.starts_with(PERMANENT);
                delivery.last_error = Some(match error.strip_prefix(PERMANENT) {
                    Some(rest) => format!("{rest} (not retried)"),
                    None => error,
                });
                if given_up || delivery.attempts >= self.config.max_attempts {
                    delivery.status = DeliveryStatus::Failed;
                    delivery.finished_at = Some(now);
                    self.retire(&delivery, now).await?;
                    // A Slack message that cannot be delivered falls back to email.
                    for fallback in plan::fallback(&self.config, &self.gate, &delivery, now).await?
                    {
                        self.insert(&fallback).await?;
                    }
                    return Ok(());
                }
                delivery.next_at = now.plus_seconds(backoff(delivery.attempts));
                match self
                    .store()
                    .doc_update(&doc_of(&delivery, PENDING, version, now)?, None)
                    .await
                {
                    Ok(()) | Err(StoreError::Conflict(_)) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Moves a finished delivery to the history.
    async fn retire(&self, delivery: &Delivery, now: Timestamp) -> Result<(), GateError> {
        match self
            .store()
            .doc_insert(&doc_of(delivery, DONE, 1, now)?, None)
            .await
        {
            Ok(()) | Err(StoreError::Duplicate(_)) => {}
            Err(e) => return Err(e.into()),
        }
        self.store().doc_delete(PENDING, &delivery.id).await?;
        Ok(())
    }

    /// Deletes what is older than `[notify] history_days`: finished deliveries, and the
    /// records of Slack messages posted and emails sent for requests (kept so a decision
    /// can update the message and send follow-ups; a request is closed long before, as
    /// no request waits more than 7 days). At most [`PRUNE_BATCH`] per kind and call;
    /// returns how many it deleted. Every instance may run it: deleting what another
    /// already deleted is a no-op.
    pub async fn prune_history(&self) -> Result<u64, GateError> {
        let keep_ms =
            i64::try_from(self.config.history_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX);
        let now = self.now();
        let mut deleted = 0;
        for kind in [DONE, slack::MESSAGE, email::SENT] {
            deleted += self.prune_kind(kind, keep_ms, now).await?;
        }
        if deleted > 0 {
            tracing::info!(
                deleted,
                days = self.config.history_days,
                "pruned the delivery history"
            );
        }
        Ok(deleted)
    }

    async fn prune_kind(&self, kind: &str, keep_ms: i64, now: Timestamp) -> Result<u64, GateError> {
        let mut deleted = 0;
        // Most ids start with something time-ordered (an event's zero-padded sequence
        // number, a request id), so the scan meets the oldest first.
        for doc in self.store().doc_list(kind, "", PENDING_SCAN_LIMIT).await? {
            if deleted as usize >= PRUNE_BATCH {
                break;
            }
            if doc.updated_at.millis_until(now) > keep_ms
                && self.store().doc_delete(kind, &doc.id).await?
            {
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
                _ = events.recv() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// The delivery history, newest first (for admins).
    pub async fn history(&self, limit: usize) -> Result<Vec<Delivery>, GateError> {
        history(self.store(), limit).await
    }
}

/// Pending and finished deliveries, newest first.
pub async fn history(store: &Arc<dyn Store>, limit: usize) -> Result<Vec<Delivery>, GateError> {
    // Every pending one (few, unless a receiver is down) and the latest finished ones:
    // the history can hold far more finished deliveries than anyone pages through.
    let pending = store.doc_list(PENDING, "", PENDING_SCAN_LIMIT).await?;
    let finished = store.doc_list_recent(DONE, limit).await?;
    let mut all = pending
        .iter()
        .chain(&finished)
        .map(delivery_of)
        .collect::<Result<Vec<_>, _>>()?;
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    all.truncate(limit);
    Ok(all)
}

/// The stable message id of a planned delivery.
pub(crate) fn message_id(origin: &str, delivery_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{origin}\n{delivery_id}").as_bytes());
    format!("msg_{}", hex::encode(&digest[..16]))
}

/// Event types as notifications name them.
pub(crate) fn event_type(kind: countersign_core::EventKind) -> Option<&'static str> {
    use countersign_core::EventKind::*;
    Some(match kind {
        RequestCreated => "request.created",
        RequestDecided => "request.decided",
        RequestTimedOut => "request.timed_out",
        RequestCancelled => "request.cancelled",
        ActionRecorded => "action.recorded",
        OutcomeRecorded => "outcome.recorded",
        _ => return None,
    })
}
