//! Approval requests: every field survives storage, creation is idempotent per
//! requester, transitions are compare-and-swap, and the listing and expiry queries
//! filter and order as promised.

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::evidence::{OutcomeStatus, ReviewVerdict, Reviewer};
use countersign_core::{
    ApprovalRequest, EventKind, Limits, Principal, SealedTransition, Status, Verdict,
};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{Created, RequestQuery, Store, StoreError, StoredEvent};

use super::fixtures::*;

/// Every field survives storage, through every kind of transition.
pub async fn request_round_trip(store: Arc<dyn Store>) {
    let requester = agent("deploy-bot");
    let alice = approver("alice");

    let created = new_request("req_a", &requester, 0, 3600, Some("key-a"));
    assert_eq!(create_new(&store, &created).await, created.request);
    assert_eq!(
        store.get_request("req_a").await.unwrap(),
        Some(created.request.clone())
    );
    assert_eq!(store.get_request("req_missing").await.unwrap(), None);

    let approved = decide(&created.request, Verdict::Approved, &alice, 60, "nonce-a");
    store.apply(&sealed(&approved)).await.unwrap();
    let stored = store.get_request("req_a").await.unwrap().unwrap();
    assert!(stored.decision.is_some() && stored.proof.is_some());
    assert_eq!(stored, approved.request);

    let used = approved
        .request
        .record_action(
            "pay_invoice".into(),
            BTreeMap::from([("invoice".to_string(), "INV-1".to_string())]),
            &requester,
            at(61),
            &Limits::default(),
        )
        .unwrap();
    store.apply(&sealed(&used)).await.unwrap();
    let stored = store.get_request("req_a").await.unwrap().unwrap();
    assert!(stored.action_record.is_some());
    assert_eq!(stored, used.request);
    assert_eq!(stored.version, 3);

    let outcome = used
        .request
        .record_outcome(
            OutcomeStatus::Partial,
            Some("paid, receipt pending".into()),
            BTreeMap::from([("receipt".to_string(), "none yet".to_string())]),
            &requester,
            at(62),
            &Limits::default(),
        )
        .unwrap();
    store.apply(&sealed(&outcome)).await.unwrap();
    let reviewer = Reviewer {
        id: "auditor".into(),
        display_name: "The Auditor".into(),
    };
    let reviewed = outcome
        .request
        .record_review(
            &reviewer,
            ReviewVerdict::Flagged,
            Some("amount close to the limit".into()),
            &alice,
            at(63),
            &Limits::default(),
        )
        .unwrap();
    store.apply(&sealed(&reviewed)).await.unwrap();
    let stored = store.get_request("req_a").await.unwrap().unwrap();
    assert!(stored.outcome.is_some() && stored.reviews.len() == 1);
    assert_eq!(stored, reviewed.request);
    assert_eq!(stored.version, 5);

    let rejected_req = new_request("req_r", &requester, 1, 3600, None);
    create_new(&store, &rejected_req).await;
    let rejected = decide(
        &rejected_req.request,
        Verdict::Rejected,
        &alice,
        2,
        "nonce-r",
    );
    store.apply(&sealed(&rejected)).await.unwrap();
    assert_eq!(
        store.get_request("req_r").await.unwrap(),
        Some(rejected.request)
    );

    let cancel_req = new_request("req_c", &requester, 2, 3600, None);
    create_new(&store, &cancel_req).await;
    let cancelled = cancel_req.request.cancel(&requester, at(3)).unwrap();
    store.apply(&sealed(&cancelled)).await.unwrap();
    let stored = store.get_request("req_c").await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Cancelled);
    assert_eq!(stored, cancelled.request);

    let expiring = new_request("req_t", &requester, 3, 10, None);
    create_new(&store, &expiring).await;
    let timed_out = expiring.request.time_out(at(13)).unwrap();
    store.apply(&sealed(&timed_out)).await.unwrap();
    let stored = store.get_request("req_t").await.unwrap().unwrap();
    assert_eq!(stored.closed_at, Some(at(13)));
    assert_eq!(stored, timed_out.request);

    store.check().await.unwrap();
}

