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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use countersign_core::evidence::{
    DecisionRecordInput, OutcomeStatus, ReviewVerdict, Reviewer, decision_record,
};
use countersign_core::merkle::{self, CompactRange, Hash, NodeId};
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, EventKind, Limits, NewRequest, Principal, Role,
    SealedEvent, SealedTransition, Signer, Status, Timestamp, TokenRecord, Transition, Verdict,
};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{
    ChangeFeed, Created, Doc, RequestQuery, Store, StoreError, StoredCheckpoint, StoredEvent,
};

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
            payloads_are_kept_beside_entries,
            events_of_subject_in_order,
            append_event_returns_the_next_seq,
            log_origin_first_wins,
            concurrent_log_origins_agree,
            integration_stores_the_tree,
            erased_payloads_leave_the_log_intact,
            concurrent_integrators_one_wins,
            checkpoints_one_per_size,
            expiry_queries,
            list_requests_filters_and_order,
            tokens,
            change_feed_wakes_watchers_on_poke,
            change_feed_polls_without_poke,
            docs_round_trip,
            doc_ids_and_keys_are_unique,
            doc_update_is_compare_and_swap,
            concurrent_doc_writes_one_wins,
            doc_writes_append_events_atomically,
            doc_delete_and_delete_prefix,
            doc_list_recent_is_latest_first,
            meta_set_once_first_writer_wins,
            imports_copy_rows_without_events,
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

