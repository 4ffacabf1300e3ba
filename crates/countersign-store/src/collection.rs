//! Typed document collections over the store's documents: each collection states its
//! kind once (from [`kinds`]) and the Rust type of its body, and every read and write
//! goes through one conversion, so a bad document means the same thing everywhere
//! ([`StoreError::Corrupt`]) and a typo cannot make a new kind. [`Docs::modify`] is the
//! one compare-and-swap retry loop for documents.

use std::marker::PhantomData;

use countersign_core::{SealedEvent, Timestamp};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Doc, Store, StoreError};

/// How many times a compare-and-swap is retried when another writer got in between.
pub const CAS_TRIES: usize = 20;

/// Every document kind countersign stores, stated once. These strings are in existing
/// databases: never rename one.
pub mod kinds {
    /// Dashboard accounts, keyed by username.
    pub const USER: &str = "user";
    /// Dashboard sessions (`{user_id}/{hash prefix}`), keyed by the token's SHA-256.
    pub const SESSION: &str = "session";
    /// Setup and invitation links, keyed by the token's SHA-256.
    pub const INVITE: &str = "invite";
    /// Claims of the first-admin slot (`first-admin-{n}`).
    pub const SETUP_CLAIM: &str = "setup_claim";
    /// Rooms, by name.
    pub const ROOM: &str = "room";
    /// Room memberships (`{room}/{principal id}`).
    pub const MEMBER: &str = "member";
    /// One per answered question or resolved blocker (`{room}/{message id}`).
    pub const ROOM_CLOSED: &str = "room.closed";
    /// Deliveries waiting to be sent (or retried).
    pub const DELIVERY_PENDING: &str = "delivery.pending";
    /// Finished deliveries: the history.
    pub const DELIVERY_DONE: &str = "delivery.done";
    /// The outbox's position in the event log.
    pub const OUTBOX: &str = "outbox";
    /// Slack messages posted for a request (`{request_id}/{delivery_id}`).
    pub const SLACK_MESSAGE: &str = "slack.message";
    /// Slack interactions already handled (`{day}/{hash}`).
    pub const SLACK_INTERACTION: &str = "slack.interaction";
    /// One-time email decision tokens (`{request_id}/{random}`), keyed by SHA-256.
    pub const EMAIL_TOKEN: &str = "email.token";
    /// Addresses emailed about a request (`{request_id}/{address}`).
    pub const EMAIL_SENT: &str = "email.sent";
    /// New requests per requester and notification window (`{requester}/{start}`).
    pub const NOTIFY_WINDOW: &str = "notify.window";
    /// The scheduled audit's last result (`last`).
    pub const AUDIT: &str = "audit";
    /// Policy set versions in the log, by digest (`sha256:...`).
    pub const POLICY_SET: &str = "policy.set";
    /// Standing grants (`{agent}/{grant id}`), keyed by the grant id.
    pub const GRANT: &str = "grant";
    /// An operator's last listing of bridged proposals (the approval-gate profile's
    /// `list_pending_approvals`), keyed by the caller's principal id: what `approve(index)`
    /// means.
    pub const BRIDGE_LISTING: &str = "bridge.listing";
}

/// Declares a collection: a marker type naming a document kind and its body type.
///
/// ```ignore
/// collection!(
///     /// Accounts, by id; keyed by username.
///     pub UserDocs: kinds::USER => User
/// );
/// ```
#[macro_export]
macro_rules! collection {
    ($(#[$meta:meta])* $vis:vis $name:ident: $kind:expr => $body:ty) => {
        $(#[$meta])*
        $vis struct $name;
        impl $crate::Collection for $name {
            const KIND: &'static str = $kind;
            type Body = $body;
        }
    };
}

/// A kind of document and the type of its body.
pub trait Collection {
    /// The stored kind: one of [`kinds`].
    const KIND: &'static str;
    type Body: Serialize + DeserializeOwned + Send + Sync;
}

/// A document read from a collection: its body and what the store keeps beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    pub id: String,
    /// The compare-and-swap token: an update writes `version + 1`.
    pub version: u64,
    pub key: Option<String>,
    pub body: T,
    pub updated_at: Timestamp,
}

/// What a [`Docs::modify`] step decided.
// Built once per step and moved straight into the write: boxing the event would cost an
// allocation on every write to save a few hundred bytes on the stack for a moment.
#[allow(clippy::large_enum_variant)]
pub enum Step<T, R> {
    /// Write this body (inserting when there was no document), with this event, and
    /// return `R` once it is stored.
    Write {
        body: T,
        event: Option<SealedEvent>,
        then: R,
    },
    /// Write nothing and return `R`.
    Done(R),
}

/// The documents of collection `C` in a store.
pub struct Docs<'a, C> {
    store: &'a dyn Store,
    collection: PhantomData<C>,
}

impl<'a, C: Collection> Docs<'a, C> {
    pub fn new(store: &'a dyn Store) -> Self {
        Self {
            store,
            collection: PhantomData,
        }
    }

    fn decode(doc: Doc) -> Result<Stored<C::Body>, StoreError> {
        let body = serde_json::from_value(doc.body)
            .map_err(|e| StoreError::Corrupt(format!("{} {}: {e}", C::KIND, doc.id)))?;
        Ok(Stored {
            id: doc.id,
            version: doc.version,
            key: doc.key,
            body,
            updated_at: doc.updated_at,
        })
    }

