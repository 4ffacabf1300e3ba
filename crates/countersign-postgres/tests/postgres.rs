//! The PostgreSQL backend against a real server: the cross-backend suite, plus what only
//! several instances on one database can show (one log across instances, wake-ups by
//! NOTIFY, racing migrations, locks held elsewhere, lost connections).
//!
//! The server is `COUNTERSIGN_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). Each test gets a schema of its own,
//! dropped when it ends. If the server cannot be reached the tests pass with a note on
//! stderr, except with `CI=true`, where that is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use countersign_core::merkle::CompactRange;
use countersign_core::{EventKind, Verdict};
use countersign_postgres::{Options, PostgresStore, SCHEMA_VERSION};
use countersign_store::testsuite::{
    agent, approver, assert_tree, decide, doc, doc_event, fill_log, grow, leaves, new_request,
    recorded_decision, sealed, token,
};
use countersign_store::{ChangeFeed, Created, Store, StoreError, StoredEvent};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const SCHEMA_PREFIX: &str = "cs_test_";

fn base_url() -> String {
    std::env::var("COUNTERSIGN_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// `url` with one more query parameter.
fn with_param(url: &str, key: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={value}")
}

/// One test's schema on the test server; dropped (with everything in it) on drop.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    /// A new, empty schema name, or `None` (after saying why) if the server cannot be
    /// reached outside CI.
    async fn new() -> Option<Self> {
        let url = base_url();
        let client = match raw_client(&url).await {
            Ok(client) => client,
            Err(err) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("CI=true and PostgreSQL at {url} cannot be reached: {err}")
            }
            Err(err) => {
                let shown = redact(&url);
                skip_note(&format!(
                    "SKIPPED: the PostgreSQL tests pass without running: PostgreSQL at {shown} \
                     cannot be reached ({err}); start it or set COUNTERSIGN_TEST_POSTGRES_URL \
                     (with CI=true this is a failure)"
                ));
                return None;
            }
        };
        drop_stale_schemas(&client).await;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut random = [0u8; 6];
        getrandom::fill(&mut random).unwrap();
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        Some(Self {
            url,
            name: format!("{SCHEMA_PREFIX}{secs}_{hex}"),
        })
    }

    fn options(&self) -> Options {
        Options {
            pool_size: 4,
            schema: Some(self.name.clone()),
            ..Options::default()
        }
    }

    async fn store(&self) -> PostgresStore {
        PostgresStore::connect_with(&self.url, &self.options())
            .await
            .unwrap()
    }

    /// A store whose connections carry `application_name`, so that the test can find
    /// them in pg_stat_activity.
    async fn store_named(&self, application_name: &str) -> PostgresStore {
        let url = with_param(&self.url, "application_name", application_name);
        PostgresStore::connect_with(&url, &self.options())
            .await
            .unwrap()
    }

    /// A plain connection with this schema first in its search_path.
    async fn raw(&self) -> tokio_postgres::Client {
        let client = raw_client(&self.url).await.unwrap();
        client
            .batch_execute(&format!("SET search_path = {}", self.name))
            .await
            .unwrap();
        client
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        // Drop can't await, and may run on a runtime's thread: drop the schema from a
        // thread with a runtime of its own, and wait for it.
        let url = self.url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let client = raw_client(&url).await?;
                client
                    .batch_execute(&format!(
                        "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {name} CASCADE"
                    ))
                    .await
                    .map_err(|e| format!("{e:?}"))
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {dropped:?}", self.name);
        }
    }
}

/// `url` without its password, if it has one.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// Says why the tests are skipped, once, on the real stderr: the test harness captures
/// `eprintln!` of passing tests, and a skip must not go unnoticed.
fn skip_note(note: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::SeqCst) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{note}");
    }
}

async fn raw_client(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("{e}: {e:?}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// Test schemas older than an hour are left over from runs that were killed (a test
/// that fails still drops its own); a run still going that long ago is long over.
async fn drop_stale_schemas(client: &tokio_postgres::Client) {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let rows = client
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)",
            &[&SCHEMA_PREFIX],
        )
        .await
        .unwrap();
    for row in rows {
        let name: String = row.get(0);
        let created = name[SCHEMA_PREFIX.len()..]
            .split('_')
            .next()
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs + 3600 < now) {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .await;
        }
    }
}