/// A different salt on every call, as in production, so that equal payloads get
/// different commitments and a store that mixes openings up is caught.
pub fn salt() -> [u8; 32] {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut salt = [0x5a; 32];
    salt[..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    salt
}

/// The transition ready to store, sealed with a fresh [`salt`].
pub fn sealed(transition: &Transition) -> SealedTransition {
    transition.seal(salt())
}

/// The event ready to store, sealed with a fresh [`salt`].
pub fn seal_event(event: &Event) -> SealedEvent {
    event.seal(salt())
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

/// A token and its creation event (which has no payload, so its salt does not matter).
pub fn token(id: &str, name: &str, hash: &str, created: i64) -> (TokenRecord, SealedEvent) {
    let record = TokenRecord {
        id: id.to_string(),
        name: name.to_string(),
        role: Role::Approver,
        hash: hash.to_string(),
        created_at: at(created),
        revoked_at: None,
    };
    let event = Event::system(
        EventKind::TokenCreated,
        at(created),
        Some("local:admin".into()),
        json!({"token_id": id, "name": name, "role": Role::Approver}),
    );
    (record, seal_event(&event))
}

pub fn token_revoked(record: &TokenRecord, seconds: i64) -> SealedEvent {
    seal_event(&Event::system(
        EventKind::TokenRevoked,
        at(seconds),
        Some("local:admin".into()),
        json!({"token_id": record.id, "name": record.name}),
    ))
}

/// An autonomous decision recorded under its own subject `id`: an event that changes no
/// request, with a payload.
pub fn recorded_decision(id: &str, by: &Principal, seconds: i64) -> SealedEvent {
    let event = decision_record(
        id,
        DecisionRecordInput {
            decision: format!("Refunded order {id} automatically"),
            rationale: Some("under the refund policy's limit".into()),
            model: None,
            authority: BTreeMap::from([("policy".to_string(), "refunds-v2".to_string())]),
            details: BTreeMap::from([("amount".to_string(), "40".to_string())]),
            related_request: None,
        },
        by,
        at(seconds),
        &Limits::default(),
    )
    .unwrap();
    seal_event(&event)
}

/// A document of `kind` with `id`, at `version`, written at `seconds`.
pub fn doc(
    kind: &str,
    id: &str,
    version: u64,
    key: Option<&str>,
    body: Value,
    seconds: i64,
) -> Doc {
    Doc {
        kind: kind.to_string(),
        id: id.to_string(),
        version,
        key: key.map(str::to_string),
        body,
        updated_at: at(seconds),
    }
}

/// An event to append with a document write: a recorded decision named after `name`,
/// with a payload, so that its opening must be stored too.
pub fn doc_event(name: &str, seconds: i64) -> SealedEvent {
    recorded_decision(&format!("dec_{name}"), &agent("admin"), seconds)
}

/// Creates `count` pending requests `{prefix}_{i}`, one event each, one after another.
pub async fn fill_log(store: &dyn Store, prefix: &str, count: usize) {
    for i in 0..count {
        let t = new_request(
            &format!("{prefix}_{i:03}"),
            &agent("bot"),
            i as i64,
            3600,
            None,
        );
        match store.create_request(&sealed(&t)).await.unwrap() {
            Created::New(_) => {}
            Created::Existing(existing) => panic!("expected a new request, got {existing:?}"),
        }
    }
}

/// The leaf hashes of the stored events with sequence numbers `from + 1 ..= to` (log
/// indexes `[from, to)`), computed from their stored bytes.
pub async fn leaves(store: &dyn Store, from: u64, to: u64) -> Vec<Hash> {
    let events = store
        .events_after(from, usize::try_from(to - from).unwrap())
        .await
        .unwrap();
    assert_eq!(events.len() as u64, to - from, "events {from}..{to} exist");
    events.iter().map(|e| merkle::leaf_hash(&e.bytes)).collect()
}

/// Appends `leaves` to `range`; returns every node they completed, as `integrate` takes.
pub fn grow(range: &mut CompactRange, leaves: &[Hash]) -> Vec<(NodeId, Hash)> {
    leaves.iter().flat_map(|leaf| range.append(*leaf)).collect()
}

/// Reads `ids` through `log_nodes` and checks that exactly those came back.
pub async fn read_nodes(store: &dyn Store, ids: &[NodeId]) -> BTreeMap<NodeId, Hash> {
    let nodes = store.log_nodes(ids).await.unwrap();
    let asked: BTreeSet<NodeId> = ids.iter().copied().collect();
    let got: BTreeSet<NodeId> = nodes.keys().copied().collect();
    assert_eq!(got, asked, "log_nodes returns the nodes asked for");
    nodes
}

/// Checks the tree of `size` entries the store holds: its root, read from the stored
/// nodes, is `root`, and every entry's inclusion proof, built from stored nodes only,
/// verifies against it with the leaf hashed from the entry's stored bytes.
pub async fn assert_tree(store: &dyn Store, size: u64, root: &Hash) {
    let edge = read_nodes(store, &merkle::root_nodes(size)).await;
    let stored_root = merkle::root(size, &mut |id| edge.get(&id).copied()).unwrap();
    assert_eq!(
        &stored_root, root,
        "the root from stored nodes, size {size}"
    );
    let leaves = leaves(store, 0, size).await;
    for (index, leaf) in (0..size).zip(&leaves) {
        let ids = merkle::inclusion_nodes(index, size).unwrap();
        let nodes = read_nodes(store, &ids).await;
        let proof =
            merkle::inclusion_proof(index, size, &mut |id| nodes.get(&id).copied()).unwrap();
        merkle::verify_inclusion(index, size, leaf, &proof, root)
            .unwrap_or_else(|e| panic!("inclusion of {index} in {size}: {e}"));
    }
}

async fn create_new(store: &Arc<dyn Store>, transition: &Transition) -> ApprovalRequest {
    create_sealed(store, &sealed(transition)).await
}

async fn create_sealed(store: &Arc<dyn Store>, write: &SealedTransition) -> ApprovalRequest {
    match store.create_request(write).await.unwrap() {
        Created::New(request) => request,
        Created::Existing(existing) => panic!("expected a new request, got {existing:?}"),
    }
}

async fn all_events(store: &Arc<dyn Store>) -> Vec<StoredEvent> {
    store.events_after(0, 100_000).await.unwrap()
}

fn kinds(events: &[StoredEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.entry.kind.as_str()).collect()
}

fn ids(requests: &[ApprovalRequest]) -> Vec<&str> {
    requests.iter().map(|r| r.id.as_str()).collect()
}

fn assert_gap_free(events: &[StoredEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "event sequence numbers must be 1, 2, 3, …");
}

/// Asserts that `stored` is `sealed` as written: same entry, same exact bytes.
fn assert_stored_as(stored: &StoredEvent, sealed: &SealedEvent) {
    assert_eq!(stored.entry, sealed.entry, "event {} entry", stored.seq);
    assert_eq!(stored.bytes, sealed.bytes, "event {} bytes", stored.seq);
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

/// Events are numbered 1, 2, 3… with no gap, even around failed writes, and keep their
/// exact bytes; `events_after` pages through them.
pub async fn events_are_gap_free_and_exact(store: Arc<dyn Store>) {
    assert_eq!(store.last_event_seq().await.unwrap(), 0);
    assert!(all_events(&store).await.is_empty());

    let bot = agent("deploy-bot");
    let alice = approver("alice");
    let mut expected: Vec<SealedEvent> = Vec::new();

    let a = sealed(&new_request("req_a", &bot, 0, 3600, None));
    create_sealed(&store, &a).await;
    expected.push(a.event.clone());

    // Each failure below sits between successes: a burned number would show as a gap.
    let clash = new_request("req_a", &bot, 1, 3600, None);
    assert!(store.create_request(&sealed(&clash)).await.is_err());

    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 1);
    store.create_token(&tok, &tok_event).await.unwrap();
    expected.push(tok_event);

    let approved = sealed(&decide(&a.request, Verdict::Approved, &alice, 2, "n1"));
    store.apply(&approved).await.unwrap();
    expected.push(approved.event.clone());

    let stale = decide(&a.request, Verdict::Rejected, &alice, 3, "n2");
    assert!(store.apply(&sealed(&stale)).await.is_err());
    let (dup, dup_event) = token("tok_2", "bob", "hash-1", 3);
    assert!(store.create_token(&dup, &dup_event).await.is_err());
    assert!(
        store
            .revoke_token("tok_missing", at(3), &token_revoked(&dup, 3))
            .await
            .is_err()
    );

    let b = sealed(&new_request("req_b", &bot, 4, 3600, Some("k")));
    create_sealed(&store, &b).await;
    expected.push(b.event.clone());
    let b_retry = new_request("req_b2", &bot, 4, 3600, Some("k"));
    assert!(matches!(
        store.create_request(&sealed(&b_retry)).await.unwrap(),
        Created::Existing(_)
    ));

    let revoked = token_revoked(&tok, 5);
    store.revoke_token("tok_1", at(5), &revoked).await.unwrap();
    expected.push(revoked.clone());
    assert!(store.revoke_token("tok_1", at(6), &revoked).await.is_err());

    let recorded = recorded_decision("dec_1", &bot, 6);
    assert_eq!(store.append_event(&recorded).await.unwrap(), 6);
    expected.push(recorded);

    let cancelled = sealed(&b.request.cancel(&bot, at(7)).unwrap());
    store.apply(&cancelled).await.unwrap();
    expected.push(cancelled.event);

    let events = all_events(&store).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), expected.len());
    for (stored, sealed) in events.iter().zip(&expected) {
        assert_stored_as(stored, sealed);
        assert_eq!(stored.index(), stored.seq - 1);
        // The entry read back is the one its bytes encode.
        assert_eq!(
            stored.entry.to_bytes(),
            stored.bytes,
            "event {}",
            stored.seq
        );
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

/// A sealed event's payload opening is stored beside its entry and read back by
/// sequence number; it opens the commitment in the stored entry. Events without a
/// payload have none, and asking for unknown numbers is not an error.
pub async fn payloads_are_kept_beside_entries(store: Arc<dyn Store>) {
    assert!(store.payloads(&[1, 2, 3]).await.unwrap().is_empty());
    let bot = agent("deploy-bot");
    let alice = approver("alice");

    // Events with (P) and without (-) a payload, interleaved.
    let a = sealed(&new_request("req_a", &bot, 0, 3600, None)); // 1 P
    create_sealed(&store, &a).await;
    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 1); // 2 -
    store.create_token(&tok, &tok_event).await.unwrap();
    let b = sealed(&new_request("req_b", &bot, 2, 3600, None)); // 3 P
    create_sealed(&store, &b).await;
    let approved = sealed(&decide(&a.request, Verdict::Approved, &alice, 3, "n1")); // 4 P
    store.apply(&approved).await.unwrap();
    let cancelled = sealed(&b.request.cancel(&bot, at(4)).unwrap()); // 5 -
    store.apply(&cancelled).await.unwrap();
    let recorded = recorded_decision("dec_1", &bot, 5); // 6 P
    assert_eq!(store.append_event(&recorded).await.unwrap(), 6);
    let used = sealed(
        &approved
            .request
            .record_action(
                "pay".into(),
                BTreeMap::from([("invoice".to_string(), "INV-9".to_string())]),
                &bot,
                at(6),
                &Limits::default(),
            )
            .unwrap(),
    ); // 7 P
    store.apply(&used).await.unwrap();

    let written = [
        &a.event,
        &tok_event,
        &b.event,
        &approved.event,
        &cancelled.event,
        &recorded,
        &used.event,
    ];
    assert!(
        [1, 3, 4, 6, 7]
            .iter()
            .all(|&seq| written[seq - 1].payload.is_some())
    );
    assert!(written[1].payload.is_none() && written[4].payload.is_none());

    let events = all_events(&store).await;
    assert_eq!(events.len(), written.len());
    let all_seqs: Vec<u64> = (1..=9).collect();
    let openings = store.payloads(&all_seqs).await.unwrap();
    assert_eq!(
        openings.keys().copied().collect::<Vec<_>>(),
        [1, 3, 4, 6, 7],
        "only the events with a payload have one"
    );
    for (stored, sealed) in events.iter().zip(written) {
        assert_stored_as(stored, sealed);
        match openings.get(&stored.seq) {
            Some(opening) => {
                assert_eq!(
                    Some(opening),
                    sealed.payload.as_ref(),
                    "opening {}",
                    stored.seq
                );
                assert!(stored.entry.payload.is_some());
                assert_eq!(
                    opening.commitment(),
                    stored.entry.payload,
                    "opening {} opens its stored entry's commitment",
                    stored.seq
                );
            }
            None => assert_eq!(stored.entry.payload, None, "event {}", stored.seq),
        }
    }
    // Openings are not interchangeable: each salt is fresh.
    assert_ne!(openings[&1].commitment(), events[2].entry.payload);

    // A subset, in any order, with repeats and unknown numbers.
    let some = store.payloads(&[7, 2, 4, 4, 100]).await.unwrap();
    assert_eq!(some.keys().copied().collect::<Vec<_>>(), [4, 7]);
    assert_eq!(some[&4], openings[&4]);
    assert!(store.payloads(&[]).await.unwrap().is_empty());
    assert!(store.payloads(&[2, 5]).await.unwrap().is_empty());
    // More numbers than one SQL statement may bind on some backends.
    // (The stored ones come last, so that a backend that splits the list must read
    // every part.)
    let many: Vec<u64> = (1..=70_000).rev().collect();
    assert_eq!(store.payloads(&many).await.unwrap(), openings);
}

/// `events_of_subject` returns exactly one subject's events, in order, however they
/// interleave with others'.
pub async fn events_of_subject_in_order(store: Arc<dyn Store>) {
    assert!(store.events_of_subject("req_a").await.unwrap().is_empty());
    let bot = agent("deploy-bot");
    let alice = approver("alice");

    let a = sealed(&new_request("req_a", &bot, 0, 3600, None)); // 1
    create_sealed(&store, &a).await;
    let b = sealed(&new_request("req_b", &bot, 1, 3600, None)); // 2
    create_sealed(&store, &b).await;
    // A subject that is a prefix of another must not match it.
    let a2 = sealed(&new_request("req_a2", &bot, 1, 3600, None)); // 3
    create_sealed(&store, &a2).await;
    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 2); // 4, no subject
    store.create_token(&tok, &tok_event).await.unwrap();
    let b_decided = sealed(&decide(&b.request, Verdict::Rejected, &alice, 3, "n1")); // 5
    store.apply(&b_decided).await.unwrap();
    let a_decided = sealed(&decide(&a.request, Verdict::Approved, &alice, 4, "n2")); // 6
    store.apply(&a_decided).await.unwrap();
    let recorded = recorded_decision("dec_1", &bot, 5); // 7
    store.append_event(&recorded).await.unwrap();
    let a_used = sealed(
        &a_decided
            .request
            .record_action(
                "pay".into(),
                BTreeMap::new(),
                &bot,
                at(6),
                &Limits::default(),
            )
            .unwrap(),
    ); // 8
    store.apply(&a_used).await.unwrap();

    let check = |subject: &'static str, expected: Vec<(u64, SealedEvent)>| {
        let store = store.clone();
        async move {
            let events = store.events_of_subject(subject).await.unwrap();
            let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
            let want: Vec<u64> = expected.iter().map(|(seq, _)| *seq).collect();
            assert_eq!(seqs, want, "events of {subject}");
            for (stored, (_, sealed)) in events.iter().zip(&expected) {
                assert_stored_as(stored, sealed);
                assert_eq!(stored.entry.subject.as_deref(), Some(subject));
            }
        }
    };
    check(
        "req_a",
        vec![
            (1, a.event.clone()),
            (6, a_decided.event.clone()),
            (8, a_used.event.clone()),
        ],
    )
    .await;
    check(
        "req_b",
        vec![(2, b.event.clone()), (5, b_decided.event.clone())],
    )
    .await;
    check("req_a2", vec![(3, a2.event.clone())]).await;
    check("dec_1", vec![(7, recorded.clone())]).await;
    check("req_missing", vec![]).await;
    check("tok_1", vec![]).await;
}

