//! Slack: requests posted with `chat.postMessage` as Block Kit messages with Approve and
//! Reject buttons, updated with `chat.update` once decided, and the interactivity
//! endpoint (`POST /slack/interactivity`) that turns a click into a decision.
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
    ApprovalRequest, AuthMethod, Channel, DecisionInput, Status, Timestamp, Verdict,
};
use countersign_store::{Doc, StoreError};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Channels, Delivery, Notifier, SendResult, permanent};
use crate::AppState;
use crate::error::GateError;
use crate::gate::Decider;

pub const DEFAULT_API_BASE_URL: &str = "https://slack.com/api";
/// The buttons' action ids and the modals' callback ids.
pub const APPROVE: &str = "countersign_approve";
pub const REJECT: &str = "countersign_reject";
/// Slack messages sent for a request: `{request_id}/{delivery_id}` → channel and ts.
pub(crate) const MESSAGE: &str = "slack.message";
/// Interactions already handled: `{day}/{sha256 of the interaction's id}`.
const SEEN: &str = "slack.interaction";
/// Requests older than this (by `X-Slack-Request-Timestamp`) are refused.
pub const MAX_AGE_SECONDS: i64 = 5 * 60;
/// Slack wants an answer within 3 s; past this the work goes on in the background and
/// its outcome is posted to the interaction's `response_url`.
const ANSWER_WITHIN: Duration = Duration::from_millis(2500);

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

/// Whether `to` names a Slack user (`U…` or `W…`) rather than a channel.
pub fn is_user_id(to: &str) -> bool {
    to.len() >= 3
        && (to.starts_with('U') || to.starts_with('W'))
        && to
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

// ---- the Web API ------------------------------------------------------------------------

/// A failed Web API call.
#[derive(Debug, Clone)]
pub struct ApiFailure {
    pub message: String,
    /// Retrying cannot help (an unknown channel, a revoked token, a missing scope).
    pub permanent: bool,
}

impl ApiFailure {
    fn transient(message: String) -> Self {
        Self {
            message,
            permanent: false,
        }
    }

    /// As a delivery error: permanent ones are marked so the outbox gives up at once.
    pub fn into_send_error(self) -> String {
        if self.permanent {
            permanent(self.message)
        } else {
            self.message
        }
    }
}

/// Slack's error codes that a later retry may not see.
fn is_transient_code(code: &str) -> bool {
    matches!(
        code,
        "ratelimited"
            | "rate_limited"
            | "internal_error"
            | "fatal_error"
            | "service_unavailable"
            | "request_timeout"
            | "team_added_to_org"
    )
}

/// What a Slack error code means, in words, where it is not obvious.
fn explain(code: &str) -> &'static str {
    match code {
        "channel_not_found" => {
            " (no such channel or user, or the app cannot see it: invite the app to the channel)"
        }
        "not_in_channel" => " (invite the app to the channel)",
        "invalid_auth" | "not_authed" => " (the bot token is wrong: check [slack] bot_token)",
        "token_revoked" | "account_inactive" => " (the bot token was revoked: reinstall the app)",
        "missing_scope" => " (the app lacks a scope: add chat:write and reinstall)",
        "is_archived" => " (the channel is archived)",
        _ => "",
    }
}

/// An error and what lies beneath it ("connection refused" rather than "error sending
/// request").
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// Calls a Web API method with a JSON body; `Ok` holds Slack's answer (`ok: true`).
pub async fn call(
    http: &reqwest::Client,
    config: &SlackConfig,
    method: &str,
    body: &Value,
) -> Result<Value, ApiFailure> {
    let url = format!("{}/{method}", config.api_base_url.trim_end_matches('/'));
    let response = http
        .post(&url)
        .bearer_auth(&config.bot_token)
        .header("content-type", "application/json; charset=utf-8")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| {
            ApiFailure::transient(format!(
                "could not reach Slack at {url}: {}",
                with_causes(&e)
            ))
        })?;
    let status = response.status();
    if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        return Err(ApiFailure::transient(format!(
            "Slack rate-limited {method}; will retry"
        )));
    }
    if !status.is_success() {
        return Err(ApiFailure {
            message: format!("Slack answered {method} with HTTP {status}"),
            permanent: status.is_client_error() && status != reqwest::StatusCode::REQUEST_TIMEOUT,
        });
    }
    let answer: Value = response.json().await.map_err(|e| {
        ApiFailure::transient(format!("Slack's answer to {method} is not JSON: {e}"))
    })?;
    if answer.get("ok").and_then(Value::as_bool) == Some(true) {
        return Ok(answer);
    }
    let code = answer
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("unknown_error")
        .to_string();
    Err(ApiFailure {
        message: format!("Slack refused {method}: {code}{}", explain(&code)),
        permanent: !is_transient_code(&code),
    })
}