async fn fresh() -> Option<(Arc<dyn Store>, Schema)> {
    let schema = Schema::new().await?;
    let store: Arc<dyn Store> = Arc::new(schema.store().await);
    Some((store, schema))
}

mod suite {
    // Outside CI, an unreachable server skips the test: the `return` leaves the test
    // function that the macro wraps around this expression.
    countersign_store::store_test_suite!(match super::fresh().await {
        Some(pair) => std::future::ready(pair),
        None => return,
    });
}

async fn all_events(store: &dyn Store) -> Vec<StoredEvent> {
    store.events_after(0, 100_000).await.unwrap()
}

fn assert_gap_free(events: &[StoredEvent]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
}

async fn wait_until<F, Fut>(what: &str, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..400 {
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// How many connections named `application_name` are listening.
async fn listeners(client: &tokio_postgres::Client, application_name: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            &[&application_name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Schedules the test body only when the server is there.
macro_rules! schema_or_skip {
    () => {
        match Schema::new().await {
            Some(schema) => schema,
            None => return,
        }
    };
}

// ---------------------------------------------------------------------------------------
// Several instances on one database.

/// Approvers on two instances decide one request at once: one wins, everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_decision_wins_across_instances() {
    let schema = schema_or_skip!();
    let a: Arc<dyn Store> = Arc::new(schema.store().await);
    let b: Arc<dyn Store> = Arc::new(schema.store().await);

    let created = new_request("req_both", &agent("deploy-bot"), 0, 3600, None);
    a.create_request(&sealed(&created)).await.unwrap();
    let barrier = Arc::new(Barrier::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let barrier = barrier.clone();
        let transition = sealed(&decide(
            &created.request,
            if i % 3 == 0 {
                Verdict::Rejected
            } else {
                Verdict::Approved
            },
            &approver(&format!("approver-{i}")),
            5,
            &format!("nonce-{i}"),
        ));
        tasks.spawn(async move {
            barrier.wait().await;
            let result = store.apply(&transition).await;
            (transition, result)
        });
    }
    let results = tasks.join_all().await;
    let winners: Vec<_> = results.iter().filter(|(_, r)| r.is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one decision wins");
    let stored = b.get_request("req_both").await.unwrap().unwrap();
    assert_eq!(stored, winners[0].0.request);
    assert_eq!(a.get_request("req_both").await.unwrap().unwrap(), stored);
    for (_, result) in &results {
        match result {
            Ok(()) => {}
            Err(StoreError::VersionConflict { current }) => assert_eq!(**current, stored),
            Err(other) => panic!("a loser must see a version conflict, got {other}"),
        }
    }
    let events = all_events(&*a).await;
    assert_gap_free(&events);
    let decided: Vec<_> = events
        .iter()
        .filter(|e| e.entry.kind == EventKind::RequestDecided)
        .collect();
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].bytes, winners[0].0.event.bytes);
}

/// Writes through two instances, from many tasks each, make one gap-free log in which
/// every write appears once, and each instance's writer shares commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_from_two_instances_are_gap_free() {
    let schema = schema_or_skip!();
    let a = Arc::new(schema.store().await);
    let b = Arc::new(schema.store().await);

    let n = 200;
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let store: Arc<dyn Store> = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move {
            if i % 10 == 9 {
                let event = recorded_decision(&format!("dec_{i:03}"), &agent("bot"), i);
                store.append_event(&event).await.map(|_| ())
            } else {
                let transition = new_request(&format!("req_{i:03}"), &agent("bot"), i, 3600, None);
                match store.create_request(&sealed(&transition)).await {
                    Ok(Created::New(_)) => Ok(()),
                    Ok(Created::Existing(r)) => panic!("unexpected existing {}", r.id),
                    Err(err) => Err(err),
                }
            }
        });
    }
    for result in tasks.join_all().await {
        result.unwrap();
    }
    let events = all_events(&*a).await;
    assert_eq!(events.len(), n as usize);
    assert_gap_free(&events);
    assert_eq!(all_events(&*b).await, events);
    let mut subjects: Vec<String> = events
        .iter()
        .map(|e| e.entry.subject.clone().unwrap())
        .collect();
    subjects.sort();
    subjects.dedup();
    assert_eq!(
        subjects.len(),
        n as usize,
        "every write appears exactly once"
    );
    assert_eq!(a.last_event_seq().await.unwrap(), n as u64);
    assert_eq!(b.last_event_seq().await.unwrap(), n as u64);

    let (sa, sb) = (a.writer_stats(), b.writer_stats());
    assert_eq!(sa.jobs + sb.jobs, n as u64);
    assert!(
        sa.batches + sb.batches < n as u64 && sa.largest_batch.max(sb.largest_batch) > 1,
        "concurrent writes share transactions: {sa:?} {sb:?}"
    );
}

