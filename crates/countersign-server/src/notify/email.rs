//! Email over SMTP (lettre, rustls): a readable HTML and text message with the action,
//! every detail, who asked, the expiry and a link to decide, and follow-ups when the
//! request is decided, times out or is cancelled.
//!
//! Links are scanner-safe: following one never decides anything. The plain link opens
//! the request in the dashboard, where a signed-in approver decides with a POST. When
//! the operator turns on `token_decisions`, the email instead links to
//! `/email/decide#t=<token>`: a one-time token, bound to the request and to the approver
//! the address is mapped to, valid for `token_minutes`. It travels in the URL fragment,
//! which browsers never send to a server or in a Referer, and only its SHA-256 is
//! stored. The page shows the request (a POST that changes nothing) and decides only
//! when the approver clicks Confirm (a POST carrying the token, which it consumes).
//!
//! The SMTP URL: `smtps://host[:port]` (TLS from the first byte, port 465 by default),
//! `smtp://host[:port]?tls=starttls` (STARTTLS required, port 587 by default), or plain
//! `smtp://host[:port]` (port 25), which is refused unless the host is the loopback
//! (a local relay).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::token::hash_token;
use countersign_core::{ApprovalRequest, AuthMethod, Channel, DecisionInput, Status, Timestamp};
use countersign_store::{Doc, StoreError};
use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Channels, Delivery, Notifier, SendResult, permanent};
use crate::AppState;
use crate::error::GateError;
use crate::gate::{Decider, Gate};
use crate::mcp::parse_decision;
use crate::rest::{ApiError, ApiJson};
use crate::views::{ApprovalView, DecisionBody};

/// One-time decision tokens: `{request_id}/{random}`, keyed by the token's SHA-256.
const TOKEN: &str = "email.token";
/// Addresses emailed about a request (for follow-ups): `{request_id}/{address}`.
pub(crate) const SENT: &str = "email.sent";

/// How the connection to the SMTP server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// No TLS: only to a relay on the loopback.
    Plain,
    /// Plain first, then STARTTLS, which must succeed before anything is sent.
    StartTls,
    /// TLS from the first byte (SMTPS).
    Tls,
}

/// A parsed `smtp_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpUrl {
    pub host: String,
    pub port: u16,
    pub security: Security,
}

impl SmtpUrl {
    /// Parses `smtps://host[:port]`, `smtp://host[:port]?tls=starttls` or (loopback only)
    /// `smtp://host[:port]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("smtp_url {url:?} must start with smtps:// or smtp://"))?;
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.trim_end_matches('/');
        if authority.contains('@') {
            return Err(format!(
                "smtp_url {:?} carries credentials: give them as [email] username and password (or password_file)",
                crate::notify::email::redact_userinfo(url)
            ));
        }
        if authority.contains('/') {
            return Err(format!("smtp_url {url:?} must not have a path"));
        }
        let starttls = match query {
            None | Some("") => false,
            Some("tls=starttls") => true,
            Some(other) => {
                return Err(format!(
                    "smtp_url {url:?}: unknown option {other:?} (the only one is tls=starttls)"
                ));
            }
        };
        let security = match (scheme, starttls) {
            ("smtps", false) => Security::Tls,
            ("smtps", true) => {
                return Err(format!(
                    "smtp_url {url:?}: smtps:// is TLS already; use smtp://…?tls=starttls for STARTTLS"
                ));
            }
            ("smtp", true) => Security::StartTls,
            ("smtp", false) => Security::Plain,
            _ => {
                return Err(format!(
                    "smtp_url {url:?} must start with smtps:// or smtp://"
                ));
            }
        };
        let (host, port) = split_host_port(authority)
            .ok_or_else(|| format!("smtp_url {url:?} has no valid host[:port]"))?;
        let port = port.unwrap_or(match security {
            Security::Plain => 25,
            Security::StartTls => 587,
            Security::Tls => 465,
        });
        if security == Security::Plain && !is_loopback(&host) {
            return Err(format!(
                "smtp_url {url:?} would send mail (and any password) unencrypted over the network; use smtps://{host} (TLS, port 465) or smtp://{host}:587?tls=starttls. Plain smtp:// is only allowed to a relay on the loopback (127.0.0.1, ::1, localhost)"
            ));
        }
        Ok(Self {
            host,
            port,
            security,
        })
    }

    /// For messages: the URL without secrets, and how it is protected.
    pub fn describe(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.security {
            Security::Plain => format!("smtp://{host}:{} (plain, loopback)", self.port),
            Security::StartTls => format!("smtp://{host}:{} (STARTTLS)", self.port),
            Security::Tls => format!("smtps://{host}:{} (TLS)", self.port),
        }
    }
}

