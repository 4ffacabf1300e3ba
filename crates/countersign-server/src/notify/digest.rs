//! Digests: one runaway agent must not bury the approvers. Each requester's new
//! requests are counted per fixed window (`[limits] notification_window_minutes`);
//! the first `notifications_per_agent` of a window are notified one by one as usual,
//! and the rest are summed up in one message per route, sent when the window ends:
//! "N more requests from <agent> are waiting". Nothing is approved or dropped: every
//! request still waits in the dashboard, and reminders still apply.
//!
//! Planning stays deterministic across processes: the window's count document
//! remembers the last event it counted and the first one that went over, so an event
//! planned twice (another process, a restart) is planned the same way.

use countersign_core::{ApprovalRequest, Status, Timestamp};
use countersign_store::{Docs, RequestQuery, Step, StoredEvent, collection, kinds};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::smtp::{build, deliver};
use super::{Delivery, DeliveryChannel, Outbound, SendResult, permanent};
use crate::error::GateError;
use crate::gate::Gate;

/// The event type of a digest delivery.
pub const EVENT_TYPE: &str = "request.digest";

/// How many new-request notifications one requester sends per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestConfig {
    /// Notified one by one per window; the rest go in the window's digest.
    pub per_agent: u32,
    pub window_seconds: u64,
}

/// One requester's requests in one window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WindowCount {
    pub requester: String,
    pub display_name: String,
    pub window_start: Timestamp,
    pub count: u32,
    /// The newest event counted (events are counted once, in order).
    pub last_seq: u64,
    /// The first event of the window that went in the digest.
    pub first_digest_seq: Option<u64>,
}

collection!(
    /// Requests per requester and window: `{requester}/{window start millis}`.
    pub(crate) CountDocs: kinds::NOTIFY_WINDOW => WindowCount
);

/// How a new request is notified.
pub(crate) enum Admit {
    /// One message per route, as usual.
    Individually,
    /// In the digest of this window (its count document's id), sent at `due`.
    Digest { window: String, due: Timestamp },
}

fn window_of(config: &DigestConfig, at: Timestamp) -> (i64, Timestamp) {
    let width = i64::try_from(config.window_seconds.max(1) * 1000).unwrap_or(i64::MAX);
    let start = at.millis().div_euclid(width) * width;
    let due = Timestamp::from_millis(start.saturating_add(width)).unwrap_or(at);
    (start, due)
}

/// Counts `event` (a `request_created` of `request`) in its requester's window and
/// says how it is notified.
pub(crate) async fn admit(
    config: &DigestConfig,
    gate: &Gate,
    request: &ApprovalRequest,
    event: &StoredEvent,
    now: Timestamp,
) -> Result<Admit, GateError> {
    let (start, due) = window_of(config, event.entry.at);
    let window = format!("{}/{start}", request.requested_by.id);
    let per_agent = config.per_agent;
    let seq = event.seq;
    let requester = &request.requested_by;
    let digest = Docs::<CountDocs>::new(&**gate.store())
        .modify(&window, now, |current| {
            let mut count = match current {
                Some(stored) => stored.body.clone(),
                None => WindowCount {
                    requester: requester.id.clone(),
                    display_name: requester.display_name.clone(),
                    window_start: Timestamp::from_millis(start).unwrap_or(now),
                    count: 0,
                    last_seq: 0,
                    first_digest_seq: None,
                },
            };
            if seq <= count.last_seq {
                // Counted before (here or by another process): decided the same way.
                let digest = count.first_digest_seq.is_some_and(|first| seq >= first);
                return Ok::<_, GateError>(Step::Done(digest));
            }
            count.count += 1;
            count.last_seq = seq;
            let digest = count.count > per_agent;
            if digest && count.first_digest_seq.is_none() {
                count.first_digest_seq = Some(seq);
            }
            Ok(Step::Write {
                body: count,
                event: None,
                then: digest,
            })
        })
        .await?;
    Ok(if digest {
        Admit::Digest { window, due }
    } else {
        Admit::Individually
    })
}

/// The digest delivery of `window` for one route's channel (`target` names it in ids).
pub(crate) fn delivery(
    gate: &Gate,
    window: &str,
    due: Timestamp,
    channel: DeliveryChannel,
    target: &str,
    now: Timestamp,
) -> Delivery {
    let mut d = Delivery::new(
        gate.log().origin(),
        format!("digest.{window}.{target}"),
        None,
        EVENT_TYPE,
        channel,
        now,
    );
    d.next_at = due;
    d.body = Some(json!({ "window": window }).to_string());
    d
}

