//! Slack, inbound: `POST /slack/interactivity`, where a click on Approve or Reject (or a
//! dialog's submission) becomes a decision.
//!
//! A click counts only when the request carries a valid `X-Slack-Signature`
//! (`v0=` + hex HMAC-SHA256 of `v0:{timestamp}:{body}` under the app's signing secret,
//! compared in constant time), its timestamp is within five minutes, it was not seen
//! before (Slack retries, replays), and the clicking Slack user is mapped by the operator
//! (`[slack.approvers]`) to an active dashboard account that may decide. The decision is
//! then that account's (`user:<username>`), made through channel `slack` and
//! authenticated by `slack_signature`. Anyone else is told they may not decide.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use countersign_core::{
    ApprovalRequest, AuthMethod, Channel, Decider, DecisionInput, Status, Timestamp, Verdict,
};
use countersign_store::{Docs, StoreError, collection, kinds};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::error::error_response;
use super::{AppState, Channels};
use crate::error::GateError;
use crate::notify::outcome_line;
use crate::notify::slack::{APPROVE, REJECT, SlackConfig, call, modal};

/// Requests older than this (by `X-Slack-Request-Timestamp`) are refused.
pub const MAX_AGE_SECONDS: i64 = 5 * 60;
/// Slack wants an answer within 3 s; past this the work goes on in the background and
/// its outcome is posted to the interaction's `response_url`.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);

/// An interaction already handled.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Seen {
    #[serde(rename = "type")]
    kind: String,
    retry: String,
    at: Timestamp,
}

collection!(
    /// Interactions already handled: `{day}/{sha256 of the interaction's id}`.
    pub(super) SeenDocs: kinds::SLACK_INTERACTION => Seen
);
/// Checks the signature and the timestamp; the reason in words when refused.
pub fn verify(
    signing_secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: Timestamp,
) -> Result<(), &'static str> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timestamp = header("x-slack-request-timestamp").ok_or("no X-Slack-Request-Timestamp")?;
    let sent = header("x-slack-signature").ok_or("no X-Slack-Signature")?;
    let at: i64 = timestamp
        .parse()
        .map_err(|_| "X-Slack-Request-Timestamp is not a number")?;
    // Checked arithmetic: a crafted timestamp (i64::MIN) must not overflow.
    let age = (now.millis() / 1000).checked_sub(at).map(i64::unsigned_abs);
    if age.is_none_or(|age| age > MAX_AGE_SECONDS.unsigned_abs()) {
        return Err("the request is older than 5 minutes (or its clock is off): refused");
    }
    let hex_sig = sent
        .strip_prefix("v0=")
        .ok_or("X-Slack-Signature is not v0=…")?;
    let sent_mac = hex::decode(hex_sig).map_err(|_| "X-Slack-Signature is not hex")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(signing_secret.as_bytes())
        .map_err(|_| "bad signing secret")?;
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    // Constant time.
    mac.verify_slice(&sent_mac)
        .map_err(|_| "the signature does not match (wrong signing secret, or the body was changed)")
}

fn refused(status: StatusCode, message: &str) -> Response {
    error_response(status, "slack_signature", message.to_string())
}

/// A message only the clicking user sees (escaped: it may quote what an agent wrote).
fn ephemeral(text: &str) -> Value {
    let text = crate::notify::slack::escape(text);
    json!({"response_type": "ephemeral", "replace_original": false, "text": text})
}

/// What handling an interaction came to.
enum Answer {
    /// Done; Slack needs only the 200.
    Empty,
    /// Tell the clicking user (ephemeral), in the response and through `response_url`.
    Tell(String),
    /// A modal submission with a problem to show next to an input.
    ModalErrors(Value),
}

