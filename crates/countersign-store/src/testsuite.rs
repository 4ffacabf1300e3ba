//! The test suite every backend must pass, so that SQLite and PostgreSQL cannot drift
//! apart in what they promise.
//!
//! A backend runs it from its own test binary with [`store_test_suite!`](crate::store_test_suite):
//!
//! ```ignore
//! mod suite {
//!     countersign_store::store_test_suite!(async {
//!         let dir = tempfile::tempdir().unwrap();
//!         let store = MyStore::open(&dir.path().join("db")).unwrap();
//!         (std::sync::Arc::new(store), dir)
//!     });
//! }
//! ```
//!
//! The factory expression is evaluated once per test and must yield, when awaited, a
//! fresh **empty** store (as an `Arc` of any [`Store`]) and a guard that lives until the
//! test ends (a temporary directory, a database to drop, or `()`). Each test is a
//! `#[tokio::test]` on a 4-thread runtime, so the test binary needs `tokio` with the
//! `macros` and `rt-multi-thread` features. Each test is also a public function here,
//! for a backend that wants to run one differently.

// Test code compiled into the library only under the `testsuite` feature: failing loudly
// is its job.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::event::EventBody;
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, Limits, NewRequest, Principal, Role, Signer,
    Status, Timestamp, TokenRecord, Transition, Verdict,
};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{ChangeFeed, Created, RequestQuery, Store, StoreError, StoredEvent};

/// Expands into one `#[tokio::test]` per suite test; see the [module docs](crate::testsuite).
#[macro_export]
macro_rules! store_test_suite {
    ($factory:expr) => {
        $crate::store_test_suite!(@each $factory;
            request_round_trip,
            idempotent_create_returns_existing,
            concurrent_idempotent_creates_make_one_request,
            duplicate_request_id_is_refused,
            apply_is_compare_and_swap,
            first_decision_wins,
            events_are_gap_free_and_exact,
            expiry_queries,
            list_requests_filters_and_order,
            tokens,
            change_feed_wakes_watchers_on_poke,
            change_feed_polls_without_poke,
        );
    };
    (@each $factory:expr; $($test:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let (store, _guard) = $factory.await;
                $crate::testsuite::$test(store).await;
            }
        )+
    };
}

// ---------------------------------------------------------------------------------------
// Fixtures, built with countersign-core's real API.

/// The suite's epoch; times are given as seconds after it.
pub fn at(seconds: i64) -> Timestamp {
    let t0 = Timestamp::parse("2026-11-29T12:00:00Z").unwrap().millis();
    Timestamp::from_millis(t0 + seconds * 1000).unwrap()
}

pub fn agent(name: &str) -> Principal {
    Principal::from_token(name, Role::Agent)
}

pub fn approver(name: &str) -> Principal {
    Principal::from_token(name, Role::Approver)
}

pub fn signer() -> Signer {
    Signer::from_seed([7; 32])
}

/// A new pending request `id` by `by`, created at `created` seconds, expiring
/// `timeout` seconds later.
pub fn new_request(
    id: &str,
    by: &Principal,
    created: i64,
    timeout: u64,
    idempotency_key: Option<&str>,
) -> Transition {
    ApprovalRequest::create(
        id.to_string(),
        NewRequest {
            description: format!("Transfer GBP 12,450 to Globex Corp ({id})"),
            details: BTreeMap::from([
                ("amount".to_string(), "12450".to_string()),
                ("currency".to_string(), "GBP".to_string()),
            ]),
            recipient_email: Some("finance@example.com".into()),
            recipient_slack: Some("#approvals".into()),
            timeout_seconds: Some(timeout),
            valid_for_seconds: Some(600),
            idempotency_key: idempotency_key.map(str::to_string),
            ..NewRequest::default()
        },
        by,
        at(created),
        &Limits::default(),
    )
    .unwrap()
}

pub fn decide(
    request: &ApprovalRequest,
    verdict: Verdict,
    by: &Principal,
    seconds: i64,
    nonce: &str,
) -> Transition {
    request
        .decide(
            verdict,
            DecisionInput {
                comment: Some(format!("{} by {}", verdict.as_str(), by.id)),
                fields: BTreeMap::from([("po_number".to_string(), "PO-7".to_string())]),
            },
            by,
            Channel::Api,
            at(seconds),
            nonce.to_string(),
            &signer(),
            &Limits::default(),
        )
        .unwrap()
}