    fn encode(
        id: &str,
        version: u64,
        key: Option<String>,
        body: &C::Body,
        at: Timestamp,
    ) -> Result<Doc, StoreError> {
        Ok(Doc {
            kind: C::KIND.to_string(),
            id: id.to_string(),
            version,
            key,
            body: serde_json::to_value(body)
                .map_err(|e| StoreError::Corrupt(format!("cannot encode {} {id}: {e}", C::KIND)))?,
            updated_at: at,
        })
    }

    fn decode_all(docs: Vec<Doc>) -> Result<Vec<Stored<C::Body>>, StoreError> {
        docs.into_iter().map(Self::decode).collect()
    }

    pub async fn get(&self, id: &str) -> Result<Option<Stored<C::Body>>, StoreError> {
        self.store
            .doc_get(C::KIND, id)
            .await?
            .map(Self::decode)
            .transpose()
    }

    /// The document whose unique key is `key`.
    pub async fn by_key(&self, key: &str) -> Result<Option<Stored<C::Body>>, StoreError> {
        self.store
            .doc_by_key(C::KIND, key)
            .await?
            .map(Self::decode)
            .transpose()
    }

    /// Documents whose id starts with `prefix` (all when empty), by id, at most `limit`.
    pub async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Stored<C::Body>>, StoreError> {
        Self::decode_all(self.store.doc_list(C::KIND, prefix, limit).await?)
    }

    /// The ids and update times of documents whose id starts with `prefix`, by id, at
    /// most `limit`, without reading their bodies (to expire old ones, even unreadable).
    pub async fn updated(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<(String, Timestamp)>, StoreError> {
        Ok(self
            .store
            .doc_list(C::KIND, prefix, limit)
            .await?
            .into_iter()
            .map(|d| (d.id, d.updated_at))
            .collect())
    }

    /// The `limit` documents updated last, the latest first.
    pub async fn list_recent(&self, limit: usize) -> Result<Vec<Stored<C::Body>>, StoreError> {
        Self::decode_all(self.store.doc_list_recent(C::KIND, limit).await?)
    }

    /// Inserts a new document (version 1), with `event` in the same transaction.
    /// [`StoreError::Duplicate`] if its id or key is taken.
    pub async fn insert(
        &self,
        id: &str,
        key: Option<String>,
        body: &C::Body,
        at: Timestamp,
        event: Option<&SealedEvent>,
    ) -> Result<(), StoreError> {
        let doc = Self::encode(id, 1, key, body, at)?;
        self.store.doc_insert(&doc, event).await
    }

    /// Replaces the document read as `read` with `body` (same id and key) if nobody
    /// changed it since: [`StoreError::Conflict`] otherwise, [`StoreError::NotFound`] if it
    /// is gone. Returns the new version.
    pub async fn update<T>(
        &self,
        read: &Stored<T>,
        body: &C::Body,
        at: Timestamp,
        event: Option<&SealedEvent>,
    ) -> Result<u64, StoreError> {
        let version = read.version + 1;
        let doc = Self::encode(&read.id, version, read.key.clone(), body, at)?;
        self.store.doc_update(&doc, event).await?;
        Ok(version)
    }

    /// Like [`Docs::update`], with a new unique key.
    pub async fn update_keyed<T>(
        &self,
        read: &Stored<T>,
        key: Option<String>,
        body: &C::Body,
        at: Timestamp,
        event: Option<&SealedEvent>,
    ) -> Result<u64, StoreError> {
        let version = read.version + 1;
        let doc = Self::encode(&read.id, version, key, body, at)?;
        self.store.doc_update(&doc, event).await?;
        Ok(version)
    }

    pub async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.store.doc_delete(C::KIND, id).await
    }

    /// Deletes every document whose id starts with `prefix` (never all); how many.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.store.doc_delete_prefix(C::KIND, prefix).await
    }

    /// Reads document `id`, lets `step` decide what to write (given what is stored, or
    /// nothing), and writes it with a compare-and-swap (an insert when there was none).
    /// When another writer got in between, reads again and asks `step` again, up to
    /// [`CAS_TRIES`] times; then gives up with [`StoreError::Unavailable`].
    pub async fn modify<R, E, F>(&self, id: &str, at: Timestamp, mut step: F) -> Result<R, E>
    where
        E: From<StoreError>,
        F: FnMut(Option<&Stored<C::Body>>) -> Result<Step<C::Body, R>, E>,
    {
        for _ in 0..CAS_TRIES {
            let current = self.get(id).await?;
            let (body, event, then) = match step(current.as_ref())? {
                Step::Done(result) => return Ok(result),
                Step::Write { body, event, then } => (body, event, then),
            };
            let written = match &current {
                Some(read) => self
                    .update(read, &body, at, event.as_ref())
                    .await
                    .map(|_| ()),
                None => self.insert(id, None, &body, at, event.as_ref()).await,
            };
            match written {
                Ok(()) => return Ok(then),
                // Someone else wrote (or deleted) it first: look again.
                Err(
                    StoreError::Conflict(_)
                    | StoreError::Duplicate(_)
                    | StoreError::NotFound { .. },
                ) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(StoreError::Unavailable(format!("{} {id} kept changing; retry", C::KIND)).into())
    }
}
