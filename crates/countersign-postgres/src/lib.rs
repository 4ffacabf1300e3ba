//! countersign's PostgreSQL storage: several countersign instances, one database, one
//! gap-free event log.
//!
//! - Appends are serialized across all instances by a row lock on the one-row
//!   `log_head` table, taken first by every transaction that appends, so sequence
//!   numbers are gap-free and in commit order (`writer.rs`).
//! - Each instance's writer batches the writes queued meanwhile into one transaction,
//!   so a commit (a WAL flush; `synchronous_commit` stays `on`) is shared by many.
//! - Every appending transaction sends `NOTIFY countersign_events`; [`Store::listen`]
//!   keeps a connection that `LISTEN`s and pokes the change feed, so an agent waiting
//!   on one instance wakes when another instance records the decision (`listener.rs`).
//! - Migrations run on connect under an advisory lock, so instances may start together
//!   (`schema.rs`).
//! - Reads and log integration use a pool of connections (deadpool-postgres,
//!   `pool.rs`), and so do the writes that append no event: document writes without
//!   one, settings, imports (`docs.rs`). A document write with an event goes through
//!   the writer.
//! - The rows themselves are encoded and decoded by `countersign_store::rows`, as for
//!   every backend; what is PostgreSQL's is the SQL and the parameter order
//!   (`params.rs`).
//! - `check` explains in words what keeps the store from working (`health.rs`).
//!
//! # The database URL
//!
//! `postgres://user:password@host:port/database?param=value&...` (or `postgresql://`),
//! or libpq's `key=value` form. Parameters: `user`, `password`, `dbname`, `host` (a
//! directory for a Unix socket, e.g. `host=/var/run/postgresql`; several hosts
//! separated by commas are tried in turn), `hostaddr`, `port`, `options` (server
//! settings such as `-c statement_timeout=5000`), `application_name` (default
//! `countersign`), `connect_timeout` (seconds; default [`Options::connect_timeout`]),
//! `keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_retries`,
//! `tcp_user_timeout`, `target_session_attrs` (`read-write` makes a client with several
//! hosts pick the primary), `load_balance_hosts` and `channel_binding`.
//!
//! TLS is not built in: `sslmode=disable` or `prefer` connect in plain text, and
//! `sslmode=require` is refused at connect. Run PostgreSQL on a private network or the
//! same host, or add a TLS connector (see `connection.rs`).

mod config;
mod connection;
mod docs;
mod error;
mod events;
mod health;
mod listener;
mod log;
mod params;
mod pool;
mod requests;
mod schema;
mod tokens;
mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use countersign_core::merkle::{Hash, NodeId};
use countersign_core::{
    ApprovalRequest, PayloadOpening, SealedEvent, SealedTransition, Status, Timestamp, TokenRecord,
};
use countersign_store::rows::{
    EventRow, RequestRow, TokenRow, TransitionRow, decode_integrated_size, to_sql_int,
};
use countersign_store::{
    ChangeCallback, Created, Doc, RequestQuery, SignedIntegration, Store, StoreError,
    StoredCheckpoint, StoredEvent,
};
use tokio_postgres::types::ToSql;

use crate::config::Target;
use crate::docs::{DocOp, DocWrite};
use crate::error::db_err;
use crate::listener::Listeners;
use crate::params::Params;
use crate::pool::Pooled;
use crate::requests::Inserted;
use crate::tokens::{NewToken, Revocation};
use crate::writer::{Outcome, Write, Writer};

/// What every store operation returns.
type Result<T, E = StoreError> = std::result::Result<T, E>;

pub use crate::config::Options;
pub use crate::health::ServerInfo;
pub use crate::schema::SCHEMA_VERSION;
pub use crate::writer::WriterStats;

/// The PostgreSQL store. Share it behind an `Arc`; dropping it stops its listeners at
/// once and its writer once the queued writes are done.
pub struct PostgresStore {
    target: Arc<Target>,
    pool: Pooled,
    writer: Writer,
    listeners: Listeners,
}