/// An agent waiting on instance B wakes when instance A records the decision, by
/// NOTIFY: far sooner than B's poll interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decision_on_one_instance_wakes_a_waiter_on_another() {
    let schema = schema_or_skip!();
    let a: Arc<dyn Store> = Arc::new(schema.store().await);
    let b: Arc<dyn Store> = Arc::new(schema.store().await);
    let poll = Duration::from_secs(5);
    let feed = ChangeFeed::start(b.clone(), poll).await.unwrap();

    for round in 0..3 {
        let id = format!("req_wake_{round}");
        let created = new_request(&id, &agent("bot"), round, 3600, None);
        a.create_request(&sealed(&created)).await.unwrap();
        let mut watch = feed.watch(&id);
        assert_eq!(b.get_request(&id).await.unwrap().unwrap().version, 1);

        let decided = decide(
            &created.request,
            Verdict::Approved,
            &approver("alice"),
            5,
            "n",
        );
        let started = Instant::now();
        a.apply(&sealed(&decided)).await.unwrap();
        tokio::time::timeout(poll, watch.changed())
            .await
            .expect("B's waiter wakes");
        let latency = started.elapsed();
        eprintln!("cross-instance wake-up {round}: {latency:?}");
        assert!(
            latency < Duration::from_secs(1),
            "woken by NOTIFY, not by the {poll:?} poll: took {latency:?}"
        );
        assert_eq!(b.get_request(&id).await.unwrap().unwrap(), decided.request);
    }
}

/// Instances starting together on an empty schema all migrate it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_race_safely() {
    let schema = schema_or_skip!();
    let schema = Arc::new(schema);
    let barrier = Arc::new(Barrier::new(4));
    let mut tasks = JoinSet::new();
    for _ in 0..4 {
        let schema = schema.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            PostgresStore::connect_with(&schema.url, &schema.options()).await
        });
    }
    let stores: Vec<PostgresStore> = tasks
        .join_all()
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let raw = schema.raw().await;
    let versions: Vec<i32> = raw
        .query("SELECT version FROM schema_version ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    for store in &stores {
        store.check().await.unwrap();
        let info = store.server_info().await.unwrap();
        assert_eq!(info.schema_version, SCHEMA_VERSION);
        assert_eq!(info.schema, schema.name);
    }
    // One head row, whoever created it.
    let heads: i64 = raw
        .query_one("SELECT count(*) FROM log_head", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(heads, 1);
    drop(stores);
}

/// Integrators on two instances race over the same entries: the size moves once, and
/// both read one tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn integrators_on_two_instances_agree() {
    let schema = schema_or_skip!();
    let a: Arc<dyn Store> = Arc::new(schema.store().await);
    let b: Arc<dyn Store> = Arc::new(schema.store().await);
    let mut range = CompactRange::empty();
    let mut size = 0;
    for (round, grow_by) in [11u64, 6].into_iter().enumerate() {
        fill_log(&*a, &format!("req_{round}"), grow_by as usize).await;
        let from = size;
        size += grow_by;
        let nodes = Arc::new(grow(&mut range, &leaves(&*b, from, size).await));
        let barrier = Arc::new(Barrier::new(8));
        let mut tasks = JoinSet::new();
        for i in 0..8 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (barrier, nodes) = (barrier.clone(), nodes.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                store.integrate(from, size, &nodes).await.unwrap()
            });
        }
        let won = tasks.join_all().await;
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {won:?}"
        );
        for store in [&a, &b] {
            assert_eq!(store.integrated_size().await.unwrap(), size);
            assert_tree(&**store, size, &range.root()).await;
        }
    }
    // Beyond the stored events is an error, and writes nothing.
    let err = a.integrate(size, size + 5, &[]).await.unwrap_err();
    assert!(err.to_string().contains("only 17 are stored"), "{err}");
    assert_eq!(a.integrated_size().await.unwrap(), size);
}

