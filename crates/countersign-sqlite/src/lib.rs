//! countersign's embedded storage: one SQLite file, safe to share between processes
//! (several `countersign mcp` stdio processes beside one `countersign serve`).
//!
//! - WAL mode with `synchronous = FULL`: every acknowledged write survives a crash or a
//!   power cut, and readers never wait for the writer.
//! - One writer thread per process commits jobs in groups (`writer.rs`), so durability
//!   costs one fsync per batch rather than per write.
//! - Writes take SQLite's write lock up front (`BEGIN IMMEDIATE`) and wait for other
//!   processes through a busy timeout rather than failing.
//! - Reads run on a small pool of read-only connections (`readers.rs`).
//! - Rows are encoded and decoded by `countersign_store::rows`, as for every backend;
//!   what is SQLite's is the SQL and the parameter binding.

pub mod backup;
mod docs;
mod error;
mod events;
mod log;
mod readers;
mod recent;
mod requests;
mod schema;
mod tokens;
mod watch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use std::collections::BTreeMap;

use countersign_core::merkle::{Hash, NodeId};
use countersign_core::{
    ApprovalRequest, PayloadOpening, SealedEvent, SealedTransition, Status, Timestamp, TokenRecord,
};
use countersign_store::rows::{DocRow, EventRow, RequestRow, TokenRow, TransitionRow};
use countersign_store::{
    Created, Doc, RequestQuery, SignedIntegration, Store, StoreError, StoredCheckpoint, StoredEvent,
};

use crate::error::db_err;
use crate::readers::Readers;
use crate::requests::Inserted;
use crate::writer::Writer;

pub use crate::schema::SCHEMA_VERSION;
pub use crate::writer::WriterStats;

/// How to open the database. The defaults suit every deployment we know of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// How long a write waits for another process's write lock before failing with
    /// [`StoreError::Unavailable`].
    pub busy_timeout: Duration,
    /// Read-only connections in the pool.
    pub readers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            readers: 4,
        }
    }
}

/// The connection settings in force on the write connection, as SQLite reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pragmas {
    pub journal_mode: String,
    /// 0 = OFF, 1 = NORMAL, 2 = FULL, 3 = EXTRA.
    pub synchronous: i64,
    pub foreign_keys: bool,
    pub busy_timeout_ms: i64,
    pub schema_version: i64,
}

/// The SQLite store. Cheap to share behind an `Arc`; dropping the last handle stops the
/// writer thread once its queued writes are done.
pub struct SqliteStore {
    path: PathBuf,
    writer: Writer,
    readers: Arc<Readers>,
    /// Set by [`Store::listen`]: wakes the change feed when another process commits.
    watch: std::sync::Mutex<Option<watch::DbWatch>>,
    /// The events this process committed last, for its change feed.
    recent: Arc<recent::Recent>,
    /// What this store's writer writes to the poke file (watch.rs).
    token: watch::Token,
}

