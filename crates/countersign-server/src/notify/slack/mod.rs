//! Slack, outbound: requests posted with `chat.postMessage` as Block Kit messages with
//! Approve and Reject buttons (`blocks`), updated with `chat.update` once decided, over
//! the Web API (`api`). The clicks come back to `http::slack`, which checks who clicked.

pub(crate) mod api;
mod blocks;

use std::collections::BTreeMap;

use countersign_core::{Status, Timestamp};
use countersign_store::{Docs, StoreError, collection, kinds};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Delivery, DeliveryChannel, Outbound, SendResult, outcome_line, permanent};

pub use api::{ApiFailure, auth_test, call};
pub(crate) use blocks::esc as escape;
pub use blocks::{final_message, modal, request_message};

pub const DEFAULT_API_BASE_URL: &str = "https://slack.com/api";
/// The buttons' action ids and the modals' callback ids.
pub const APPROVE: &str = "countersign_approve";
pub const REJECT: &str = "countersign_reject";

/// A Slack message sent for a request, remembered so a decision can update it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PostedMessage {
    pub channel: String,
    pub ts: String,
    pub delivery_id: String,
    pub to: String,
}

collection!(
    /// Slack messages sent for a request: `{request_id}/{delivery_id}`.
    pub(crate) MessageDocs: kinds::SLACK_MESSAGE => PostedMessage
);

/// The Slack app countersign posts as.
#[derive(Clone, PartialEq, Eq)]
pub struct SlackConfig {
    /// The bot token (`xoxb-...`), sent as `Authorization: Bearer`.
    pub bot_token: String,
    /// The app's signing secret, which signs every interactivity request.
    pub signing_secret: String,
    /// Slack's Web API, `https://slack.com/api` unless pointed elsewhere (tests).
    pub api_base_url: String,
    /// Slack user id → countersign dashboard username.
    pub approvers: BTreeMap<String, String>,
}

impl std::fmt::Debug for SlackConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackConfig")
            .field("bot_token", &"***")
            .field("signing_secret", &"***")
            .field("api_base_url", &self.api_base_url)
            .field("approvers", &self.approvers)
            .finish()
    }
}

/// Checks (and trims) `[slack] api_base_url`: Slack's API, or a stand-in on the loopback
/// for tests. The bot token goes there, so anything else must be https.
pub fn check_api_base_url(url: &str) -> Result<String, String> {
    let url = url.trim_end_matches('/').to_string();
    let parsed = reqwest::Url::parse(&url)
        .map_err(|e| format!("[slack] api_base_url {url:?} is not a URL: {e}"))?;
    let loopback = parsed.host_str().is_some_and(crate::hosts::is_loopback);
    if !(parsed.scheme() == "https" || (parsed.scheme() == "http" && loopback)) {
        return Err(format!(
            "[slack] api_base_url {url:?} must be https:// (http:// only on the loopback, for tests): it carries the bot token"
        ));
    }
    Ok(url)
}

/// Whether `to` names a Slack user (`U…` or `W…`) rather than a channel.
pub fn is_user_id(to: &str) -> bool {
    to.len() >= 3
        && (to.starts_with('U') || to.starts_with('W'))
        && to
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

// ---- deliveries -------------------------------------------------------------------------

/// The delivery that updates one posted message (`message_delivery_id` posted it, as
/// `ts` in `channel`) to its request's state: its outcome, or (`progress`: the log
/// index of an approval recorded toward a quorum) how far its quorum has come, each
/// progress its own delivery so that none of them stands in for the final update.
#[allow(clippy::too_many_arguments)]
pub(crate) fn update(
    origin: &str,
    request_id: &str,
    message_delivery_id: &str,
    channel: &str,
    ts: &str,
    event_type: &str,
    progress: Option<u64>,
    now: Timestamp,
) -> Delivery {
    let id = match progress {
        Some(index) => format!("progress.{index}.{request_id}.{message_delivery_id}"),
        None => format!("update.{request_id}.{message_delivery_id}"),
    };
    let mut d = Delivery::new(
        origin,
        id,
        Some(request_id.to_string()),
        event_type,
        DeliveryChannel::SlackUpdate {
            to: channel.to_string(),
        },
        now,
    );
    d.body = Some(json!({"channel": channel, "ts": ts}).to_string());
    d
}

/// Posts a request (or a reminder) and remembers the message so it can be updated.
pub(super) async fn send_post(
    out: &Outbound,
    delivery: &Delivery,
    to: &str,
    reminder: bool,
    later: &mut Vec<Delivery>,
) -> SendResult {
    let Some(config) = &out.config.slack else {
        return Err(permanent("Slack is not configured on this server"));
    };
    let request = out.request(delivery).await?;
    let id = &request.id;
    let now = out.now();
    if request.status != Status::Pending || request.is_past_expiry(now) {
        return Ok(Some(json!({
            "skipped": format!("not posted: the request was already closed ({})", outcome_line(&request)),
        })));
    }
    let mut body = request_message(&request, &out.config.public_url, reminder);
    body["channel"] = json!(to);
    let answer = call(&out.http, config, "chat.postMessage", &body)
        .await
        .map_err(ApiFailure::into_send_error)?;
    let channel = answer
        .get("channel")
        .and_then(Value::as_str)
        .unwrap_or(to)
        .to_string();
    let ts = answer
        .get("ts")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let receipt = json!({"channel": channel, "ts": ts});
    // Remembered before looking at the request again: a decision committed meanwhile is
    // either seen here (and the update planned now) or sees this message when planned.
    let posted = PostedMessage {
        channel: channel.clone(),
        ts: ts.clone(),
        delivery_id: delivery.id.clone(),
        to: to.to_string(),
    };
    match Docs::<MessageDocs>::new(&**out.gate.store())
        .insert(&format!("{id}/{}", delivery.id), None, &posted, now, None)
        .await
    {
        Ok(()) | Err(StoreError::Duplicate(_)) => {}
        Err(e) => tracing::warn!(%e, delivery = %delivery.id, "could not remember a Slack message"),
    }
    if let Ok(Some(current)) = out.gate.store().get_request(id).await
        && current.status.is_final()
    {
        let update = update(
            out.origin(),
            &current.id,
            &delivery.id,
            &channel,
            &ts,
            "request.decided",
            None,
            now,
        );
        later.push(update);
    }
    Ok(Some(receipt))
}

/// Replaces a posted message with the request's outcome.
pub(super) async fn send_update(out: &Outbound, delivery: &Delivery) -> SendResult {
    let Some(config) = &out.config.slack else {
        return Err(permanent("Slack is not configured on this server"));
    };
    let target: Value = delivery
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .ok_or_else(|| permanent("the update names no message"))?;
    let request = out.request(delivery).await?;
    // Still pending (an approval recorded toward a quorum): the request with its
    // buttons and how far it has come; closed: the outcome.
    let mut body = if request.status == countersign_core::Status::Pending {
        request_message(&request, &out.config.public_url, false)
    } else {
        final_message(&request)
    };
    body["channel"] = target["channel"].clone();
    body["ts"] = target["ts"].clone();
    call(&out.http, config, "chat.update", &body)
        .await
        .map_err(ApiFailure::into_send_error)?;
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_are_told_from_channels() {
        assert!(is_user_id("U0123ABC"));
        assert!(is_user_id("W0123ABC"));
        assert!(!is_user_id("C0123ABC"));
        assert!(!is_user_id("#approvals"));
        assert!(!is_user_id("Ualice"));
    }
}
