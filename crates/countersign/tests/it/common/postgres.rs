//! A PostgreSQL database of its own for each test that needs one (the multi-instance and
//! webhook tests), on the server at `COUNTERSIGN_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`). One place for it, so every suite names,
//! skips and cleans up its databases the same way.
//!
//! Each database is `cs_it_<unix seconds>_<random hex>` and is dropped when its `TestDb`
//! drops; those left behind by runs that started more than ten minutes ago are dropped too.
//! If the server cannot be reached, `TestDb::create` says so once and returns `None` (the
//! test passes without running), except with `CI=true`, where that is a failure.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::NoTls;

use super::tools::in_ci;

/// `postgres` exists on every server, so the default needs no set-up.
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const DB_PREFIX: &str = "cs_it_";
/// Databases of runs that started this long before ours are left-overs (a run takes a
/// few minutes); younger ones may belong to a run going on beside ours.
const STALE_AFTER_SECS: u64 = 600;

fn base_url() -> String {
    std::env::var("COUNTERSIGN_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// When this test binary started (the first test to ask).
fn run_started() -> u64 {
    static STARTED: OnceLock<u64> = OnceLock::new();
    *STARTED.get_or_init(unix_secs)
}

/// `url` naming database `db` instead (query parameters kept).
fn url_with_db(url: &str, db: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((main, query)) => (main, Some(query)),
        None => (url, None),
    };
    let authority = main.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match main[authority..].find('/') {
        Some(slash) => &main[..authority + slash],
        None => main,
    };
    match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    }
}

/// The URL with any password replaced by `***`, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

async fn pg_client(url: &str) -> Result<tokio_postgres::Client, String> {
    let connect = tokio_postgres::connect(url, NoTls);
    let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A fresh database on the test server, dropped on drop.
pub struct TestDb {
    admin_url: String,
    name: String,
    /// The database's URL, for `database_url`.
    pub url: String,
}

impl TestDb {
    /// `None` (after saying why) when PostgreSQL cannot be reached outside CI.
    pub async fn create() -> Option<TestDb> {
        let admin_url = base_url();
        let client = match pg_client(&admin_url).await {
            Ok(client) => client,
            Err(err) if in_ci() => {
                panic!(
                    "CI=true and PostgreSQL at {} cannot be reached: {err}",
                    redact(&admin_url)
                )
            }
            Err(err) => {
                // Said once, and past the test harness's capture, so that it is seen.
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::SeqCst) {
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "SKIPPED: the PostgreSQL tests pass without running: PostgreSQL at \
                         {} cannot be reached ({err}); start it or set \
                         COUNTERSIGN_TEST_POSTGRES_URL (with CI=true this is a failure)",
                        redact(&admin_url)
                    );
                }
                return None;
            }
        };
        drop_stale_databases(&client).await;
        let mut random = [0u8; 6];
        getrandom::fill(&mut random).expect("randomness");
        let name = format!("{DB_PREFIX}{}_{}", unix_secs(), hex::encode(random));
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        Some(TestDb {
            url: url_with_db(&admin_url, &name),
            admin_url,
            name,
        })
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        pg_client(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", redact(&self.url)))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let row = self
            .client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await and may run on a runtime thread: use a thread with a runtime
        // of its own, and wait for it. FORCE ends connections of instances still running.
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let client = pg_client(&admin_url).await?;
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!(
                "could not drop the test database {}: {dropped:?}",
                self.name
            );
        }
    }
}

/// Drops `cs_it_*` databases created by runs that started well before this one.
async fn drop_stale_databases(client: &tokio_postgres::Client) {
    let cutoff = run_started().saturating_sub(STALE_AFTER_SECS);
    let Ok(rows) = client
        .query(
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'cs\\_it\\_%'",
            &[],
        )
        .await
    else {
        return;
    };
    for row in rows {
        let name: String = row.get(0);
        let created = name
            .strip_prefix(DB_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok());
        if created.is_some_and(|secs| secs < cutoff) {
            // Another run may be dropping it too: errors do not matter.
            let _ = client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }
}