/// `append_event` numbers an event like any other write, returns its number, and the
/// event reads back at once; concurrent appends get distinct, gap-free numbers.
pub async fn append_event_returns_the_next_seq(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let first = recorded_decision("dec_1", &bot, 0);
    assert_eq!(store.append_event(&first).await.unwrap(), 1);
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
    let events = all_events(&store).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].seq, 1);
    assert_stored_as(&events[0], &first);
    assert_eq!(
        store.payloads(&[1]).await.unwrap().get(&1),
        first.payload.as_ref()
    );

    create_new(&store, &new_request("req_a", &bot, 1, 3600, None)).await;
    // An event with neither subject nor payload.
    let rotated = seal_event(&Event::system(
        EventKind::KeyRotated,
        at(2),
        None,
        json!({"kid": "key-2", "previous": "key-1"}),
    ));
    assert_eq!(store.append_event(&rotated).await.unwrap(), 3);
    let third = store.events_after(2, 10).await.unwrap();
    assert_eq!(third.len(), 1);
    assert_stored_as(&third[0], &rotated);
    assert!(store.payloads(&[3]).await.unwrap().is_empty());

    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        let barrier = barrier.clone();
        let event = recorded_decision(&format!("dec_c{i:02}"), &bot, 10 + i);
        tasks.spawn(async move {
            barrier.wait().await;
            let seq = store.append_event(&event).await.unwrap();
            (seq, event)
        });
    }
    let mut appended = tasks.join_all().await;
    appended.sort_by_key(|(seq, _)| *seq);
    let seqs: Vec<u64> = appended.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (4..=19).collect::<Vec<_>>());
    let events = all_events(&store).await;
    assert_gap_free(&events);
    for (seq, event) in &appended {
        assert_stored_as(&events[usize::try_from(*seq).unwrap() - 1], event);
    }
}

/// The first origin ever proposed is the log's origin for good.
pub async fn log_origin_first_wins(store: Arc<dyn Store>) {
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(
        store.log_origin("other.example.net/log").await.unwrap(),
        "gate.example.com/log",
        "a later proposal gets the first back"
    );
    // Writing events does not disturb it.
    fill_log(&*store, "req", 2).await;
    assert_eq!(
        store.log_origin("third.example.org").await.unwrap(),
        "gate.example.com/log"
    );
}

/// Processes that start together and each propose an origin all end up with the same
/// one.
pub async fn concurrent_log_origins_agree(store: Arc<dyn Store>) {
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = JoinSet::new();
    for i in 0..8 {
        let store = store.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            store.log_origin(&format!("origin-{i}")).await.unwrap()
        });
    }
    let origins: BTreeSet<String> = tasks.join_all().await.into_iter().collect();
    assert_eq!(
        origins.len(),
        1,
        "every proposer learns the one origin: {origins:?}"
    );
    let origin = origins.into_iter().next().unwrap();
    assert!((0..8).any(|i| origin == format!("origin-{i}")), "{origin}");
    assert_eq!(store.log_origin("late").await.unwrap(), origin);
}

/// Integration stores the Merkle nodes of new entries and moves the integrated size,
/// as a compare-and-swap; roots and inclusion proofs built from stored nodes verify.
pub async fn integration_stores_the_tree(store: Arc<dyn Store>) {
    assert_eq!(store.integrated_size().await.unwrap(), 0);
    assert!(store.log_nodes(&[]).await.unwrap().is_empty());
    let missing = store.log_nodes(&[NodeId::new(0, 0)]).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound { .. }), "{missing}");

    let n = 13;
    fill_log(&*store, "req", n as usize).await;
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&*store, 0, n).await);
    let root = range.root();
    assert!(store.integrate(0, n, &nodes).await.unwrap());
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &root).await;

    // Integrating the same range again loses, and writes nothing: not the altered
    // hashes, not the extra node.
    let extra = NodeId::new(0, n + 40);
    let mut bogus: Vec<(NodeId, Hash)> = nodes.iter().map(|(id, _)| (*id, [0xee; 32])).collect();
    bogus.push((extra, [0xee; 32]));
    assert!(!store.integrate(0, n, &bogus).await.unwrap());
    assert!(!store.integrate(0, n + 3, &bogus).await.unwrap());
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &root).await;
    let err = store.log_nodes(&[extra]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");

    // Nodes that were never stored are an error, not a short answer: past the end, too
    // high, or mixed in with nodes that exist.
    for ids in [
        vec![NodeId::new(0, n)],
        vec![NodeId::new(4, 0)],
        vec![NodeId::new(0, 0), NodeId::new(2, 3)],
    ] {
        let err = store.log_nodes(&ids).await.unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }), "{ids:?}: {err}");
    }
    // Asking for a node twice is fine.
    let twice = read_nodes(&*store, &[NodeId::new(3, 0), NodeId::new(3, 0)]).await;
    assert_eq!(twice.len(), 1);

    // A size beyond the stored events is refused, and so is rewriting a node that
    // exists: the tree is append-only.
    assert!(
        store.integrate(n, n + 5, &[]).await.is_err(),
        "beyond the events"
    );
    fill_log(&*store, "one-more", 1).await;
    let clash = [
        (NodeId::new(0, 0), [0xaa; 32]),
        (NodeId::new(0, n), [0xbb; 32]),
    ];
    let err = store.integrate(n, n + 1, &clash).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert_eq!(store.integrated_size().await.unwrap(), n, "nothing moved");
    assert_tree(&*store, n, &root).await;
    let err = store.log_nodes(&[NodeId::new(0, n)]).await.unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { .. }),
        "the refused batch wrote nothing: {err}"
    );

    // More entries integrate from where the last integration ended; an integrator that
    // still believes the old size loses.
    let m = 21;
    fill_log(&*store, "more", (m - n - 1) as usize).await;
    let first_range = range.clone();
    let more = grow(&mut range, &leaves(&*store, n, m).await);
    let second_root = range.root();
    assert!(!store.integrate(0, m, &more).await.unwrap(), "stale from");
    assert!(store.integrate(n, m, &more).await.unwrap());
    assert!(!store.integrate(n, m, &more).await.unwrap(), "twice");
    assert_eq!(store.integrated_size().await.unwrap(), m);
    assert_tree(&*store, m, &second_root).await;
    // The smaller tree is still answerable, and the two are consistent.
    assert_tree(&*store, n, &first_range.root()).await;
    let ids = merkle::consistency_nodes(n, m).unwrap();
    let stored = read_nodes(&*store, &ids).await;
    let proof = merkle::consistency_proof(n, m, &mut |id| stored.get(&id).copied()).unwrap();
    merkle::verify_consistency(n, m, &first_range.root(), &second_root, &proof).unwrap();
}