/// What a digest says.
struct Summary {
    held_back: u32,
    per_agent: u32,
    waiting: usize,
    requester: String,
    minutes: u64,
}

impl Summary {
    fn line(&self) -> String {
        format!(
            "{} more requests from {} are waiting: it asked for more than {} notifications within {} minutes, so the rest are summed up here instead of one message each. {} of its requests are pending now.",
            self.held_back, self.requester, self.per_agent, self.minutes, self.waiting
        )
    }
}

async fn summary(out: &Outbound, delivery: &Delivery) -> Result<Summary, String> {
    let Some(config) = &out.config.digest else {
        return Err(permanent(
            "digests are no longer configured ([limits] notifications_per_agent)",
        ));
    };
    let window = delivery
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .and_then(|b| b.get("window").and_then(|w| w.as_str()).map(str::to_string))
        .ok_or_else(|| permanent("the digest names no window"))?;
    let count = Docs::<CountDocs>::new(&**out.gate.store())
        .get(&window)
        .await
        .map_err(|e| format!("could not read the digest's count: {e}"))?
        .ok_or_else(|| permanent(format!("the count of window {window} is gone")))?
        .body;
    let now = out.now();
    let waiting = out
        .gate
        .store()
        .list_requests(&RequestQuery {
            status: Some(Status::Pending),
            requested_by: Some(count.requester.clone()),
            limit: 10_000,
        })
        .await
        .map_err(|e| format!("could not count the pending requests: {e}"))?
        .iter()
        .filter(|r| !r.is_past_expiry(now))
        .count();
    Ok(Summary {
        held_back: count.count.saturating_sub(config.per_agent),
        per_agent: config.per_agent,
        waiting,
        requester: format!("{} ({})", count.display_name, count.requester),
        minutes: config.window_seconds / 60,
    })
}

fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Sends a digest to its route.
pub(crate) async fn send(out: &Outbound, delivery: &Delivery) -> SendResult {
    let summary = summary(out, delivery).await?;
    let line = summary.line();
    let link = format!("{}/", out.config.public_url.trim_end_matches('/'));
    match &delivery.channel {
        DeliveryChannel::Slack { to, .. } => {
            let Some(config) = &out.config.slack else {
                return Err(permanent("Slack is not configured on this server"));
            };
            let text = format!("{} <{link}|Open the dashboard>", slack_escape(&line));
            let body = json!({"channel": to, "text": text, "unfurl_links": false});
            super::slack::api::call(&out.http, config, "chat.postMessage", &body)
                .await
                .map_err(super::slack::api::ApiFailure::into_send_error)?;
            Ok(Some(json!({"digest": summary.held_back})))
        }
        DeliveryChannel::Email { to, .. } => {
            let Some(config) = &out.config.email else {
                return Err(permanent("email is not configured on this server"));
            };
            let subject = format!(
                "{} more requests from {} are waiting",
                summary.held_back, summary.requester
            );
            let text = format!("{line}\n\nOpen the dashboard: {link}\n");
            let html = format!(
                "<p>{}</p><p><a href=\"{}\">Open the dashboard</a></p>",
                html_escape(&line),
                html_escape(&link)
            );
            let message = build(
                config,
                to,
                &subject,
                Some(delivery.message_id.clone()),
                text,
                html,
            )?;
            let timeout = std::time::Duration::from_secs(out.config.lease_seconds.clamp(1, 10));
            deliver(config, message, timeout).await?;
            Ok(Some(json!({"digest": summary.held_back, "to": to})))
        }
        _ => Err(permanent("a digest goes to Slack or email only")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_fixed_and_due_at_their_end() {
        let config = DigestConfig {
            per_agent: 2,
            window_seconds: 600,
        };
        let at = Timestamp::parse("2026-11-29T12:04:59Z").unwrap();
        let (start, due) = window_of(&config, at);
        assert_eq!(
            Timestamp::from_millis(start).unwrap(),
            Timestamp::parse("2026-11-29T12:00:00Z").unwrap()
        );
        assert_eq!(due, Timestamp::parse("2026-11-29T12:10:00Z").unwrap());
    }
}
