//! The suite's fixtures, built with countersign-core's real API so that a store is tested
//! with what the server really writes, and the assertions the tests share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use countersign_core::evidence::{DecisionRecordInput, decision_record};
use countersign_core::merkle::{self, CompactRange, Hash, NodeId};
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, EventKind, Limits, NewRequest, Principal, Role,
    SealedEvent, SealedTransition, Signer, Timestamp, TokenRecord, Transition, Verdict,
};
use serde_json::{Value, json};

use crate::{Created, Doc, Store, StoredEvent};

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
        expires_at: None,
        scopes: None,
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

pub(super) async fn create_new(store: &Arc<dyn Store>, transition: &Transition) -> ApprovalRequest {
    create_sealed(store, &sealed(transition)).await
}

pub(super) async fn create_sealed(
    store: &Arc<dyn Store>,
    write: &SealedTransition,
) -> ApprovalRequest {
    match store.create_request(write).await.unwrap() {
        Created::New(request) => request,
        Created::Existing(existing) => panic!("expected a new request, got {existing:?}"),
    }
}

pub(super) async fn all_events(store: &Arc<dyn Store>) -> Vec<StoredEvent> {
    store.events_after(0, 100_000).await.unwrap()
}

pub(super) fn kinds(events: &[StoredEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.entry.kind.as_str()).collect()
}

pub(super) fn ids(requests: &[ApprovalRequest]) -> Vec<&str> {
    requests.iter().map(|r| r.id.as_str()).collect()
}

pub(super) fn assert_gap_free(events: &[StoredEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "event sequence numbers must be 1, 2, 3, …");
}

/// Asserts that `stored` is `sealed` as written: same entry, same exact bytes.
pub(super) fn assert_stored_as(stored: &StoredEvent, sealed: &SealedEvent) {
    assert_eq!(stored.entry, sealed.entry, "event {} entry", stored.seq);
    assert_eq!(stored.bytes, sealed.bytes, "event {} bytes", stored.seq);
}
