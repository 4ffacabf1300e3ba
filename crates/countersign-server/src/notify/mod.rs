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

//!
//! This module is outbound only: the inbound side of Slack and email (clicks, decision
//! links) lives in `http/`, and nothing here knows of `http/` or `mcp/`.

mod digest;
pub mod email;
mod outbox;
mod plan;
pub mod slack;
pub mod smtp;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::{ApprovalRequest, Status, Timestamp, Verdict};
use countersign_store::{Docs, Store, collection, kinds};
use serde::{Deserialize, Serialize};

use crate::error::GateError;
use crate::gate::Gate;
use smtp::SmtpUrl;

pub use digest::DigestConfig;
pub use outbox::Notifier;
pub use plan::plan;

/// Who a request goes to, in two groups: the recipients it names (which
/// `request_approval` accepted only if they are known approvers), and the configured
/// routes, always. Each group is routed on its own (Slack first, email as its
/// fallback), so a request can add people to tell but never keep the configured ones
/// from being told. Naming a configured route changes nothing.
pub fn plan_routes(
    config: &NotifyConfig,
    request: &countersign_core::ApprovalRequest,
) -> Vec<Vec<Route>> {
    let configured = &config.default_routes;
    let named: Vec<Route> = [
        request.recipient_slack.clone().map(Route::Slack),
        request.recipient_email.clone().map(Route::Email),
    ]
    .into_iter()
    .flatten()
    .filter(|route| !configured.iter().any(|r| r.same_target(route)))
    .collect();
    [named, configured.clone()]
        .into_iter()
        .filter(|group| !group.is_empty())
        .collect()
}

/// Where a notification goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "to", rename_all = "snake_case")]
pub enum Route {
    /// A Slack user (`U...`) or channel (`#name` or `C...`).
    Slack(String),
    Email(String),
}