impl SqliteStore {
    /// Opens (creating if needed, with its parent directories) the database at `path`
    /// and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, &Options::default())
    }

    pub fn open_with(path: &Path, options: &Options) -> Result<Self, StoreError> {
        schema::create_file(path)?;
        let conn = schema::open_writer(path, options.busy_timeout)?;
        let readers = Readers::open(path.to_path_buf(), options.readers, options.busy_timeout)?;
        let recent = Arc::new(recent::Recent::default());
        let token = watch::new_token();
        let writer = Writer::start(conn, path, recent.clone(), token)?;
        Ok(Self {
            path: path.to_path_buf(),
            writer,
            readers,
            recent,
            token,
            watch: std::sync::Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many transactions the writer ran and how many jobs they carried.
    pub fn writer_stats(&self) -> WriterStats {
        self.writer.stats()
    }

    /// The settings of the write connection, for `doctor` output and tests.
    pub async fn pragmas(&self) -> Result<Pragmas, StoreError> {
        self.writer
            .submit(|conn| {
                let int = |name: &str| {
                    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
                        .map_err(db_err("read the connection settings"))
                };
                Ok(Pragmas {
                    journal_mode: conn
                        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                        .map_err(db_err("read the connection settings"))?,
                    synchronous: int("synchronous")?,
                    foreign_keys: int("foreign_keys")? == 1,
                    busy_timeout_ms: int("busy_timeout")?,
                    schema_version: int("user_version")?,
                })
            })
            .await
    }
}

/// Pages of at most this many events are read like point reads ([`Readers::read_now`]):
/// the change feed's pages, which are this size.
const SHORT_READ_EVENTS: usize = 1000;

#[async_trait]
impl Store for SqliteStore {
    async fn create_request(&self, transition: &SealedTransition) -> Result<Created, StoreError> {
        let row = TransitionRow::of(transition)?;
        match self
            .writer
            .submit(move |conn| requests::insert(conn, &row))
            .await?
        {
            Inserted::New => Ok(Created::New(transition.request.clone())),
            Inserted::Existing(existing) => Ok(Created::Existing(*existing)),
        }
    }

    async fn create_decided(
        &self,
        created: &SealedTransition,
        then: &[SealedTransition],
    ) -> Result<Created, StoreError> {
        let created_event = EventRow::of(&created.event)?;
        let (id, version) = (created.request.id.to_string(), created.request.version);
        let rows = then
            .iter()
            .map(TransitionRow::of)
            .collect::<Result<Vec<_>, _>>()?;
        let Some(last) = then.last() else {
            return self.create_request(created).await;
        };
        let stored = last.request.clone();
        // One job, so one commit: every event or none. The row goes in once, as it
        // ends, rather than inserted as created and then updated.
        match self
            .writer
            .submit(move |conn| {
                requests::insert_decided(conn, (&id, version, &created_event), &rows)
            })
            .await?
        {
            Inserted::New => Ok(Created::New(stored)),
            Inserted::Existing(existing) => Ok(Created::Existing(*existing)),
        }
    }

    async fn get_request(&self, id: &str) -> Result<Option<ApprovalRequest>, StoreError> {
        let id = id.to_string();
        self.readers
            .read_now(move |conn| requests::get(conn, &id))
            .await
    }

    async fn apply(&self, transition: &SealedTransition) -> Result<(), StoreError> {
        let row = TransitionRow::of(transition)?;
        self.writer
            .submit(move |conn| requests::apply(conn, &row))
            .await
    }

    async fn append_event(&self, event: &SealedEvent) -> Result<u64, StoreError> {
        let row = EventRow::of(event)?;
        self.writer
            .submit(move |conn| events::append(conn, &row))
            .await
    }

    async fn list_requests(
        &self,
        query: &RequestQuery,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let query = query.clone();
        self.readers
            .run(move |conn| requests::list(conn, &query))
            .await
    }

    async fn due_for_expiry(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.readers
            .run(move |conn| requests::due_for_expiry(conn, now, limit))
            .await
    }

    async fn next_expiry(&self) -> Result<Option<Timestamp>, StoreError> {
        self.readers.read_now(requests::next_expiry).await
    }

    async fn count_requests(&self, status: Status) -> Result<u64, StoreError> {
        self.readers
            .read_now(move |conn| requests::count(conn, status))
            .await
    }

    async fn create_token(
        &self,
        token: &TokenRecord,
        event: &SealedEvent,
    ) -> Result<(), StoreError> {
        let token = TokenRow::of(token);
        let event = EventRow::of(event)?;
        self.writer
            .submit(move |conn| tokens::insert(conn, &token, &event))
            .await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError> {
        let hash = hash.to_string();
        self.readers
            .read_now(move |conn| tokens::by_hash(conn, &hash))
            .await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.readers.run(tokens::list).await
    }

    async fn revoke_token(
        &self,
        id: &str,
        at: Timestamp,
        event: &SealedEvent,
    ) -> Result<TokenRecord, StoreError> {
        let id = id.to_string();
        let event = EventRow::of(event)?;
        self.writer
            .submit(move |conn| tokens::revoke(conn, &id, at, &event))
            .await
    }

    async fn follow_events(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<countersign_store::Followed, StoreError> {
        // This process's own last commits, without reading them back (recent.rs).
        let mut ours = self.recent.after(after, limit);
        if ours.is_empty() && self.recent.settled().await {
            // A commit was landing: its events may be visible already, and here now.
            ours = self.recent.after(after, limit);
        }
        if !ours.is_empty() {
            return Ok(countersign_store::Followed {
                events: ours,
                read: false,
            });
        }
        self.recent.reading();
        Ok(countersign_store::Followed {
            events: self.events_after(after, limit).await?,
            read: true,
        })
    }

    fn changed_elsewhere(&self) -> bool {
        self.recent.changed_elsewhere()
    }

    async fn events_after(&self, after: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        let read = move |conn: &rusqlite::Connection| events::after(conn, after, limit);
        // The change feed's pages (usually a few new events) are short reads; a caller
        // paging through the whole log is not.
        if limit <= SHORT_READ_EVENTS {
            self.readers.read_now(read).await
        } else {
            self.readers.run(read).await
        }
    }

    async fn events_of_subject(&self, subject: &str) -> Result<Vec<StoredEvent>, StoreError> {
        let subject = subject.to_string();
        self.readers
            .run(move |conn| events::of_subject(conn, &subject))
            .await
    }

    async fn events_of_subject_after(
        &self,
        subject: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let subject = subject.to_string();
        let read = move |conn: &rusqlite::Connection| {
            events::of_subject_after(conn, &subject, after, limit)
        };
        if limit <= SHORT_READ_EVENTS {
            self.readers.read_now(read).await
        } else {
            self.readers.run(read).await
        }
    }

    async fn events_of_subject_before(
        &self,
        subject: &str,
        before: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let subject = subject.to_string();
        self.readers
            .run(move |conn| events::of_subject_before(conn, &subject, before, limit))
            .await
    }

    async fn requests_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<countersign_store::RawRequest>, StoreError> {
        let after = after.to_string();
        self.readers
            .run(move |conn| requests::after(conn, &after, limit))
            .await
    }

    async fn payloads_between(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<countersign_store::RawPayload>, StoreError> {
        self.readers
            .run(move |conn| events::payloads_between(conn, from, to))
            .await
    }

    async fn payloads(&self, seqs: &[u64]) -> Result<BTreeMap<u64, PayloadOpening>, StoreError> {
        let seqs = seqs.to_vec();
        self.readers
            .run(move |conn| events::payloads(conn, &seqs))
            .await
    }

    async fn erase_payloads(&self, seqs: &[u64]) -> Result<u64, StoreError> {
        let seqs = seqs.to_vec();
        self.writer
            .submit(move |conn| events::erase_payloads(conn, &seqs))
            .await
    }

    async fn last_event_seq(&self) -> Result<u64, StoreError> {
        self.readers.read_now(events::last_seq).await
    }

    async fn log_origin(&self, origin: &str) -> Result<String, StoreError> {
        let proposed = origin.to_string();
        // Read first: once set, the origin never changes, and reads need no write lock.
        if let Some(existing) = self
            .readers
            .read_now(|conn| log::meta(conn, "origin"))
            .await?
        {
            return Ok(existing);
        }
        self.writer
            .submit(move |conn| log::origin(conn, &proposed))
            .await
    }

    async fn integrated_size(&self) -> Result<u64, StoreError> {
        self.readers.read_now(log::integrated_size).await
    }

    async fn integrate(
        &self,
        from: u64,
        to: u64,
        nodes: &[(NodeId, Hash)],
    ) -> Result<bool, StoreError> {
        let nodes = nodes.to_vec();
        self.writer
            .submit(move |conn| log::integrate(conn, from, to, &nodes))
            .await
    }

    async fn integrate_signed(&self, signed: SignedIntegration<'_>) -> Result<bool, StoreError> {
        let (from, to) = (signed.from, signed.to);
        let nodes = signed.nodes.to_vec();
        let checkpoint = signed.checkpoint.clone();
        // One job, so one commit: the nodes, the size and the checkpoint, or nothing.
        self.writer
            .submit(move |conn| {
                if !log::integrate(conn, from, to, &nodes)? {
                    return Ok(false);
                }
                log::add_checkpoint(conn, &checkpoint)?;
                Ok(true)
            })
            .await
    }

    async fn log_nodes(&self, ids: &[NodeId]) -> Result<BTreeMap<NodeId, Hash>, StoreError> {
        let ids = ids.to_vec();
        self.readers
            .read_now(move |conn| log::nodes(conn, &ids))
            .await
    }

    async fn add_checkpoint(&self, checkpoint: &StoredCheckpoint) -> Result<(), StoreError> {
        let checkpoint = checkpoint.clone();
        self.writer
            .submit(move |conn| log::add_checkpoint(conn, &checkpoint))
            .await
    }

    async fn checkpoint(&self, size: Option<u64>) -> Result<Option<StoredCheckpoint>, StoreError> {
        self.readers
            .read_now(move |conn| log::checkpoint(conn, size))
            .await
    }

    async fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, StoreError> {
        self.readers.run(log::checkpoints).await
    }

    async fn doc_get(&self, kind: &str, id: &str) -> Result<Option<Doc>, StoreError> {
        let (kind, id) = (kind.to_string(), id.to_string());
        self.readers
            .read_now(move |conn| docs::get(conn, &kind, &id))
            .await
    }

    async fn doc_by_key(&self, kind: &str, key: &str) -> Result<Option<Doc>, StoreError> {
        let (kind, key) = (kind.to_string(), key.to_string());
        self.readers
            .read_now(move |conn| docs::by_key(conn, &kind, &key))
            .await
    }

    async fn doc_list(
        &self,
        kind: &str,
        id_prefix: &str,
        limit: usize,
    ) -> Result<Vec<Doc>, StoreError> {
        let (kind, prefix) = (kind.to_string(), id_prefix.to_string());
        self.readers
            .run(move |conn| docs::list(conn, &kind, &prefix, limit))
            .await
    }

    async fn doc_count(&self, kind: &str) -> Result<u64, StoreError> {
        let kind = kind.to_string();
        self.readers
            .read_now(move |conn| docs::count(conn, &kind))
            .await
    }

    async fn doc_list_recent(&self, kind: &str, limit: usize) -> Result<Vec<Doc>, StoreError> {
        let kind = kind.to_string();
        self.readers
            .run(move |conn| docs::list_recent(conn, &kind, limit))
            .await
    }

    async fn doc_insert(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<(), StoreError> {
        let row = DocRow::of(doc)?;
        let event = event.map(EventRow::of).transpose()?;
        self.writer
            .submit(move |conn| docs::insert(conn, &row, event.as_ref()))
            .await
    }

    async fn doc_update(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<(), StoreError> {
        let row = DocRow::of(doc)?;
        let event = event.map(EventRow::of).transpose()?;
        self.writer
            .submit(move |conn| docs::update(conn, &row, event.as_ref()))
            .await
    }

    async fn doc_delete(&self, kind: &str, id: &str) -> Result<bool, StoreError> {
        let (kind, id) = (kind.to_string(), id.to_string());
        self.writer
            .submit(move |conn| docs::delete(conn, &kind, &id))
            .await
    }

    async fn doc_delete_prefix(&self, kind: &str, id_prefix: &str) -> Result<u64, StoreError> {
        let (kind, prefix) = (kind.to_string(), id_prefix.to_string());
        self.writer
            .submit(move |conn| docs::delete_prefix(conn, &kind, &prefix))
            .await
    }

    async fn meta_set_once(&self, key: &str, value: &str) -> Result<String, StoreError> {
        let (key, value) = (key.to_string(), value.to_string());
        self.writer
            .submit(move |conn| docs::meta_set_once(conn, &key, &value))
            .await
    }

    async fn meta_list(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = prefix.to_string();
        self.readers
            .run(move |conn| docs::meta_list(conn, &prefix))
            .await
    }

    async fn import_request(&self, request: &ApprovalRequest) -> Result<(), StoreError> {
        let row = RequestRow::of(request)?;
        self.writer
            .submit(move |conn| requests::import(conn, &row))
            .await
    }

    async fn import_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        let row = TokenRow::of(token);
        self.writer
            .submit(move |conn| tokens::import(conn, &row))
            .await
    }

    async fn check(&self) -> Result<(), StoreError> {
        let path = self.path.display().to_string();
        // SQLite keeps working on a file deleted under it, silently losing everything
        // written from then on; say so instead.
        if let Err(err) = std::fs::metadata(&self.path) {
            return Err(StoreError::Unavailable(format!(
                "the database file {path} is gone: {err}"
            )));
        }
        if !self.writer.is_running() {
            return Err(self.writer.stopped());
        }
        self.readers
            .run(|conn| {
                conn.query_row("SELECT max(seq) FROM events", [], |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .map_err(db_err("read from the database"))
            })
            .await
            .map_err(|e| StoreError::Unavailable(format!("{path} cannot be read: {e}")))?;
        // A job takes the write lock (BEGIN IMMEDIATE) and commits: the writer is alive
        // and no other process holds the lock for longer than the busy timeout.
        self.writer
            .submit(|conn| {
                conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
                    .map_err(db_err("write to the database"))
            })
            .await
            .map_err(|e| StoreError::Unavailable(format!("{path} cannot be written: {e}")))?;
        Ok(())
    }

    /// Watches the database's files, so a commit by another process (a stdio `mcp`
    /// beside `serve`) wakes the change feed at once instead of at its next poll. If the
    /// platform cannot watch files, the feed's poll is all there is: logged, not fatal.
    async fn listen(&self, on_change: countersign_store::ChangeCallback) -> Result<(), StoreError> {
        match watch::start(&self.path, self.token, self.recent.clone(), on_change) {
            Ok(w) => {
                if let Ok(mut slot) = self.watch.lock() {
                    *slot = Some(w);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "changes by other processes are seen at the next poll")
            }
        }
        Ok(())
    }
}