/// `POST /slack/interactivity`.
pub(super) async fn interactivity(
    State(state): State<AppState>,
    channels: Option<Extension<Arc<Channels>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(Extension(channels)) = channels else {
        return refused(
            StatusCode::NOT_FOUND,
            "Slack is not configured on this server",
        );
    };
    let Some(config) = channels.config.slack.clone() else {
        return refused(
            StatusCode::NOT_FOUND,
            "Slack is not configured on this server",
        );
    };
    let now = state.gate.clock().now();
    if let Err(why) = verify(&config.signing_secret, &headers, &body, now) {
        tracing::warn!(reason = why, "refused a Slack interactivity request");
        return refused(StatusCode::UNAUTHORIZED, why);
    }
    let form: BTreeMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    if form.contains_key("ssl_check") {
        return StatusCode::OK.into_response();
    }
    let Some(payload) = form
        .get("payload")
        .and_then(|p| serde_json::from_str::<Value>(p).ok())
    else {
        return refused(StatusCode::BAD_REQUEST, "no payload");
    };
    let retry = headers
        .get("x-slack-retry-num")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0")
        .to_string();
    match first_time(&state, &payload, &retry, now).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(retry = %retry, "a Slack interaction arrived again; answered without acting");
            return Json(ephemeral(
                "This click was already received; nothing more was done.",
            ))
            .into_response();
        }
        Err(e) => {
            tracing::error!(%e, "could not record a Slack interaction");
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    let response_url = payload
        .get("response_url")
        .and_then(Value::as_str)
        .filter(|u| response_url_allowed(u, &config))
        .map(str::to_string);
    let work = {
        let state = state.clone();
        let channels = channels.clone();
        let payload = payload.clone();
        tokio::spawn(async move { handle(&state, &channels, &config, &payload).await })
    };
    let answer = match tokio::time::timeout(ANSWER_WITHIN, work).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            tracing::error!(%e, "a Slack interaction failed");
            Answer::Tell("Something went wrong; the server's log has the details.".into())
        }
        Err(elapsed) => {
            // Still working: acknowledge now; `handle` goes on and its outcome is lost
            // only to the clicking user's screen (the message update still comes).
            tracing::warn!(%elapsed, "a Slack interaction took longer than 2.5 s; acknowledged");
            return StatusCode::OK.into_response();
        }
    };
    match answer {
        Answer::Empty => StatusCode::OK.into_response(),
        Answer::ModalErrors(errors) => {
            Json(json!({"response_action": "errors", "errors": errors})).into_response()
        }
        Answer::Tell(text) => {
            let body = ephemeral(&text);
            if let Some(url) = response_url {
                let http = channels.http.clone();
                let message = body.clone();
                tokio::spawn(async move {
                    if let Err(e) = http.post(&url).json(&message).send().await {
                        tracing::warn!(%e, "could not answer through Slack's response_url");
                    }
                });
            }
            Json(body).into_response()
        }
    }
}

/// Slack's `response_url`s live on hooks.slack.com (or, when the Web API is pointed
/// elsewhere, on that host): never post a signed-in answer anywhere else.
fn response_url_allowed(url: &str, config: &SlackConfig) -> bool {
    let origin = |u: &str| {
        reqwest::Url::parse(u).ok().map(|u| {
            (
                u.scheme().to_string(),
                u.host_str().map(str::to_string),
                u.port_or_known_default(),
            )
        })
    };
    url.starts_with("https://hooks.slack.com/")
        || (origin(url).is_some() && origin(url) == origin(&config.api_base_url))
}

