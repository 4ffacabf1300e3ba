//! The change feed over a store: a poke wakes the watchers of what changed at once, and
//! the poll finds a change without one.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::Verdict;

use crate::{ChangeFeed, Store};

use super::fixtures::*;

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