fn redact_userinfo(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_string(),
    }
}

fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse().ok()?)),
        None => (authority, None),
    };
    if host.is_empty() || host.contains(':') {
        return None;
    }
    Some((host.to_ascii_lowercase(), port))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// How long an emailed decision token works unless configured otherwise.
pub const DEFAULT_TOKEN_MINUTES: u64 = 30;
/// Whether follow-up emails are sent unless configured otherwise.
pub const DEFAULT_FOLLOW_UPS: bool = true;

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

/// Whether `address` is a valid mailbox (`a@b.c` or `Name <a@b.c>`).
pub fn check_address(address: &str) -> Result<(), String> {
    address
        .parse::<Mailbox>()
        .map(|_| ())
        .map_err(|e| format!("{address:?} is not an email address: {e}"))
}

/// Reads `[email] ca_file`: PEM with at least one certificate, which the SMTP server's
/// certificate may chain to besides the Mozilla roots.
pub fn load_ca_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("[email] ca_file {}: cannot read it: {e}", path.display()))?;
    let count = pem
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .filter(|w| *w == b"-----BEGIN CERTIFICATE-----")
        .count();
    if count == 0 {
        return Err(format!(
            "[email] ca_file {}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Certificate::from_pem(&pem).map_err(|e| format!("[email] ca_file {}: {e}", path.display()))?;
    Ok(pem)
}

fn transport(
    config: &EmailConfig,
    timeout: Duration,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let host = config.smtp.host.as_str();
    let setup = |e: lettre::transport::smtp::Error| format!("TLS setup for {host}: {e}");
    let mut builder = match config.smtp.security {
        Security::Plain => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host),
        Security::StartTls => {
            AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(host).map_err(setup)?
        }
        Security::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(host).map_err(setup)?,
    };
    // A private CA: the same TLS mode, with its certificates trusted besides the roots.
    let tls: Option<fn(TlsParameters) -> Tls> = match config.smtp.security {
        Security::Plain => None,
        Security::StartTls => Some(Tls::Required),
        Security::Tls => Some(Tls::Wrapper),
    };
    if let (Some(pem), Some(tls)) = (&config.extra_roots, tls) {
        let parameters = TlsParameters::builder(host.to_string())
            .add_root_certificate(Certificate::from_pem(pem).map_err(setup)?)
            .build()
            .map_err(setup)?;
        builder = builder.tls(tls(parameters));
    }
    let mut builder = builder.port(config.smtp.port).timeout(Some(timeout));
    if let Some(user) = &config.username {
        builder = builder.credentials(Credentials::new(
            user.clone(),
            config.password.clone().unwrap_or_default(),
        ));
    }
    Ok(builder.build())
}

/// An SMTP error in words, with what lies beneath it.
fn words(config: &EmailConfig, err: &lettre::transport::smtp::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    let hint = if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        " (the server's certificate is not trusted: if it comes from a private CA, give that \
         CA's certificate as [email] ca_file)"
    } else if err.is_tls() {
        " (TLS failed: is the port right for this URL form, and does the certificate match the host?)"
    } else if err.is_permanent() && text.contains("535") {
        " (the server refused the username or password)"
    } else if err.is_timeout() {
        " (no answer in time)"
    } else {
        ""
    };
    format!("{}: {text}{hint}", config.smtp.describe())
}