/// Several integrators racing over the same entries: exactly one moves the size.
pub async fn concurrent_integrators_one_wins(store: Arc<dyn Store>) {
    let n = 9;
    fill_log(&*store, "req", n as usize).await;
    let mut range = CompactRange::empty();
    let nodes = Arc::new(grow(&mut range, &leaves(&*store, 0, n).await));

    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        let barrier = barrier.clone();
        let nodes = nodes.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            store.integrate(0, n, &nodes).await.unwrap()
        });
    }
    let won = tasks.join_all().await;
    assert_eq!(
        won.iter().filter(|w| **w).count(),
        1,
        "exactly one integrator wins: {won:?}"
    );
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &range.root()).await;
}

/// One checkpoint per size, the first kept; the largest is the latest.
pub async fn checkpoints_one_per_size(store: Arc<dyn Store>) {
    assert_eq!(store.checkpoint(None).await.unwrap(), None);
    assert_eq!(store.checkpoint(Some(1)).await.unwrap(), None);
    assert!(store.checkpoints().await.unwrap().is_empty());

    let checkpoint = |size: u64, note: &str, seconds: i64| StoredCheckpoint {
        size,
        note: format!("gate.example.com/log\n{size}\n{note}\n\n— gate.example.com sig\n"),
        created_at: at(seconds),
    };
    let three = checkpoint(3, "cm9vdC0z", 10);
    let one = checkpoint(1, "cm9vdC0x", 20);
    let seven = checkpoint(7, "cm9vdC03", 30);
    // Added out of size order, so that reading must sort.
    for c in [&three, &one, &seven] {
        store.add_checkpoint(c).await.unwrap();
    }
    assert_eq!(
        store.checkpoints().await.unwrap(),
        vec![one.clone(), three.clone(), seven.clone()]
    );
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(seven.clone()));
    assert_eq!(
        store.checkpoint(Some(3)).await.unwrap(),
        Some(three.clone())
    );
    assert_eq!(store.checkpoint(Some(1)).await.unwrap(), Some(one.clone()));
    assert_eq!(store.checkpoint(Some(4)).await.unwrap(), None);
    assert_eq!(store.checkpoint(Some(8)).await.unwrap(), None);

    // A second checkpoint of a size is ignored: the first signed note stays.
    store
        .add_checkpoint(&checkpoint(3, "b3RoZXI=", 40))
        .await
        .unwrap();
    assert_eq!(
        store.checkpoint(Some(3)).await.unwrap(),
        Some(three.clone())
    );
    assert_eq!(
        store.checkpoints().await.unwrap(),
        vec![one, three, seven.clone()]
    );
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(seven));
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
    store.apply(&sealed(&decided)).await.unwrap();
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
    assert_eq!(
        kinds(&all_events(&store).await),
        ["token_created", "token_created", "token_revoked"]
    );
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

    let decided = sealed(&decide(
        &watched.request,
        Verdict::Approved,
        &approver("alice"),
        1,
        "n",
    ));
    store.apply(&decided).await.unwrap();
    feed.poke();

    tokio::time::timeout(Duration::from_secs(5), on_watched.changed())
        .await
        .expect("the watcher of the decided request wakes");
    let seen = tokio::time::timeout(Duration::from_secs(5), all.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.seq, 3);
    assert_stored_as(&seen, &decided.event);
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
    store.apply(&sealed(&cancelled)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), on_watched.changed())
        .await
        .expect("the poll finds the change");
    assert!(feed.wait_for_seq(2, Duration::from_secs(5)).await);
}

// ---------------------------------------------------------------------------------------
// Documents, one-time settings and imports.

fn doc_ids(docs: &[Doc]) -> Vec<&str> {
    docs.iter().map(|d| d.id.as_str()).collect()
}

async fn listed(store: &Arc<dyn Store>, kind: &str, prefix: &str, limit: usize) -> Vec<String> {
    let docs = store.doc_list(kind, prefix, limit).await.unwrap();
    for d in &docs {
        assert_eq!(d.kind, kind);
        assert!(
            d.id.starts_with(prefix),
            "{} listed for prefix {prefix:?}",
            d.id
        );
    }
    doc_ids(&docs).into_iter().map(str::to_string).collect()
}

async fn assert_no_events(store: &Arc<dyn Store>) {
    assert_eq!(store.last_event_seq().await.unwrap(), 0, "no event written");
    assert!(all_events(store).await.is_empty(), "no event written");
}

/// A body with every kind of JSON value, including what a database's JSON type might
/// normalise or refuse (a NUL character, extreme numbers, key order, empty containers).
fn awkward_body(name: &str) -> Value {
    json!({
        "name": name,
        "text": "Zoë 🚀 \"quoted\" \\ back\nslash\ttab \u{7f} \u{2028}",
        "nul": "before\u{0}after",
        "numbers": [0, -1, 1.0, 0.1, 3.5e-7, 5e-324, 1.7976931348623157e308, u64::MAX, i64::MIN],
        "literals": [true, false, null],
        "empty": {"object": {}, "array": [], "string": ""},
        "order": {"b": 1, "a": 2, "": 3, "ключ": 4, "B": 5},
        "deep": {"a": {"b": {"c": {"d": [[[["bottom"]]]]}}}},
    })
}

