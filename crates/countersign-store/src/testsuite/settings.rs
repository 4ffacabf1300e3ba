//! One-time settings: the first writer wins, even among concurrent ones, and settings
//! are listed by literal prefix.

use std::sync::Arc;

use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::Store;

use super::docs::assert_no_events;

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