/// Connects (and, with credentials, authenticates) without sending anything.
pub async fn test_connection(config: &EmailConfig) -> Result<(), String> {
    let transport = transport(config, Duration::from_secs(15))?;
    match transport.test_connection().await {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "{} accepted the connection but did not answer NOOP",
            config.smtp.describe()
        )),
        Err(e) => Err(words(config, &e)),
    }
}

async fn deliver(config: &EmailConfig, message: Message, timeout: Duration) -> Result<(), String> {
    let transport = transport(config, timeout)?;
    match transport.send(message).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_permanent() => Err(permanent(words(config, &e))),
        Err(e) => Err(words(config, &e)),
    }
}

/// A plain test message (`countersign send-test-email`).
pub async fn send_test(config: &EmailConfig, to: &str, public_url: &str) -> Result<(), String> {
    let text = format!(
        "This is a test message from countersign at {public_url}.\n\nIf you can read it, countersign can send approval requests by email through {}.\n",
        config.smtp.describe()
    );
    let html = format!(
        "<p>This is a test message from countersign at {}.</p><p>If you can read it, countersign can send approval requests by email through {}.</p>",
        html_esc(public_url),
        html_esc(&config.smtp.describe())
    );
    let message = build(config, to, "countersign test message", None, text, html)?;
    deliver(config, message, Duration::from_secs(15)).await
}

fn build(
    config: &EmailConfig,
    to: &str,
    subject: &str,
    message_id: Option<String>,
    text: String,
    html: String,
) -> Result<Message, String> {
    let from: Mailbox = config
        .from
        .parse()
        .map_err(|e| permanent(format!("[email] from {:?}: {e}", config.from)))?;
    let to: Mailbox = to
        .parse()
        .map_err(|e| permanent(format!("{to:?} is not an email address: {e}")))?;
    let domain = from.email.domain().to_string();
    Message::builder()
        .from(from)
        .to(to)
        .subject(subject)
        .message_id(message_id.map(|id| format!("<{id}@{domain}>")))
        .header(AutoSubmitted)
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| permanent(format!("could not build the message: {e}")))
}

/// `Auto-Submitted: auto-generated` (RFC 3834), so auto-responders stay quiet.
#[derive(Clone)]
struct AutoSubmitted;

impl lettre::message::header::Header for AutoSubmitted {
    fn name() -> lettre::message::header::HeaderName {
        lettre::message::header::HeaderName::new_from_ascii_str("Auto-Submitted")
    }
    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self)
    }
    fn display(&self) -> lettre::message::header::HeaderValue {
        lettre::message::header::HeaderValue::new(Self::name(), "auto-generated".into())
    }
}

// ---- the message ------------------------------------------------------------------------

fn html_esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut out: String = flat.chars().take(max - 1).collect();
        out.push('…');
        out
    }
}

/// A one-time decision link.
pub struct TokenLink {
    pub url: String,
    pub expires_at: Timestamp,
}

