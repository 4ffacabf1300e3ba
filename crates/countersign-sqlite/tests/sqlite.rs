//! The SQLite backend: the cross-backend suite, plus what only a file on disk shared by
//! several processes can show (durability, permissions, group commit, locking).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use countersign_core::merkle::CompactRange;
use countersign_core::{EventKind, Status, Verdict};
use countersign_sqlite::{Options, SCHEMA_VERSION, SqliteStore};
use countersign_store::testsuite::{
    agent, approver, assert_tree, at, decide, fill_log, grow, leaves, new_request, sealed, token,
    token_revoked,
};
use countersign_store::{ChangeFeed, Created, RequestQuery, Store, StoreError, StoredEvent};
use tempfile::TempDir;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

fn db_path(dir: &TempDir) -> PathBuf {
    // A missing subdirectory, so that `open` has to create it.
    dir.path().join("data").join("countersign.db")
}

async fn fresh() -> (Arc<dyn Store>, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&db_path(&dir)).unwrap();
    (Arc::new(store), dir)
}

mod suite {
    use super::fresh;

    countersign_store::store_test_suite!(fresh());
}

async fn all_events(store: &dyn Store) -> Vec<StoredEvent> {
    store.events_after(0, 100_000).await.unwrap()
}

fn assert_gap_free(events: &[StoredEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Holds SQLite's write lock from outside the store, as another process would.
fn lock_database(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_survives_reopening_and_settings_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).unwrap();

    let pragmas = store.pragmas().await.unwrap();
    assert_eq!(pragmas.journal_mode, "wal");
    assert_eq!(pragmas.synchronous, 2, "synchronous = FULL");
    assert!(pragmas.foreign_keys);
    assert_eq!(pragmas.busy_timeout_ms, 5000);
    assert_eq!(pragmas.schema_version, SCHEMA_VERSION);

    let created = new_request("req_keep", &agent("deploy-bot"), 0, 3600, Some("k"));
    store.create_request(&sealed(&created)).await.unwrap();
    let decided = decide(
        &created.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n",
    );
    store.apply(&sealed(&decided)).await.unwrap();
    let (tok, tok_event) = token("tok_keep", "alice", "hash-keep", 1);
    store.create_token(&tok, &tok_event).await.unwrap();
    let revoked = store
        .revoke_token("tok_keep", at(9), &token_revoked(&tok, 9))
        .await
        .unwrap();
    let events = all_events(&store).await;
    assert_eq!(events.len(), 4);

    #[cfg(unix)]
    {
        assert_eq!(mode(&path), 0o600, "the database is private to its owner");
        assert_eq!(mode(&path.with_extension("db-wal")), 0o600);
        assert_eq!(mode(&path.with_extension("db-shm")), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }
    drop(store);

    // WAL mode is a property of the file, seen by any connection.
    let raw = rusqlite::Connection::open(&path).unwrap();
    let journal: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
    drop(raw);

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.get_request("req_keep").await.unwrap(),
        Some(decided.request.clone())
    );
    assert_eq!(store.list_tokens().await.unwrap(), vec![revoked]);
    assert_eq!(all_events(&store).await, events);
    // The idempotency key still holds, and numbering carries on.
    let retry = new_request("req_retry", &agent("deploy-bot"), 10, 3600, Some("k"));
    assert_eq!(
        store.create_request(&sealed(&retry)).await.unwrap(),
        Created::Existing(decided.request)
    );
    let next = new_request("req_next", &agent("deploy-bot"), 11, 3600, None);
    store.create_request(&sealed(&next)).await.unwrap();
    assert_eq!(store.last_event_seq().await.unwrap(), 5);
    store.check().await.unwrap();
}

/// A commit through one handle reaches the change feed of another at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_by_another_handle_wakes_the_feed_without_polling() {
    // Two handles on one file stand for two processes (the watch is on the file, not in
    // memory). B's feed polls only once a minute: everything it sees within seconds came
    // from the file watch.
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let feed = ChangeFeed::start(b.clone(), Duration::from_secs(60))
        .await
        .unwrap();
    // Listen without poking the feed (which would make it read at once).
    let mut events = feed.subscribe();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let created = new_request(&format!("req_watch_{i}"), &agent("bot"), 0, 3600, None);
        let started = std::time::Instant::now();
        a.create_request(&sealed(&created)).await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("commit {i} by the other handle was not seen within 10 s (the poll is 60 s)")
            })
            .unwrap();
        assert_eq!(
            seen.entry.subject.as_deref(),
            Some(format!("req_watch_{i}").as_str())
        );
        slowest = slowest.max(started.elapsed());
    }
    println!("slowest cross-handle wake: {slowest:?}");
    // The signal is the poke file beside the database, as private as the database.
    let poke = PathBuf::from(format!("{}-poke", path.display()));
    assert!(poke.exists(), "{}", poke.display());
    #[cfg(unix)]
    assert_eq!(mode(&poke), 0o600);
}

