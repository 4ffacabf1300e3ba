//! Documents: what they hold reads back exactly, and they are found by id or key,
//! listed by prefix or by recency, and deleted one or a prefix at a time.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::{Doc, Store};

use super::fixtures::*;

fn doc_ids(docs: &[Doc]) -> Vec<&str> {
    docs.iter().map(|d| d.id.as_str()).collect()
}

pub(super) async fn listed(
    store: &Arc<dyn Store>,
    kind: &str,
    prefix: &str,
    limit: usize,
) -> Vec<String> {
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

pub(super) async fn assert_no_events(store: &Arc<dyn Store>) {
    assert_eq!(store.last_event_seq().await.unwrap(), 0, "no event written");
    assert!(all_events(store).await.is_empty(), "no event written");
}

/// A body with every kind of JSON value, including what a database's JSON type might
/// normalise or refuse (a NUL character, extreme numbers, key order, empty containers).
pub(super) fn awkward_body(name: &str) -> Value {
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

/// `doc_delete` deletes exactly one id; `doc_delete_prefix` every id with the literal
/// prefix in that kind, and nothing for an empty prefix.
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
    // Counted by kind alone (the outbox's depth in /metrics).
    assert_eq!(store.doc_count("session").await.unwrap(), 7);
    assert_eq!(store.doc_count("account").await.unwrap(), 1);
    assert_eq!(store.doc_count("room").await.unwrap(), 0);
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
    assert_eq!(store.doc_count("session").await.unwrap(), 2);
    assert_eq!(
        store.doc_get("account", "u1/a").await.unwrap(),
        Some(other_kind)
    );
    assert_no_events(&store).await;
}