/// Subject, text and HTML of an email about `request`. `ask`: a request for a decision
/// (or a reminder); otherwise a follow-up saying how it ended.
pub fn compose(
    request: &ApprovalRequest,
    public_url: &str,
    ask: bool,
    reminder: bool,
    token: Option<&TokenLink>,
) -> (String, String, String) {
    let dashboard = format!(
        "{}/requests/{}",
        public_url.trim_end_matches('/'),
        request.id
    );
    let outcome = super::slack::outcome_line(request);
    let title = if ask {
        if reminder {
            "Reminder: approval still needed"
        } else {
            "Approval needed"
        }
    } else {
        match request.status {
            Status::Approved => "Approved",
            Status::Rejected => "Rejected",
            Status::TimedOut => "Timed out (not approved)",
            Status::Cancelled => "Cancelled",
            Status::Pending => "Update",
        }
    };
    let subject = format!("{title}: {}", one_line(&request.action.description, 120));
    let by = &request.requested_by;
    let asked_by = format!("{} ({})", by.display_name, by.id);

    let mut text = format!("{title}\n\n{}\n\n", request.action.description);
    for (k, v) in &request.action.details {
        text.push_str(&format!("  {k}: {v}\n"));
    }
    text.push_str(&format!(
        "\nAsked by: {asked_by}\nRequested at: {}\nExpires at: {} (not approved unless someone approves it by then)\nRequest: {}\n",
        request.requested_at, request.expires_at, request.id
    ));
    if !request.requested_fields.is_empty() {
        text.push_str(&format!(
            "Approving asks for: {}\n",
            request.requested_fields.join(", ")
        ));
    }
    if !ask {
        text.push_str(&format!("\n{outcome}\n"));
        if let Some(comment) = request.decision.as_ref().and_then(|d| d.comment.as_deref()) {
            text.push_str(&format!("Comment: {comment}\n"));
        }
    }
    text.push('\n');
    match (ask, token) {
        (true, Some(link)) => text.push_str(&format!(
            "Review and decide (opening the link decides nothing; you confirm on the page). The link works once, until {}:\n{}\n\nOr sign in to the dashboard:\n{dashboard}\n",
            link.expires_at, link.url
        )),
        (true, None) => text.push_str(&format!(
            "Review and decide in the dashboard (sign in; opening the link decides nothing):\n{dashboard}\n"
        )),
        (false, _) => text.push_str(&format!("The request in the dashboard:\n{dashboard}\n")),
    }
    text.push_str("\n-- \nSent by countersign. Nothing is approved by silence.\n");

    let mut rows = String::new();
    for (k, v) in &request.action.details {
        rows.push_str(&format!(
            "<tr><th style=\"text-align:left;padding:4px 12px 4px 0;vertical-align:top;color:#555\">{}</th><td style=\"padding:4px 0;font-family:monospace\">{}</td></tr>",
            html_esc(k),
            html_esc(v)
        ));
    }
    let button = |href: &str, label: &str| {
        format!(
            "<p><a href=\"{}\" style=\"display:inline-block;padding:10px 18px;background:#1f4fd1;color:#fff;text-decoration:none;border-radius:6px\">{}</a></p>",
            html_esc(href),
            html_esc(label)
        )
    };
    let action_html = match (ask, token) {
        (true, Some(link)) => format!(
            "{}<p style=\"color:#555\">Opening the link decides nothing: you confirm on the page. It works once, until {}.</p><p>Or <a href=\"{}\">sign in to the dashboard</a>.</p>",
            button(&link.url, "Review and decide"),
            html_esc(&link.expires_at.to_string()),
            html_esc(&dashboard)
        ),
        (true, None) => format!(
            "{}<p style=\"color:#555\">Sign in to decide; opening the link decides nothing.</p>",
            button(&dashboard, "Review in the dashboard")
        ),
        (false, _) => format!(
            "<p><a href=\"{}\">The request in the dashboard</a></p>",
            html_esc(&dashboard)
        ),
    };
    let outcome_html = if ask {
        String::new()
    } else {
        let comment = request
            .decision
            .as_ref()
            .and_then(|d| d.comment.as_deref())
            .map(|c| format!("<blockquote style=\"border-left:3px solid #ccc;margin:8px 0;padding-left:10px\">{}</blockquote>", html_esc(c)))
            .unwrap_or_default();
        format!("<p><strong>{}</strong></p>{comment}", html_esc(&outcome))
    };
    let html = format!(
        "<!doctype html><html><body style=\"font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;color:#111;max-width:640px\">\
<h2 style=\"margin:0 0 12px\">{}</h2>\
<p style=\"font-size:16px\"><strong>{}</strong></p>\
<table style=\"border-collapse:collapse;margin:8px 0 16px\">{rows}</table>\
<p style=\"color:#555\">Asked by {} · requested {} · expires {} (not approved unless someone approves it by then) · <code>{}</code></p>\
{outcome_html}{action_html}\
<p style=\"color:#888;font-size:12px\">Sent by countersign. Nothing is approved by silence.</p>\
</body></html>",
        html_esc(title),
        html_esc(&request.action.description),
        html_esc(&asked_by),
        html_esc(&request.requested_at.to_string()),
        html_esc(&request.expires_at.to_string()),
        html_esc(&request.id),
    );
    (subject, text, html)
}

