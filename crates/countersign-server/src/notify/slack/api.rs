//! Slack's Web API: one call with its errors in words, and which of them a retry can fix.

use serde_json::{Value, json};

use super::SlackConfig;
use crate::notify::permanent;

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