/// The feed of a process that commits too takes its own events without reading them
/// back, and still sees every event of another process interleaved with them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_and_foreign_commits_interleaved_all_reach_the_feed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let ours: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let theirs: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let feed = ChangeFeed::start(ours.clone(), Duration::from_secs(60))
        .await
        .unwrap();
    let mut events = feed.subscribe();
    for i in 0..40 {
        let by = if i % 3 == 0 { &theirs } else { &ours };
        let created = new_request(&format!("req_mix_{i}"), &agent("bot"), 0, 3600, None);
        by.create_request(&sealed(&created)).await.unwrap();
        if i % 3 != 0 {
            // What the gate does after its own writes.
            feed.poke();
        }
    }
    for i in 0..40 {
        let seen = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap_or_else(|_| panic!("event {i} not seen within 10 s (the poll is 60 s)"))
            .unwrap();
        assert_eq!(seen.seq, i + 1);
        assert_eq!(
            seen.entry.subject.as_deref(),
            Some(format!("req_mix_{i}").as_str())
        );
        // The same entry as the database holds.
        let stored = ours.events_after(i, 1).await.unwrap();
        assert_eq!(stored[0].bytes, seen.bytes);
        assert_eq!(stored[0].entry, seen.entry);
    }
    // The committing process's own run (events 38 and 39) is answered without a read;
    // past it the database is read when another process signalled a commit or the last
    // read is old: here the other process's 40, and then nothing more.
    let followed = ours.follow_events(37, 10).await.unwrap();
    assert!(!followed.read && followed.events.iter().map(|e| e.seq).eq([38, 39]));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let followed = ours.follow_events(39, 10).await.unwrap();
    assert!(followed.read && followed.events.iter().map(|e| e.seq).eq([40]));
    let followed = ours.follow_events(40, 10).await.unwrap();
    assert!(followed.read && followed.events.is_empty());
}

/// The writer checkpoints the WAL into the database file as it grows (after its replies,
/// in place of SQLite's automatic checkpoint inside the commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wal_is_checkpointed_as_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let before = size(&path);
    let mut i = 0;
    // Until the database file has grown: only a checkpoint writes it.
    while size(&path) <= before {
        assert!(i < 20_000, "no checkpoint after {i} requests");
        let mut set = JoinSet::new();
        for _ in 0..50 {
            let store = store.clone();
            let created = new_request(&format!("req_wal_{i}"), &agent("bot"), 0, 3600, None);
            set.spawn(async move { store.create_request(&sealed(&created)).await.unwrap() });
            i += 1;
        }
        while set.join_next().await.is_some() {}
    }
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    println!("checkpointed after {i} requests; WAL {} bytes", size(&wal));
    // The WAL starts over after a complete checkpoint rather than growing without end.
    assert!(size(&wal) < 64 * 1024 * 1024, "{}", size(&wal));
}

/// Two stores on one file, as `countersign serve` and a `countersign mcp` process are.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());

    // First decision wins across both.
    let created = new_request("req_both", &agent("deploy-bot"), 0, 3600, None);
    a.create_request(&sealed(&created)).await.unwrap();
    let mut tasks = JoinSet::new();
    for i in 0..10 {
        for (name, store) in [("a", &a), ("b", &b)] {
            let store = store.clone();
            let transition = decide(
                &created.request,
                Verdict::Approved,
                &approver(&format!("approver-{name}-{i}")),
                5,
                &format!("nonce-{name}-{i}"),
            );
            tasks.spawn(async move { store.apply(&sealed(&transition)).await });
        }
    }
    let results = tasks.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(()) | Err(StoreError::VersionConflict { .. })))
    );

    // Writes through both interleave into one gap-free sequence.
    let mut tasks = JoinSet::new();
    for i in 0..40 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let transition = new_request(&format!("req_{i:02}"), &agent("bot"), i, 3600, None);
        tasks.spawn(async move { store.create_request(&sealed(&transition)).await });
    }
    assert!(tasks.join_all().await.iter().all(Result::is_ok));
    let events = all_events(&*b).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), 1 + 1 + 40);
    assert_eq!(all_events(&*a).await, events);
    assert_eq!(
        events
            .iter()
            .filter(|e| e.entry.kind == EventKind::RequestDecided)
            .count(),
        1
    );

    // B's change feed sees a change made through A by polling alone: nothing pokes it.
    let watched = new_request("req_feed", &agent("bot"), 50, 3600, None);
    a.create_request(&sealed(&watched)).await.unwrap();
    let feed = ChangeFeed::start(b.clone(), Duration::from_millis(100))
        .await
        .unwrap();
    let mut watch = feed.watch("req_feed");
    let cancelled = watched.request.cancel(&agent("bot"), at(51)).unwrap();
    let started = std::time::Instant::now();
    a.apply(&sealed(&cancelled)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("B's feed sees A's write");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "seen within a few poll intervals, took {:?}",
        started.elapsed()
    );
}

