//! Document writes: ids and keys are unique within a kind, updates are
//! compare-and-swap, racing writers have exactly one winner, and an event written with a
//! document is appended atomically with it.

use std::sync::Arc;

use countersign_core::SealedEvent;
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{Doc, Store, StoreError};

use super::docs::{assert_no_events, awkward_body, listed};
use super::fixtures::*;

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
