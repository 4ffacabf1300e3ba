//! Digests (`[limits] notifications_per_agent`): past its limit in a window, one agent's
//! new requests are summed up in one message per route when the window ends, instead of
//! one message each; other agents are notified as usual, and planning twice plans once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use countersign_core::{FixedClock, Timestamp};
use countersign_server::notify::slack::SlackConfig;
use countersign_server::notify::{DigestConfig, Notifier, NotifyConfig, Route};
use serde_json::{Value, json};

use super::support::start_clocked_with;

/// A Slack Web API that records every chat.postMessage body.
async fn fake_slack() -> (String, Arc<Mutex<Vec<Value>>>) {
    let posted: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/api/chat.postMessage",
            axum::routing::post(
                |State(posted): State<Arc<Mutex<Vec<Value>>>>, body: axum::body::Bytes| async move {
                    let body: Value = serde_json::from_slice(&body).unwrap();
                    let n = {
                        let mut all = posted.lock().unwrap();
                        all.push(body);
                        all.len()
                    };
                    axum::Json(json!({"ok": true, "channel": "C0OPS", "ts": format!("{n}.0001")}))
                },
            ),
        )
        .with_state(posted.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/api"), posted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_requests_from_one_agent_is_summed_up_in_one_digest() {
    let clock = Arc::new(FixedClock::new(
        Timestamp::parse("2026-11-29T12:00:00Z").unwrap(),
    ));
    let server = start_clocked_with(clock.clone(), countersign_server::Settings::default()).await;
    let (api, posted) = fake_slack().await;
    let config = NotifyConfig {
        slack: Some(SlackConfig {
            bot_token: "xoxb-test".into(),
            signing_secret: "secret".into(),
            api_base_url: api,
            approvers: BTreeMap::new(),
        }),
        default_routes: vec![Route::Slack("#ops".into())],
        digest: Some(DigestConfig {
            per_agent: 2,
            window_seconds: 600,
        }),
        public_url: "https://approvals.example.com".into(),
        ..NotifyConfig::default()
    };
    let notifier = Notifier::new(server.gate.clone(), config).unwrap();
    notifier.plan_new_events().await.unwrap();

    for n in 0..5 {
        server
            .create(
                &server.agent,
                json!({"action_description": format!("Delete bucket {n}")}),
            )
            .await;
    }
    server
        .create(
            &server.agent2,
            json!({"action_description": "Restart the cache"}),
        )
        .await;
    // Two of the runaway agent's requests and the other agent's one, then one digest.
    let planned = notifier.plan_new_events().await.unwrap();
    assert_eq!(planned, 4);
    assert_eq!(notifier.plan_new_events().await.unwrap(), 0);
    let digests: Vec<_> = notifier
        .history(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.event_type == "request.digest")
        .collect();
    assert_eq!(digests.len(), 1, "{digests:?}");
    assert_eq!(
        digests[0].next_at,
        Timestamp::parse("2026-11-29T12:10:00Z").unwrap()
    );

    assert_eq!(notifier.send_due().await.unwrap(), 3);
    {
        let posted = posted.lock().unwrap();
        assert_eq!(posted.len(), 3);
        let texts: Vec<String> = posted.iter().map(|p| p["text"].to_string()).collect();
        assert_eq!(
            texts.iter().filter(|t| t.contains("Delete bucket")).count(),
            2,
            "{texts:?}"
        );
        assert!(texts.iter().any(|t| t.contains("Restart the cache")));
    }

    // The window ends: one message says how many more wait.
    clock.advance_seconds(600);
    assert_eq!(notifier.send_due().await.unwrap(), 1);
    let digest = posted.lock().unwrap()[3].clone();
    assert_eq!(digest["channel"], "#ops");
    let text = digest["text"].as_str().unwrap();
    assert!(
        text.starts_with("3 more requests from deploy-bot (token:deploy-bot) are waiting"),
        "{text}"
    );
    assert!(text.contains("5 of its requests are pending now"), "{text}");
    assert!(text.contains("<https://approvals.example.com/|Open the dashboard>"));
    assert_eq!(notifier.send_due().await.unwrap(), 0);

    // A new window: notified one by one again.
    server
        .create(
            &server.agent,
            json!({"action_description": "Delete bucket 9"}),
        )
        .await;
    assert_eq!(notifier.plan_new_events().await.unwrap(), 1);
    assert_eq!(notifier.send_due().await.unwrap(), 1);
    assert!(
        posted.lock().unwrap()[4]["text"]
            .to_string()
            .contains("Delete bucket 9")
    );
}

/// A webhook URL with secrets in it (a password, a token in the query) appears redacted
/// in the delivery history and in its errors; the send still goes to the real URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_secrets_in_urls_stay_out_of_the_history() {
    let clock = Arc::new(FixedClock::new(
        Timestamp::parse("2026-11-29T12:00:00Z").unwrap(),
    ));
    let server = start_clocked_with(clock.clone(), countersign_server::Settings::default()).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = NotifyConfig {
        webhooks: vec![countersign_server::notify::WebhookConfig {
            name: "audit".into(),
            url: format!("http://hook:pa55word@127.0.0.1:{closed}/in?token=s3cret"),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            events: vec![],
            format: Default::default(),
        }],
        ..NotifyConfig::default()
    };
    let notifier = Notifier::new(server.gate.clone(), config).unwrap();
    notifier.plan_new_events().await.unwrap();
    server.create_default().await;
    assert_eq!(notifier.plan_new_events().await.unwrap(), 1);
    assert_eq!(notifier.send_due().await.unwrap(), 1);
    let history = notifier.history(10).await.unwrap();
    let text = serde_json::to_string(&history).unwrap();
    assert!(
        !text.contains("s3cret") && !text.contains("pa55word"),
        "{text}"
    );
    assert!(
        text.contains(&format!("http://***@127.0.0.1:{closed}/in?***")),
        "{text}"
    );
    let error = history[0].last_error.clone().unwrap();
    assert!(error.contains("could not reach"), "{error}");
}