/// Documents written from two instances at once, some with events and some without:
/// one owner per key, one winner per version, and only the winners' events, gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn document_writes_race_across_instances() {
    let schema = schema_or_skip!();
    let a: Arc<dyn Store> = Arc::new(schema.store().await);
    let b: Arc<dyn Store> = Arc::new(schema.store().await);
    let n = 16;
    let mut winning_events = Vec::new();
    for round in 0..3 {
        let id = |what: &str, i: usize| format!("{what}{round}_{i:02}");
        for i in 0..n {
            a.doc_insert(&doc("account", &id("own", i), 1, None, json!({}), 0), None)
                .await
                .unwrap();
        }
        let cas = id("cas", 0);
        b.doc_insert(&doc("account", &cas, 1, None, json!({}), 0), None)
            .await
            .unwrap();
        // Every document claims one key; new documents claim another; every writer
        // updates one document from the same version.
        for what in ["claim", "insert", "cas"] {
            let key = format!("{what}-{round}");
            let barrier = Arc::new(Barrier::new(n));
            let mut tasks = JoinSet::new();
            for i in 0..n {
                let store = if i % 2 == 0 { a.clone() } else { b.clone() };
                let event = (i % 4 < 2).then(|| doc_event(&id(what, i), 1));
                let write = match what {
                    "claim" => doc("account", &id("own", i), 2, Some(&key), json!({"i": i}), 1),
                    "insert" => doc("account", &id("new", i), 1, Some(&key), json!({"i": i}), 1),
                    _ => doc("account", &cas, 2, None, json!({"i": i}), 1),
                };
                let barrier = barrier.clone();
                tasks.spawn(async move {
                    barrier.wait().await;
                    let result = if what == "insert" {
                        store.doc_insert(&write, event.as_ref()).await
                    } else {
                        store.doc_update(&write, event.as_ref()).await
                    };
                    (write, event, result)
                });
            }
            let mut winners = Vec::new();
            for (write, event, result) in tasks.join_all().await {
                match (what, result) {
                    (_, Ok(())) => winners.push((write, event)),
                    ("cas", Err(StoreError::Conflict(_)))
                    | ("claim" | "insert", Err(StoreError::Duplicate(_))) => {}
                    (_, Err(other)) => panic!("{what}, round {round}: {other:?}"),
                }
            }
            assert_eq!(winners.len(), 1, "{what}, round {round}: one winner");
            let (winner, event) = winners.pop().unwrap();
            assert_eq!(
                b.doc_get("account", &winner.id).await.unwrap(),
                Some(winner.clone())
            );
            if what != "cas" {
                assert_eq!(a.doc_by_key("account", &key).await.unwrap(), Some(winner));
            }
            winning_events.extend(event);
        }
    }
    let events = all_events(&*a).await;
    assert_gap_free(&events);
    let mut stored: Vec<&Vec<u8>> = events.iter().map(|e| &e.bytes).collect();
    let mut expected: Vec<&Vec<u8>> = winning_events.iter().map(|e| &e.bytes).collect();
    stored.sort();
    expected.sort();
    assert_eq!(stored, expected, "exactly the winners' events");
}