pub fn token(id: &str, name: &str, hash: &str, created: i64) -> (TokenRecord, Event) {
    let record = TokenRecord {
        id: id.to_string(),
        name: name.to_string(),
        role: Role::Approver,
        hash: hash.to_string(),
        created_at: at(created),
        revoked_at: None,
    };
    let event = Event {
        at: at(created),
        actor: Some("local:admin".into()),
        body: EventBody::TokenCreated {
            token_id: id.to_string(),
            name: name.to_string(),
            role: Role::Approver,
        },
    };
    (record, event)
}

pub fn token_revoked(record: &TokenRecord, seconds: i64) -> Event {
    Event {
        at: at(seconds),
        actor: Some("local:admin".into()),
        body: EventBody::TokenRevoked {
            token_id: record.id.clone(),
            name: record.name.clone(),
        },
    }
}

async fn create_new(store: &Arc<dyn Store>, transition: &Transition) -> ApprovalRequest {
    match store.create_request(transition).await.unwrap() {
        Created::New(request) => request,
        Created::Existing(existing) => panic!("expected a new request, got {existing:?}"),
    }
}

async fn all_events(store: &Arc<dyn Store>) -> Vec<StoredEvent> {
    store.events_after(0, 100_000).await.unwrap()
}

fn ids(requests: &[ApprovalRequest]) -> Vec<&str> {
    requests.iter().map(|r| r.id.as_str()).collect()
}

fn assert_gap_free(events: &[StoredEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "event sequence numbers must be 1, 2, 3, …");
}