/// Documents round-trip exactly, are found by id and by key within their kind, and are
/// listed by id in byte order, filtered by a literal prefix and limited.
pub async fn docs_round_trip(store: Arc<dyn Store>) {
    assert_eq!(store.doc_get("account", "u1").await.unwrap(), None);
    assert_eq!(store.doc_by_key("account", "alice").await.unwrap(), None);
    assert!(store.doc_list("account", "", 100).await.unwrap().is_empty());

    // Inserted out of order, so that listing must sort; "U9" and "ü" sort by byte,
    // whatever the database's collation says about case and accents.
    let accounts = [
        doc("account", "u2/x", 1, None, json!(["a", 1]), 1),
        doc("account", "u1/b", 1, None, json!(null), 2),
        doc("account", "U9", 1, Some("ALICE"), json!(42), 3),
        doc("account", "u10", 1, None, json!("just a string"), 4),
        doc("account", "u1", 1, Some("alice"), awkward_body("u1"), 5),
        doc("account", "u1/a", 7, Some("Alice"), awkward_body("u1/a"), 6),
        doc("account", "ü", 1, None, json!({}), 7),
        doc("account", "u1/c", 1, None, json!(-0.5), 8),
    ];
    for d in &accounts {
        store.doc_insert(d, None).await.unwrap();
    }
    // Another kind may use the same id and the same key.
    let session = doc("session", "u1/a", 1, Some("alice"), json!({"s": 1}), 9);
    store.doc_insert(&session, None).await.unwrap();

    for d in &accounts {
        assert_eq!(
            store.doc_get("account", &d.id).await.unwrap().as_ref(),
            Some(d)
        );
    }
    assert_eq!(
        store.doc_get("session", "u1/a").await.unwrap(),
        Some(session.clone())
    );
    assert_eq!(store.doc_get("account", "nope").await.unwrap(), None);
    assert_eq!(store.doc_get("room", "u1").await.unwrap(), None);

    let by_key = |kind: &'static str, key: &'static str| {
        let store = store.clone();
        async move { store.doc_by_key(kind, key).await.unwrap() }
    };
    assert_eq!(
        by_key("account", "alice").await.as_ref(),
        Some(&accounts[4])
    );
    assert_eq!(
        by_key("account", "Alice").await.as_ref(),
        Some(&accounts[5])
    );
    assert_eq!(
        by_key("account", "ALICE").await.as_ref(),
        Some(&accounts[2])
    );
    assert_eq!(by_key("session", "alice").await, Some(session.clone()));
    assert_eq!(by_key("account", "bob").await, None);
    assert_eq!(by_key("room", "alice").await, None);

    let everything = store.doc_list("account", "", 100).await.unwrap();
    assert_eq!(
        doc_ids(&everything),
        ["U9", "u1", "u1/a", "u1/b", "u1/c", "u10", "u2/x", "ü"]
    );
    for d in &everything {
        assert_eq!(accounts.iter().find(|a| a.id == d.id), Some(d));
    }
    assert_eq!(
        listed(&store, "account", "u1/", 100).await,
        ["u1/a", "u1/b", "u1/c"]
    );
    assert_eq!(
        listed(&store, "account", "u1", 100).await,
        ["u1", "u1/a", "u1/b", "u1/c", "u10"]
    );
    assert_eq!(
        listed(&store, "account", "u", 100).await,
        ["u1", "u1/a", "u1/b", "u1/c", "u10", "u2/x"]
    );
    assert_eq!(listed(&store, "account", "u1/", 2).await, ["u1/a", "u1/b"]);
    assert_eq!(listed(&store, "account", "", 3).await, ["U9", "u1", "u1/a"]);
    assert_eq!(listed(&store, "account", "ü", 10).await, ["ü"]);
    assert_eq!(listed(&store, "account", "u1/a", 10).await, ["u1/a"]);
    assert!(listed(&store, "account", "", 0).await.is_empty());
    assert!(listed(&store, "account", "u3", 100).await.is_empty());
    assert!(listed(&store, "account", "u1/a/", 100).await.is_empty());
    assert_eq!(listed(&store, "session", "", 100).await, ["u1/a"]);
    assert!(listed(&store, "room", "", 100).await.is_empty());

    // A prefix is literal: no wildcards, no escapes.
    for id in ["abc", "a_c", "a%b", "a\\d", "a"] {
        store
            .doc_insert(&doc("room", id, 1, None, json!({}), 10), None)
            .await
            .unwrap();
    }
    assert_eq!(
        listed(&store, "room", "a", 10).await,
        ["a", "a%b", "a\\d", "a_c", "abc"]
    );
    assert_eq!(listed(&store, "room", "a%", 10).await, ["a%b"]);
    assert_eq!(listed(&store, "room", "a_", 10).await, ["a_c"]);
    assert_eq!(listed(&store, "room", "a\\", 10).await, ["a\\d"]);
    assert!(listed(&store, "room", "%", 10).await.is_empty());
    assert!(listed(&store, "room", "_", 10).await.is_empty());

    assert_no_events(&store).await;
}

/// An id or a key already taken within the kind is refused with `Duplicate`; the
/// refused write leaves no trace, not even its event.
pub async fn doc_ids_and_keys_are_unique(store: Arc<dyn Store>) {
    let alice = doc(
        "account",
        "u1",
        1,
        Some("alice"),
        json!({"name": "Alice"}),
        0,
    );
    let first_event = doc_event("u1", 0);
    store.doc_insert(&alice, Some(&first_event)).await.unwrap();

    let same_id = doc("account", "u1", 1, Some("bob"), json!({"name": "Bob"}), 1);
    let same_id_no_key = doc("account", "u1", 1, None, json!({"name": "Nobody"}), 1);
    let same_key = doc("account", "u2", 1, Some("alice"), json!({"name": "Eve"}), 1);
    for clash in [&same_id, &same_id_no_key, &same_key] {
        for event in [None, Some(doc_event("clash", 1))] {
            let err = store.doc_insert(clash, event.as_ref()).await.unwrap_err();
            assert!(matches!(err, StoreError::Duplicate(_)), "{clash:?}: {err}");
        }
    }
    assert_eq!(
        store.doc_get("account", "u1").await.unwrap(),
        Some(alice.clone())
    );
    assert_eq!(store.doc_get("account", "u2").await.unwrap(), None);
    assert_eq!(
        store.doc_by_key("account", "alice").await.unwrap(),
        Some(alice.clone())
    );
    assert_eq!(store.doc_by_key("account", "bob").await.unwrap(), None);
    let events = all_events(&store).await;
    assert_eq!(events.len(), 1, "the refused inserts appended nothing");
    assert_stored_as(&events[0], &first_event);

    // The same id and key in another kind are another document.
    let session = doc("session", "u1", 1, Some("alice"), json!({}), 2);
    store.doc_insert(&session, None).await.unwrap();
    assert_eq!(store.doc_get("session", "u1").await.unwrap(), Some(session));
    // Documents without a key never clash on it.
    for id in ["u3", "u4", "u5"] {
        store
            .doc_insert(&doc("account", id, 1, None, json!({}), 3), None)
            .await
            .unwrap();
    }
    // A later success takes the next number: the refusals burned none.
    let dave_event = doc_event("u6", 4);
    store
        .doc_insert(
            &doc("account", "u6", 1, Some("dave"), json!({}), 4),
            Some(&dave_event),
        )
        .await
        .unwrap();
    let events = all_events(&store).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), 2);
    assert_stored_as(&events[1], &dave_event);
    assert_eq!(
        listed(&store, "account", "", 100).await,
        ["u1", "u3", "u4", "u5", "u6"]
    );
}