// ---- deliveries -------------------------------------------------------------------------

/// Sends a request, a reminder or a follow-up to `to`.
pub(super) async fn send(
    notifier: &Notifier,
    delivery: &Delivery,
    to: &str,
    reminder: bool,
) -> SendResult {
    let Some(config) = &notifier.config.email else {
        return Err(permanent("email is not configured on this server"));
    };
    let Some(id) = &delivery.subject else {
        return Err(permanent("the delivery names no request"));
    };
    let gate = &notifier.gate;
    let request = gate
        .store()
        .get_request(id)
        .await
        .map_err(|e| format!("could not read the request: {e}"))?
        .ok_or_else(|| permanent(format!("request {id} does not exist")))?;
    let now = notifier.now();
    let ask = matches!(
        delivery.event_type.as_str(),
        "request.created" | "request.reminder"
    );
    if ask && (request.status != Status::Pending || request.is_past_expiry(now)) {
        return Ok(Some(json!({
            "skipped": format!("not sent: the request was already closed ({})", super::slack::outcome_line(&request)),
        })));
    }
    let public_url = &notifier.config.public_url;
    let token = match (ask, approver_of(config, to)) {
        (true, Some(username)) if config.token_decisions => Some(
            issue(gate, config, &request, username, to, now, public_url)
                .await
                .map_err(|e| format!("could not issue a decision token: {e}"))?,
        ),
        _ => None,
    };
    let (subject, text, html) = compose(&request, public_url, ask, reminder, token.as_ref());
    let message = build(
        config,
        to,
        &subject,
        Some(delivery.message_id.clone()),
        text,
        html,
    )?;
    // Remembered before sending: a follow-up may reach someone whose email then failed
    // (harmless), but never misses someone who got the request.
    if ask {
        let doc = Doc {
            kind: SENT.into(),
            id: format!("{id}/{}", to.to_ascii_lowercase()),
            version: 1,
            key: None,
            body: json!({"to": to, "delivery_id": delivery.id}),
            updated_at: now,
        };
        match gate.store().doc_insert(&doc, None).await {
            Ok(()) | Err(StoreError::Duplicate(_)) => {}
            Err(e) => return Err(format!("could not record the recipient: {e}")),
        }
    }
    // Each SMTP command is cut off within the lease, like every other send.
    let timeout = Duration::from_secs(notifier.config.lease_seconds.clamp(1, 10));
    deliver(config, message, timeout).await?;
    if ask
        && config.follow_ups
        && let Ok(Some(current)) = gate.store().get_request(id).await
        && current.status.is_final()
    {
        // Closed while this was being sent: make sure the follow-up goes out.
        let follow = super::plan::follow_up(gate, &current, to, "request.decided", now);
        if let Err(e) = notifier.insert(&follow).await {
            tracing::warn!(%e, "could not plan a follow-up email");
        }
    }
    Ok(Some(json!({
        "to": to,
        "token_expires_at": token.map(|t| t.expires_at),
    })))
}

/// The dashboard username an address is mapped to.
fn approver_of<'a>(config: &'a EmailConfig, address: &str) -> Option<&'a str> {
    let bare = address
        .parse::<Mailbox>()
        .map(|m| m.email.to_string())
        .unwrap_or_else(|_| address.to_string())
        .to_ascii_lowercase();
    config.approvers.get(&bare).map(String::as_str)
}

fn random_token() -> Result<String, GateError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// What a decision token is bound to (stored without the token, under its hash).
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
struct TokenRecord {
    request_id: String,
    username: String,
    email: String,
    expires_at: Timestamp,
    created_at: Timestamp,
}