/// Integrators in two processes on one file (`serve` and a `countersign mcp` process)
/// race over the same entries: the integrated size moves once, and both see one tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_race_integration() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let a: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    let b: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());

    let mut range = CompactRange::empty();
    let mut size = 0;
    for (round, grow_by) in [11u64, 6].into_iter().enumerate() {
        fill_log(&*a, &format!("req_{round}"), grow_by as usize).await;
        let from = size;
        size += grow_by;
        // Each side computes the nodes from what it reads.
        let nodes = Arc::new(grow(&mut range, &leaves(&*b, from, size).await));
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = JoinSet::new();
        for i in 0..8 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            let nodes = nodes.clone();
            tasks.spawn(async move {
                barrier.wait().await;
                store.integrate(from, size, &nodes).await.unwrap()
            });
        }
        let won = tasks.join_all().await;
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: exactly one integrator wins across both stores: {won:?}"
        );
        for store in [&a, &b] {
            assert_eq!(store.integrated_size().await.unwrap(), size);
            assert_tree(&**store, size, &range.root()).await;
        }
    }
}

/// Erasing a payload (a data subject's request, say) removes only the opening: the
/// entry keeps its bytes and its commitment, so the log hashes and proves as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_payload_leaves_the_log_intact() {
    let (store, dir) = fresh_sqlite();
    let created = sealed(&new_request("req_erase", &agent("bot"), 0, 3600, None));
    store.create_request(&created).await.unwrap();
    let decided = sealed(&decide(
        &created.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n",
    ));
    store.apply(&decided).await.unwrap();
    fill_log(&*store, "req_other", 3).await;

    let size = store.last_event_seq().await.unwrap();
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&*store, 0, size).await);
    assert!(store.integrate(0, size, &nodes).await.unwrap());
    let root = range.root();
    let events = all_events(&*store).await;
    let seqs: Vec<u64> = (1..=size).collect();
    let openings = store.payloads(&seqs).await.unwrap();
    assert_eq!(openings.get(&1), created.event.payload.as_ref());
    assert_eq!(openings.get(&2), decided.event.payload.as_ref());

    let raw = rusqlite::Connection::open(db_path(&dir)).unwrap();
    let erased = raw
        .execute("DELETE FROM payloads WHERE seq = ?1", [1])
        .unwrap();
    assert_eq!(erased, 1, "the creation's payload row is removable");
    drop(raw);

    let after = store.payloads(&seqs).await.unwrap();
    assert!(!after.contains_key(&1), "the opening is gone");
    assert_eq!(after.get(&2), openings.get(&2), "other openings stay");
    assert_eq!(after.len(), openings.len() - 1);
    assert_eq!(all_events(&*store).await, events, "entries are untouched");
    assert_eq!(events[0].bytes, created.event.bytes);
    assert!(events[0].entry.payload.is_some(), "the commitment stays");
    assert_eq!(
        openings[&1].commitment(),
        events[0].entry.payload,
        "and a copy of the opening kept elsewhere still opens it"
    );
    // The leaves hash as before and every proof still verifies, across a reopen too.
    let mut again = CompactRange::empty();
    grow(&mut again, &leaves(&*store, 0, size).await);
    assert_eq!(again.root(), root);
    assert_tree(&*store, size, &root).await;
    drop(store);
    let reopened = SqliteStore::open(&db_path(&dir)).unwrap();
    assert_eq!(reopened.integrated_size().await.unwrap(), size);
    assert_tree(&reopened, size, &root).await;
    assert!(!reopened.payloads(&[1]).await.unwrap().contains_key(&1));
}