// ---------------------------------------------------------------------------------------
// The tests.

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
    store.apply(&approved).await.unwrap();
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
    store.apply(&used).await.unwrap();
    let stored = store.get_request("req_a").await.unwrap().unwrap();
    assert!(stored.action_record.is_some());
    assert_eq!(stored, used.request);
    assert_eq!(stored.version, 3);

    let rejected_req = new_request("req_r", &requester, 1, 3600, None);
    create_new(&store, &rejected_req).await;
    let rejected = decide(
        &rejected_req.request,
        Verdict::Rejected,
        &alice,
        2,
        "nonce-r",
    );
    store.apply(&rejected).await.unwrap();
    assert_eq!(
        store.get_request("req_r").await.unwrap(),
        Some(rejected.request)
    );

    let cancel_req = new_request("req_c", &requester, 2, 3600, None);
    create_new(&store, &cancel_req).await;
    let cancelled = cancel_req.request.cancel(&requester, at(3)).unwrap();
    store.apply(&cancelled).await.unwrap();
    let stored = store.get_request("req_c").await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Cancelled);
    assert_eq!(stored, cancelled.request);

    let expiring = new_request("req_t", &requester, 3, 10, None);
    create_new(&store, &expiring).await;
    let timed_out = expiring.request.time_out(at(13)).unwrap();
    store.apply(&timed_out).await.unwrap();
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
    match store.create_request(&retry).await.unwrap() {
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
    store.apply(&decided).await.unwrap();
    match store.create_request(&retry).await.unwrap() {
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
            store.create_request(&transition).await.unwrap()
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
    let err = store.create_request(&clash).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(
        store.get_request("req_dup").await.unwrap(),
        Some(first.request)
    );
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
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
    store.apply(&approved).await.unwrap();
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
        match store.apply(&stale).await {
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
    match store.apply(&used).await {
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
    match store.apply(&ghost_decided).await {
        Err(StoreError::NotFound { what, id }) => {
            assert_eq!((what, id.as_str()), ("request", "req_ghost"))
        }
        other => panic!("expected not found, got {other:?}"),
    }
    assert_eq!(store.get_request("req_ghost").await.unwrap(), None);

    // Two creates and one decision: the failures wrote nothing.
    let kinds: Vec<&str> = all_events(&store)
        .await
        .iter()
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(
        kinds,
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
        let transition = decide(
            &created.request,
            verdict,
            &approver(&format!("approver-{i}")),
            10,
            &format!("nonce-{i}"),
        );
        let store = store.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            let result = store.apply(&transition).await;
            (transition, result)
        });
    }
    let results = tasks.join_all().await;

    let winners: Vec<&Transition> = results
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
        .filter(|e| e.event.kind() == "request_decided")
        .collect();
    assert_eq!(decided.len(), 1, "exactly one decision event");
    assert_eq!(decided[0].event, winners[0].event);
    assert_eq!(store.last_event_seq().await.unwrap(), 2);
}

/// Events are numbered 1, 2, 3… with no gap, even around failed writes, and keep their
/// exact bytes; `events_after` pages through them.
pub async fn events_are_gap_free_and_exact(store: Arc<dyn Store>) {
    assert_eq!(store.last_event_seq().await.unwrap(), 0);
    assert!(all_events(&store).await.is_empty());

    let bot = agent("deploy-bot");
    let alice = approver("alice");
    let mut expected: Vec<Event> = Vec::new();

    let a = new_request("req_a", &bot, 0, 3600, None);
    create_new(&store, &a).await;
    expected.push(a.event.clone());

    // Each failure below sits between successes: a burned number would show as a gap.
    let clash = new_request("req_a", &bot, 1, 3600, None);
    assert!(store.create_request(&clash).await.is_err());

    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 1);
    store.create_token(&tok, &tok_event).await.unwrap();
    expected.push(tok_event);

    let approved = decide(&a.request, Verdict::Approved, &alice, 2, "n1");
    store.apply(&approved).await.unwrap();
    expected.push(approved.event.clone());

    let stale = decide(&a.request, Verdict::Rejected, &alice, 3, "n2");
    assert!(store.apply(&stale).await.is_err());
    let (dup, dup_event) = token("tok_2", "bob", "hash-1", 3);
    assert!(store.create_token(&dup, &dup_event).await.is_err());
    assert!(
        store
            .revoke_token("tok_missing", at(3), &token_revoked(&dup, 3))
            .await
            .is_err()
    );

    let b = new_request("req_b", &bot, 4, 3600, Some("k"));
    create_new(&store, &b).await;
    expected.push(b.event.clone());
    let b_retry = new_request("req_b2", &bot, 4, 3600, Some("k"));
    assert!(matches!(
        store.create_request(&b_retry).await.unwrap(),
        Created::Existing(_)
    ));

    let revoked = token_revoked(&tok, 5);
    store.revoke_token("tok_1", at(5), &revoked).await.unwrap();
    expected.push(revoked.clone());
    assert!(store.revoke_token("tok_1", at(6), &revoked).await.is_err());

    let cancelled = b.request.cancel(&bot, at(7)).unwrap();
    store.apply(&cancelled).await.unwrap();
    expected.push(cancelled.event);

    let events = all_events(&store).await;
    assert_gap_free(&events);
    let stored: Vec<&Event> = events.iter().map(|e| &e.event).collect();
    assert_eq!(stored, expected.iter().collect::<Vec<_>>());
    for (stored, event) in events.iter().zip(&expected) {
        assert_eq!(stored.bytes, event.to_bytes(), "event {} bytes", stored.seq);
    }
    assert_eq!(store.last_event_seq().await.unwrap(), expected.len() as u64);

    // Paging two at a time yields the same events.
    let mut paged = Vec::new();
    let mut cursor = 0;
    loop {
        let page = store.events_after(cursor, 2).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        cursor = last.seq;
        paged.extend(page);
    }
    assert_eq!(paged, events);
    assert_eq!(
        store.events_after(2, 1).await.unwrap(),
        vec![events[2].clone()]
    );
    assert!(
        store
            .events_after(events.len() as u64, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The sweeper's queries: only pending requests, due at or before now, earliest first.
pub async fn expiry_queries(store: Arc<dyn Store>) {
    assert_eq!(store.next_expiry().await.unwrap(), None);
    assert!(store.due_for_expiry(at(1000), 10).await.unwrap().is_empty());

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
    store.apply(&decided).await.unwrap();
    assert_eq!(store.next_expiry().await.unwrap(), Some(at(15)));

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
    store.apply(&timed_out).await.unwrap();
    assert_eq!(due(30, 10).await, ["req_e5", "req_e1"]);
    assert_eq!(store.next_expiry().await.unwrap(), Some(at(15)));

    for t in [&e5, &e1, &e3] {
        let timed_out = t.request.time_out(at(100)).unwrap();
        store.apply(&timed_out).await.unwrap();
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
    store.apply(&approved).await.unwrap();
    let rejected = decide(&transitions[4].request, Verdict::Rejected, &alice, 7, "n2");
    store.apply(&rejected).await.unwrap();

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

/// Tokens: create, look up by hash, list oldest first, revoke once.
pub async fn tokens(store: Arc<dyn Store>) {
    assert!(store.list_tokens().await.unwrap().is_empty());
    // Created out of time order, so that listing must sort.
    let (second, second_event) = token("tok_b", "bob", "hash-b", 20);
    let (first, first_event) = token("tok_a", "alice", "hash-a", 10);
    store.create_token(&second, &second_event).await.unwrap();
    store.create_token(&first, &first_event).await.unwrap();

    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.token_by_hash("hash-zzz").await.unwrap(), None);
    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![first.clone(), second.clone()]
    );

    let (same_hash, event) = token("tok_c", "carol", "hash-a", 30);
    let err = store.create_token(&same_hash, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    let (same_id, event) = token("tok_a", "carol", "hash-c", 30);
    let err = store.create_token(&same_id, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);

    let revoked = store
        .revoke_token("tok_a", at(40), &token_revoked(&first, 40))
        .await
        .unwrap();
    let expected = TokenRecord {
        revoked_at: Some(at(40)),
        ..first.clone()
    };
    assert_eq!(revoked, expected);
    assert!(!revoked.is_active());
    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(expected.clone())
    );

    let err = store
        .revoke_token("tok_a", at(50), &token_revoked(&first, 50))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert!(err.to_string().contains("tok_a"), "{err}");
    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(expected.clone()),
        "the first revocation time stays"
    );

    let err = store
        .revoke_token("tok_zzz", at(50), &token_revoked(&first, 50))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NotFound { what: "token", id } if id == "tok_zzz"),
        "{err}"
    );

    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![expected, second.clone()]
    );
    let kinds: Vec<&str> = all_events(&store)
        .await
        .iter()
        .map(|e| e.event.kind())
        .collect();
    assert_eq!(kinds, ["token_created", "token_created", "token_revoked"]);
}