/// Issues a one-time token for `username` to decide `request`; only its hash is kept.
pub async fn issue(
    gate: &Gate,
    config: &EmailConfig,
    request: &ApprovalRequest,
    username: &str,
    email: &str,
    now: Timestamp,
    public_url: &str,
) -> Result<TokenLink, GateError> {
    let token = random_token()?;
    let mut expires_at = now.plus_seconds(config.token_minutes.max(1) * 60);
    if request.expires_at < expires_at {
        expires_at = request.expires_at;
    }
    let record = TokenRecord {
        request_id: request.id.clone(),
        username: username.to_string(),
        email: email.to_string(),
        expires_at,
        created_at: now,
    };
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix)
        .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
    let doc = Doc {
        kind: TOKEN.into(),
        id: format!("{}/{}", request.id, hex::encode(suffix)),
        version: 1,
        key: Some(hash_token(&token)),
        body: serde_json::to_value(&record)
            .map_err(|e| GateError::Store(StoreError::Backend(e.to_string())))?,
        updated_at: now,
    };
    gate.store().doc_insert(&doc, None).await?;
    Ok(TokenLink {
        url: format!(
            "{}/email/decide#t={token}",
            public_url.trim_end_matches('/')
        ),
        expires_at,
    })
}

/// Drops the tokens of a request that closed (they could no longer decide anything).
pub(crate) async fn forget_tokens(gate: &Gate, request_id: &str) -> Result<(), GateError> {
    gate.store()
        .doc_delete_prefix(TOKEN, &format!("{request_id}/"))
        .await?;
    Ok(())
}

fn invalid_link() -> GateError {
    GateError::Unauthenticated(
        "This link no longer works: it was already used, it expired, or its request is closed. Open the request in the dashboard instead.".into(),
    )
}

/// The token's record, if it exists and has not expired.
async fn lookup(gate: &Gate, token: &str) -> Result<(Doc, TokenRecord), GateError> {
    if token.is_empty() || token.len() > 128 {
        return Err(invalid_link());
    }
    let doc = gate
        .store()
        .doc_by_key(TOKEN, &hash_token(token))
        .await?
        .ok_or_else(invalid_link)?;
    let record: TokenRecord = serde_json::from_value(doc.body.clone())
        .map_err(|e| GateError::Store(StoreError::Corrupt(format!("email token: {e}"))))?;
    if gate.clock().now() >= record.expires_at {
        let _ = gate.store().doc_delete(TOKEN, &doc.id).await;
        return Err(invalid_link());
    }
    Ok((doc, record))
}

/// The account a token speaks for, if it may still decide.
async fn decider(gate: &Gate, record: &TokenRecord) -> Result<Decider, GateError> {
    let user = gate
        .accounts()
        .user_by_name(&record.username)
        .await?
        .filter(|u| u.is_active() && u.role.may_decide())
        .ok_or_else(|| {
            GateError::Forbidden(format!(
                "the account {} this address is mapped to cannot decide (disabled, not yet activated, or missing)",
                record.username
            ))
        })?;
    Decider::new(user.principal().authenticated_by(AuthMethod::EmailToken))
}