impl Route {
    /// Whether two routes reach the same place (email addresses ignoring case).
    pub fn same_target(&self, other: &Route) -> bool {
        match (self, other) {
            (Route::Slack(a), Route::Slack(b)) => a == b,
            (Route::Email(a), Route::Email(b)) => a.eq_ignore_ascii_case(b),
            _ => false,
        }
    }
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

/// How a webhook endpoint's messages are signed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WebhookFormat {
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,...`
    /// keyed by the `whsec_` secret.
    #[default]
    Standard,
    /// LoopPause's HMAC webhooks: `X-LoopPause-Signature: sha256=<hex of
    /// HMAC-SHA256(secret, body)>`, keyed by the secret's bytes as they are (LoopPause's
    /// LOOPPAUSE_SIGNING_SECRET), instead of `webhook-signature`; `webhook-id` and
    /// `webhook-timestamp` are sent as well.
    LoopPause,
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
    /// How messages are signed (`format` in `[[webhooks]]`).
    pub format: WebhookFormat,
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
    /// Where every request goes, whatever recipients it names.
    pub default_routes: Vec<Route>,
    /// Recipients a request may name besides the approvers mapped in `[email]` and
    /// `[slack]` (a team channel, a shared inbox).
    pub allowed_recipients: Vec<Route>,
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
    pub email: Option<EmailConfig>,
    /// How people reach this server, for links in messages.
    pub public_url: String,
    /// Beyond this many new-request notifications per requester and window, a digest
    /// instead of one message each (`None`: every request is notified on its own).
    pub digest: Option<DigestConfig>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            webhooks: Vec::new(),
            default_routes: Vec::new(),
            allowed_recipients: Vec::new(),
            reminders: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lease_seconds: DEFAULT_LEASE_SECONDS,
            history_days: DEFAULT_HISTORY_DAYS,
            slack: None,
            email: None,
            public_url: String::new(),
            digest: None,
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
        if self
            .reminders
            .as_ref()
            .is_some_and(|r| r.after_seconds < 60)
        {
            return Err("[reminders] after_minutes must be at least 1".into());
        }
        if let Some(email) = &self.email
            && !(1..=MAX_TOKEN_MINUTES).contains(&email.token_minutes)
        {
            return Err(format!(
                "[email] token_minutes must be between 1 and {}",
                MAX_TOKEN_MINUTES
            ));
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

    /// Who a request may name as recipients: the approvers mapped to dashboard accounts
    /// in `[email]` and `[slack]` (checked to be active approvers when a request names
    /// them), `allowed_recipients`, and the routes that are told anyway (the defaults,
    /// the escalation routes).
    pub fn recipients(&self) -> crate::gate::Recipients {
        let mut out = crate::gate::Recipients::default();
        if let Some(email) = &self.email {
            for (address, username) in &email.approvers {
                out.email
                    .insert(address.to_lowercase(), Some(username.clone()));
            }
        }
        if let Some(slack) = &self.slack {
            for (user, username) in &slack.approvers {
                out.slack.insert(user.clone(), Some(username.clone()));
            }
        }
        let listed = self
            .allowed_recipients
            .iter()
            .chain(&self.default_routes)
            .chain(self.reminders.iter().flat_map(|r| &r.escalate_to));
        for route in listed {
            match route {
                Route::Email(to) => out.email.entry(to.to_lowercase()).or_insert(None),
                Route::Slack(to) => out.slack.entry(to.clone()).or_insert(None),
            };
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.webhooks.is_empty()
            && self.default_routes.is_empty()
            && self.slack.is_none()
            && self.email.is_none()
    }
}

/// How long an emailed decision token works unless configured otherwise.
pub const DEFAULT_TOKEN_MINUTES: u64 = 30;
/// Whether follow-up emails are sent unless configured otherwise.
pub const DEFAULT_FOLLOW_UPS: bool = true;
/// Whether emails carry one-time decision links unless configured otherwise: off, an
/// operator opts in.
pub const DEFAULT_TOKEN_DECISIONS: bool = false;
/// The longest an emailed decision token may be configured to work: a day.
pub const MAX_TOKEN_MINUTES: u64 = 24 * 60;

/// How countersign sends email, and who may decide by email.
#[derive(Clone, PartialEq, Eq)]
pub struct EmailConfig {
    pub smtp: SmtpUrl,
    /// The From address, e.g. `countersign <approvals@example.com>`.
    pub from: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Certificates (PEM) trusted for the SMTP server besides the Mozilla roots: a
    /// private CA's, or a self-signed server's (`[email] ca_file`).
    pub extra_roots: Option<Vec<u8>>,
    /// Email address (lowercase) → countersign dashboard username.
    pub approvers: BTreeMap<String, String>,
    /// Whether emails carry one-time decision tokens (an operator's opt-in).
    pub token_decisions: bool,
    /// How long a decision token works.
    pub token_minutes: u64,
    /// Whether decisions, timeouts and cancellations send a follow-up email.
    pub follow_ups: bool,
}

impl std::fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailConfig")
            .field("smtp", &self.smtp)
            .field("from", &self.from)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field(
                "extra_roots",
                &self.extra_roots.as_ref().map(|pem| pem.len()),
            )
            .field("approvers", &self.approvers)
            .field("token_decisions", &self.token_decisions)
            .field("token_minutes", &self.token_minutes)
            .field("follow_ups", &self.follow_ups)
            .finish()
    }
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

impl Delivery {
    /// A new pending delivery of this installation (`origin`, the log's); `seq` and
    /// `body` are set by the caller when it has them.
    pub(crate) fn new(
        origin: &str,
        id: String,
        subject: Option<String>,
        event_type: &str,
        channel: DeliveryChannel,
        now: Timestamp,
    ) -> Self {
        Delivery {
            message_id: message_id(origin, &id),
            id,
            seq: 0,
            subject,
            event_type: event_type.to_string(),
            channel,
            attempts: 0,
            next_at: now,
            lease_until: None,
            last_error: None,
            status: DeliveryStatus::Pending,
            created_at: now,
            finished_at: None,
            receipt: None,
            body: None,
        }
    }
}

impl DeliveryChannel {
    /// The transport, as `/metrics` names it (one of `metrics::DELIVERY_CHANNELS`).
    pub fn transport(&self) -> &'static str {
        match self {
            DeliveryChannel::Webhook { .. } => "webhook",
            DeliveryChannel::Slack { .. } | DeliveryChannel::SlackUpdate { .. } => "slack",
            DeliveryChannel::Email { .. } => "email",
        }
    }

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

collection!(
    /// Deliveries waiting to be sent or retried, by id.
    pub(crate) PendingDocs: kinds::DELIVERY_PENDING => Delivery
);

collection!(
    /// Finished deliveries (sent, failed, skipped): the history, by id.
    pub(crate) DoneDocs: kinds::DELIVERY_DONE => Delivery
);

/// How many times a delivery is tried before it is given up, unless configured otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 12;
/// How long a claimed delivery is left to its sender before another may take it, unless
/// configured otherwise.
pub const DEFAULT_LEASE_SECONDS: u64 = 60;
/// How long finished deliveries are kept, unless configured otherwise.
pub const DEFAULT_HISTORY_DAYS: u64 = 30;
/// The shortest history allowed: longer than the longest a request may wait (168 h).
pub const MIN_HISTORY_DAYS: u64 = 8;
/// How many pending deliveries one pass looks at (as many as the history lists).
const PENDING_SCAN_LIMIT: usize = 100_000;

/// What a transport sends with: the gate (to read requests and remember what was sent),
/// the settings, and an HTTP client whose every call ends within the lease.
pub(crate) struct Outbound {
    pub gate: Arc<Gate>,
    pub config: NotifyConfig,
    pub http: reqwest::Client,
}

impl Outbound {
    pub fn now(&self) -> Timestamp {
        self.gate.now()
    }

    pub fn origin(&self) -> &str {
        self.gate.log().origin()
    }

