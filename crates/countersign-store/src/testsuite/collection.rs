//! Typed document collections over every backend: a body round-trips through its type,
//! a document that does not decode is `Corrupt` (never a panic or a default), and
//! `Docs::modify` retries a lost compare-and-swap until every writer's change is in.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::task::JoinSet;

use crate::{Collection, Docs, Step, Store, StoreError};

use super::fixtures::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Counter {
    n: u64,
    by: Vec<String>,
}

struct Counters;
impl Collection for Counters {
    const KIND: &'static str = "test.counter";
    type Body = Counter;
}

/// Typed inserts, reads by id, key and prefix, updates and deletes.
pub async fn typed_docs_round_trip_and_refuse_bad_bodies(store: Arc<dyn Store>) {
    let docs = Docs::<Counters>::new(&*store);
    let zero = Counter { n: 0, by: vec![] };
    docs.insert("a/1", Some("first".into()), &zero, at(1), None)
        .await
        .unwrap();
    docs.insert("a/2", None, &zero, at(2), None).await.unwrap();
    let read = docs.get("a/1").await.unwrap().unwrap();
    assert_eq!((read.version, read.body.clone()), (1, zero.clone()));
    assert_eq!(docs.by_key("first").await.unwrap().unwrap().id, "a/1");
    let one = Counter {
        n: 1,
        by: vec!["x".into()],
    };
    assert_eq!(docs.update(&read, &one, at(3), None).await.unwrap(), 2);
    // The same read again lost the race: a conflict, nothing written.
    let stale = docs.update(&read, &zero, at(4), None).await.unwrap_err();
    assert!(matches!(stale, StoreError::Conflict(_)), "{stale}");
    let now = docs.get("a/1").await.unwrap().unwrap();
    assert_eq!(
        (now.version, now.body, now.key.as_deref()),
        (2, one, Some("first"))
    );
    assert_eq!(docs.list("a/", 10).await.unwrap().len(), 2);
    assert_eq!(
        docs.updated("a/", 10).await.unwrap(),
        [("a/1".to_string(), at(3)), ("a/2".to_string(), at(2))]
    );

    // A body of another shape under this kind is corrupt, with its kind and id named.
    store
        .doc_insert(
            &doc("test.counter", "a/3", 1, None, json!({"n": "three"}), 5),
            None,
        )
        .await
        .unwrap();
    let err = docs.get("a/3").await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains("test.counter a/3")),
        "{err}"
    );
    assert!(matches!(
        docs.list("a/", 10).await,
        Err(StoreError::Corrupt(_))
    ));
    assert_eq!(
        docs.updated("a/", 10).await.unwrap().len(),
        3,
        "dates still readable"
    );
    assert!(docs.delete("a/3").await.unwrap());
    assert_eq!(docs.delete_prefix("a/").await.unwrap(), 2);
    assert!(docs.get("a/1").await.unwrap().is_none());
}

/// Writers racing on one document through `modify` each get their change in once: the
/// losers of a compare-and-swap read again and retry. A step that writes nothing
/// returns at once.
pub async fn modify_retries_until_every_writer_is_in(store: Arc<dyn Store>) {
    const WRITERS: usize = 8;
    let mut tasks = JoinSet::new();
    for w in 0..WRITERS {
        let store = store.clone();
        tasks.spawn(async move {
            let docs = Docs::<Counters>::new(&*store);
            docs.modify("shared", at(1), |current| {
                let mut counter = current
                    .map(|c| c.body.clone())
                    .unwrap_or(Counter { n: 0, by: vec![] });
                counter.n += 1;
                counter.by.push(format!("w{w}"));
                Ok::<_, StoreError>(Step::Write {
                    body: counter,
                    event: None,
                    then: (),
                })
            })
            .await
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let docs = Docs::<Counters>::new(&*store);
    let end = docs.get("shared").await.unwrap().unwrap();
    assert_eq!(end.body.n, WRITERS as u64);
    let mut by = end.body.by.clone();
    by.sort();
    by.dedup();
    assert_eq!(
        by.len(),
        WRITERS,
        "each writer exactly once: {:?}",
        end.body.by
    );
    assert_eq!(end.version, WRITERS as u64, "one version per write");

    let seen = docs
        .modify("shared", at(2), |current| {
            Ok::<_, StoreError>(Step::Done(current.map(|c| c.version)))
        })
        .await
        .unwrap();
    assert_eq!(seen, Some(WRITERS as u64));
    assert_eq!(
        docs.get("shared").await.unwrap().unwrap().version,
        WRITERS as u64
    );
}
