//! Deciding over REST: first decision wins, push wake-up, durability of the outcome.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_approve_and_reject_record_exactly_one_decision() {
    let server = start().await;
    for round in 0..3 {
        let id = server.create_default().await;
        let mut calls = Vec::new();
        for i in 0..20 {
            let token = if i % 2 == 0 {
                server.approver.clone()
            } else {
                server.approver2.clone()
            };
            let decision = if i % 3 == 0 { "rejected" } else { "approved" };
            let http = server.http.clone();
            let url = server.url(&format!("/api/v1/requests/{id}/decision"));
            calls.push(tokio::spawn(async move {
                let resp = http
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({"decision": decision}))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<serde_json::Value>().await.unwrap())
            }));
        }
        let mut winners = Vec::new();
        for call in calls {
            let (status, body) = call.await.unwrap();
            match status {
                200 => winners.push(body),
                409 => {
                    assert_eq!(body["error"]["code"], "already_decided", "{body}");
                    assert!(
                        body["error"]["message"]
                            .as_str()
                            .unwrap()
                            .contains(" via api"),
                        "the loser learns who won: {body}"
                    );
                }
                other => panic!("round {round}: unexpected status {other}: {body}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one decision wins");
        let (_, state) = server
            .get(&format!("/api/v1/requests/{id}"), &server.approver)
            .await;
        assert_eq!(state["status"], winners[0]["status"]);
        assert_eq!(
            state["decision"]["approvers"],
            winners[0]["decision"]["approvers"]
        );
    }
    let kinds = server.event_kinds().await;
    assert_eq!(kinds.iter().filter(|k| *k == "request_decided").count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_long_poll_is_woken_by_the_decision() {
    let server = start().await;
    let id = server.create_default().await;
    let waiter = {
        let http = server.http.clone();
        let url = server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=60"));
        let token = server.agent.clone();
        tokio::spawn(async move {
            let resp = http.get(url).bearer_auth(token).send().await.unwrap();
            (
                Instant::now(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = server.decide(&server.approver, &id, "rejected").await;
    let decided_at = Instant::now();
    assert_eq!(status, 200);
    let (woke_at, body) = waiter.await.unwrap();
    assert_eq!(body["status"], "rejected");
    assert!(body["message"].as_str().unwrap().contains("Do NOT perform"));
    let latency = woke_at.saturating_duration_since(decided_at);
    assert!(
        latency < Duration::from_secs(5),
        "woken {latency:?} after the decision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_usable_once_and_only_by_its_requester() {
    let server = start().await;
    let id = server
        .create(
            &server.agent,
            json!({"action_description": "Refund order 9", "valid_for_seconds": 60}),
        )
        .await;
    server.decide(&server.approver, &id, "approved").await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            &server.agent2,
            json!({"tool": "refund"}),
        )
        .await;
    assert_eq!(
        status, 404,
        "another agent cannot see it, let alone use it: {body}"
    );
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            &server.agent,
            json!({"tool": "refund", "details": {"order": "9"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["used"]["tool"], "refund");
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            &server.agent,
            json!({"tool": "refund"}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "already_used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_requests_cannot_be_decided() {
    let server = start().await;
    let id = server.create_default().await;
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/cancel"),
            &server.agent,
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    let (status, body) = server.decide(&server.approver, &id, "approved").await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "already_decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_pending_requests_newest_first() {
    let server = start().await;
    let first = server.create_default().await;
    let second = server.create_default().await;
    let decided = server.create_default().await;
    server.decide(&server.approver, &decided, "approved").await;
    let (status, body) = server
        .get("/api/v1/requests?status=pending", &server.approver)
        .await;
    assert_eq!(status, 200);
    let ids: Vec<_> = body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec![second, first]);
    let (status, body) = server
        .get("/api/v1/requests?status=bogus", &server.approver)
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("bogus"));
}

/// The delivery history shows every pending delivery and the latest finished ones,
/// newest first, however many older ones the history holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_history_shows_the_newest_first() {
    use countersign_server::notify::{Delivery, DeliveryChannel, DeliveryStatus, history};
    use countersign_store::Doc;

    let server = start().await;
    let store = server.gate.store().clone();
    let t0 = countersign_core::Clock::now(server.gate.clock().as_ref());
    let delivery = |n: u64, status: DeliveryStatus| Delivery {
        id: format!("{n:012}.webhook.audit"),
        seq: n,
        subject: None,
        event_type: "request.created".into(),
        channel: DeliveryChannel::Webhook {
            name: "audit".into(),
            url: "https://hooks.example.com/".into(),
        },
        message_id: format!("msg_{n}"),
        attempts: 1,
        next_at: t0.plus_seconds(n),
        lease_until: None,
        last_error: None,
        status,
        created_at: t0.plus_seconds(n),
        finished_at: None,
        receipt: None,
        body: None,
    };
    let put = |kind: &'static str, d: Delivery| {
        let store = store.clone();
        async move {
            let doc = Doc {
                kind: kind.into(),
                id: d.id.clone(),
                version: 1,
                key: None,
                body: serde_json::to_value(&d).unwrap(),
                updated_at: d.created_at,
            };
            store.doc_insert(&doc, None).await.unwrap();
        }
    };
    // 300 finished (ids sort oldest first), and one still pending from early on.
    for n in 1..=300 {
        put("delivery.done", delivery(n, DeliveryStatus::Sent)).await;
    }
    put("delivery.pending", delivery(0, DeliveryStatus::Pending)).await;

    let shown = history(&store, 5).await.unwrap();
    let seqs: Vec<u64> = shown.iter().map(|d| d.seq).collect();
    assert_eq!(seqs, [300, 299, 298, 297, 296]);
    // With room for all of them, the pending one is there too, last (it is the oldest).
    let shown = history(&store, 1000).await.unwrap();
    assert_eq!(shown.len(), 301);
    assert_eq!(shown.last().unwrap().status, DeliveryStatus::Pending);
}

/// Finished deliveries, and the records of Slack messages and emails sent, older than
/// `[notify] history_days` are pruned; newer ones and pending deliveries stay; a history
/// shorter than a request's longest wait is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_history_is_pruned_after_its_retention() {
    use countersign_server::notify::{Notifier, NotifyConfig};
    use countersign_store::Doc;

    let server = start().await;
    let store = server.gate.store().clone();
    let now = countersign_core::Clock::now(server.gate.clock().as_ref());
    let days_ago = |days: i64| {
        countersign_core::Timestamp::from_millis(now.millis() - days * 86_400_000).unwrap()
    };
    let doc = |kind: &str, id: &str, at| Doc {
        kind: kind.into(),
        id: id.into(),
        version: 1,
        key: None,
        body: json!({"id": id}),
        updated_at: at,
    };
    for (id, age) in [
        ("old-1", 31),
        ("old-2", 45),
        ("old-3", 400),
        ("new-1", 29),
        ("new-2", 0),
    ] {
        store
            .doc_insert(&doc("delivery.done", id, days_ago(age)), None)
            .await
            .unwrap();
    }
    store
        .doc_insert(&doc("delivery.pending", "waiting", days_ago(60)), None)
        .await
        .unwrap();
    for (kind, id, age) in [
        ("slack.message", "req_old/000000000001.slack.U1", 31),
        ("slack.message", "req_new/000000000009.slack.U1", 2),
        ("email.sent", "req_old/ann@example.com", 31),
        ("email.sent", "req_new/ann@example.com", 2),
    ] {
        store
            .doc_insert(&doc(kind, id, days_ago(age)), None)
            .await
            .unwrap();
    }

    let notifier = Notifier::new(server.gate.clone(), NotifyConfig::default()).unwrap();
    assert_eq!(notifier.prune_history().await.unwrap(), 5);
    for kind in ["slack.message", "email.sent"] {
        let left: Vec<String> = store
            .doc_list(kind, "", 100)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.id)
            .collect();
        assert_eq!(left.len(), 1, "{kind}: {left:?}");
        assert!(left[0].starts_with("req_new/"), "{kind}: {left:?}");
    }
    let left: Vec<String> = store
        .doc_list("delivery.done", "", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(left, vec!["new-1".to_string(), "new-2".to_string()]);
    assert!(
        store
            .doc_get("delivery.pending", "waiting")
            .await
            .unwrap()
            .is_some(),
        "a pending delivery is never pruned"
    );
    assert_eq!(notifier.prune_history().await.unwrap(), 0);

    // A shorter history, as configured, prunes more.
    let week = Notifier::new(
        server.gate.clone(),
        NotifyConfig {
            history_days: 10,
            ..NotifyConfig::default()
        },
    )
    .unwrap();
    assert_eq!(week.prune_history().await.unwrap(), 1);

    let err = Notifier::new(
        server.gate.clone(),
        NotifyConfig {
            history_days: 3,
            ..NotifyConfig::default()
        },
    )
    .err()
    .expect("3 days is refused");
    assert!(err.to_string().contains("at least 8"), "{err}");
}