/// `auth.test`: whether the bot token works, and as whom.
pub async fn auth_test(http: &reqwest::Client, config: &SlackConfig) -> Result<String, String> {
    let answer = call(http, config, "auth.test", &json!({}))
        .await
        .map_err(|e| e.message)?;
    let field = |name: &str| {
        answer
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    Ok(format!(
        "the bot token works: workspace {} as {}",
        field("team"),
        field("user")
    ))
}

// ---- messages ---------------------------------------------------------------------------

/// Escapes text for Slack's mrkdwn.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// At most `max` characters, with an ellipsis when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A time Slack shows in the reader's own time zone.
fn slack_date(at: Timestamp) -> String {
    format!(
        "<!date^{}^{{date_short_pretty}} at {{time}}|{}>",
        at.millis() / 1000,
        at
    )
}

fn plain(text: &str) -> Value {
    json!({"type": "plain_text", "text": text, "emoji": false})
}

fn mrkdwn(text: &str) -> Value {
    json!({"type": "mrkdwn", "text": text})
}

/// The description and every detail (as fields, ten to a section).
fn action_blocks(request: &ApprovalRequest) -> Vec<Value> {
    let mut blocks = vec![json!({
        "type": "section",
        "block_id": "description",
        "text": mrkdwn(&cut(&format!("*{}*", esc(&request.action.description)), 3000)),
    })];
    let fields: Vec<Value> = request
        .action
        .details
        .iter()
        .map(|(k, v)| mrkdwn(&cut(&format!("*{}*\n{}", esc(k), esc(v)), 2000)))
        .collect();
    for (i, chunk) in fields.chunks(10).take(40).enumerate() {
        blocks
            .push(json!({"type": "section", "block_id": format!("details_{i}"), "fields": chunk}));
    }
    blocks
}

fn requester(request: &ApprovalRequest) -> String {
    let by = &request.requested_by;
    format!("*{}* (`{}`)", esc(&by.display_name), esc(&by.id))
}

/// The message asking for a decision, with Approve and Reject buttons.
pub fn request_message(request: &ApprovalRequest, public_url: &str, reminder: bool) -> Value {
    let title = if reminder {
        "Reminder: approval still needed"
    } else {
        "Approval needed"
    };
    let link = format!(
        "{}/requests/{}",
        public_url.trim_end_matches('/'),
        request.id
    );
    let mut blocks = vec![json!({"type": "header", "text": plain(title)})];
    blocks.extend(action_blocks(request));
    if !request.requested_fields.is_empty() {
        blocks.push(json!({
            "type": "context",
            "elements": [mrkdwn(&format!(
                "Approving asks for: {}",
                request.requested_fields.iter().map(|f| format!("`{}`", esc(f))).collect::<Vec<_>>().join(", ")
            ))],
        }));
    }
    blocks.push(json!({
        "type": "context",
        "elements": [mrkdwn(&format!(
            "Asked by {} · expires {} (not approved unless someone approves) · `{}`",
            requester(request),
            slack_date(request.expires_at),
            request.id
        ))],
    }));
    blocks.push(json!({
        "type": "actions",
        "block_id": "decision",
        "elements": [
            {
                "type": "button",
                "action_id": APPROVE,
                "text": plain("Approve"),
                "style": "primary",
                "value": request.id,
                "confirm": {
                    "title": plain("Approve this?"),
                    "text": mrkdwn(&cut(&format!("Approve *{}*?", esc(&request.action.description)), 300)),
                    "confirm": plain("Approve"),
                    "deny": plain("Cancel"),
                },
            },
            {
                "type": "button",
                "action_id": REJECT,
                "text": plain("Reject"),
                "style": "danger",
                "value": request.id,
            },
        ],
    }));
    blocks.push(json!({
        "type": "context",
        "elements": [mrkdwn(&format!("<{link}|Open in the countersign dashboard>"))],
    }));
    json!({
        "text": cut(&format!("{title}: {}", request.action.description), 3000),
        "blocks": blocks,
        "unfurl_links": false,
        "unfurl_media": false,
    })
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

fn verdict_word(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "Approved",
        Verdict::Rejected => "Rejected",
    }
}

/// The message once the request is closed: who decided and when, no buttons.
pub fn final_message(request: &ApprovalRequest) -> Value {
    let title = match request.status {
        Status::Approved => "Approved",
        Status::Rejected => "Rejected",
        Status::TimedOut => "Timed out: not approved",
        Status::Cancelled => "Cancelled",
        Status::Pending => "Approval needed",
    };
    let mut blocks = vec![json!({"type": "header", "text": plain(title)})];
    blocks.extend(action_blocks(request));
    let mut line = match (&request.status, &request.decision) {
        (Status::Approved | Status::Rejected, Some(d)) => {
            let who = d
                .approvers
                .iter()
                .map(|a| format!("*{}* via {}", esc(&a.display_name), a.channel.as_str()))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "{} by {who} {}",
                verdict_word(d.decision),
                slack_date(d.decided_at)
            )
        }
        _ => esc(&outcome_line(request)),
    };
    if let Some(d) = &request.decision {
        if let Some(comment) = d.comment.as_deref().filter(|c| !c.is_empty()) {
            line.push_str(&format!("\n> {}", esc(comment).replace('\n', "\n> ")));
        }
        for (k, v) in &d.fields {
            line.push_str(&format!("\n*{}*: {}", esc(k), esc(v)));
        }
    }
    blocks
        .push(json!({"type": "section", "block_id": "outcome", "text": mrkdwn(&cut(&line, 3000))}));
    blocks.push(json!({
        "type": "context",
        "elements": [mrkdwn(&format!("Asked by {} · `{}`", requester(request), request.id))],
    }));
    json!({
        "text": cut(&format!("{title}: {}", request.action.description), 3000),
        "blocks": blocks,
    })
}