/// A retry with the same key by the same requester gets the stored request back and
/// writes nothing; the key is scoped to its requester.
pub async fn idempotent_create_returns_existing(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let other_bot = agent("billing-bot");

    let first = new_request("req_1", &bot, 0, 3600, Some("k1"));
    create_new(&store, &first).await;
    let seq = store.last_event_seq().await.unwrap();
    assert_eq!(seq, 1);

    let retry = new_request("req_2", &bot, 5, 60, Some("k1"));
    match store.create_request(&sealed(&retry)).await.unwrap() {
        Created::Existing(existing) => assert_eq!(existing, first.request),
        Created::New(_) => panic!("a retry with the same key must not create a request"),
    }
    assert_eq!(
        store.last_event_seq().await.unwrap(),
        seq,
        "nothing written"
    );
    assert_eq!(store.get_request("req_2").await.unwrap(), None);

    // The existing request is returned as it is now, not as it was created.
    let decided = decide(
        &first.request,
        Verdict::Approved,
        &approver("alice"),
        10,
        "n",
    );
    store.apply(&sealed(&decided)).await.unwrap();
    match store.create_request(&sealed(&retry)).await.unwrap() {
        Created::Existing(existing) => assert_eq!(existing, decided.request),
        Created::New(_) => panic!("a retry with the same key must not create a request"),
    }

    // Another requester may use the same key.
    let theirs = new_request("req_3", &other_bot, 6, 3600, Some("k1"));
    assert_eq!(create_new(&store, &theirs).await, theirs.request);

    // Requests without a key never collide.
    create_new(&store, &new_request("req_4", &bot, 7, 3600, None)).await;
    create_new(&store, &new_request("req_5", &bot, 8, 3600, None)).await;
    assert_eq!(
        store
            .list_requests(&RequestQuery::default())
            .await
            .unwrap()
            .len(),
        4
    );
    assert_eq!(store.last_event_seq().await.unwrap(), 5);
}

/// Twenty concurrent creates with one key: one request, and every caller learns its id.
pub async fn concurrent_idempotent_creates_make_one_request(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        let barrier = barrier.clone();
        let transition = new_request(&format!("req_{i:02}"), &bot, i, 3600, Some("same-key"));
        tasks.spawn(async move {
            barrier.wait().await;
            store.create_request(&sealed(&transition)).await.unwrap()
        });
    }
    let results = tasks.join_all().await;
    let new: Vec<&ApprovalRequest> = results
        .iter()
        .filter_map(|c| match c {
            Created::New(r) => Some(r),
            Created::Existing(_) => None,
        })
        .collect();
    assert_eq!(new.len(), 1, "exactly one create wins");
    let winner = new[0].clone();
    for created in &results {
        let (Created::New(r) | Created::Existing(r)) = created;
        assert_eq!(r, &winner, "every caller sees the one stored request");
    }
    let listed = store.list_requests(&RequestQuery::default()).await.unwrap();
    assert_eq!(listed, vec![winner]);
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
}

/// Two requests cannot share an id; the refused one leaves no trace.
pub async fn duplicate_request_id_is_refused(store: Arc<dyn Store>) {
    let first = new_request("req_dup", &agent("a"), 0, 3600, None);
    create_new(&store, &first).await;
    let clash = new_request("req_dup", &agent("b"), 1, 60, None);
    let err = store.create_request(&sealed(&clash)).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(
        store.get_request("req_dup").await.unwrap(),
        Some(first.request)
    );
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
}

