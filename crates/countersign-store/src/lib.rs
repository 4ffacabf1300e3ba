//! The `Store` trait: everything countersign keeps, behind one interface that every
//! backend (embedded SQLite, PostgreSQL) implements and passes one test suite against.
//!
//! The store knows nothing of the rules: the domain (`countersign-core`) computes each
//! transition, and the store applies it atomically with a compare-and-swap on the
//! request's version, writing the transition's event in the same transaction. Events get
//! a gap-free, increasing sequence number; the change feed and the transparency log are
//! built on that order.

pub mod audit;
pub mod batch;
mod collection;
mod error;
mod feed;
pub mod rows;
#[cfg(feature = "testsuite")]
pub mod testsuite;

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::merkle::{Hash, NodeId};
use countersign_core::{
    ApprovalRequest, LogEntry, PayloadOpening, SealedEvent, SealedTransition, Status, Timestamp,
    TokenRecord,
};

pub use collection::{CAS_TRIES, Collection, Docs, Step, Stored, kinds};
pub use error::StoreError;
pub use feed::{ChangeFeed, Watch};

/// The result of inserting a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The request is new and stored.
    New(ApprovalRequest),
    /// A request with the same requester and idempotency key already exists; nothing
    /// was written. The caller decides whether the retry matches.
    Existing(ApprovalRequest),
}

/// Which requests to list, newest first: by `requested_at`, then by id, both descending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestQuery {
    pub status: Option<Status>,
    pub requested_by: Option<String>,
    pub limit: usize,
}

impl Default for RequestQuery {
    fn default() -> Self {
        Self {
            status: None,
            requested_by: None,
            limit: 100,
        }
    }
}

/// An event as stored: its position in the sequence, its log entry and the entry's
/// exact bytes (the Merkle leaf). Log index = `seq - 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// 1-based, gap-free and increasing in commit order.
    pub seq: u64,
    pub entry: LogEntry,
    pub bytes: Vec<u8>,
}

/// An answer of [`Store::follow_events`].
#[derive(Debug, Clone)]
pub struct Followed {
    pub events: Vec<StoredEvent>,
    /// Read from the database (rather than this process's own last commits).
    pub read: bool,
}

impl Followed {
    /// Whether the caller has caught up: read from the database, and a short page.
    pub fn caught_up(&self, limit: usize) -> bool {
        self.read && self.events.len() < limit
    }
}

impl StoredEvent {
    /// The entry's 0-based position in the transparency log.
    pub fn index(&self) -> u64 {
        self.seq - 1
    }
}

/// A small document kept by kind and id: accounts, sessions, invitations, settings,
/// rooms. `version` is its compare-and-swap token (an update must carry the stored
/// version + 1); `key`, when set, is unique among documents of the same kind (a
/// username, a token hash) and can be looked up.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    pub kind: String,
    pub id: String,
    pub version: u64,
    pub key: Option<String>,
    pub body: serde_json::Value,
    pub updated_at: Timestamp,
}

/// A request row exactly as stored, columns and `body` undecoded, for the audit
/// ([`audit`]): a body that no longer decodes, or columns that disagree with it, are
/// differences to report, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRequest {
    pub id: String,
    pub version: i64,
    pub status: String,
    pub requested_by: String,
    pub idempotency_key: Option<String>,
    pub requested_at: i64,
    pub expires_at: i64,
    pub body: String,
}

/// A payload opening exactly as stored (its `payload` JSON undecoded), for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPayload {
    pub seq: u64,
    pub salt: String,
    pub payload: String,
}

/// An integration of entries `[from, to)` with the checkpoint signed over the tree it
/// makes: [`Store::integrate_signed`].
#[derive(Debug, Clone, Copy)]
pub struct SignedIntegration<'a> {
    pub from: u64,
    pub to: u64,
    pub nodes: &'a [(NodeId, Hash)],
    pub checkpoint: &'a StoredCheckpoint,
}