// ---- deliveries -------------------------------------------------------------------------

fn store_failure(e: impl std::fmt::Display) -> String {
    format!("could not read the request: {e}")
}

/// Posts a request (or a reminder) and remembers the message so it can be updated.
pub(super) async fn send_post(
    notifier: &Notifier,
    delivery: &Delivery,
    to: &str,
    reminder: bool,
) -> SendResult {
    let Some(config) = &notifier.config.slack else {
        return Err(permanent("Slack is not configured on this server"));
    };
    let Some(id) = &delivery.subject else {
        return Err(permanent("the delivery names no request"));
    };
    let request = notifier
        .gate
        .store()
        .get_request(id)
        .await
        .map_err(store_failure)?
        .ok_or_else(|| permanent(format!("request {id} does not exist")))?;
    let now = notifier.now();
    if request.status != Status::Pending || request.is_past_expiry(now) {
        return Ok(Some(json!({
            "skipped": format!("not posted: the request was already closed ({})", outcome_line(&request)),
        })));
    }
    let mut body = request_message(&request, &notifier.config.public_url, reminder);
    body["channel"] = json!(to);
    let answer = call(&notifier.http, config, "chat.postMessage", &body)
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
    let doc = Doc {
        kind: MESSAGE.into(),
        id: format!("{id}/{}", delivery.id),
        version: 1,
        key: None,
        body: json!({"channel": channel, "ts": ts, "delivery_id": delivery.id, "to": to}),
        updated_at: now,
    };
    match notifier.gate.store().doc_insert(&doc, None).await {
        Ok(()) | Err(StoreError::Duplicate(_)) => {}
        Err(e) => tracing::warn!(%e, delivery = %delivery.id, "could not remember a Slack message"),
    }
    if let Ok(Some(current)) = notifier.gate.store().get_request(id).await
        && current.status.is_final()
    {
        let update = super::plan::slack_update(
            &notifier.gate,
            &current.id,
            &delivery.id,
            &channel,
            &ts,
            "request.decided",
            now,
        );
        if let Err(e) = notifier.insert(&update).await {
            tracing::warn!(%e, "could not plan a Slack update");
        }
    }
    Ok(Some(receipt))
}