impl PostgresStore {
    /// Connects to the database at `url` and brings its schema up to date.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &Options::default()).await
    }

    pub async fn connect_with(url: &str, options: &Options) -> Result<Self> {
        let store = Self::connect_lazy(url, options)?;
        schema::migrate(&store.target).await?;
        Ok(store)
    }

    /// A store that has not touched the database yet: it connects on first use and
    /// runs no migrations (see [`migrate`](Self::migrate)). For health checks of a
    /// database that may be down, and for instances that should start (and report
    /// themselves unhealthy) while it is. Fails only for a malformed URL or options.
    /// Must be called within a tokio runtime.
    pub fn connect_lazy(url: &str, options: &Options) -> Result<Self> {
        // The writer is a task: without a runtime, spawning it would panic.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError::Backend(
                "the PostgreSQL store must be opened within a tokio runtime".into(),
            ));
        }
        let target = Arc::new(Target::new(url, options)?);
        let pool = Pooled::new(target.clone(), options)?;
        let writer = Writer::start((*target).clone());
        Ok(Self {
            target,
            pool,
            writer,
            listeners: Listeners::default(),
        })
    }

    /// Brings the schema up to date (what [`connect`](Self::connect) does); returns
    /// the schema version.
    pub async fn migrate(&self) -> Result<i32> {
        schema::migrate(&self.target).await
    }

    /// The server, without the password: `host:port/database as user`.
    pub fn target(&self) -> &str {
        &self.target.name
    }

    /// How many transactions the writer ran and how many writes they carried.
    pub fn writer_stats(&self) -> WriterStats {
        self.writer.stats()
    }

    async fn write(&self, write: Write) -> Result<Outcome> {
        self.writer.submit(write).await
    }

    /// A document write: through the writer with its event, otherwise on its own.
    async fn write_doc(&self, write: DocWrite) -> Result<()> {
        if write.has_event() {
            return match self.write(Write::Doc(write)).await? {
                Outcome::DocWritten => Ok(()),
                _ => Err(unexpected("a document write")),
            };
        }
        let op = write.what();
        let client = self.pool.client(op).await?;
        let statement = client
            .prepare_cached(&write.sql())
            .await
            .map_err(db_err(op))?;
        let rows = client
            .query(&statement, &write.params())
            .await
            .map_err(|e| write.error(&e))?;
        write.result(&rows)
    }

    /// The setting `key`, set to `value` first if it has none. The first proposal to
    /// commit wins: a racing insert waits for it and then does nothing, and the read
    /// that follows (a statement of its own, so with a newer snapshot) sees the winner.
    async fn set_once(&self, key: &str, value: &str) -> Result<String> {
        let op = "read a log setting";
        // Read first: once set, the value never changes.
        let rows = self.pool.query(op, log::META, &[&key]).await?;
        if let Some(existing) = log::decode_meta(&rows)? {
            return Ok(existing);
        }
        self.pool
            .execute("write a log setting", log::PROPOSE_META, &[&key, &value])
            .await?;
        let rows = self.pool.query(op, log::META, &[&key]).await?;
        log::decode_meta(&rows)?
            .ok_or_else(|| StoreError::Backend(format!("{op}: {key} is missing after being set")))
    }
}