/// A signed checkpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    pub size: u64,
    pub note: String,
    pub created_at: Timestamp,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores a new pending request with its creation event. When the request has an
    /// idempotency key that its requester already used, returns the existing request
    /// and writes nothing.
    async fn create_request(&self, write: &SealedTransition) -> Result<Created, StoreError>;

    /// Stores a new request already decided (a policy's decision at creation):
    /// `created` is its creation, `then` the transitions that follow it at once, in
    /// order (the decision; for a call the gateway forwards, also its claim), each the
    /// next version of the one before. [`Created::New`] holds the request as stored:
    /// the last of `then`, unless someone else changed it in between (then theirs).
    /// With an idempotency key already used, returns the existing request and writes
    /// nothing, as [`Store::create_request`].
    ///
    /// A backend should write them all in one transaction (the SQLite and PostgreSQL
    /// stores do); this default writes them one after the other, which costs a commit
    /// each and, if a later one cannot be written, keeps what was (a pending request
    /// goes to a person; an approval not claimed is claimed by the caller afterwards).
    async fn create_decided(
        &self,
        created: &SealedTransition,
        then: &[SealedTransition],
    ) -> Result<Created, StoreError> {
        match self.create_request(created).await? {
            Created::New(mut stored) => {
                for next in then {
                    match self.apply(next).await {
                        Ok(()) => stored = next.request.clone(),
                        Err(StoreError::VersionConflict { current }) => {
                            return Ok(Created::New(*current));
                        }
                        Err(err) => return Err(err),
                    }
                }
                Ok(Created::New(stored))
            }
            existing @ Created::Existing(_) => Ok(existing),
        }
    }

    async fn get_request(&self, id: &str) -> Result<Option<ApprovalRequest>, StoreError>;

    /// Applies a transition of an existing request: stores `write.request` if the
    /// stored version is exactly one less, and appends its event, atomically. Otherwise
    /// fails with [`StoreError::VersionConflict`] carrying the current request, so the
    /// loser of a race learns what won.
    async fn apply(&self, write: &SealedTransition) -> Result<(), StoreError>;

    /// Appends an event that changes no request (a recorded autonomous decision, a key
    /// rotation); returns its sequence number.
    async fn append_event(&self, event: &SealedEvent) -> Result<u64, StoreError>;

    /// Requests matching `query`, newest first (`requested_at` descending, then id
    /// descending), at most `query.limit`.
    async fn list_requests(&self, query: &RequestQuery)
    -> Result<Vec<ApprovalRequest>, StoreError>;

    /// Pending requests whose `expires_at` is at or before `now`, the earliest expiry
    /// first (then by id).
    async fn due_for_expiry(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError>;

    /// The earliest `expires_at` among pending requests.
    async fn next_expiry(&self) -> Result<Option<Timestamp>, StoreError>;

    /// How many requests have `status` now (`/metrics` asks for the pending ones at
    /// every scrape, so it is an index count, not a scan of the bodies).
    async fn count_requests(&self, status: Status) -> Result<u64, StoreError>;

    /// Stores a new token with its creation event. Fails with
    /// [`StoreError::Duplicate`] if its id or hash exists, or a token (revoked or not)
    /// ever had its name, ignoring ASCII case.
    async fn create_token(
        &self,
        token: &TokenRecord,
        event: &SealedEvent,
    ) -> Result<(), StoreError>;

    /// The token whose hash is `hash`, revoked or not.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>, StoreError>;

    /// All tokens, oldest first (by `created_at`, then id).
    async fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;

    /// Marks the token revoked at `at` with its event. Fails with
    /// [`StoreError::NotFound`] for an unknown id, and with [`StoreError::Duplicate`]
    /// (writing nothing) if it is already revoked.
    async fn revoke_token(
        &self,
        id: &str,
        at: Timestamp,
        event: &SealedEvent,
    ) -> Result<TokenRecord, StoreError>;

    /// Events with a sequence number above `after`, in order, at most `limit`.
    async fn events_after(&self, after: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// The same, for a reader that follows the log as it grows (the change feed, the
    /// log's integration, the outbox): a backend may answer with the events this process
    /// has just committed without reading them back. Such an answer is a run right after
    /// `after`, never skipping one, but may stop short of the newest: `read` is false and
    /// the caller asks again from its last event. With `read` true the events were read
    /// from the database, and fewer than `limit` means there are no more yet.
    async fn follow_events(&self, after: u64, limit: usize) -> Result<Followed, StoreError> {
        Ok(Followed {
            events: self.events_after(after, limit).await?,
            read: true,
        })
    }

    /// Whether another process may have committed since [`Store::follow_events`] last
    /// read the database (not just answered with this process's own commits). A
    /// follower that has taken this process's own events and sees `false` has caught
    /// up. The default, for backends that cannot tell: always.
    fn changed_elsewhere(&self) -> bool {
        true
    }

    /// Every event whose subject is `subject`, in order.
    async fn events_of_subject(&self, subject: &str) -> Result<Vec<StoredEvent>, StoreError>;

    /// The events of `subject` with a sequence number above `after`, in order, at most
    /// `limit`: what is new since a reader last looked, without reading the rest.
    async fn events_of_subject_after(
        &self,
        subject: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = self.events_of_subject(subject).await?;
        events.retain(|e| e.seq > after);
        events.truncate(limit);
        Ok(events)
    }

    /// The newest `limit` events of `subject` with a sequence number below `before`,
    /// in order (oldest first): the end of a long history, and the page before it.
    async fn events_of_subject_before(
        &self,
        subject: &str,
        before: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = self.events_of_subject(subject).await?;
        events.retain(|e| e.seq < before);
        let skip = events.len().saturating_sub(limit);
        Ok(events.split_off(skip))
    }

    /// The payload openings of the events with these sequence numbers (those that have
    /// one and whose payload was not erased).
    async fn payloads(&self, seqs: &[u64]) -> Result<BTreeMap<u64, PayloadOpening>, StoreError>;

    /// Erases the payload openings of these events (their values and salts); the log
    /// entries, which only hold commitments, stay as they are, so the log still verifies.
    /// Returns how many were erased.
    async fn erase_payloads(&self, seqs: &[u64]) -> Result<u64, StoreError>;

    /// Request rows with an id above `after` (all from `""`), by id, at most `limit`,
    /// as stored: what the audit pages through.
    async fn requests_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<RawRequest>, StoreError>;

    /// Payload openings of the events numbered `from..=to`, by number, as stored.
    async fn payloads_between(&self, from: u64, to: u64) -> Result<Vec<RawPayload>, StoreError>;

    /// The sequence number of the newest event (0 when there is none).
    async fn last_event_seq(&self) -> Result<u64, StoreError>;

    /// The log's origin, setting it to `origin` if none is set yet; returns the origin in
    /// force (the first one ever set).
    async fn log_origin(&self, origin: &str) -> Result<String, StoreError>;

    /// How many entries have their Merkle nodes stored (the integrated tree size).
    async fn integrated_size(&self) -> Result<u64, StoreError>;

    /// Stores the Merkle nodes of entries `[from, to)` and moves the integrated size from
    /// `from` to `to`, atomically, if it is still `from`. Returns false (writing
    /// nothing) when another process integrated first. Nodes are written once: a node
    /// that already exists is [`StoreError::Corrupt`]; `to` beyond the stored events is
    /// an error.
    async fn integrate(
        &self,
        from: u64,
        to: u64,
        nodes: &[(NodeId, Hash)],
    ) -> Result<bool, StoreError>;

    /// As [`Store::integrate`], and stores `checkpoint` (signed over the tree of `to`
    /// entries) with it: both or, when another process integrated first, neither. The
    /// SQLite and PostgreSQL stores write them in one transaction, so an integration
    /// costs one commit; this default writes them one after the other.
    async fn integrate_signed(&self, signed: SignedIntegration<'_>) -> Result<bool, StoreError> {
        if !self.integrate(signed.from, signed.to, signed.nodes).await? {
            return Ok(false);
        }
        self.add_checkpoint(signed.checkpoint).await?;
        Ok(true)
    }

    /// The stored hashes of these nodes; a missing node is [`StoreError::NotFound`].
    async fn log_nodes(&self, ids: &[NodeId]) -> Result<BTreeMap<NodeId, Hash>, StoreError>;

    /// Stores a signed checkpoint; a second checkpoint of the same size is ignored.
    async fn add_checkpoint(&self, checkpoint: &StoredCheckpoint) -> Result<(), StoreError>;

    /// The checkpoint of exactly `size`, or the largest when `size` is `None`.
    async fn checkpoint(&self, size: Option<u64>) -> Result<Option<StoredCheckpoint>, StoreError>;

    /// Every stored checkpoint, smallest first.
    async fn checkpoints(&self) -> Result<Vec<StoredCheckpoint>, StoreError>;

    /// Checks that the database answers and is writable; says what is wrong otherwise.
    async fn check(&self) -> Result<(), StoreError>;

    /// The document of `kind` with `id`.
    async fn doc_get(&self, kind: &str, id: &str) -> Result<Option<Doc>, StoreError>;

    /// The document of `kind` whose unique key is `key`.
    async fn doc_by_key(&self, kind: &str, key: &str) -> Result<Option<Doc>, StoreError>;

    /// Documents of `kind` whose id starts with `id_prefix` (all when empty), by id, at
    /// most `limit`.
    async fn doc_list(
        &self,
        kind: &str,
        id_prefix: &str,
        limit: usize,
    ) -> Result<Vec<Doc>, StoreError>;

    /// The `limit` documents of `kind` updated last, the latest first (ties by id,
    /// descending).
    async fn doc_list_recent(&self, kind: &str, limit: usize) -> Result<Vec<Doc>, StoreError>;

    /// Inserts `doc` (at whatever version it carries, normally 1) and, when given,
    /// appends `event`, atomically. [`StoreError::Duplicate`] if its id or key is taken.
    async fn doc_insert(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<(), StoreError>;

    /// Replaces the stored document if its version is `doc.version - 1`, appending
    /// `event` when given, atomically. [`StoreError::Conflict`] if the version moved,
    /// [`StoreError::NotFound`] if there is no such document, [`StoreError::Duplicate`]
    /// if the new key belongs to another document.
    async fn doc_update(&self, doc: &Doc, event: Option<&SealedEvent>) -> Result<(), StoreError>;

    /// How many documents of `kind` there are (the outbox's depth, for `/metrics`).
    async fn doc_count(&self, kind: &str) -> Result<u64, StoreError>;

    /// Deletes the document of `kind` with exactly `id`; whether there was one.
    async fn doc_delete(&self, kind: &str, id: &str) -> Result<bool, StoreError>;

    /// Deletes every document of `kind` whose id starts with `id_prefix` (never all: an
    /// empty prefix deletes nothing); how many.
    async fn doc_delete_prefix(&self, kind: &str, id_prefix: &str) -> Result<u64, StoreError>;

    /// A setting written once: returns the value in force, setting `value` when `key`
    /// has none (the first writer wins, as with the log origin).
    async fn meta_set_once(&self, key: &str, value: &str) -> Result<String, StoreError>;

    /// Settings whose key starts with `prefix`, by key.
    async fn meta_list(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError>;

    /// Copies a request as it is, with no event (for `migrate-data`, which copies the
    /// events separately). [`StoreError::Duplicate`] if it exists.
    async fn import_request(&self, request: &ApprovalRequest) -> Result<(), StoreError>;

    /// Copies a token as it is, with no event. [`StoreError::Duplicate`] if it exists.
    async fn import_token(&self, token: &TokenRecord) -> Result<(), StoreError>;

    /// Starts pushing change notifications: the backend calls `on_change` soon after
    /// events are committed by any process or instance (e.g. PostgreSQL LISTEN/NOTIFY).
    /// Backends without such a channel keep the default, and the change feed relies on
    /// its poll interval. A notification may be lost; the feed's poll still catches up.
    async fn listen(&self, on_change: ChangeCallback) -> Result<(), StoreError> {
        let _ = on_change;
        Ok(())
    }
}

/// What a backend calls when it learns that events were committed.
pub type ChangeCallback = Arc<dyn Fn() + Send + Sync>;