/// A request stored already decided: both transitions' events, in order, or nothing
/// (an idempotent retry, a taken id).
pub async fn create_decided_writes_both_or_neither(store: Arc<dyn Store>) {
    let bot = agent("refund-bot");
    let created = new_request("req_ruled", &bot, 0, 3600, Some("k-ruled"));
    let decided = decide(
        &created.request,
        Verdict::Approved,
        &approver("policy"),
        0,
        "n",
    );
    match store
        .create_decided(&sealed(&created), &[sealed(&decided)])
        .await
        .unwrap()
    {
        Created::New(request) => assert_eq!(request, decided.request),
        Created::Existing(_) => panic!("a new request"),
    }
    assert_eq!(
        store.get_request("req_ruled").await.unwrap(),
        Some(decided.request.clone())
    );
    let events = store.events_after(0, 10).await.unwrap();
    let kinds: Vec<(u64, EventKind)> = events.iter().map(|e| (e.seq, e.entry.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (1, EventKind::RequestCreated),
            (2, EventKind::RequestDecided)
        ]
    );

    // A retry of its idempotency key writes nothing and returns the request as it is.
    let retry = new_request("req_ruled_2", &bot, 5, 3600, Some("k-ruled"));
    let retry_decided = decide(
        &retry.request,
        Verdict::Rejected,
        &approver("policy"),
        5,
        "m",
    );
    match store
        .create_decided(&sealed(&retry), &[sealed(&retry_decided)])
        .await
        .unwrap()
    {
        Created::Existing(existing) => assert_eq!(existing, decided.request),
        Created::New(_) => panic!("a retry with the same key must not create a request"),
    }
    assert_eq!(store.get_request("req_ruled_2").await.unwrap(), None);
    assert_eq!(store.last_event_seq().await.unwrap(), 2);

    // A taken id: refused, and neither event is written.
    let clash = new_request("req_ruled", &agent("other-bot"), 6, 3600, None);
    let clash_decided = decide(
        &clash.request,
        Verdict::Approved,
        &approver("policy"),
        6,
        "o",
    );
    let err = store
        .create_decided(&sealed(&clash), &[sealed(&clash_decided)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(store.last_event_seq().await.unwrap(), 2);
    assert_eq!(
        store.get_request("req_ruled").await.unwrap(),
        Some(decided.request)
    );

    // A decision that does not follow its creation (a version skipped): refused, and the
    // request is not stored either (one transaction: two commits would keep it).
    let orphan = new_request("req_ruled_3", &bot, 7, 3600, None);
    let mut skipped = decide(
        &orphan.request,
        Verdict::Approved,
        &approver("policy"),
        7,
        "p",
    );
    skipped.request.version += 1;
    let refused = store
        .create_decided(&sealed(&orphan), &[sealed(&skipped)])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(store.get_request("req_ruled_3").await.unwrap(), None);
    assert_eq!(store.last_event_seq().await.unwrap(), 2);

    // A decision and the claim of its one use (a gateway's forward), in one write: the
    // row as claimed, and the three events in order.
    let gated = new_request("req_ruled_4", &bot, 8, 3600, Some("k-gated"));
    let approved = decide(
        &gated.request,
        Verdict::Approved,
        &approver("policy"),
        8,
        "q",
    );
    let claimed = approved
        .request
        .record_action(
            "write".into(),
            [("forwarded_by".to_string(), "gw-1".to_string())].into(),
            &bot,
            at(8),
            &Limits::default(),
        )
        .unwrap();
    match store
        .create_decided(&sealed(&gated), &[sealed(&approved), sealed(&claimed)])
        .await
        .unwrap()
    {
        Created::New(request) => assert_eq!(request, claimed.request),
        Created::Existing(_) => panic!("a new request"),
    }
    let stored = store.get_request("req_ruled_4").await.unwrap().unwrap();
    assert_eq!(stored, claimed.request);
    assert!(stored.used().is_some(), "stored as claimed");
    let events = store.events_after(2, 10).await.unwrap();
    let kinds: Vec<(u64, EventKind)> = events.iter().map(|e| (e.seq, e.entry.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (3, EventKind::RequestCreated),
            (4, EventKind::RequestDecided),
            (5, EventKind::ActionRecorded)
        ]
    );

    // A chain with a gap (the claim skips a version): nothing is written.
    let gapped = new_request("req_ruled_5", &bot, 9, 3600, None);
    let approved = decide(
        &gapped.request,
        Verdict::Approved,
        &approver("policy"),
        9,
        "r",
    );
    let mut claimed = approved
        .request
        .record_action(
            "write".into(),
            Default::default(),
            &bot,
            at(9),
            &Limits::default(),
        )
        .unwrap();
    claimed.request.version += 1;
    let refused = store
        .create_decided(&sealed(&gapped), &[sealed(&approved), sealed(&claimed)])
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(store.get_request("req_ruled_5").await.unwrap(), None);
    assert_eq!(store.last_event_seq().await.unwrap(), 5);
}

/// `apply` stores only the next version, and a loser learns what won.
pub async fn apply_is_compare_and_swap(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let created = new_request("req_cas", &bot, 0, 3600, None);
    create_new(&store, &created).await;

    let approved = decide(
        &created.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n1",
    );
    store.apply(&sealed(&approved)).await.unwrap();
    assert_eq!(
        store.get_request("req_cas").await.unwrap().unwrap().version,
        2
    );

    // The same transition twice, and a rival built from the old version, both lose.
    for stale in [
        approved.clone(),
        decide(
            &created.request,
            Verdict::Rejected,
            &approver("bob"),
            6,
            "n2",
        ),
    ] {
        match store.apply(&sealed(&stale)).await {
            Err(StoreError::VersionConflict { current }) => {
                assert_eq!(*current, approved.request)
            }
            other => panic!("expected a version conflict, got {other:?}"),
        }
    }

    // A transition that skips a version is refused too.
    let second = new_request("req_skip", &bot, 1, 3600, None);
    create_new(&store, &second).await;
    let decided = decide(
        &second.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n3",
    );
    let used = decided
        .request
        .record_action(
            "pay".into(),
            BTreeMap::new(),
            &bot,
            at(6),
            &Limits::default(),
        )
        .unwrap();
    match store.apply(&sealed(&used)).await {
        Err(StoreError::VersionConflict { current }) => assert_eq!(*current, second.request),
        other => panic!("expected a version conflict, got {other:?}"),
    }

    // A request that was never stored.
    let ghost = new_request("req_ghost", &bot, 0, 3600, None);
    let ghost_decided = decide(
        &ghost.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n4",
    );
    match store.apply(&sealed(&ghost_decided)).await {
        Err(StoreError::NotFound { what, id }) => {
            assert_eq!((what, id.as_str()), ("request", "req_ghost"))
        }
        other => panic!("expected not found, got {other:?}"),
    }
    assert_eq!(store.get_request("req_ghost").await.unwrap(), None);

    // Two creates and one decision: the failures wrote nothing.
    assert_eq!(
        kinds(&all_events(&store).await),
        ["request_created", "request_decided", "request_created"]
    );
}

/// Twenty approvers decide the same pending request at once: one wins, the others are
/// told what won, and only one decision is recorded.
pub async fn first_decision_wins(store: Arc<dyn Store>) {
    let created = new_request("req_race", &agent("deploy-bot"), 0, 3600, None);
    create_new(&store, &created).await;

    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let verdict = if i % 2 == 0 {
            Verdict::Approved
        } else {
            Verdict::Rejected
        };
        let transition = sealed(&decide(
            &created.request,
            verdict,
            &approver(&format!("approver-{i}")),
            10,
            &format!("nonce-{i}"),
        ));
        let store = store.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            let result = store.apply(&transition).await;
            (transition, result)
        });
    }
    let results = tasks.join_all().await;

    let winners: Vec<&SealedTransition> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(t, _)| t)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one decision wins");
    let stored = store.get_request("req_race").await.unwrap().unwrap();
    assert_eq!(stored, winners[0].request);
    for (_, result) in &results {
        match result {
            Ok(()) => {}
            Err(StoreError::VersionConflict { current }) => assert_eq!(**current, stored),
            Err(other) => panic!("a losing decision must be a version conflict, got {other}"),
        }
    }

    let decided: Vec<StoredEvent> = all_events(&store)
        .await
        .into_iter()
        .filter(|e| e.entry.kind == EventKind::RequestDecided)
        .collect();
    assert_eq!(decided.len(), 1, "exactly one decision event");
    assert_stored_as(&decided[0], &winners[0].event);
    assert_eq!(store.last_event_seq().await.unwrap(), 2);
}