/// Records the interaction; false when it was seen before (a retry or a replay).
async fn first_time(
    state: &AppState,
    payload: &Value,
    retry: &str,
    now: Timestamp,
) -> Result<bool, GateError> {
    let kind = payload.get("type").and_then(Value::as_str).unwrap_or("");
    let trigger = payload.get("trigger_id").and_then(Value::as_str);
    let action_ts = payload
        .pointer("/actions/0/action_ts")
        .and_then(Value::as_str);
    let key = match (trigger, action_ts) {
        (Some(t), _) => format!("{kind}:{t}"),
        (None, Some(a)) => format!("{kind}:{a}"),
        (None, None) => format!(
            "payload:{}",
            hex::encode(Sha256::digest(payload.to_string()))
        ),
    };
    let hash = hex::encode(Sha256::digest(key.as_bytes()));
    let day = now.millis().div_euclid(86_400_000);
    let seen = Docs::<SeenDocs>::new(&**state.gate.store());
    // A retry can cross midnight: look in yesterday's too.
    if seen.get(&format!("{}/{hash}", day - 1)).await?.is_some() {
        return Ok(false);
    }
    let record = Seen {
        kind: kind.to_string(),
        retry: retry.to_string(),
        at: now,
    };
    match seen
        .insert(&format!("{day}/{hash}"), None, &record, now, None)
        .await
    {
        Ok(()) => {
            // Timestamps older than 5 minutes are refused, so two days back is history.
            let _ = seen.delete_prefix(&format!("{}/", day - 2)).await;
            Ok(true)
        }
        Err(StoreError::Duplicate(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The countersign account a Slack user is mapped to, if it may decide.
async fn approver_for(
    state: &AppState,
    config: &SlackConfig,
    slack_user: &str,
) -> Result<Option<Decider>, GateError> {
    let Some(username) = config.approvers.get(slack_user) else {
        return Ok(None);
    };
    let decider = state
        .gate
        .accounts()
        .decider(username, AuthMethod::SlackSignature)
        .await?;
    if decider.is_none() {
        tracing::warn!(
            slack_user,
            username,
            "a Slack approver is mapped to no account that may decide"
        );
    }
    Ok(decider)
}

const NOT_AN_APPROVER: &str = "You may not decide this request: your Slack account is not mapped to a countersign approver. Ask an admin to add you to [slack.approvers], or decide in the dashboard.";

async fn handle(
    state: &AppState,
    channels: &Channels,
    config: &SlackConfig,
    payload: &Value,
) -> Answer {
    let kind = payload.get("type").and_then(Value::as_str).unwrap_or("");
    let user = payload
        .pointer("/user/id")
        .and_then(Value::as_str)
        .unwrap_or("");
    match kind {
        "block_actions" => {
            let action = payload
                .pointer("/actions/0/action_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let id = payload
                .pointer("/actions/0/value")
                .and_then(Value::as_str)
                .unwrap_or("");
            if action != APPROVE && action != REJECT {
                return Answer::Empty;
            }
            click(state, channels, config, payload, user, action, id).await
        }
        "view_submission" => {
            let callback = payload
                .pointer("/view/callback_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let meta: Value = payload
                .pointer("/view/private_metadata")
                .and_then(Value::as_str)
                .and_then(|m| serde_json::from_str(m).ok())
                .unwrap_or(Value::Null);
            let id = meta.get("request_id").and_then(Value::as_str).unwrap_or("");
            if callback != APPROVE && callback != REJECT {
                return Answer::Empty;
            }
            submit(state, config, payload, user, callback, id).await
        }
        _ => Answer::Empty,
    }
}

fn closed_text(request: &ApprovalRequest) -> String {
    format!("This request is already closed: {}.", outcome_line(request))
}

fn error_text(err: &GateError) -> String {
    match err {
        GateError::Core(countersign_core::CoreError::AlreadyDecided { .. }) => {
            format!("Someone decided first: {}", err.public_message())
        }
        other => format!("Not decided: {}", other.public_message()),
    }
}

#[allow(clippy::too_many_arguments)]
async fn click(
    state: &AppState,
    channels: &Channels,
    config: &SlackConfig,
    payload: &Value,
    user: &str,
    action: &str,
    id: &str,
) -> Answer {
    let decider = match approver_for(state, config, user).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            tracing::info!(
                slack_user = user,
                request = id,
                "a Slack user who is not an approver clicked"
            );
            return Answer::Tell(NOT_AN_APPROVER.into());
        }
        Err(e) => return Answer::Tell(error_text(&e)),
    };
    let request = match state.gate.get(decider.principal(), id).await {
        Ok(r) => r,
        Err(e) => return Answer::Tell(error_text(&e)),
    };
    if request.status != Status::Pending {
        return Answer::Tell(closed_text(&request));
    }
    if action == APPROVE && request.requested_fields.is_empty() {
        return match state
            .gate
            .decide(
                &decider,
                id,
                Verdict::Approved,
                DecisionInput::default(),
                Channel::Slack,
            )
            .await
        {
            Ok(_) => Answer::Empty,
            Err(GateError::Core(countersign_core::CoreError::AlreadyDecided { .. })) => {
                match state.gate.get(decider.principal(), id).await {
                    Ok(r) => Answer::Tell(closed_text(&r)),
                    Err(e) => Answer::Tell(error_text(&e)),
                }
            }
            Err(e) => Answer::Tell(error_text(&e)),
        };
    }
    // Reject asks for a reason; an approval that needs reply fields asks for them.
    let Some(trigger) = payload.get("trigger_id").and_then(Value::as_str) else {
        return Answer::Tell("Slack sent no trigger_id, so the dialog cannot open.".into());
    };
    let view = modal(&request, action);
    match call(
        &channels.http,
        config,
        "views.open",
        &json!({"trigger_id": trigger, "view": view}),
    )
    .await
    {
        Ok(_) => Answer::Empty,
        Err(e) => {
            tracing::warn!(error = %e.message, "could not open a Slack dialog");
            Answer::Tell(format!("Could not open the dialog: {}", e.message))
        }
    }
}

/// The dialog a Reject click (a reason) or an Approve with reply fields opens.
async fn submit(
    state: &AppState,
    config: &SlackConfig,
    payload: &Value,
    user: &str,
    callback: &str,
    id: &str,
) -> Answer {
    let first_block = if callback == REJECT {
        "reason"
    } else {
        "comment"
    };
    let problem = |text: String| Answer::ModalErrors(json!({ first_block: text }));
    let decider = match approver_for(state, config, user).await {
        Ok(Some(d)) => d,
        Ok(None) => return problem(NOT_AN_APPROVER.into()),
        Err(e) => return problem(error_text(&e)),
    };
    let values = payload
        .pointer("/view/state/values")
        .cloned()
        .unwrap_or(Value::Null);
    let value = |block: &str, action: &str| {
        values
            .pointer(&format!(
                "/{}/{}/value",
                block.replace('~', "~0").replace('/', "~1"),
                action
            ))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (verdict, input) = if callback == REJECT {
        let Some(reason) = value("reason", "reason") else {
            return problem("Give a reason: the agent sees it.".into());
        };
        (
            Verdict::Rejected,
            DecisionInput {
                comment: Some(reason),
                ..DecisionInput::default()
            },
        )
    } else {
        let request = match state.gate.get(decider.principal(), id).await {
            Ok(r) => r,
            Err(e) => return problem(error_text(&e)),
        };
        let mut fields = BTreeMap::new();
        for field in &request.requested_fields {
            match value(&format!("field:{field}"), "value") {
                Some(v) => {
                    fields.insert(field.clone(), v);
                }
                None => {
                    return Answer::ModalErrors(
                        json!({ format!("field:{field}"): "Required to approve." }),
                    );
                }
            }
        }
        (
            Verdict::Approved,
            DecisionInput {
                comment: value("comment", "comment"),
                fields,
            },
        )
    };
    match state
        .gate
        .decide(&decider, id, verdict, input, Channel::Slack)
        .await
    {
        Ok(_) => Answer::Empty,
        Err(e) => problem(error_text(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `X-Slack-Signature` for a request.
    fn signature(signing_secret: &str, timestamp: &str, body: &[u8]) -> String {
        let mut mac = match Hmac::<Sha256>::new_from_slice(signing_secret.as_bytes()) {
            Ok(mac) => mac,
            Err(_) => return String::new(),
        };
        mac.update(b"v0:");
        mac.update(timestamp.as_bytes());
        mac.update(b":");
        mac.update(body);
        format!("v0={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn signs_like_slacks_documented_example() {
        // The example from Slack's "Verifying requests from Slack" guide.
        let secret = "8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            signature(secret, "1531420618", body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-slack-request-timestamp", "1531420618".parse().unwrap());
        headers.insert(
            "x-slack-signature",
            signature(secret, "1531420618", body).parse().unwrap(),
        );
        let at = Timestamp::from_millis(1_531_420_618_000 + 60_000).unwrap();
        assert!(verify(secret, &headers, body, at).is_ok());
        let late = Timestamp::from_millis(1_531_420_618_000 + 301_000).unwrap();
        assert!(verify(secret, &headers, body, late).is_err());
        assert!(verify("another secret", &headers, body, at).is_err());
        assert!(verify(secret, &headers, b"token=changed", at).is_err());
    }

    #[test]
    fn crafted_timestamps_are_refused_without_overflow() {
        let secret = "s";
        for timestamp in [
            i64::MIN.to_string(),
            i64::MAX.to_string(),
            (i64::MIN + 1).to_string(),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert("x-slack-request-timestamp", timestamp.parse().unwrap());
            headers.insert(
                "x-slack-signature",
                signature(secret, &timestamp, b"x").parse().unwrap(),
            );
            let now = Timestamp::from_millis(1_700_000_000_000).unwrap();
            assert_eq!(
                verify(secret, &headers, b"x", now),
                Err("the request is older than 5 minutes (or its clock is off): refused"),
                "{timestamp}"
            );
        }
    }
}
