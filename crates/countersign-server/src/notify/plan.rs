//! Planning: which deliveries an event (or a long wait) calls for.

use countersign_core::{ApprovalRequest, Status, Timestamp};
use countersign_store::{Docs, RequestQuery, StoredEvent};

use super::email::{self, SentDocs};
use super::slack::{self, MessageDocs};
use super::{
    Delivery, DeliveryChannel, DeliveryStatus, NotifyConfig, ReminderConfig, Route, event_type,
};
use crate::error::GateError;
use crate::gate::Gate;
use crate::views::ApprovalView;

/// A new pending delivery of this server's.
fn delivery(
    gate: &Gate,
    id: String,
    subject: Option<String>,
    event_type: &str,
    channel: DeliveryChannel,
    now: Timestamp,
) -> Delivery {
    Delivery::new(gate.log().origin(), id, subject, event_type, channel, now)
}

/// The deliveries one event calls for.
pub async fn plan(
    config: &NotifyConfig,
    gate: &Gate,
    event: &StoredEvent,
    now: Timestamp,
) -> Result<Vec<Delivery>, GateError> {
    let Some(kind) = event_type(event.entry.kind) else {
        return Ok(Vec::new());
    };
    let request = match &event.entry.subject {
        Some(id) => gate.store().get_request(id).await?,
        None => None,
    };
    let mut out = Vec::new();
    let webhooks: Vec<_> = config
        .webhooks
        .iter()
        .filter(|w| w.events.is_empty() || w.events.iter().any(|e| e == kind))
        .collect();
    if !webhooks.is_empty() {
        // The body is fixed now, so every retry of this message carries the same bytes.
        let body = serde_json::to_string(&serde_json::json!({
            "type": kind,
            "timestamp": event.entry.at,
            "data": {
                "request_id": event.entry.subject,
                "log_index": event.index(),
                "event": event.entry.data,
                "request": request.as_ref().map(ApprovalView::new),
            },
        }))
        .map_err(|e| GateError::internal("encode a webhook body", e))?;
        for webhook in webhooks {
            let mut d = delivery(
                gate,
                format!("{:012}.webhook.{}", event.seq, webhook.name),
                event.entry.subject.clone(),
                kind,
                // The history shows the URL redacted; the sender takes it from the
                // config by name.
                DeliveryChannel::Webhook {
                    name: webhook.name.clone(),
                    url: super::webhook::redact_url(&webhook.url),
                },
                now,
            );
            d.seq = event.seq;
            d.body = Some(body.clone());
            out.push(d);
        }
    }
    if let Some(request) = &request {
        match kind {
            // A request a policy decided at once asks nobody (webhooks still hear of it).
            "request.created" if decided_as_made(request) => {}
            "request.created" => {
                out.extend(created_deliveries(config, gate, request, event, now).await?)
            }
            "request.decided" | "request.timed_out" | "request.cancelled" => {
                out.extend(closing_deliveries(config, gate, request, kind, None, now).await?);
            }
            // One approval of several: the Slack messages show how far it has come; the
            // emailed links stay valid for the approvers still needed.
            "request.approval_recorded" => {
                let progress = Some(event.seq);
                out.extend(closing_deliveries(config, gate, request, kind, progress, now).await?);
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Whether a policy or a standing grant decided `request` as it was made.
fn decided_as_made(request: &ApprovalRequest) -> bool {
    use countersign_core::AuthorizationType::{Grant, Policy};
    request
        .decision
        .as_ref()
        .is_some_and(|d| matches!(d.authorization_type, Policy | Grant))
}

/// Whether this server can deliver to `route` (its transport is configured).
fn supported(config: &NotifyConfig, route: &Route) -> bool {
    match route {
        Route::Slack(_) => config.slack.is_some(),
        Route::Email(_) => config.email.is_some(),
    }
}

/// Where a request's notifications go. The recipients the request names and the
/// configured routes are two groups, each routed on its own, so that one never takes
/// the other's place: in each, Slack first; email instead of a Slack user who is not an
/// approver, and as the fallback if the group's Slack delivery fails for good.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Routing {
    pub primary: Vec<Route>,
    /// Per group: its emails, sent if one of its Slack messages fails for good.
    pub fallback: Vec<Fallback>,
    /// Routes not used, and why (shown in the delivery history).
    pub skipped: Vec<(Route, String)>,
}

/// The emails that back up a group's Slack messages.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Fallback {
    pub slack: Vec<Route>,
    pub emails: Vec<Route>,
}

impl Routing {
    /// The emails to send when the Slack message to `to` failed for good.
    pub fn fallback_for(&self, to: &str) -> Vec<Route> {
        self.fallback
            .iter()
            .filter(|f| {
                f.slack
                    .iter()
                    .any(|r| matches!(r, Route::Slack(s) if s == to))
            })
            .flat_map(|f| f.emails.iter().cloned())
            .collect()
    }
}

pub(crate) fn routing(config: &NotifyConfig, request: &ApprovalRequest) -> Routing {
    let mut out = Routing::default();
    for group in super::plan_routes(config, request) {
        let routed = route_group(config, &group);
        for route in routed.primary {
            if !out.primary.iter().any(|r| r.same_target(&route)) {
                out.primary.push(route);
            }
        }
        out.fallback.extend(routed.fallback);
        out.skipped.extend(routed.skipped);
    }
    out
}

/// One group's routing: Slack first, its emails as the fallback.
fn route_group(config: &NotifyConfig, routes: &[Route]) -> Routing {
    let mut out = Routing::default();
    let emails: Vec<Route> = routes
        .iter()
        .filter(|r| matches!(r, Route::Email(_)) && supported(config, r))
        .cloned()
        .collect();
    let mut slacks = Vec::new();
    for route in routes {
        match route {
            Route::Slack(to) if !supported(config, route) => out.skipped.push((
                route.clone(),
                if emails.is_empty() {
                    format!("not sent: Slack is not configured on this server ([slack]), so {to} cannot be reached")
                } else {
                    format!("not sent: Slack is not configured on this server ([slack]); emailed {} instead", names(&emails))
                },
            )),
            Route::Email(to) if !supported(config, route) => out.skipped.push((
                route.clone(),
                format!("not sent: email is not configured on this server ([email]), so {to} cannot be reached"),
            )),
            Route::Slack(to)
                if !emails.is_empty()
                    && slack::is_user_id(to)
                    && !config
                        .slack
                        .as_ref()
                        .is_some_and(|s| s.approvers.contains_key(to)) =>
            {
                out.skipped.push((
                    route.clone(),
                    format!(
                        "not sent: Slack user {to} is not mapped to a countersign approver ([slack.approvers]); emailed {} instead",
                        names(&emails)
                    ),
                ))
            }
            Route::Slack(_) => slacks.push(route.clone()),
            Route::Email(_) => {}
        }
    }
    if slacks.is_empty() {
        out.primary = emails;
    } else {
        out.fallback.push(Fallback {
            slack: slacks.clone(),
            emails,
        });
        out.primary = slacks;
    }
    out
}

fn names(routes: &[Route]) -> String {
    routes
        .iter()
        .map(|r| match r {
            Route::Slack(to) | Route::Email(to) => to.as_str(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn channel_of(route: &Route, reminder: bool) -> (DeliveryChannel, String) {
    match route {
        Route::Slack(to) => (
            DeliveryChannel::Slack {
                to: to.clone(),
                reminder,
            },
            format!("slack.{to}"),
        ),
        Route::Email(to) => (
            DeliveryChannel::Email {
                to: to.clone(),
                reminder,
            },
            format!("email.{to}"),
        ),
    }
}

/// A new request: its own messages, or, when its requester has sent more than
/// `[limits] notifications_per_agent` in this window, a place in the window's digest
/// (one per route; planning it again plans nothing new).
async fn created_deliveries(
    config: &NotifyConfig,
    gate: &Gate,
    request: &ApprovalRequest,
    event: &StoredEvent,
    now: Timestamp,
) -> Result<Vec<Delivery>, GateError> {
    if let Some(digest) = &config.digest
        && let super::digest::Admit::Digest { window, due } =
            super::digest::admit(digest, gate, request, event, now).await?
    {
        return Ok(routing(config, request)
            .primary
            .iter()
            .map(|route| {
                let (channel, target) = channel_of(route, false);
                super::digest::delivery(gate, &window, due, channel, &target, now)
            })
            .collect());
    }
    Ok(route_deliveries(config, gate, request, event, now))
}

/// A new request: its Slack messages or emails, and a history line for each route not
/// used.
fn route_deliveries(
    config: &NotifyConfig,
    gate: &Gate,
    request: &ApprovalRequest,
    event: &StoredEvent,
    now: Timestamp,
) -> Vec<Delivery> {
    let routing = routing(config, request);
    let mut out = Vec::new();
    for route in &routing.primary {
        let (channel, target) = channel_of(route, false);
        let mut d = delivery(
            gate,
            format!("{:012}.{target}", event.seq),
            Some(request.id.clone()),
            "request.created",
            channel,
            now,
        );
        d.seq = event.seq;
        out.push(d);
    }
    for (route, note) in routing.skipped {
        let (channel, target) = channel_of(&route, false);
        let mut d = delivery(
            gate,
            format!("{:012}.{target}", event.seq),
            Some(request.id.clone()),
            "request.created",
            channel,
            now,
        );
        d.seq = event.seq;
        d.status = DeliveryStatus::Skipped;
        d.last_error = Some(note);
        d.finished_at = Some(now);
        out.push(d);
    }
    out
}

/// A closed request: every Slack message sent for it is updated, and everyone emailed
/// about it gets a follow-up (when enabled). Its unused email tokens are dropped.
/// The updates a request's change calls for: its Slack messages updated, and, once it
/// is closed (`progress` is `None`), email follow-ups and its links forgotten.
async fn closing_deliveries(
    config: &NotifyConfig,
    gate: &Gate,
    request: &ApprovalRequest,
    kind: &str,
    progress: Option<u64>,
    now: Timestamp,
) -> Result<Vec<Delivery>, GateError> {
    let mut out = Vec::new();
    let prefix = format!("{}/", request.id);
    let store = &**gate.store();
    if config.slack.is_some() {
        for posted in Docs::<MessageDocs>::new(store).list(&prefix, 1000).await? {
            let m = &posted.body;
            out.push(slack::update(
                gate.log().origin(),
                &request.id,
                &m.delivery_id,
                &m.channel,
                &m.ts,
                kind,
                progress,
                now,
            ));
        }
    }
    if progress.is_some() {
        return Ok(out);
    }
    if let Some(email) = &config.email {
        if email.follow_ups {
            for sent in Docs::<SentDocs>::new(store).list(&prefix, 1000).await? {
                out.push(email::follow_up(
                    gate.log().origin(),
                    request,
                    &sent.body.to,
                    kind,
                    now,
                ));
            }
        }
        crate::links::forget(gate, &request.id).await?;
    }
    Ok(out)
}

/// The email fallback for a Slack message that failed for good.
pub(crate) async fn fallback(
    config: &NotifyConfig,
    gate: &Gate,
    failed: &Delivery,
    now: Timestamp,
) -> Result<Vec<Delivery>, GateError> {
    let DeliveryChannel::Slack { to, reminder } = &failed.channel else {
        return Ok(Vec::new());
    };
    let Some(id) = &failed.subject else {
        return Ok(Vec::new());
    };
    let Some(request) = gate.store().get_request(id).await? else {
        return Ok(Vec::new());
    };
    if request.status != Status::Pending {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for route in routing(config, &request).fallback_for(to) {
        let (channel, target) = channel_of(&route, *reminder);
        let mut d = delivery(
            gate,
            format!("fallback.{}.{target}", failed.id),
            Some(request.id.clone()),
            &failed.event_type,
            channel,
            now,
        );
        d.seq = failed.seq;
        out.push(d);
    }
    Ok(out)
}

/// Reminders for requests pending longer than the quiet period, and escalations for
/// those pending longer still. Deterministic ids: each is planned once per request and
/// route. Reminders only notify; nothing is ever approved by silence.
pub async fn reminders(
    config: &NotifyConfig,
    reminders: &ReminderConfig,
    gate: &Gate,
    now: Timestamp,
) -> Result<Vec<Delivery>, GateError> {
    let pending = gate
        .store()
        .list_requests(&RequestQuery {
            status: Some(Status::Pending),
            requested_by: None,
            limit: 10_000,
        })
        .await?;
    let mut out = Vec::new();
    for request in pending.iter().filter(|r| !r.is_past_expiry(now)) {
        let waited = request.requested_at.millis_until(now).max(0) as u64 / 1000;
        let mut routes: Vec<(&str, Route)> = Vec::new();
        if waited >= reminders.after_seconds {
            for route in routing(config, request).primary {
                routes.push(("reminder", route));
            }
        }
        if let Some(after) = reminders.escalate_after_seconds
            && waited >= reminders.after_seconds + after
        {
            for route in &reminders.escalate_to {
                routes.push(("escalation", route.clone()));
            }
        }
        for (what, route) in routes {
            if !supported(config, &route) {
                continue;
            }
            let (channel, target) = channel_of(&route, true);
            out.push(delivery(
                gate,
                format!("{what}.{}.{target}", request.id),
                Some(request.id.clone()),
                "request.reminder",
                channel,
                now,
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use countersign_core::{ApprovalRequest, Limits, NewRequest, Principal, Role, Timestamp};

    use super::*;
    use crate::notify::EmailConfig;
    use crate::notify::slack::SlackConfig;
    use crate::notify::smtp::SmtpUrl;

    fn config() -> NotifyConfig {
        NotifyConfig {
            slack: Some(SlackConfig {
                bot_token: "xoxb-test".into(),
                signing_secret: "secret".into(),
                api_base_url: "http://127.0.0.1:9/api".into(),
                approvers: BTreeMap::from([
                    ("U0ALICE".to_string(), "alice".to_string()),
                    ("U0BOB".to_string(), "bob".to_string()),
                ]),
            }),
            email: Some(EmailConfig {
                smtp: SmtpUrl::parse("smtp://127.0.0.1:9").unwrap(),
                from: "countersign <approvals@example.com>".into(),
                username: None,
                password: None,
                extra_roots: None,
                approvers: BTreeMap::new(),
                token_decisions: false,
                token_minutes: 30,
                follow_ups: true,
            }),
            default_routes: vec![
                Route::Slack("U0ALICE".into()),
                Route::Email("alice@example.com".into()),
            ],
            ..NotifyConfig::default()
        }
    }

    fn request(slack: Option<&str>, email: Option<&str>) -> ApprovalRequest {
        let new = NewRequest {
            description: "Rotate the key".into(),
            recipient_slack: slack.map(str::to_string),
            recipient_email: email.map(str::to_string),
            ..NewRequest::default()
        };
        let agent = Principal::from_token("bot", Role::Agent);
        let now = Timestamp::parse("2026-11-29T12:00:00Z").unwrap();
        ApprovalRequest::create("req_1".into(), new, &agent, now, &Limits::default())
            .unwrap()
            .request
    }

    #[test]
    fn named_recipients_are_told_besides_the_configured_routes_never_instead() {
        let config = config();
        let routed = routing(&config, &request(Some("U0BOB"), Some("bob@example.com")));
        assert_eq!(
            routed.primary,
            [Route::Slack("U0BOB".into()), Route::Slack("U0ALICE".into())]
        );
        // Each group's email backs up its own Slack message only.
        assert_eq!(
            routed.fallback_for("U0BOB"),
            [Route::Email("bob@example.com".into())]
        );
        assert_eq!(
            routed.fallback_for("U0ALICE"),
            [Route::Email("alice@example.com".into())]
        );

        // An email named beside a configured Slack route is sent, not held back as a
        // fallback.
        let routed = routing(&config, &request(None, Some("bob@example.com")));
        assert_eq!(
            routed.primary,
            [
                Route::Email("bob@example.com".into()),
                Route::Slack("U0ALICE".into())
            ]
        );

        // Naming a configured route changes nothing; naming nobody, the configured ones.
        let plain = routing(&config, &request(None, None));
        assert_eq!(routing(&config, &request(Some("U0ALICE"), None)), plain);
        assert_eq!(
            routing(&config, &request(None, Some("Alice@Example.com"))),
            plain
        );
        assert_eq!(plain.primary, [Route::Slack("U0ALICE".into())]);
    }
}