/// The sweeper's queries: only pending requests, due at or before now, earliest first.
pub async fn expiry_queries(store: Arc<dyn Store>) {
    assert_eq!(store.next_expiry().await.unwrap(), None);
    assert!(store.due_for_expiry(at(1000), 10).await.unwrap().is_empty());
    assert_eq!(store.count_requests(Status::Pending).await.unwrap(), 0);

    let bot = agent("deploy-bot");
    // Expiring at +30, +15, +60, +5 (then decided), +15 (ties with req_e2 by time).
    let e1 = new_request("req_e1", &bot, 0, 30, None);
    let e2 = new_request("req_e2", &bot, 5, 10, None);
    let e3 = new_request("req_e3", &bot, 0, 60, None);
    let e4 = new_request("req_e4", &bot, 0, 5, None);
    let e5 = new_request("req_e5", &bot, 10, 5, None);
    for t in [&e5, &e4, &e3, &e2, &e1] {
        create_new(&store, t).await;
    }
    assert_eq!(store.next_expiry().await.unwrap(), Some(at(5)));
    let decided = decide(&e4.request, Verdict::Approved, &approver("alice"), 1, "n");
    store.apply(&sealed(&decided)).await.unwrap();
    assert_eq!(store.next_expiry().await.unwrap(), Some(at(15)));
    // The counts /metrics reads: by status, decided ones no longer pending.
    assert_eq!(store.count_requests(Status::Pending).await.unwrap(), 4);
    assert_eq!(store.count_requests(Status::Approved).await.unwrap(), 1);
    assert_eq!(store.count_requests(Status::TimedOut).await.unwrap(), 0);

    let due = |now: i64, limit: usize| {
        let store = store.clone();
        async move {
            let due = store.due_for_expiry(at(now), limit).await.unwrap();
            assert!(due.iter().all(|r| r.status == Status::Pending));
            due.iter().map(|r| r.id.clone()).collect::<Vec<_>>()
        }
    };
    assert!(due(14, 10).await.is_empty());
    assert_eq!(
        due(15, 10).await,
        ["req_e2", "req_e5"],
        "due at exactly now"
    );
    assert_eq!(due(30, 10).await, ["req_e2", "req_e5", "req_e1"]);
    assert_eq!(due(30, 2).await, ["req_e2", "req_e5"]);
    assert_eq!(
        due(1000, 10).await,
        ["req_e2", "req_e5", "req_e1", "req_e3"]
    );

    let timed_out = e2.request.time_out(at(15)).unwrap();
    store.apply(&sealed(&timed_out)).await.unwrap();
    assert_eq!(due(30, 10).await, ["req_e5", "req_e1"]);
    assert_eq!(store.next_expiry().await.unwrap(), Some(at(15)));

    for t in [&e5, &e1, &e3] {
        let timed_out = t.request.time_out(at(100)).unwrap();
        store.apply(&sealed(&timed_out)).await.unwrap();
    }
    assert_eq!(store.next_expiry().await.unwrap(), None);
    assert!(due(1000, 10).await.is_empty());
}