/// A watcher wakes when its request changes and the writer pokes the feed; a watcher of
/// another request does not. The poll interval is long, so only the poke can wake it.
pub async fn change_feed_wakes_watchers_on_poke(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let watched = new_request("req_watched", &bot, 0, 3600, None);
    let other = new_request("req_other", &bot, 0, 3600, None);
    create_new(&store, &watched).await;
    create_new(&store, &other).await;

    let feed = ChangeFeed::start(store.clone(), Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(feed.cursor(), 2, "the feed starts after existing events");
    let mut on_watched = feed.watch("req_watched");
    let mut on_other = feed.watch("req_other");
    let mut all = feed.subscribe();

    let decided = decide(
        &watched.request,
        Verdict::Approved,
        &approver("alice"),
        1,
        "n",
    );
    store.apply(&decided).await.unwrap();
    feed.poke();

    tokio::time::timeout(Duration::from_secs(5), on_watched.changed())
        .await
        .expect("the watcher of the decided request wakes");
    let seen = tokio::time::timeout(Duration::from_secs(5), all.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((seen.seq, &seen.event), (3, &decided.event));
    assert!(feed.wait_for_seq(3, Duration::from_secs(5)).await);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), on_other.changed())
            .await
            .is_err(),
        "a watcher of another request stays asleep"
    );
}

/// Without a poke (a change by another process), the feed still sees it within its poll
/// interval.
pub async fn change_feed_polls_without_poke(store: Arc<dyn Store>) {
    let watched = new_request("req_polled", &agent("deploy-bot"), 0, 3600, None);
    create_new(&store, &watched).await;
    let feed = ChangeFeed::start(store.clone(), Duration::from_millis(50))
        .await
        .unwrap();
    let mut on_watched = feed.watch("req_polled");

    let cancelled = watched.request.cancel(&agent("deploy-bot"), at(1)).unwrap();
    store.apply(&cancelled).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), on_watched.changed())
        .await
        .expect("the poll finds the change");
    assert!(feed.wait_for_seq(2, Duration::from_secs(5)).await);
}