/// Replaces a posted message with the request's outcome.
pub(super) async fn send_update(notifier: &Notifier, delivery: &Delivery) -> SendResult {
    let Some(config) = &notifier.config.slack else {
        return Err(permanent("Slack is not configured on this server"));
    };
    let target: Value = delivery
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .ok_or_else(|| permanent("the update names no message"))?;
    let Some(id) = &delivery.subject else {
        return Err(permanent("the delivery names no request"));
    };
    let request = notifier
        .gate
        .store()
        .get_request(id)
        .await
        .map_err(store_failure)?
        .ok_or_else(|| permanent(format!("request {id} does not exist")))?;
    let mut body = final_message(&request);
    body["channel"] = target["channel"].clone();
    body["ts"] = target["ts"].clone();
    call(&notifier.http, config, "chat.update", &body)
        .await
        .map_err(ApiFailure::into_send_error)?;
    Ok(Some(target))
}

// ---- interactivity ------------------------------------------------------------------------

/// The `X-Slack-Signature` for a request.
pub fn signature(signing_secret: &str, timestamp: &str, body: &[u8]) -> String {
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
    if (now.millis() / 1000 - at).abs() > MAX_AGE_SECONDS {
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
    (
        status,
        Json(json!({"error": {"code": "slack_signature", "message": message}})),
    )
        .into_response()
}

/// A message only the clicking user sees.
fn ephemeral(text: &str) -> Value {
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
pub async fn interactivity(
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
    let store = state.gate.store();
    // A retry can cross midnight: look in yesterday's too.
    if store
        .doc_get(SEEN, &format!("{}/{hash}", day - 1))
        .await?
        .is_some()
    {
        return Ok(false);
    }
    let doc = Doc {
        kind: SEEN.into(),
        id: format!("{day}/{hash}"),
        version: 1,
        key: None,
        body: json!({"type": kind, "retry": retry, "at": now}),
        updated_at: now,
    };
    match store.doc_insert(&doc, None).await {
        Ok(()) => {
            // Timestamps older than 5 minutes are refused, so two days back is history.
            let _ = store
                .doc_delete_prefix(SEEN, &format!("{}/", day - 2))
                .await;
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
    let Some(user) = state.gate.accounts().user_by_name(username).await? else {
        tracing::warn!(
            slack_user,
            username,
            "a Slack approver is mapped to no account"
        );
        return Ok(None);
    };
    if !user.is_active() || !user.role.may_decide() {
        return Ok(None);
    }
    Ok(Decider::new(
        user.principal()
            .authenticated_by(AuthMethod::SlackSignature),
    )
    .ok())
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
pub fn modal(request: &ApprovalRequest, action: &str) -> Value {
    let meta = json!({"request_id": request.id}).to_string();
    let mut blocks = vec![json!({
        "type": "section",
        "text": mrkdwn(&cut(&format!("*{}*", esc(&request.action.description)), 3000)),
    })];
    if action == REJECT {
        blocks.push(json!({
            "type": "input",
            "block_id": "reason",
            "label": plain("Why are you rejecting it?"),
            "element": {"type": "plain_text_input", "action_id": "reason", "multiline": true, "max_length": 2000},
        }));
    } else {
        for field in &request.requested_fields {
            blocks.push(json!({
                "type": "input",
                "block_id": format!("field:{field}"),
                "label": plain(&cut(field, 150)),
                "element": {"type": "plain_text_input", "action_id": "value"},
            }));
        }
        blocks.push(json!({
            "type": "input",
            "block_id": "comment",
            "optional": true,
            "label": plain("Comment"),
            "element": {"type": "plain_text_input", "action_id": "comment", "multiline": true},
        }));
    }
    let (title, submit) = if action == REJECT {
        ("Reject request", "Reject")
    } else {
        ("Approve request", "Approve")
    };
    json!({
        "type": "modal",
        "callback_id": action,
        "private_metadata": meta,
        "title": plain(title),
        "submit": plain(submit),
        "close": plain("Cancel"),
        "blocks": blocks,
    })
}

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
    fn user_ids_are_told_from_channels() {
        assert!(is_user_id("U0123ABC"));
        assert!(is_user_id("W0123ABC"));
        assert!(!is_user_id("C0123ABC"));
        assert!(!is_user_id("#approvals"));
        assert!(!is_user_id("Ualice"));
    }

    #[test]
    fn escapes_mrkdwn_and_cuts_long_text() {
        assert_eq!(esc("<@U1> & co"), "&lt;@U1&gt; &amp; co");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