/// A key held by a transaction still in flight elsewhere: the write waits for it; if it
/// commits, the write is refused as a duplicate (not a backend error), with or without
/// an event, and appends nothing; if it rolls back, the write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_taken_by_a_concurrent_transaction_is_a_duplicate() {
    let schema = schema_or_skip!();
    let app = format!("cs_doc_{}", &schema.name[SCHEMA_PREFIX.len()..]);
    let store: Arc<dyn Store> = Arc::new(schema.store_named(&app).await);
    let observer = schema.raw().await;
    store
        .doc_insert(&doc("account", "u1", 1, None, json!({}), 0), None)
        .await
        .unwrap();
    let mut version = 1;
    let mut events = 0;
    let cases = [
        ("insert", true, "COMMIT"),
        ("insert", false, "COMMIT"),
        ("update", true, "COMMIT"),
        ("update", false, "COMMIT"),
        ("insert", true, "ROLLBACK"),
        ("update", true, "ROLLBACK"),
        ("update", false, "ROLLBACK"),
    ];
    for (n, (what, with_event, end)) in cases.into_iter().enumerate() {
        let key = format!("held-{n}");
        let holder = schema.raw().await;
        holder
            .batch_execute(&format!(
                "BEGIN; INSERT INTO documents (kind, id, version, key, body, updated_at)
                 VALUES ('account', 'holder-{n}', 1, '{key}', '{{}}', 0)"
            ))
            .await
            .unwrap();
        let write = if what == "insert" {
            doc(
                "account",
                &format!("new-{n}"),
                1,
                Some(&key),
                json!({"n": n}),
                1,
            )
        } else {
            doc("account", "u1", version + 1, Some(&key), json!({"n": n}), 1)
        };
        let event = with_event.then(|| doc_event(&format!("case_{n}"), 1));
        let task = {
            let (store, write) = (store.clone(), write.clone());
            tokio::spawn(async move {
                if what == "insert" {
                    store.doc_insert(&write, event.as_ref()).await
                } else {
                    store.doc_update(&write, event.as_ref()).await
                }
            })
        };
        wait_until("the write waits for the holder", || async {
            let waiting: i64 = observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    &[&app],
                )
                .await
                .unwrap()
                .get(0);
            waiting > 0
        })
        .await;
        holder.batch_execute(end).await.unwrap();
        let result = task.await.unwrap();
        let case = format!("{what} with event {with_event}, holder {end}");
        if end == "COMMIT" {
            assert!(
                matches!(result, Err(StoreError::Duplicate(_))),
                "{case}: {result:?}"
            );
            assert_eq!(
                store
                    .doc_by_key("account", &key)
                    .await
                    .unwrap()
                    .map(|d| d.id),
                Some(format!("holder-{n}")),
                "{case}"
            );
        } else {
            result.unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(
                store.doc_by_key("account", &key).await.unwrap(),
                Some(write.clone())
            );
            if what == "update" {
                version += 1;
            }
            if with_event {
                events += 1;
            }
        }
        assert_eq!(
            store
                .doc_get("account", "u1")
                .await
                .unwrap()
                .unwrap()
                .version,
            version
        );
        let stored = all_events(&*store).await;
        assert_eq!(stored.len(), events, "{case}");
        assert_gap_free(&stored);
    }
}

// ---------------------------------------------------------------------------------------
// Batching.

