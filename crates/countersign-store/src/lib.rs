//! The `Store` trait: everything countersign keeps, behind one interface that every
//! backend (embedded SQLite, PostgreSQL) implements and passes one test suite against.
//!
//! The store knows nothing of the rules: the domain (`countersign-core`) computes each
//! transition, and the store applies it atomically with a compare-and-swap on the
//! request's version, writing the transition's event in the same transaction. Events get
//! a gap-free, increasing sequence number; the change feed and the transparency log are
//! built on that order.

mod error;
mod feed;
#[cfg(feature = "testsuite")]
pub mod testsuite;

use async_trait::async_trait;
use countersign_core::{ApprovalRequest, Event, Status, Timestamp, TokenRecord, Transition};

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

/// An event as stored: its position in the sequence and its exact bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// 1-based, gap-free and increasing in commit order.
    pub seq: u64,
    pub event: Event,
    pub bytes: Vec<u8>,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Stores a new pending request with its creation event. When the transition's
    /// request has an idempotency key that its requester already used, returns the
    /// existing request and writes nothing.
    async fn create_request(&self, transition: &Transition) -> Result<Created, StoreError>;

    async fn get_request(&self, id: &str) -> Result<Option<ApprovalRequest>, StoreError>;

    /// Applies a transition of an existing request: stores `transition.request` if the
    /// stored version is exactly one less, and appends its event, atomically. Otherwise
    /// fails with [`StoreError::VersionConflict`] carrying the current request, so the
    /// loser of a race learns what won.
    async fn apply(&self, transition: &Transition) -> Result<(), StoreError>;

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

    /// Stores a new token with its creation event. Fails with
    /// [`StoreError::Duplicate`] if its id or hash exists.
    async fn create_token(&self, token: &TokenRecord, event: &Event) -> Result<(), StoreError>;

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
        event: &Event,
    ) -> Result<TokenRecord, StoreError>;

    /// Events with a sequence number above `after`, in order, at most `limit`.
    async fn events_after(&self, after: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// The sequence number of the newest event (0 when there is none).
    async fn last_event_seq(&self) -> Result<u64, StoreError>;

    /// Checks that the database answers and is writable; says what is wrong otherwise.
    async fn check(&self) -> Result<(), StoreError>;
}
