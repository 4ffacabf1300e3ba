//! Email, outbound: a readable HTML and text message with the action, every detail, who
//! asked, the expiry and a link to decide, and follow-ups when the request is decided,
//! times out or is cancelled. Sent over SMTP (`smtp`).
//!
//! Links are scanner-safe: following one never decides anything. The plain link opens
//! the request in the dashboard, where a signed-in approver decides with a POST. When
//! the operator turns on `token_decisions`, the email instead links to
//! `/email/decide#t=<token>` (`crate::links`): a one-time token, bound to the request and
//! to the approver the address is mapped to, valid for `token_minutes`. It travels in the
//! URL fragment, which browsers never send to a server or in a Referer, and only its
//! SHA-256 is stored. The page (`http::email_links`) shows the request (a POST that
//! changes nothing) and decides only when the approver clicks Confirm (a POST carrying
//! the token, which it consumes).

use std::time::Duration;

use countersign_core::{ApprovalRequest, Status, Timestamp};
use countersign_store::{Docs, StoreError, collection, kinds};
use lettre::message::Mailbox;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::smtp::{build, deliver};
use super::{
    Delivery, DeliveryChannel, EmailConfig, Outbound, SendResult, outcome_line, permanent,
};
use crate::links::{self, TokenLink};

/// Who was emailed about a request, for follow-ups.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SentTo {
    pub to: String,
    pub delivery_id: String,
}

collection!(
    /// Addresses emailed about a request: `{request_id}/{address}`.
    pub(crate) SentDocs: kinds::EMAIL_SENT => SentTo
);

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
        .map(|c| if surprising(c) { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut out: String = flat.chars().take(max - 1).collect();
        out.push('…');
        out
    }
}

/// Characters that would break a header line (CR, LF and every other control), or make
/// a line read other than it is written: line and paragraph separators, bidirectional
/// overrides and isolates (which can turn "exe.txt" into "txt.exe"), and zero-width ones.
fn surprising(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
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
    let outcome = outcome_line(request);
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
    let quorum = crate::views::QuorumView::of(request).map(|q| {
        let who = q.approved_by();
        if who.is_empty() {
            q.summary()
        } else {
            format!("{} (approved by {})", q.summary(), who.join(", "))
        }
    });
    if let Some(line) = &quorum {
        text.push_str(&format!("Approvals: {line}\n"));
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
    let outcome_html = match &quorum {
        Some(line) => format!(
            "<p><strong>Approvals:</strong> {}</p>{outcome_html}",
            html_esc(line)
        ),
        None => outcome_html,
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

// ---- test message ------------------------------------------------------------------------

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

// ---- deliveries -------------------------------------------------------------------------

/// The follow-up email telling `to` how a request ended.
pub(crate) fn follow_up(
    origin: &str,
    request: &ApprovalRequest,
    to: &str,
    event_type: &str,
    now: Timestamp,
) -> Delivery {
    Delivery::new(
        origin,
        format!("followup.{}.email.{}", request.id, to.to_ascii_lowercase()),
        Some(request.id.clone()),
        event_type,
        DeliveryChannel::Email {
            to: to.to_string(),
            reminder: false,
        },
        now,
    )
}

/// Sends a request, a reminder or a follow-up to `to`.
pub(super) async fn send(
    out: &Outbound,
    delivery: &Delivery,
    to: &str,
    reminder: bool,
    later: &mut Vec<Delivery>,
) -> SendResult {
    let Some(config) = &out.config.email else {
        return Err(permanent("email is not configured on this server"));
    };
    let gate = &out.gate;
    let request = out.request(delivery).await?;
    let id = &request.id;
    let now = out.now();
    let ask = matches!(
        delivery.event_type.as_str(),
        "request.created" | "request.reminder"
    );
    if ask && (request.status != Status::Pending || request.is_past_expiry(now)) {
        return Ok(Some(json!({
            "skipped": format!("not sent: the request was already closed ({})", outcome_line(&request)),
        })));
    }
    let public_url = &out.config.public_url;
    let token = match (ask, approver_of(config, to)) {
        (true, Some(username)) if config.token_decisions => Some(
            links::issue(
                gate,
                config.token_minutes,
                &request,
                username,
                to,
                public_url,
            )
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
        let sent = SentTo {
            to: to.to_string(),
            delivery_id: delivery.id.clone(),
        };
        match Docs::<SentDocs>::new(&**gate.store())
            .insert(
                &format!("{id}/{}", to.to_ascii_lowercase()),
                None,
                &sent,
                now,
                None,
            )
            .await
        {
            Ok(()) | Err(StoreError::Duplicate(_)) => {}
            Err(e) => return Err(format!("could not record the recipient: {e}")),
        }
    }
    // Each SMTP command is cut off within the lease, like every other send.
    let timeout = Duration::from_secs(out.config.lease_seconds.clamp(1, 10));
    deliver(config, message, timeout).await?;
    if ask
        && config.follow_ups
        && let Ok(Some(current)) = gate.store().get_request(id).await
        && current.status.is_final()
    {
        // Closed while this was being sent: make sure the follow-up goes out.
        later.push(follow_up(
            out.origin(),
            &current,
            to,
            "request.decided",
            now,
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_one_plain_line() {
        let crafted = "Pay\r\nBcc: everyone@example.com\u{2028}now \u{202E}txt.exe\u{200B}";
        let subject = one_line(crafted, 120);
        assert_eq!(subject, "Pay  Bcc: everyone@example.com now  txt.exe ");
        assert!(!subject.chars().any(surprising));
        assert_eq!(one_line("abcdef", 4), "abc…");
    }

    #[test]
    fn an_email_says_how_far_a_quorum_has_come() {
        use countersign_core::{
            ApprovalRequest, DecisionAccounts, DecisionInput, Limits, NewRequest, Principal,
            Quorum, Role, Timestamp,
        };
        let now = Timestamp::parse("2026-12-02T10:00:00Z").unwrap_or_else(|_| unreachable!());
        let agent = Principal::from_token("bot", Role::Agent);
        let mut made = ApprovalRequest::create(
            "req_e".into(),
            NewRequest {
                description: "Pay out".into(),
                ..NewRequest::default()
            },
            &agent,
            now,
            &Limits::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        made.require_quorum(Quorum::new(2, Some("sre")).unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
        let bob = Principal::user("bob", "Bob", Role::Approver);
        let accounts = DecisionAccounts {
            decider: "user:bob".into(),
            requester: "token:bot".into(),
            eligible: true,
        };
        let signer = countersign_core::keys::Signer::from_seed([7; 32]);
        let one = made
            .request
            .decide_as(
                countersign_core::Verdict::Approved,
                DecisionInput::default(),
                &bob,
                &accounts,
                countersign_core::Channel::Dashboard,
                now.plus_seconds(5),
                "nonce-0123456789abcdef".into(),
                &signer,
                &Limits::default(),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, text, html) = compose(&one.request, "https://gate.example", true, false, None);
        assert!(
            text.contains("Approvals: 1 of 2 approvals; 1 more needed, from sre (approved by Bob via dashboard)"),
            "{text}"
        );
        assert!(
            html.contains("1 of 2 approvals; 1 more needed, from sre"),
            "{html}"
        );
        let (_, plain, _) = compose(&made.request, "https://gate.example", true, false, None);
        assert!(
            plain.contains("Approvals: 0 of 2 approvals; 2 more needed, from sre"),
            "{plain}"
        );
    }
}