/// One write whose statement fails mid-batch: the batch is rolled back and its writes
/// run again alone, so that only the failing one fails; an expected refusal (a
/// duplicate) in the same batch costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_write_does_not_sink_its_batch() {
    let schema = schema_or_skip!();
    let store = Arc::new(schema.store().await);
    let (existing, event) = token("tok_00", "existing", "hash-taken", 0);
    store.create_token(&existing, &event).await.unwrap();

    // Hold the log head as another instance would: the writer blocks on its first
    // write's batch, and the others queue up behind it to form the next batch.
    let holder = schema.raw().await;
    holder
        .batch_execute("BEGIN; SELECT last_seq FROM log_head FOR UPDATE")
        .await
        .unwrap();
    let before = store.writer_stats();
    let mut tasks = JoinSet::new();
    for i in 1..=10u64 {
        let hash = if i == 5 {
            "hash-taken".to_string()
        } else {
            format!("hash-{i}")
        };
        // PostgreSQL refuses a NUL byte in text: this write's statement raises an error.
        let name = if i == 7 {
            "bad\0name".to_string()
        } else {
            format!("t{i}")
        };
        let (record, event) = token(&format!("tok_{i:02}"), &name, &hash, i as i64);
        let writer = store.clone();
        tasks.spawn(async move { (i, writer.create_token(&record, &event).await) });
        if i == 1 {
            let store = store.clone();
            wait_until("the writer took the first write", || {
                let store = store.clone();
                async move { store.writer_stats().jobs == before.jobs + 1 }
            })
            .await;
        } else {
            let store = store.clone();
            wait_until("the write is queued", move || {
                let store = store.clone();
                async move { store.writer_stats().queued == i - 1 }
            })
            .await;
        }
    }
    holder.batch_execute("ROLLBACK").await.unwrap();

    for (i, result) in tasks.join_all().await {
        match i {
            5 => assert!(
                matches!(result, Err(StoreError::Duplicate(_))),
                "{result:?}"
            ),
            7 => assert!(
                matches!(&result, Err(StoreError::Backend(m)) if m.contains("insert a token")),
                "{result:?}"
            ),
            _ => result.unwrap(),
        }
    }
    let after = store.writer_stats();
    assert_eq!(after.jobs, before.jobs + 10);
    assert_eq!(after.split_batches, before.split_batches + 1, "{after:?}");
    assert!(
        after.largest_batch >= 9,
        "jobs 2..=10 formed one batch: {after:?}"
    );

    let ids: Vec<String> = store
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        ids,
        [
            "tok_00", "tok_01", "tok_02", "tok_03", "tok_04", "tok_06", "tok_08", "tok_09",
            "tok_10"
        ]
    );
    let events = all_events(&*store).await;
    assert_eq!(events.len(), 9);
    assert_gap_free(&events);
}

// ---------------------------------------------------------------------------------------
// Failures said in words.

/// A lock held elsewhere past the lock timeout makes writes `Unavailable` (retryable),
/// not broken; reads go on; once the lock is gone, writes go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_log_head_is_unavailable_not_broken() {
    let schema = schema_or_skip!();
    let options = Options {
        lock_timeout: Duration::from_millis(200),
        ..schema.options()
    };
    let store = PostgresStore::connect_with(&schema.url, &options)
        .await
        .unwrap();
    let holder = schema.raw().await;
    holder
        .batch_execute("BEGIN; SELECT last_seq FROM log_head FOR UPDATE")
        .await
        .unwrap();

    let created = new_request("req_busy", &agent("bot"), 0, 3600, None);
    let err = store.create_request(&sealed(&created)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("lock"), "{err}");
    let err = store.check().await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("cannot be written")),
        "{err}"
    );
    assert_eq!(store.last_event_seq().await.unwrap(), 0, "reads go on");

    holder.batch_execute("ROLLBACK").await.unwrap();
    store.create_request(&sealed(&created)).await.unwrap();
    store.check().await.unwrap();
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_what_is_wrong() {
    let schema = schema_or_skip!();
    let good = schema.store().await;
    good.check().await.unwrap();

    // Nothing listens on port 1.
    let nowhere = "postgres://postgres@127.0.0.1:1/test";
    let err = PostgresStore::connect_with(nowhere, &schema.options())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("cannot reach PostgreSQL at 127.0.0.1:1/test")),
        "{err}"
    );
    let lazy = PostgresStore::connect_lazy(nowhere, &schema.options()).unwrap();
    let err = lazy.check().await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("cannot reach PostgreSQL at 127.0.0.1:1/test")),
        "{err}"
    );
    // The writer says the same, and stays usable for when the server is back.
    let created = new_request("req_x", &agent("bot"), 0, 3600, None);
    let err = lazy.create_request(&sealed(&created)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");

    // A role that does not exist: refused, and the message names the user.
    let stranger = base_url().replacen("postgres@", "no_such_role_cs@", 1);
    if stranger != base_url() {
        let lazy = PostgresStore::connect_lazy(&stranger, &schema.options()).unwrap();
        let err = lazy.check().await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("refused") && text.contains("no_such_role_cs"),
            "{text}"
        );
    }

    // Read-only sessions (as on a standby, or a read-only role).
    let read_only = with_param(
        &schema.url,
        "options",
        "-c%20default_transaction_read_only%3Don",
    );
    let lazy = PostgresStore::connect_lazy(&read_only, &schema.options()).unwrap();
    let err = lazy.check().await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("only allows reads")),
        "{err}"
    );
    let err = PostgresStore::connect_with(&read_only, &schema.options())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("read-only"), "{err}");

    // A schema that was never migrated.
    let empty = Schema::new().await.unwrap();
    let lazy = PostgresStore::connect_lazy(&empty.url, &empty.options()).unwrap();
    let err = lazy.check().await.unwrap_err();
    assert!(err.to_string().contains("countersign migrate"), "{err}");
    assert_eq!(lazy.migrate().await.unwrap(), SCHEMA_VERSION);
    lazy.check().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let schema = schema_or_skip!();
    let store = schema.store().await;
    schema
        .raw()
        .await
        .execute(
            "INSERT INTO schema_version (version, applied_at) VALUES ($1, 0)",
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .unwrap();
    let err = PostgresStore::connect_with(&schema.url, &schema.options())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("newer"), "{err}");
    let err = store.check().await.unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_durable() {
    let schema = schema_or_skip!();
    let store = schema.store().await;
    let info = store.server_info().await.unwrap();
    assert_eq!(info.synchronous_commit, "on");
    assert!(!info.read_only && !info.in_recovery);
    assert_eq!(info.schema, schema.name);
    assert_eq!(info.schema_version, SCHEMA_VERSION);
}

