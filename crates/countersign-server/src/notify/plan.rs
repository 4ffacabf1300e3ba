//! Planning: which deliveries an event (or a long wait) calls for.

use countersign_core::{Status, Timestamp};
use countersign_store::{RequestQuery, StoredEvent};

use super::{
    Delivery, DeliveryChannel, DeliveryStatus, NotifyConfig, ReminderConfig, Route, event_type,
    message_id,
};
use crate::error::GateError;
use crate::gate::Gate;
use crate::views::ApprovalView;

/// A new pending delivery; `seq` and `body` are set by the caller when it has them.
pub(crate) fn delivery(
    gate: &Gate,
    id: String,
    subject: Option<String>,
    event_type: &str,
    channel: DeliveryChannel,
    now: Timestamp,
) -> Delivery {
    Delivery {
        message_id: message_id(gate.log().origin(), &id),
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
        .map_err(|e| GateError::BadInput(e.to_string()))?;
        for webhook in webhooks {
            let mut d = delivery(
                gate,
                format!("{:012}.webhook.{}", event.seq, webhook.name),
                event.entry.subject.clone(),
                kind,
                DeliveryChannel::Webhook {
                    name: webhook.name.clone(),
                    url: webhook.url.clone(),
                },
                now,
            );
            d.seq = event.seq;
            d.body = Some(body.clone());
            out.push(d);
        }
    }
    Ok(out)
}

/// Whether this server can deliver to `route` (its transport is configured).
fn supported(_config: &NotifyConfig, route: &Route) -> bool {
    match route {
        Route::Slack(_) | Route::Email(_) => false,
    }
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
            for route in super::plan_routes(config, request) {
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
            let (channel, target) = match &route {
                Route::Slack(to) => (
                    DeliveryChannel::Slack {
                        to: to.clone(),
                        reminder: true,
                    },
                    format!("slack.{to}"),
                ),
                Route::Email(to) => (
                    DeliveryChannel::Email {
                        to: to.clone(),
                        reminder: true,
                    },
                    format!("email.{to}"),
                ),
            };
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