/// Everything the log keeps survives reopening: origin, integrated size, nodes,
/// checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    fill_log(&store, "req", 5).await;
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&store, 0, 5).await);
    assert!(store.integrate(0, 5, &nodes).await.unwrap());
    let checkpoint = countersign_store::StoredCheckpoint {
        size: 5,
        note: "gate.example.com/log\n5\nroot\n\n— sig\n".into(),
        created_at: at(1),
    };
    store.add_checkpoint(&checkpoint).await.unwrap();
    drop(store);

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.log_origin("other").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(store.integrated_size().await.unwrap(), 5);
    assert_tree(&store, 5, &range.root()).await;
    assert_eq!(store.checkpoints().await.unwrap(), vec![checkpoint]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_share_commits() {
    let (store, _dir) = fresh_sqlite();
    let mut tasks = JoinSet::new();
    for i in 0..500 {
        let store = store.clone();
        let transition = new_request(&format!("req_{i:03}"), &agent("bot"), i, 3600, None);
        tasks.spawn(async move { store.create_request(&sealed(&transition)).await });
    }
    let results = tasks.join_all().await;
    assert!(results.iter().all(|r| matches!(r, Ok(Created::New(_)))));

    let listed = store
        .list_requests(&RequestQuery {
            limit: 1000,
            ..RequestQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 500);
    let events = all_events(&*store).await;
    assert_eq!(events.len(), 500);
    assert_gap_free(&events);

    let stats = store.writer_stats();
    assert_eq!(stats.jobs, 500);
    assert!(
        stats.batches < stats.jobs && stats.largest_batch > 1,
        "writes queued together commit together: {stats:?}"
    );
}

async fn wait_until(condition: impl Fn() -> bool) {
    for _ in 0..1000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting");
}

fn fresh_sqlite() -> (Arc<SqliteStore>, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&db_path(&dir)).unwrap();
    (Arc::new(store), dir)
}

/// One failing job in a batch rolls back alone; the rest of its batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_job_does_not_sink_its_batch() {
    let (store, dir) = fresh_sqlite();
    let (existing, event) = token("tok_00", "existing", "hash-taken", 0);
    store.create_token(&existing, &event).await.unwrap();

    // With the write lock held elsewhere, the writer blocks on its first job's batch, and
    // every later job queues up behind it to form the next batch.
    let lock = lock_database(&db_path(&dir));
    let mut tasks = JoinSet::new();
    for i in 1..=10 {
        let hash = if i == 5 {
            "hash-taken".to_string()
        } else {
            format!("hash-{i}")
        };
        let (record, event) = token(&format!("tok_{i:02}"), &format!("t{i}"), &hash, i);
        let writer = store.clone();
        tasks.spawn(async move { (i, writer.create_token(&record, &event).await) });
        // Enqueue in order, so that the failing job sits mid-batch. The writer takes job 1
        // alone and holds it while it waits for the lock; the others queue.
        if i == 1 {
            wait_until(|| store.writer_stats().jobs == 2).await;
        } else {
            let queued = (i - 1) as u64;
            wait_until(|| store.writer_stats().queued == queued).await;
        }
    }
    let before = store.writer_stats();
    lock.execute_batch("ROLLBACK").unwrap();

    for (i, result) in tasks.join_all().await {
        if i == 5 {
            assert!(
                matches!(result, Err(StoreError::Duplicate(_))),
                "{result:?}"
            );
        } else {
            result.unwrap();
        }
    }
    let after = store.writer_stats();
    assert_eq!(
        after.batches,
        before.batches + 1,
        "jobs 2..=10 formed one batch"
    );
    assert!(after.largest_batch >= 9, "{after:?}");

    let tokens = store.list_tokens().await.unwrap();
    let ids: Vec<&str> = tokens.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "tok_00", "tok_01", "tok_02", "tok_03", "tok_04", "tok_06", "tok_07", "tok_08",
            "tok_09", "tok_10"
        ]
    );
    let events = all_events(&*store).await;
    assert_eq!(events.len(), 10);
    assert_gap_free(&events);
}