// ---------------------------------------------------------------------------------------
// Lost connections and stopping.

/// The listener's connection is killed: it reconnects, and decisions wake waiters
/// again by NOTIFY.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_listener_reconnects() {
    let schema = schema_or_skip!();
    let name = format!("{}_b", schema.name);
    let a: Arc<dyn Store> = Arc::new(schema.store().await);
    let b: Arc<dyn Store> = Arc::new(schema.store_named(&name).await);
    let feed = ChangeFeed::start(b.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    let raw = schema.raw().await;
    assert_eq!(listeners(&raw, &name).await, 1);
    raw.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = $1 AND query LIKE 'LISTEN%'",
        &[&name],
    )
    .await
    .unwrap();
    wait_until("the listener is back", || {
        let (raw, name) = (&raw, &name);
        async move { listeners(raw, name).await == 1 }
    })
    .await;

    let created = new_request("req_after", &agent("bot"), 0, 3600, None);
    a.create_request(&sealed(&created)).await.unwrap();
    let mut watch = feed.watch("req_after");
    let decided = decide(
        &created.request,
        Verdict::Rejected,
        &approver("alice"),
        5,
        "n",
    );
    let started = Instant::now();
    a.apply(&sealed(&decided)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the waiter wakes");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// Every connection of an instance is killed (a database restart, say): writes and
/// reads recover on new connections, at worst after one retryable failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_and_reads_survive_lost_connections() {
    let schema = schema_or_skip!();
    let name = format!("{}_w", schema.name);
    let store = schema.store_named(&name).await;
    fill_log(&store, "before", 3).await;
    assert_eq!(store.last_event_seq().await.unwrap(), 3);
    let raw = schema.raw().await;
    let killed: i64 = raw
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        killed >= 2,
        "the writer's and a pooled connection: {killed}"
    );

    let created = sealed(&new_request("req_again", &agent("bot"), 9, 3600, None));
    let mut attempts = 0;
    loop {
        attempts += 1;
        match store.create_request(&created).await {
            Ok(_) => break,
            Err(StoreError::Unavailable(m)) if attempts < 3 => eprintln!("retrying: {m}"),
            Err(other) => panic!("attempt {attempts}: {other}"),
        }
    }
    let mut attempts = 0;
    let events = loop {
        attempts += 1;
        match store.events_after(0, 100).await {
            Ok(events) => break events,
            Err(StoreError::Unavailable(m)) if attempts < 5 => eprintln!("retrying: {m}"),
            Err(other) => panic!("attempt {attempts}: {other}"),
        }
    };
    assert_eq!(events.len(), 4);
    assert_gap_free(&events);
    store.check().await.unwrap();
}