/// `doc_update` stores only the next version; a stale or skipping version is a
/// `Conflict`, a missing document `NotFound`, another document's key `Duplicate`, and
/// none of them writes anything. Clearing the key frees it.
pub async fn doc_update_is_compare_and_swap(store: Arc<dyn Store>) {
    let v1 = doc(
        "account",
        "u1",
        1,
        Some("alice"),
        json!({"name": "Alice"}),
        0,
    );
    let bob = doc("account", "u2", 1, Some("bob"), json!({"name": "Bob"}), 0);
    store.doc_insert(&v1, None).await.unwrap();
    store.doc_insert(&bob, None).await.unwrap();

    let v2 = doc(
        "account",
        "u1",
        2,
        Some("alice2"),
        awkward_body("Alice L."),
        10,
    );
    store.doc_update(&v2, None).await.unwrap();
    assert_eq!(
        store.doc_get("account", "u1").await.unwrap(),
        Some(v2.clone())
    );
    assert_eq!(store.doc_by_key("account", "alice").await.unwrap(), None);
    assert_eq!(
        store.doc_by_key("account", "alice2").await.unwrap(),
        Some(v2.clone())
    );

    let expect = |result: Result<(), StoreError>, what: &str| match (what, result) {
        ("conflict", Err(StoreError::Conflict(_)))
        | ("duplicate", Err(StoreError::Duplicate(_)))
        | ("not found", Err(StoreError::NotFound { .. })) => {}
        (what, other) => panic!("expected {what}, got {other:?}"),
    };
    // The same write again (it expects version 1, the store has 2), one built on the
    // old version, and one that skips a version.
    let stale = doc(
        "account",
        "u1",
        2,
        Some("alice"),
        json!({"name": "stale"}),
        11,
    );
    let skipping = doc(
        "account",
        "u1",
        4,
        Some("alice2"),
        json!({"name": "skip"}),
        11,
    );
    for (write, event) in [
        (&v2, None),
        (&stale, None),
        (&skipping, None),
        (&stale, Some(doc_event("stale", 11))),
    ] {
        expect(store.doc_update(write, event.as_ref()).await, "conflict");
    }
    assert_eq!(
        store.doc_get("account", "u1").await.unwrap(),
        Some(v2.clone())
    );
    assert_eq!(store.doc_by_key("account", "alice").await.unwrap(), None);

    // Nothing to update: an unknown id, or the id in another kind.
    for (kind, id) in [("account", "ghost"), ("session", "u1")] {
        let ghost = doc(kind, id, 2, None, json!({}), 12);
        expect(store.doc_update(&ghost, None).await, "not found");
        expect(
            store
                .doc_update(&ghost, Some(&doc_event("ghost", 12)))
                .await,
            "not found",
        );
        assert_eq!(store.doc_get(kind, id).await.unwrap(), None);
    }
    match store
        .doc_update(&doc("account", "ghost", 1, None, json!({}), 12), None)
        .await
    {
        Err(StoreError::NotFound { id, .. }) => assert!(id.contains("ghost"), "{id}"),
        other => panic!("expected not found, got {other:?}"),
    }

    // Another document's key is refused, with or without an event.
    let takes_bobs = doc(
        "account",
        "u1",
        3,
        Some("bob"),
        json!({"name": "thief"}),
        13,
    );
    expect(store.doc_update(&takes_bobs, None).await, "duplicate");
    expect(
        store
            .doc_update(&takes_bobs, Some(&doc_event("bob", 13)))
            .await,
        "duplicate",
    );
    assert_eq!(
        store.doc_get("account", "u1").await.unwrap(),
        Some(v2.clone())
    );
    assert_eq!(
        store.doc_by_key("account", "bob").await.unwrap(),
        Some(bob.clone())
    );

    // Keeping its own key is no clash.
    let bob2 = doc(
        "account",
        "u2",
        2,
        Some("bob"),
        json!({"name": "Robert"}),
        14,
    );
    store.doc_update(&bob2, None).await.unwrap();
    assert_eq!(
        store.doc_by_key("account", "bob").await.unwrap(),
        Some(bob2)
    );

    // Clearing the key frees it for another document.
    let v3 = doc(
        "account",
        "u1",
        3,
        None,
        json!({"name": "Alice, keyless"}),
        15,
    );
    store.doc_update(&v3, None).await.unwrap();
    assert_eq!(
        store.doc_get("account", "u1").await.unwrap(),
        Some(v3.clone())
    );
    assert_eq!(store.doc_by_key("account", "alice2").await.unwrap(), None);
    let heir = doc("account", "u3", 1, Some("alice2"), json!({}), 16);
    store.doc_insert(&heir, None).await.unwrap();
    assert_eq!(
        store.doc_by_key("account", "alice2").await.unwrap(),
        Some(heir)
    );
    // ... and another document can take over a key freed by an update.
    let v4 = doc("account", "u1", 4, Some("carol"), json!({}), 17);
    store.doc_update(&v4, None).await.unwrap();
    let v5 = doc("account", "u1", 5, Some("alice"), json!({}), 18);
    store.doc_update(&v5, None).await.unwrap();
    let u2_takes_carol = doc("account", "u2", 3, Some("carol"), json!({}), 19);
    store.doc_update(&u2_takes_carol, None).await.unwrap();
    assert_eq!(
        store.doc_by_key("account", "carol").await.unwrap(),
        Some(u2_takes_carol)
    );

    // Every refusal above was free; a successful update with an event appends it.
    assert_no_events(&store).await;
    let v6 = doc(
        "account",
        "u1",
        6,
        Some("alice"),
        json!({"name": "Alice"}),
        20,
    );
    let event = doc_event("u1", 20);
    store.doc_update(&v6, Some(&event)).await.unwrap();
    assert_eq!(store.doc_get("account", "u1").await.unwrap(), Some(v6));
    let events = all_events(&store).await;
    assert_eq!(events.len(), 1);
    assert_stored_as(&events[0], &event);
}