/// A database locked past the busy timeout is `Unavailable` (retryable), and `check`
/// says which file; once the lock is gone, writes go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_is_unavailable_not_broken() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let options = Options {
        busy_timeout: Duration::from_millis(100),
        ..Options::default()
    };
    let store = SqliteStore::open_with(&path, &options).unwrap();

    let lock = lock_database(&path);
    let created = new_request("req_busy", &agent("bot"), 0, 3600, None);
    let err = store.create_request(&sealed(&created)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    let err = store.check().await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    // Reads are not blocked by a writer.
    assert_eq!(store.last_event_seq().await.unwrap(), 0);

    lock.execute_batch("ROLLBACK").unwrap();
    store.create_request(&sealed(&created)).await.unwrap();
    store.check().await.unwrap();
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_notices_a_deleted_file() {
    let (store, dir) = fresh_sqlite();
    store.check().await.unwrap();
    std::fs::remove_file(db_path(&dir)).unwrap();
    let err = store.check().await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("countersign.db") && message.contains("gone"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(SqliteStore::open(&path).unwrap());
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(raw);
    let err = SqliteStore::open(&path)
        .err()
        .expect("a newer schema is refused");
    assert!(err.to_string().contains("newer"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Several real processes on one file. The test binary re-runs itself: with CHILD_ENV set,
// `child_process_entry` acts as one writer process; without it, it does nothing.

const CHILD_ENV: &str = "COUNTERSIGN_SQLITE_TEST_CHILD";
const CHILDREN: usize = 3;
const PER_CHILD: usize = 30;

#[test]
fn child_process_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (path, index) = spec.rsplit_once('|').unwrap();
    let index: usize = index.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(child_writer(Path::new(path), index));
}

async fn child_writer(path: &Path, index: usize) {
    // Every child opens a file that may not exist yet: the migrations race.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).unwrap());
    let mut tasks = JoinSet::new();
    for j in 0..PER_CHILD {
        let store = store.clone();
        let transition = new_request(
            &format!("req_p{index}_{j:02}"),
            &agent("bot"),
            0,
            3600,
            None,
        );
        tasks.spawn(async move { store.create_request(&sealed(&transition)).await.unwrap() });
    }
    tasks.join_all().await;

    // All children create "the same" request and then race to decide it.
    let shared = new_request(
        &format!("req_shared_{index}"),
        &agent("shared-bot"),
        0,
        3600,
        Some("shared"),
    );
    let (Created::New(request) | Created::Existing(request)) =
        store.create_request(&sealed(&shared)).await.unwrap();
    if request.status == Status::Pending {
        let decided = decide(
            &request,
            Verdict::Approved,
            &approver(&format!("child-{index}")),
            1,
            &format!("nonce-{index}"),
        );
        match store.apply(&sealed(&decided)).await {
            Ok(()) | Err(StoreError::VersionConflict { .. }) => {}
            Err(other) => panic!("child {index}: {other}"),
        }
    }
}

#[test]
fn several_processes_share_one_file() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            std::process::Command::new(&exe)
                .args(["--exact", "child_process_entry", "--test-threads=1"])
                .env(CHILD_ENV, format!("{}|{i}", path.display()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "child failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let requests = store
            .list_requests(&RequestQuery {
                limit: 1000,
                ..RequestQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(requests.len(), CHILDREN * PER_CHILD + 1);
        let shared: Vec<_> = requests
            .iter()
            .filter(|r| r.idempotency_key.as_deref() == Some("shared"))
            .collect();
        assert_eq!(shared.len(), 1, "one request for the shared key");
        assert_eq!(shared[0].status, Status::Approved);
        assert_eq!(shared[0].version, 2, "decided exactly once");

        let events = all_events(&store).await;
        assert_gap_free(&events);
        assert_eq!(events.len(), CHILDREN * PER_CHILD + 1 + 1);
        let decided: Vec<_> = events
            .iter()
            .filter(|e| e.entry.kind == EventKind::RequestDecided)
            .collect();
        assert_eq!(decided.len(), 1);
        let winner = decided[0].entry.actor.clone().unwrap();
        assert!(
            (0..CHILDREN).any(|i| winner == format!("token:child-{i}")),
            "{winner}"
        );
    });
}

/// A database of schema version 1 (before token expiry, scopes and unique names): its
/// tokens keep working, and their names stay taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_schema_1_keep_working_and_their_names_stay_taken() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(include_str!("../migrations/0001_initial.sql"))
        .unwrap();
    raw.pragma_update(None, "user_version", 1).unwrap();
    raw.execute_batch(countersign_store::testsuite::SCHEMA_1_TOKENS)
        .unwrap();
    drop(raw);
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.pragmas().await.unwrap().schema_version,
        SCHEMA_VERSION
    );
    countersign_store::testsuite::tokens_of_schema_1_keep_working(Arc::new(store)).await;
}