/// Dropping the store (and its feed) closes the listener's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_stops_its_listener() {
    let schema = schema_or_skip!();
    let name = format!("{}_l", schema.name);
    let store: Arc<dyn Store> = Arc::new(schema.store_named(&name).await);
    let feed = ChangeFeed::start(store.clone(), Duration::from_secs(30))
        .await
        .unwrap();
    let raw = schema.raw().await;
    assert_eq!(listeners(&raw, &name).await, 1);
    drop(feed);
    drop(store);
    wait_until("the listener's connection is closed", || {
        let (raw, name) = (&raw, &name);
        async move { listeners(raw, name).await == 0 }
    })
    .await;
}

/// Erasing a payload removes only the opening; the log reads and proves as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_payload_leaves_the_log_intact() {
    let schema = schema_or_skip!();
    let store = schema.store().await;
    fill_log(&store, "req", 4).await;
    let size = store.last_event_seq().await.unwrap();
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&store, 0, size).await);
    assert!(store.integrate(0, size, &nodes).await.unwrap());
    let before = store.payloads(&[1, 2, 3, 4]).await.unwrap();
    assert_eq!(before.len(), 4);

    let erased = schema
        .raw()
        .await
        .execute("DELETE FROM payloads WHERE seq = 2", &[])
        .await
        .unwrap();
    assert_eq!(erased, 1);
    let after = store.payloads(&[1, 2, 3, 4]).await.unwrap();
    assert_eq!(after.keys().copied().collect::<Vec<_>>(), [1, 3, 4]);
    assert_tree(&store, size, &range.root()).await;
    assert!(all_events(&store).await[1].entry.payload.is_some());
}

// ---------------------------------------------------------------------------------------
// Throughput, on demand: `cargo test -p countersign-postgres --release --test postgres
// -- --ignored --nocapture throughput`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check; run on demand"]
async fn throughput() {
    let schema = schema_or_skip!();
    let instances = [
        Arc::new(schema.store().await),
        Arc::new(schema.store().await),
    ];
    for (label, count, spread) in [("one instance", 4000, 1), ("two instances", 4000, 2)] {
        // Seal first, so that only storing is timed.
        let prefix = label.replace(' ', "_");
        let writes: Vec<_> = (0..count)
            .map(|i| {
                sealed(&new_request(
                    &format!("{prefix}_{i}"),
                    &agent("bot"),
                    i as i64,
                    3600,
                    None,
                ))
            })
            .collect();
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for (i, write) in writes.into_iter().enumerate() {
            let store = instances[i % spread].clone();
            tasks.spawn(async move { store.create_request(&write).await.unwrap() });
        }
        tasks.join_all().await;
        let elapsed = started.elapsed();
        eprintln!(
            "{label}: {count} concurrent durable creates in {elapsed:?} = {:.0}/s",
            count as f64 / elapsed.as_secs_f64()
        );
    }
    for (i, store) in instances.iter().enumerate() {
        eprintln!("instance {i}: {:?}", store.writer_stats());
    }
    assert_gap_free(&all_events(&*instances[0]).await);
}

/// A schema of version 1 (before token expiry, scopes and unique names): its tokens keep
/// working, and their names stay taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_schema_1_keep_working_and_their_names_stay_taken() {
    let schema = schema_or_skip!();
    let raw = raw_client(&schema.url).await.unwrap();
    raw.batch_execute(&format!(
        "CREATE SCHEMA {name}; SET search_path = {name};
         CREATE TABLE schema_version (version integer PRIMARY KEY, applied_at bigint NOT NULL);
         INSERT INTO schema_version VALUES (1, 0);",
        name = schema.name
    ))
    .await
    .unwrap();
    raw.batch_execute(include_str!("../migrations/0001_initial.sql"))
        .await
        .unwrap();
    raw.batch_execute(countersign_store::testsuite::SCHEMA_1_TOKENS)
        .await
        .unwrap();
    let store = schema.store().await;
    assert_eq!(
        store.server_info().await.unwrap().schema_version,
        SCHEMA_VERSION
    );
    countersign_store::testsuite::tokens_of_schema_1_keep_working(Arc::new(store)).await;
}