/// Eight writers update one document from the same version at once: exactly one wins,
/// with and without events; eight inserts of one key: exactly one wins.
pub async fn concurrent_doc_writes_one_wins(store: Arc<dyn Store>) {
    let v1 = doc("room", "r1", 1, Some("lobby"), json!({"members": []}), 0);
    store.doc_insert(&v1, None).await.unwrap();

    async fn race(
        store: &Arc<dyn Store>,
        writes: Vec<(Doc, Option<SealedEvent>)>,
        insert: bool,
    ) -> Vec<(Doc, Option<SealedEvent>, Result<(), StoreError>)> {
        let barrier = Arc::new(Barrier::new(writes.len()));
        let mut tasks = JoinSet::new();
        for (write, event) in writes {
            let store = store.clone();
            let barrier = barrier.clone();
            tasks.spawn(async move {
                barrier.wait().await;
                let result = if insert {
                    store.doc_insert(&write, event.as_ref()).await
                } else {
                    store.doc_update(&write, event.as_ref()).await
                };
                (write, event, result)
            });
        }
        tasks.join_all().await
    }

    // From version 1, without events.
    let writes = (0..8)
        .map(|i| {
            (
                doc("room", "r1", 2, Some("lobby"), json!({"writer": i}), i),
                None,
            )
        })
        .collect();
    let results = race(&store, writes, false).await;
    let winners: Vec<_> = results.iter().filter(|(_, _, r)| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one update wins");
    for (_, _, result) in &results {
        assert!(
            matches!(result, Ok(()) | Err(StoreError::Conflict(_))),
            "{result:?}"
        );
    }
    assert_eq!(
        store.doc_get("room", "r1").await.unwrap().as_ref(),
        Some(&winners[0].0)
    );
    assert_no_events(&store).await;

    // From version 2, each with its event: one update and one event.
    let writes = (0..8)
        .map(|i| {
            let write = doc("room", "r1", 3, Some("lobby"), json!({"second": i}), 10 + i);
            (write, Some(doc_event(&format!("r1_{i}"), 10 + i)))
        })
        .collect();
    let results = race(&store, writes, false).await;
    let winners: Vec<_> = results.iter().filter(|(_, _, r)| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one update wins");
    for (_, _, result) in &results {
        assert!(
            matches!(result, Ok(()) | Err(StoreError::Conflict(_))),
            "{result:?}"
        );
    }
    let (winner, winner_event, _) = winners[0];
    assert_eq!(
        store.doc_get("room", "r1").await.unwrap().as_ref(),
        Some(winner)
    );
    let events = all_events(&store).await;
    assert_eq!(events.len(), 1, "only the winner's event");
    assert_stored_as(&events[0], winner_event.as_ref().unwrap());

    // Eight new documents claiming one key, with events.
    let writes = (0..8)
        .map(|i| {
            let write = doc(
                "room",
                &format!("n{i}"),
                1,
                Some("stage"),
                json!({"n": i}),
                20,
            );
            (write, Some(doc_event(&format!("n{i}"), 20)))
        })
        .collect();
    let results = race(&store, writes, true).await;
    let winners: Vec<_> = results.iter().filter(|(_, _, r)| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one insert wins the key");
    for (_, _, result) in &results {
        assert!(
            matches!(result, Ok(()) | Err(StoreError::Duplicate(_))),
            "{result:?}"
        );
    }
    let (winner, winner_event, _) = winners[0];
    assert_eq!(
        store.doc_by_key("room", "stage").await.unwrap().as_ref(),
        Some(winner)
    );
    assert_eq!(listed(&store, "room", "n", 100).await, [winner.id.as_str()]);
    let events = all_events(&store).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), 2);
    assert_stored_as(&events[1], winner_event.as_ref().unwrap());
}

/// A document write with an event appends exactly that event (and its payload) in the
/// one gap-free log, atomically: a refused write appends nothing.
pub async fn doc_writes_append_events_atomically(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let mut expected: Vec<SealedEvent> = Vec::new();

    let request = sealed(&new_request("req_a", &bot, 0, 3600, None));
    create_sealed(&store, &request).await;
    expected.push(request.event.clone());

    let v1 = doc("account", "u1", 1, Some("alice"), json!({"v": 1}), 1);
    let inserted = doc_event("u1_created", 1);
    store.doc_insert(&v1, Some(&inserted)).await.unwrap();
    expected.push(inserted);

    // Refusals between successes: a burned number would show as a gap.
    let err = store
        .doc_insert(&v1, Some(&doc_event("again", 2)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");

    let v2 = doc("account", "u1", 2, Some("alice"), json!({"v": 2}), 3);
    let updated = doc_event("u1_updated", 3);
    store.doc_update(&v2, Some(&updated)).await.unwrap();
    expected.push(updated);

    let err = store
        .doc_update(&v2, Some(&doc_event("stale", 4)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let missing = doc("account", "u9", 2, None, json!({}), 4);
    let err = store
        .doc_update(&missing, Some(&doc_event("missing", 4)))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");

    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 5);
    store.create_token(&tok, &tok_event).await.unwrap();
    expected.push(tok_event);

    // Writes with and without events interleave; only those with events count.
    store
        .doc_insert(&doc("session", "s1", 1, None, json!({}), 6), None)
        .await
        .unwrap();
    let v3 = doc("account", "u1", 3, None, json!({"v": 3}), 7);
    let third = doc_event("u1_third", 7);
    store.doc_update(&v3, Some(&third)).await.unwrap();
    expected.push(third);
    let keyless = doc_event("u2_created", 8);
    store
        .doc_insert(&doc("account", "u2", 1, None, json!({}), 8), Some(&keyless))
        .await
        .unwrap();
    expected.push(keyless);

    let events = all_events(&store).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), expected.len());
    for (stored, sealed) in events.iter().zip(&expected) {
        assert_stored_as(stored, sealed);
    }
    assert_eq!(store.last_event_seq().await.unwrap(), expected.len() as u64);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let payloads = store.payloads(&seqs).await.unwrap();
    for (stored, sealed) in events.iter().zip(&expected) {
        assert_eq!(
            payloads.get(&stored.seq),
            sealed.payload.as_ref(),
            "payload {}",
            stored.seq
        );
    }
    assert_eq!(store.doc_get("account", "u1").await.unwrap(), Some(v3));
}

/// `doc_delete` deletes exactly one id; `doc_delete_prefix` every id with the literal
/// prefix in that kind, and nothing for an empty prefix.
/// `doc_list_recent`: the latest updates first, ties by id descending (byte order), only
/// the kind asked for, at most `limit`; an update moves a document to the front.
pub async fn doc_list_recent_is_latest_first(store: Arc<dyn Store>) {
    assert!(
        store
            .doc_list_recent("delivery", 10)
            .await
            .unwrap()
            .is_empty()
    );
    for (id, seconds) in [
        ("d3", 30),
        ("d1", 10),
        ("d4", 40),
        ("d2", 20),
        ("U2", 20),
        ("ü2", 20),
    ] {
        store
            .doc_insert(
                &doc("delivery", id, 1, None, json!({"id": id}), seconds),
                None,
            )
            .await
            .unwrap();
    }
    store
        .doc_insert(&doc("other", "x", 1, None, json!(null), 99), None)
        .await
        .unwrap();
    let ids = |docs: Vec<Doc>| docs.into_iter().map(|d| d.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.doc_list_recent("delivery", 10).await.unwrap()),
        ["d4", "d3", "ü2", "d2", "U2", "d1"]
    );
    assert_eq!(
        ids(store.doc_list_recent("delivery", 2).await.unwrap()),
        ["d4", "d3"]
    );
    // Updating the oldest makes it the latest.
    let mut d1 = store.doc_get("delivery", "d1").await.unwrap().unwrap();
    d1.version += 1;
    d1.updated_at = at(50);
    store.doc_update(&d1, None).await.unwrap();
    assert_eq!(
        ids(store.doc_list_recent("delivery", 3).await.unwrap()),
        ["d1", "d4", "d3"]
    );
    assert_eq!(store.doc_list_recent("delivery", 1).await.unwrap()[0], d1);
}

pub async fn doc_delete_and_delete_prefix(store: Arc<dyn Store>) {
    let ids = ["u1", "u1/a", "u1/b", "u1/c/d", "u10", "u2/a", "a%b", "ab"];
    for id in ids {
        let key = format!("key-{id}");
        store
            .doc_insert(&doc("session", id, 1, Some(&key), json!({}), 0), None)
            .await
            .unwrap();
    }
    let other_kind = doc("account", "u1/a", 1, None, json!({}), 0);
    store.doc_insert(&other_kind, None).await.unwrap();

    assert!(store.doc_delete("session", "u1/a").await.unwrap());
    assert!(
        !store.doc_delete("session", "u1/a").await.unwrap(),
        "already gone"
    );
    assert!(!store.doc_delete("session", "nope").await.unwrap());
    assert!(!store.doc_delete("room", "u1").await.unwrap());
    assert_eq!(store.doc_get("session", "u1/a").await.unwrap(), None);
    assert_eq!(store.doc_by_key("session", "key-u1/a").await.unwrap(), None);
    assert_eq!(
        store.doc_get("account", "u1/a").await.unwrap(),
        Some(other_kind.clone())
    );
    // A deleted document's id and key are free again.
    let reborn = doc(
        "session",
        "u1/a",
        1,
        Some("key-u1/a"),
        json!({"again": true}),
        1,
    );
    store.doc_insert(&reborn, None).await.unwrap();
    assert!(store.doc_delete("session", "u1/a").await.unwrap());

    assert_eq!(
        store.doc_delete_prefix("session", "").await.unwrap(),
        0,
        "never all"
    );
    assert_eq!(store.doc_list("session", "", 100).await.unwrap().len(), 7);
    assert_eq!(store.doc_delete_prefix("session", "zzz").await.unwrap(), 0);
    assert_eq!(store.doc_delete_prefix("room", "u1/").await.unwrap(), 0);
    assert_eq!(store.doc_delete_prefix("session", "u1/").await.unwrap(), 2);
    assert_eq!(
        listed(&store, "session", "", 100).await,
        ["a%b", "ab", "u1", "u10", "u2/a"]
    );
    assert_eq!(
        store.doc_delete_prefix("session", "a%").await.unwrap(),
        1,
        "literal"
    );
    assert_eq!(store.doc_delete_prefix("session", "u1").await.unwrap(), 2);
    assert_eq!(listed(&store, "session", "", 100).await, ["ab", "u2/a"]);
    assert_eq!(
        store.doc_get("account", "u1/a").await.unwrap(),
        Some(other_kind)
    );
    assert_no_events(&store).await;
}

/// `meta_set_once` keeps the first value written, even among concurrent writers, in
/// the table the log origin lives in; `meta_list` lists by literal prefix, by key.
pub async fn meta_set_once_first_writer_wins(store: Arc<dyn Store>) {
    assert!(store.meta_list("app.").await.unwrap().is_empty());
    assert_eq!(
        store.meta_set_once("app.secret", "one").await.unwrap(),
        "one"
    );
    assert_eq!(
        store.meta_set_once("app.secret", "two").await.unwrap(),
        "one"
    );
    assert_eq!(store.meta_set_once("app.empty", "").await.unwrap(), "");
    assert_eq!(store.meta_set_once("app.empty", "late").await.unwrap(), "");

    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = JoinSet::new();
    for i in 0..8 {
        let store = store.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            store
                .meta_set_once("app.race", &format!("value-{i}"))
                .await
                .unwrap()
        });
    }
    let seen = tasks.join_all().await;
    let winner = seen[0].clone();
    assert!(
        seen.iter().all(|v| *v == winner),
        "every writer sees one value: {seen:?}"
    );
    assert!((0..8).any(|i| winner == format!("value-{i}")), "{winner}");

    for (key, value) in [
        ("app.b", "B"),
        ("app.A", "upper"),
        ("app.a", "lower"),
        ("app_x", "x"),
    ] {
        assert_eq!(store.meta_set_once(key, value).await.unwrap(), value);
    }
    let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        store.meta_list("app.").await.unwrap(),
        owned(&[
            ("app.A", "upper"),
            ("app.a", "lower"),
            ("app.b", "B"),
            ("app.empty", ""),
            ("app.race", &winner),
            ("app.secret", "one"),
        ])
    );
    assert_eq!(
        store.meta_list("app.r").await.unwrap(),
        owned(&[("app.race", &winner)])
    );
    assert_eq!(
        store.meta_list("app_").await.unwrap(),
        owned(&[("app_x", "x")])
    );
    assert_eq!(
        store.meta_list("app.secret").await.unwrap(),
        owned(&[("app.secret", "one")])
    );
    assert!(store.meta_list("app.secret.").await.unwrap().is_empty());
    assert!(store.meta_list("%").await.unwrap().is_empty());

    // The log origin is such a setting.
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(
        store
            .meta_set_once("origin", "other.example.com/log")
            .await
            .unwrap(),
        "gate.example.com/log"
    );
    assert_no_events(&store).await;
}

