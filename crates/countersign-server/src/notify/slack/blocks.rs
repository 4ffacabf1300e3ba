//! Block Kit: the message asking for a decision, the message once it is closed, and the
//! dialog a Reject (a reason) or an Approve with reply fields opens.

use countersign_core::{ApprovalRequest, Status, Timestamp};
use serde_json::{Value, json};

use super::{APPROVE, REJECT};
use crate::notify::{outcome_line, verdict_word};

/// Escapes text for Slack's mrkdwn, and for the top-level `text` (what notifications
/// show), which Slack parses the same way: `<!channel>` would ping everyone, and
/// `<http://evil.example|Approve here>` would show as a disguised link. Every string an
/// agent wrote goes through this before it reaches Slack.
pub(crate) fn esc(text: &str) -> String {
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
    if let Some(quorum) = crate::views::QuorumView::of(request) {
        let mut line = format!("*{}*", esc(&quorum.summary()));
        let who = quorum.approved_by();
        if !who.is_empty() {
            line.push_str(&format!(" · approved by {}", esc(&who.join(", "))));
        }
        blocks.push(json!({"type": "context", "elements": [mrkdwn(&cut(&line, 3000))]}));
    }
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
        "text": cut(&format!("{title}: {}", esc(&request.action.description)), 3000),
        "blocks": blocks,
        "unfurl_links": false,
        "unfurl_media": false,
    })
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
        "text": cut(&format!("{title}: {}", esc(&request.action.description)), 3000),
        "blocks": blocks,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(description: &str) -> ApprovalRequest {
        let agent = countersign_core::Principal::from_token("bot", countersign_core::Role::Agent);
        let input = countersign_core::NewRequest {
            description: description.into(),
            details: [("note".to_string(), "<@U0BOSS> <!here>".to_string())].into(),
            ..Default::default()
        };
        ApprovalRequest::create(
            "req_1".into(),
            input,
            &agent,
            Timestamp::from_millis(1_700_000_000_000).unwrap(),
            &countersign_core::Limits::default(),
        )
        .unwrap()
        .request
    }

    /// Every string in a message, however deep.
    fn strings(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            Value::Object(map) => map.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }

    #[test]
    fn agent_text_is_escaped_in_every_field_of_every_message() {
        let request = request("<!channel> pay <http://evil.example/login|Approve here>");
        for message in [
            request_message(&request, "http://gate.example", false),
            final_message(&request),
            modal(&request, APPROVE),
        ] {
            let mut all = Vec::new();
            strings(&message, &mut all);
            for s in &all {
                for raw in ["<!channel>", "<http://evil.example", "<@U0BOSS>", "<!here>"] {
                    assert!(!s.contains(raw), "{raw} reached Slack in {s:?}");
                }
            }
        }
        let text = request_message(&request, "http://gate.example", false)["text"].clone();
        assert_eq!(
            text,
            "Approval needed: &lt;!channel&gt; pay &lt;http://evil.example/login|Approve here&gt;"
        );
    }

    #[test]
    fn escapes_mrkdwn_and_cuts_long_text() {
        assert_eq!(esc("<@U1> & co"), "&lt;@U1&gt; &amp; co");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