pub(crate) fn unexpected(op: &str) -> StoreError {
    StoreError::Backend(format!("internal error: {op} got another write's result"))
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_request(&self, transition: &SealedTransition) -> Result<Created> {
        let row = TransitionRow::of(transition)?;
        match self.write(Write::CreateRequest(row)).await? {
            Outcome::Created(Inserted::New) => Ok(Created::New(transition.request.clone())),
            Outcome::Created(Inserted::Existing(existing)) => Ok(Created::Existing(*existing)),
            _ => Err(unexpected("create_request")),
        }
    }

    async fn create_decided(
        &self,
        created: &SealedTransition,
        then: &[SealedTransition],
    ) -> Result<Created> {
        let Some(last) = then.last() else {
            return self.create_request(created).await;
        };
        let write = Write::CreateDecided(
            TransitionRow::of(created)?,
            then.iter()
                .map(TransitionRow::of)
                .collect::<Result<Vec<_>>>()?,
        );
        match self.write(write).await? {
            Outcome::CreatedDecided => Ok(Created::New(last.request.clone())),
            Outcome::Created(Inserted::Existing(existing)) => Ok(Created::Existing(*existing)),
            _ => Err(unexpected("create_decided")),
        }
    }

    async fn get_request(&self, id: &str) -> Result<Option<ApprovalRequest>> {
        let rows = self
            .pool
            .query("read a request", requests::GET, &[&id])
            .await?;
        Ok(requests::decode_bodies(&rows)?.into_iter().next())
    }

    async fn apply(&self, transition: &SealedTransition) -> Result<()> {
        let row = TransitionRow::of(transition)?;
        match self.write(Write::Apply(row)).await? {
            Outcome::Applied => Ok(()),
            _ => Err(unexpected("apply")),
        }
    }

    async fn append_event(&self, event: &SealedEvent) -> Result<u64> {
        match self.write(Write::AppendEvent(EventRow::of(event)?)).await? {
            Outcome::Appended(seq) => Ok(seq),
            _ => Err(unexpected("append_event")),
        }
    }

    async fn list_requests(&self, query: &RequestQuery) -> Result<Vec<ApprovalRequest>> {
        let (sql, params) = requests::list_query(query);
        let params: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect();
        let rows = self.pool.query("list requests", &sql, &params).await?;
        requests::decode_bodies(&rows)
    }

    async fn due_for_expiry(&self, now: Timestamp, limit: usize) -> Result<Vec<ApprovalRequest>> {
        let (now, limit) = requests::due_params(now, limit);
        let rows = self
            .pool
            .query(
                "find requests due for expiry",
                requests::DUE_FOR_EXPIRY,
                &[&now, &limit],
            )
            .await?;
        requests::decode_bodies(&rows)
    }

    async fn next_expiry(&self) -> Result<Option<Timestamp>> {
        let row = self
            .pool
            .query_one("find the next expiry", requests::NEXT_EXPIRY, &[])
            .await?;
        requests::decode_next_expiry(&row)
    }

    async fn count_requests(&self, status: Status) -> Result<u64> {
        let row = self
            .pool
            .query_one("count requests", requests::COUNT, &[&status.as_str()])
            .await?;
        decode_count(&row)
    }

    async fn create_token(&self, token: &TokenRecord, event: &SealedEvent) -> Result<()> {
        let new = NewToken::of(token, EventRow::of(event)?);
        match self.write(Write::CreateToken(new)).await? {
            Outcome::TokenCreated => Ok(()),
            _ => Err(unexpected("create_token")),
        }
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let rows = self
            .pool
            .query("read a token", &tokens::by_hash_sql(), &[&hash])
            .await?;
        Ok(tokens::decode_tokens(&rows)?.into_iter().next())
    }

    async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let rows = self
            .pool
            .query("list tokens", &tokens::list_sql(), &[])
            .await?;
        tokens::decode_tokens(&rows)
    }

    async fn revoke_token(
        &self,
        id: &str,
        at: Timestamp,
        event: &SealedEvent,
    ) -> Result<TokenRecord> {
        let revocation = Revocation::new(id, at, EventRow::of(event)?);
        match self.write(Write::RevokeToken(revocation)).await? {
            Outcome::Revoked(token) => Ok(token),
            _ => Err(unexpected("revoke_token")),
        }
    }

    async fn events_after(&self, after: u64, limit: usize) -> Result<Vec<StoredEvent>> {
        let (after, limit) = events::after_params(after, limit);
        let rows = self
            .pool
            .query("read events", events::AFTER, &[&after, &limit])
            .await?;
        events::decode_events(&rows)
    }

    async fn events_of_subject(&self, subject: &str) -> Result<Vec<StoredEvent>> {
        let rows = self
            .pool
            .query("read a subject's events", events::OF_SUBJECT, &[&subject])
            .await?;
        events::decode_events(&rows)
    }

    async fn events_of_subject_after(
        &self,
        subject: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        let (after, limit) = events::after_params(after, limit);
        let rows = self
            .pool
            .query(
                "read a subject's events",
                events::OF_SUBJECT_AFTER,
                &[&subject, &after, &limit],
            )
            .await?;
        events::decode_events(&rows)
    }

    async fn events_of_subject_before(
        &self,
        subject: &str,
        before: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>> {
        let (before, limit) = events::after_params(before, limit);
        let rows = self
            .pool
            .query(
                "read a subject's events",
                events::OF_SUBJECT_BEFORE,
                &[&subject, &before, &limit],
            )
            .await?;
        let mut events = events::decode_events(&rows)?;
        events.reverse();
        Ok(events)
    }

    async fn requests_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<countersign_store::RawRequest>> {
        let limit = countersign_store::rows::to_sql_int(limit);
        let rows = self
            .pool
            .query("read requests", requests::AFTER, &[&after, &limit])
            .await?;
        requests::decode_raw(&rows)
    }

    async fn payloads_between(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Vec<countersign_store::RawPayload>> {
        let (from, to) = (
            countersign_store::rows::to_sql_int(from),
            countersign_store::rows::to_sql_int(to),
        );
        let rows = self
            .pool
            .query("read payloads", events::PAYLOADS_BETWEEN, &[&from, &to])
            .await?;
        events::decode_raw_payloads(&rows)
    }

    async fn payloads(&self, seqs: &[u64]) -> Result<BTreeMap<u64, PayloadOpening>> {
        let wanted = events::payload_seqs(seqs);
        if wanted.is_empty() {
            return Ok(BTreeMap::new());
        }
        let rows = self
            .pool
            .query("read payloads", events::PAYLOADS, &[&wanted])
            .await?;
        events::decode_payloads(&rows)
    }

    async fn erase_payloads(&self, seqs: &[u64]) -> Result<u64> {
        let wanted = events::payload_seqs(seqs);
        if wanted.is_empty() {
            return Ok(0);
        }
        self.pool
            .execute(
                "erase payloads",
                "DELETE FROM payloads WHERE seq = ANY($1::bigint[])",
                &[&wanted],
            )
            .await
    }

    async fn last_event_seq(&self) -> Result<u64> {
        let row = self
            .pool
            .query_one("read the last event number", events::LAST_SEQ, &[])
            .await?;
        events::decode_last_seq(&row)
    }

    async fn log_origin(&self, origin: &str) -> Result<String> {
        self.set_once("origin", origin).await
    }

    async fn integrated_size(&self) -> Result<u64> {
        let rows = self
            .pool
            .query(
                "read the integrated log size",
                log::META,
                &[&"integrated_size"],
            )
            .await?;
        decode_integrated_size(log::decode_meta(&rows)?)
    }

    async fn integrate(&self, from: u64, to: u64, nodes: &[(NodeId, Hash)]) -> Result<bool> {
        let mut client = self.pool.client("integrate log entries").await?;
        log::integrate(&mut client, from, to, nodes, None).await
    }

    async fn integrate_signed(&self, signed: SignedIntegration<'_>) -> Result<bool> {
        let mut client = self.pool.client("integrate log entries").await?;
        let SignedIntegration {
            from,
            to,
            nodes,
            checkpoint,
        } = signed;
        log::integrate(&mut client, from, to, nodes, Some(checkpoint)).await
    }

    async fn log_nodes(&self, ids: &[NodeId]) -> Result<BTreeMap<NodeId, Hash>> {
        if ids.is_empty() {
            return Ok(BTreeMap::new());
        }
        let (wanted, levels, indexes) = log::node_params(ids);
        let rows = self
            .pool
            .query("read Merkle nodes", log::NODES, &[&levels, &indexes])
            .await?;
        log::decode_nodes(&wanted, &rows)
    }

    async fn add_checkpoint(&self, checkpoint: &StoredCheckpoint) -> Result<()> {
        let size = to_sql_int(checkpoint.size);
        let at = checkpoint.created_at.millis();
        self.pool
            .query(
                "store a checkpoint",
                log::ADD_CHECKPOINT,
                &[&size, &checkpoint.note, &at],
            )
            .await?;
        Ok(())
    }

    async fn checkpoint(&self, size: Option<u64>) -> Result<Option<StoredCheckpoint>> {
        let op = "read a checkpoint";
        let rows = match size {
            Some(size) => {
                self.pool
                    .query(op, log::CHECKPOINT_OF_SIZE, &[&to_sql_int(size)])
                    .await?
            }
            None => self.pool.query(op, log::LATEST_CHECKPOINT, &[]).await?,
        };
        Ok(log::decode_checkpoints(&rows)?.into_iter().next())
    }

    async fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>> {
        let rows = self
            .pool
            .query("read checkpoints", log::CHECKPOINTS, &[])
            .await?;
        log::decode_checkpoints(&rows)
    }

    async fn doc_get(&self, kind: &str, id: &str) -> Result<Option<Doc>> {
        let rows = self
            .pool
            .query("read a document", &docs::get_sql(), &[&kind, &id])
            .await?;
        Ok(docs::decode_docs(&rows)?.into_iter().next())
    }

    async fn doc_by_key(&self, kind: &str, key: &str) -> Result<Option<Doc>> {
        let rows = self
            .pool
            .query("look up a document", &docs::by_key_sql(), &[&kind, &key])
            .await?;
        Ok(docs::decode_docs(&rows)?.into_iter().next())
    }

    async fn doc_count(&self, kind: &str) -> Result<u64> {
        let row = self
            .pool
            .query_one("count documents", docs::COUNT, &[&kind])
            .await?;
        decode_count(&row)
    }

    async fn doc_list(&self, kind: &str, id_prefix: &str, limit: usize) -> Result<Vec<Doc>> {
        let op = "list documents";
        let limit = to_sql_int(limit);
        let rows = match docs::prefix_end(id_prefix) {
            Some(end) => {
                self.pool
                    .query(
                        op,
                        &docs::list_range_sql(),
                        &[&kind, &id_prefix, &end, &limit],
                    )
                    .await?
            }
            None => {
                self.pool
                    .query(op, &docs::list_open_sql(), &[&kind, &id_prefix, &limit])
                    .await?
            }
        };
        docs::decode_docs(&rows)
    }

    async fn doc_list_recent(&self, kind: &str, limit: usize) -> Result<Vec<Doc>> {
        let limit = to_sql_int(limit);
        let rows = self
            .pool
            .query(
                "list recent documents",
                &docs::list_recent_sql(),
                &[&kind, &limit],
            )
            .await?;
        docs::decode_docs(&rows)
    }

    async fn doc_insert(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<()> {
        self.write_doc(DocWrite::new(DocOp::Insert, doc, event)?)
            .await
    }

    async fn doc_update(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<()> {
        self.write_doc(DocWrite::new(DocOp::Update, doc, event)?)
            .await
    }

    async fn doc_delete(&self, kind: &str, id: &str) -> Result<bool> {
        let deleted = self
            .pool
            .execute("delete a document", docs::DELETE, &[&kind, &id])
            .await?;
        Ok(deleted > 0)
    }

    async fn doc_delete_prefix(&self, kind: &str, id_prefix: &str) -> Result<u64> {
        let op = "delete documents";
        if id_prefix.is_empty() {
            return Ok(0);
        }
        match docs::prefix_end(id_prefix) {
            Some(end) => {
                self.pool
                    .execute(op, docs::DELETE_RANGE, &[&kind, &id_prefix, &end])
                    .await
            }
            None => {
                self.pool
                    .execute(op, docs::DELETE_OPEN, &[&kind, &id_prefix])
                    .await
            }
        }
    }

    async fn meta_set_once(&self, key: &str, value: &str) -> Result<String> {
        self.set_once(key, value).await
    }

    async fn meta_list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let rows = self
            .pool
            .query("read settings", docs::META_PREFIX, &[&prefix])
            .await?;
        docs::decode_meta_list(&rows)
    }

    async fn import_request(&self, request: &ApprovalRequest) -> Result<()> {
        let row = RequestRow::of(request)?;
        self.pool
            .insert_new("import a request", requests::IMPORT, &row.params(), || {
                format!("request {}", row.id)
            })
            .await
    }

    async fn import_token(&self, token: &TokenRecord) -> Result<()> {
        let row = TokenRow::of(token);
        let name_key = row.name_key();
        let mut params = row.params();
        params.push(&name_key);
        self.pool
            .insert_new("import a token", &tokens::import_sql(), &params, || {
                format!("token {} (or its hash)", row.id)
            })
            .await
    }

    async fn check(&self) -> Result<()> {
        self.health().await
    }

    async fn listen(&self, on_change: ChangeCallback) -> Result<()> {
        self.listeners.start(self.target.clone(), on_change).await;
        Ok(())
    }
}

/// A `count(*)`, which PostgreSQL answers as a bigint.
fn decode_count(row: &tokio_postgres::Row) -> Result<u64> {
    let n: i64 = row.try_get(0).map_err(error::column_err("a count"))?;
    Ok(n.unsigned_abs())
}