/// Imported requests and tokens read back exactly as given, write no event, cannot be
/// imported twice, and carry on like any other.
pub async fn imports_copy_rows_without_events(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let created = new_request("req_done", &bot, 0, 3600, Some("key-done"));
    let decided = decide(
        &created.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n1",
    );
    let pending = new_request("req_open", &bot, 1, 30, Some("key-open"));
    store.import_request(&decided.request).await.unwrap();
    store.import_request(&pending.request).await.unwrap();

    assert_eq!(
        store.get_request("req_done").await.unwrap(),
        Some(decided.request.clone())
    );
    assert_eq!(
        store.get_request("req_open").await.unwrap(),
        Some(pending.request.clone())
    );
    assert_eq!(
        store.list_requests(&RequestQuery::default()).await.unwrap(),
        vec![pending.request.clone(), decided.request.clone()]
    );
    assert_eq!(
        store.next_expiry().await.unwrap(),
        Some(pending.request.expires_at)
    );
    assert_eq!(
        ids(&store.due_for_expiry(at(1000), 10).await.unwrap()),
        ["req_open"]
    );
    // The requester's idempotency key came along.
    let retry = new_request("req_retry", &bot, 2, 3600, Some("key-open"));
    match store.create_request(&sealed(&retry)).await.unwrap() {
        Created::Existing(existing) => assert_eq!(existing, pending.request),
        Created::New(_) => panic!("the imported request holds the idempotency key"),
    }

    for again in [&decided.request, &created.request, &pending.request] {
        let err = store.import_request(again).await.unwrap_err();
        assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    }
    assert_eq!(
        store.get_request("req_done").await.unwrap(),
        Some(decided.request.clone())
    );

    let (active, _) = token("tok_live", "live", "hash-live", 3);
    let revoked = TokenRecord {
        revoked_at: Some(at(4)),
        ..token("tok_gone", "gone", "hash-gone", 2).0
    };
    store.import_token(&active).await.unwrap();
    store.import_token(&revoked).await.unwrap();
    assert_eq!(
        store.token_by_hash("hash-live").await.unwrap(),
        Some(active.clone())
    );
    assert_eq!(
        store.token_by_hash("hash-gone").await.unwrap(),
        Some(revoked.clone())
    );
    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![revoked.clone(), active.clone()]
    );
    let same_hash = TokenRecord {
        id: "tok_other".into(),
        ..active.clone()
    };
    for again in [&active, &revoked, &same_hash] {
        let err = store.import_token(again).await.unwrap_err();
        assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    }
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);
    assert_no_events(&store).await;

    // Imported rows carry on as usual: the pending request can be decided, from the
    // version it was imported at, and the token revoked.
    let approved = sealed(&decide(
        &pending.request,
        Verdict::Approved,
        &approver("bob"),
        6,
        "n2",
    ));
    store.apply(&approved).await.unwrap();
    assert_eq!(
        store.get_request("req_open").await.unwrap(),
        Some(approved.request.clone())
    );
    store
        .revoke_token("tok_live", at(7), &token_revoked(&active, 7))
        .await
        .unwrap();
    let err = store
        .revoke_token("tok_gone", at(8), &token_revoked(&revoked, 8))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(_)),
        "already revoked: {err}"
    );
    assert_eq!(
        kinds(&all_events(&store).await),
        ["request_decided", "token_revoked"]
    );
}

/// Erasing payload openings removes the values (and salts) but not the entries: the
/// log hashes the same, and other events keep theirs.
pub async fn erased_payloads_leave_the_log_intact(store: Arc<dyn Store>) {
    fill_log(&*store, "req", 3).await;
    let events = all_events(&store).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let before = store.payloads(&seqs).await.unwrap();
    assert_eq!(before.len(), 3, "each request_created has a payload");
    assert_eq!(
        store
            .erase_payloads(&[seqs[0], seqs[2], 999])
            .await
            .unwrap(),
        2
    );
    let after = store.payloads(&seqs).await.unwrap();
    assert_eq!(after.keys().copied().collect::<Vec<_>>(), vec![seqs[1]]);
    let again = all_events(&store).await;
    assert_eq!(again, events, "entries are untouched");
    assert_eq!(store.erase_payloads(&[]).await.unwrap(), 0);
}
