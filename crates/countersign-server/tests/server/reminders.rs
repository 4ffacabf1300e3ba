//! Reminders and escalation (`[reminders]`): planned once per request and route after the
//! quiet period, an escalation once after the next, none for a closed request, and a
//! request nobody decides times out: silence never approves.

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::{FixedClock, Timestamp};
use countersign_server::notify::EmailConfig;
use countersign_server::notify::smtp::SmtpUrl;
use countersign_server::notify::{Notifier, NotifyConfig, ReminderConfig, Route};
use serde_json::json;

use super::support::start_clocked_with;

/// The planned reminders and escalations: (id, subject), sorted.
async fn reminders(notifier: &Notifier) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = notifier
        .history(1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.event_type == "request.reminder")
        .map(|d| (d.id, d.subject.unwrap_or_default()))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reminders_and_escalations_notify_once_and_never_approve() {
    let clock = Arc::new(FixedClock::new(
        Timestamp::parse("2026-11-29T09:00:00Z").unwrap(),
    ));
    // alice@example.com may be named as a recipient (the operator listed it).
    let settings = countersign_server::Settings {
        recipients: countersign_server::gate::Recipients {
            email: BTreeMap::from([("alice@example.com".to_string(), None)]),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = start_clocked_with(clock.clone(), settings).await;
    let config = NotifyConfig {
        email: Some(EmailConfig {
            // Nothing is sent in this test: it looks at what the outbox plans.
            smtp: SmtpUrl::parse("smtp://127.0.0.1:9").unwrap(),
            from: "countersign <approvals@example.com>".into(),
            username: None,
            password: None,
            extra_roots: None,
            approvers: BTreeMap::from([("alice@example.com".into(), "alice".into())]),
            token_decisions: false,
            token_minutes: 30,
            follow_ups: true,
        }),
        reminders: Some(ReminderConfig {
            after_seconds: 30 * 60,
            escalate_after_seconds: Some(60 * 60),
            escalate_to: vec![Route::Email("lead@example.com".into())],
        }),
        ..NotifyConfig::default()
    };
    let notifier = Notifier::new(server.gate.clone(), config).unwrap();

    let ask = |n: u32| {
        json!({
            "action_description": format!("Pay invoice INV-{n}"),
            "action_details": {"amount": "120.00"},
            "recipient_email": "alice@example.com",
            "timeout_hours": 3,
        })
    };
    let waiting = server.create(&server.agent, ask(1)).await;
    let decided = server.create(&server.agent, ask(2)).await;
    let (status, _) = server.decide(&server.approver, &decided, "approved").await;
    assert_eq!(status, 200);

    // Within the quiet period: nothing.
    clock.advance_seconds(29 * 60);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 0);
    assert!(reminders(&notifier).await.is_empty());

    // After it: one reminder, to the request's own route, for the pending request only;
    // planning again adds nothing.
    clock.advance_seconds(2 * 60);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 1);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 0);
    let planned = reminders(&notifier).await;
    assert_eq!(planned.len(), 1, "{planned:?}");
    assert!(planned[0].0.starts_with("reminder."), "{planned:?}");
    assert!(planned[0].0.contains("alice@example.com"), "{planned:?}");
    assert_eq!(planned[0].1, waiting);

    // An hour later still: the escalation, once, to the escalation route.
    clock.advance_seconds(60 * 60);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 1);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 0);
    let planned = reminders(&notifier).await;
    assert_eq!(planned.len(), 2, "{planned:?}");
    let escalation = planned
        .iter()
        .find(|(id, _)| id.starts_with("escalation."))
        .expect("an escalation");
    assert!(escalation.0.contains("lead@example.com"), "{planned:?}");
    assert_eq!(escalation.1, waiting);

    // Nobody decides: at its deadline the request times out, and is never approved.
    clock.advance_seconds(2 * 3600);
    let (status, view) = server
        .get(&format!("/api/v1/requests/{waiting}"), &server.agent)
        .await;
    assert_eq!(status, 200);
    assert_eq!(view["status"], "timed_out", "{view}");
    assert!(
        view["proof"].is_null(),
        "a timed-out request carries no proof: {view}"
    );
    // And an expired request is reminded of no more.
    clock.advance_seconds(3600);
    assert_eq!(notifier.plan_reminders().await.unwrap(), 0);
}