/// Listing filters by status and requester, newest first, ties broken by id descending.
pub async fn list_requests_filters_and_order(store: Arc<dyn Store>) {
    let a = agent("agent-a");
    let b = agent("agent-b");
    let alice = approver("alice");
    let transitions = [
        new_request("req_l1", &a, 1, 3600, None),
        new_request("req_l2", &b, 2, 3600, None),
        new_request("req_l3", &a, 3, 3600, None),
        new_request("req_l4", &a, 3, 3600, None),
        new_request("req_l5", &b, 5, 3600, None),
    ];
    // Inserted out of order, so that insertion order cannot pass for time order.
    for i in [2, 0, 4, 3, 1] {
        create_new(&store, &transitions[i]).await;
    }
    let approved = decide(&transitions[2].request, Verdict::Approved, &alice, 6, "n1");
    store.apply(&sealed(&approved)).await.unwrap();
    let rejected = decide(&transitions[4].request, Verdict::Rejected, &alice, 7, "n2");
    store.apply(&sealed(&rejected)).await.unwrap();

    let list = |status: Option<Status>, by: Option<&Principal>, limit: usize| {
        let store = store.clone();
        let query = RequestQuery {
            status,
            requested_by: by.map(|p| p.id.clone()),
            limit,
        };
        async move { store.list_requests(&query).await.unwrap() }
    };

    let everything = list(None, None, 100).await;
    assert_eq!(
        ids(&everything),
        ["req_l5", "req_l4", "req_l3", "req_l2", "req_l1"]
    );
    for listed in &everything {
        assert_eq!(
            Some(listed),
            store.get_request(&listed.id).await.unwrap().as_ref()
        );
    }
    assert_eq!(
        ids(&list(Some(Status::Pending), None, 100).await),
        ["req_l4", "req_l2", "req_l1"]
    );
    assert_eq!(
        ids(&list(Some(Status::Approved), None, 100).await),
        ["req_l3"]
    );
    assert_eq!(
        ids(&list(None, Some(&a), 100).await),
        ["req_l4", "req_l3", "req_l1"]
    );
    assert_eq!(
        ids(&list(Some(Status::Pending), Some(&b), 100).await),
        ["req_l2"]
    );
    assert_eq!(ids(&list(None, None, 2).await), ["req_l5", "req_l4"]);
    assert!(list(None, Some(&agent("nobody")), 100).await.is_empty());
    assert!(list(Some(Status::Cancelled), None, 100).await.is_empty());
}