    /// The request a delivery is about (its subject), as a transport's error if it
    /// cannot be read (retried) or is not there (given up).
    pub async fn request(&self, delivery: &Delivery) -> Result<ApprovalRequest, String> {
        let Some(id) = &delivery.subject else {
            return Err(permanent("the delivery names no request"));
        };
        self.gate
            .store()
            .get_request(id)
            .await
            .map_err(|e| format!("could not read the request: {e}"))?
            .ok_or_else(|| permanent(format!("request {id} does not exist")))
    }
}

/// What a transport reports after trying to send.
pub type SendResult = Result<Option<serde_json::Value>, String>;

/// Pending and finished deliveries, newest first.
pub async fn history(store: &Arc<dyn Store>, limit: usize) -> Result<Vec<Delivery>, GateError> {
    // Every pending one (few, unless a receiver is down) and the latest finished ones:
    // the history can hold far more finished deliveries than anyone pages through.
    let pending = Docs::<PendingDocs>::new(&**store)
        .list("", PENDING_SCAN_LIMIT)
        .await?;
    let finished = Docs::<DoneDocs>::new(&**store).list_recent(limit).await?;
    let mut all: Vec<Delivery> = pending
        .into_iter()
        .chain(finished)
        .map(|d| d.body)
        .collect();
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    all.truncate(limit);
    Ok(all)
}

/// Who decided (through which channel) and when, or why the request closed.
pub fn outcome_line(request: &ApprovalRequest) -> String {
    match (&request.status, &request.decision) {
        (Status::Approved | Status::Rejected, Some(d)) => {
            let who = d
                .approvers
                .iter()
                .map(|a| format!("{} via {}", a.display_name, a.channel.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            format!("{} by {who} at {}", verdict_word(d.decision), d.decided_at)
        }
        (Status::TimedOut, _) => format!(
            "Timed out at {}: nobody decided, so it is not approved",
            request.closed_at.unwrap_or(request.expires_at)
        ),
        (Status::Cancelled, _) => format!(
            "Cancelled at {}",
            request.closed_at.unwrap_or(request.requested_at)
        ),
        (status, _) => format!("Status: {status}"),
    }
}

pub(crate) fn verdict_word(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "Approved",
        Verdict::Rejected => "Rejected",
    }
}

/// The stable message id of a planned delivery.
pub(crate) fn message_id(origin: &str, delivery_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{origin}\n{delivery_id}").as_bytes());
    format!("msg_{}", hex::encode(&digest[..16]))
}

/// The event types notifications are sent for (webhooks subscribe to these), with
/// the log event each names.
const NOTIFIED: [(countersign_core::EventKind, &str); 9] = {
    use countersign_core::EventKind::*;
    [
        (RequestCreated, "request.created"),
        (RequestApprovalRecorded, "request.approval_recorded"),
        (RequestDecided, "request.decided"),
        (RequestTimedOut, "request.timed_out"),
        (RequestCancelled, "request.cancelled"),
        (ActionRecorded, "action.recorded"),
        (ProofRedeemed, "proof.redeemed"),
        (OutcomeRecorded, "outcome.recorded"),
        (AuditMismatch, "audit.mismatch"),
    ]
};

/// The event types a webhook may subscribe to.
pub const EVENT_TYPES: [&str; 9] = {
    let mut names = [""; 9];
    let mut i = 0;
    while i < NOTIFIED.len() {
        names[i] = NOTIFIED[i].1;
        i += 1;
    }
    names
};

/// The event type notifications name an event by, if it is notified.
pub(crate) fn event_type(kind: countersign_core::EventKind) -> Option<&'static str> {
    NOTIFIED
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_each_bound_is_named() {
        assert_eq!(NotifyConfig::default().validate(), Ok(()));
        let bad = |change: fn(&mut NotifyConfig)| {
            let mut config = NotifyConfig::default();
            change(&mut config);
            config.validate().unwrap_err()
        };
        assert!(bad(|c| c.max_attempts = 0).contains("max_attempts"));
        assert!(bad(|c| c.lease_seconds = 0).contains("lease_seconds"));
        assert!(bad(|c| c.history_days = MIN_HISTORY_DAYS - 1).contains("history_days"));
        assert!(
            bad(|c| {
                c.reminders = Some(ReminderConfig {
                    after_seconds: 59,
                    escalate_after_seconds: None,
                    escalate_to: Vec::new(),
                })
            })
            .contains("after_minutes")
        );
    }

    #[test]
    fn every_notified_event_has_a_subscribable_type() {
        use countersign_core::EventKind;
        let named: Vec<&str> = [
            EventKind::RequestCreated,
            EventKind::RequestApprovalRecorded,
            EventKind::RequestDecided,
            EventKind::RequestTimedOut,
            EventKind::RequestCancelled,
            EventKind::ActionRecorded,
            EventKind::ProofRedeemed,
            EventKind::OutcomeRecorded,
            EventKind::AuditMismatch,
            EventKind::TokenCreated,
            EventKind::MessagePosted,
        ]
        .into_iter()
        .filter_map(event_type)
        .collect();
        assert_eq!(
            named, EVENT_TYPES,
            "the eight request events and the audit's mismatch, in order, and no others"
        );
    }
}