fn token_decisions_on(channels: &Option<Extension<Arc<Channels>>>) -> Result<(), GateError> {
    match channels {
        Some(Extension(c)) if c.config.email.as_ref().is_some_and(|e| e.token_decisions) => Ok(()),
        _ => Err(GateError::Forbidden(
            "Email decision links are off on this server: open the request in the dashboard."
                .into(),
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    token: String,
}

/// `POST /email/api/request`: what a token's page shows. Changes nothing.
pub async fn token_request(
    State(state): State<AppState>,
    channels: Option<Extension<Arc<Channels>>>,
    ApiJson(body): ApiJson<TokenBody>,
) -> Result<Json<Value>, ApiError> {
    token_decisions_on(&channels)?;
    let gate = &state.gate;
    let (_, record) = lookup(gate, &body.token).await?;
    let decider = decider(gate, &record).await?;
    let request = gate.get(decider.principal(), &record.request_id).await?;
    Ok(Json(json!({
        "request": ApprovalView::new(&request),
        "approver": {"username": record.username, "display_name": decider.principal().display_name},
        "token_expires_at": record.expires_at,
        "can_decide": request.status == Status::Pending,
        "outcome": if request.status == Status::Pending { None } else { Some(super::slack::outcome_line(&request)) },
        "dashboard_url": format!("/requests/{}", request.id),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenDecisionBody {
    token: String,
    decision: String,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    fields: BTreeMap<String, String>,
}

/// `POST /email/api/decision`: the Confirm click. Consumes the token, then decides as
/// the approver it is bound to (channel `email`, authenticated by `email_token`).
pub async fn token_decision(
    State(state): State<AppState>,
    channels: Option<Extension<Arc<Channels>>>,
    ApiJson(body): ApiJson<TokenDecisionBody>,
) -> Result<Json<Value>, ApiError> {
    token_decisions_on(&channels)?;
    let verdict = parse_decision(&DecisionBody {
        decision: body.decision,
        comment: None,
        fields: Default::default(),
    })?;
    let input = DecisionInput {
        comment: body.comment.filter(|c| !c.trim().is_empty()),
        fields: body.fields,
    };
    let request = decide_with_token(&state.gate, &body.token, verdict, input).await?;
    Ok(Json(json!({
        "request": ApprovalView::new(&request),
        "outcome": super::slack::outcome_line(&request),
    })))
}

/// Consumes a token and decides as the approver it is bound to.
pub(crate) async fn decide_with_token(
    gate: &Gate,
    token: &str,
    verdict: countersign_core::Verdict,
    input: DecisionInput,
) -> Result<ApprovalRequest, GateError> {
    let (doc, record) = lookup(gate, token).await?;
    // Consume first: of two concurrent uses, one finds nothing to delete.
    if !gate.store().doc_delete(TOKEN, &doc.id).await? {
        return Err(invalid_link());
    }
    let decider = decider(gate, &record).await?;
    gate.decide(&decider, &record.request_id, verdict, input, Channel::Email)
        .await
}

const PAGE: &str = include_str!("../../assets/email.html");

/// `GET /email/decide`: the page a token link opens. Static: the token stays in the
/// fragment, and the page's script sends it only in POST bodies.
pub async fn decide_page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use countersign_core::{Clock, FixedClock, NewRequest, Principal, Role, Verdict};
    use countersign_store::ChangeFeed;

    use crate::{Gate, KeyRing, Settings, TransparencyLog};

    async fn gate(dir: &std::path::Path, clock: Arc<FixedClock>) -> Arc<Gate> {
        let store: Arc<dyn countersign_store::Store> =
            Arc::new(countersign_sqlite::SqliteStore::open(&dir.join("countersign.db")).unwrap());
        let feed = ChangeFeed::start(store.clone(), Duration::from_millis(50))
            .await
            .unwrap();
        let keys = Arc::new(KeyRing::open_or_create(&dir.join("keys"), clock.now()).unwrap());
        let clock: Arc<dyn countersign_core::Clock> = clock;
        let log = Arc::new(
            TransparencyLog::open(store.clone(), keys.clone(), clock.clone(), "test/email")
                .await
                .unwrap(),
        );
        Arc::new(Gate::new(store, feed, keys, clock, log, Settings::default()).unwrap())
    }

    /// A token works once, for the approver it names, and not after it expires.
    #[tokio::test]
    async fn decision_tokens_are_single_use_bound_and_short_lived() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FixedClock::new(
            Timestamp::parse("2026-11-29T12:00:00Z").unwrap(),
        ));
        let gate = gate(dir.path(), clock.clone()).await;
        let admin = Principal::local_user("root", Role::Admin);
        let (_, invite) = gate
            .accounts()
            .invite("alice", Some("Alice"), Role::Approver, &admin, 3600)
            .await
            .unwrap();
        gate.accounts()
            .accept(&invite, None, None, "correct horse battery")
            .await
            .unwrap();
        let agent = Principal::from_token("deploy-bot", Role::Agent);
        let ask = |what: &str| NewRequest {
            description: what.to_string(),
            timeout_seconds: Some(7200),
            ..NewRequest::default()
        };
        let first = gate
            .request_approval(&agent, ask("first"))
            .await
            .unwrap()
            .request;
        let second = gate
            .request_approval(&agent, ask("second"))
            .await
            .unwrap()
            .request;
        let config = EmailConfig {
            smtp: SmtpUrl::parse("smtp://127.0.0.1:25").unwrap(),
            from: "countersign <approvals@example.com>".into(),
            username: None,
            password: None,
            extra_roots: None,
            approvers: BTreeMap::from([("alice@example.com".into(), "alice".into())]),
            token_decisions: true,
            token_minutes: 30,
            follow_ups: true,
        };
        let url = "http://127.0.0.1:8787";
        let now = clock.now();
        let link = issue(
            &gate,
            &config,
            &first,
            "alice",
            "alice@example.com",
            now,
            url,
        )
        .await
        .unwrap();
        assert!(
            link.url
                .starts_with("http://127.0.0.1:8787/email/decide#t=")
        );
        assert_eq!(link.expires_at, now.plus_seconds(1800));
        let token = link.url.split_once("#t=").unwrap().1.to_string();
        // Only the hash is stored.
        let stored = gate.store().doc_list(TOKEN, "", 10).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert!(!stored[0].body.to_string().contains(&token));
        assert_eq!(stored[0].key.as_deref(), Some(hash_token(&token).as_str()));

        // Looking does not use it up.
        lookup(&gate, &token).await.unwrap();
        lookup(&gate, &token).await.unwrap();
        let decided = decide_with_token(&gate, &token, Verdict::Approved, DecisionInput::default())
            .await
            .unwrap();
        let approver = &decided.decision.as_ref().unwrap().approvers[0];
        assert_eq!(approver.id, "user:alice");
        assert_eq!(approver.channel, Channel::Email);
        assert_eq!(approver.auth_method, AuthMethod::EmailToken);
        // Once.
        let again = decide_with_token(&gate, &token, Verdict::Rejected, DecisionInput::default())
            .await
            .unwrap_err();
        assert_eq!(again.code(), "unauthenticated", "{again}");

        // Not after it expires.
        let link = issue(
            &gate,
            &config,
            &second,
            "alice",
            "alice@example.com",
            clock.now(),
            url,
        )
        .await
        .unwrap();
        let token = link.url.split_once("#t=").unwrap().1.to_string();
        clock.advance_seconds(30 * 60);
        let late = decide_with_token(&gate, &token, Verdict::Approved, DecisionInput::default())
            .await
            .unwrap_err();
        assert_eq!(late.code(), "unauthenticated", "{late}");
        let second = gate.get(&agent, &second.id).await.unwrap();
        assert_eq!(second.status, Status::Pending);
        assert!(
            decide_with_token(&gate, "", Verdict::Approved, DecisionInput::default())
                .await
                .is_err()
        );
    }

    #[test]
    fn smtp_urls_say_how_they_are_protected() {
        let tls = SmtpUrl::parse("smtps://mail.example.com").unwrap();
        assert_eq!((tls.port, tls.security), (465, Security::Tls));
        let st = SmtpUrl::parse("smtp://mail.example.com:2587?tls=starttls").unwrap();
        assert_eq!((st.port, st.security), (2587, Security::StartTls));
        let local = SmtpUrl::parse("smtp://127.0.0.1:2525").unwrap();
        assert_eq!((local.port, local.security), (2525, Security::Plain));
        assert!(SmtpUrl::parse("smtp://[::1]:25").is_ok());
        assert!(SmtpUrl::parse("smtp://localhost").is_ok());

        let plain = SmtpUrl::parse("smtp://mail.example.com").unwrap_err();
        assert!(plain.contains("unencrypted"), "{plain}");
        assert!(SmtpUrl::parse("smtp://10.0.0.1:25").is_err());
        let creds = SmtpUrl::parse("smtps://bob:hunter2@mail.example.com").unwrap_err();
        assert!(!creds.contains("hunter2"), "{creds}");
        assert!(SmtpUrl::parse("smtps://mail.example.com?tls=starttls").is_err());
        assert!(SmtpUrl::parse("smtp://mail.example.com?tls=none").is_err());
        assert!(SmtpUrl::parse("http://mail.example.com").is_err());
        assert!(SmtpUrl::parse("smtps://mail.example.com:notaport").is_err());
    }
}
