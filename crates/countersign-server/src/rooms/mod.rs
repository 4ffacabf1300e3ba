//! Rooms: messages, presence, questions (a soft gate) and blockers (a hard gate). The
//! rules are `countersign_core::rooms`; this service stores rooms and memberships as
//! typed documents and a room's history as its log events (subject `room:<name>`).
//! Waiting agents are woken by the change feed, exactly like approval waiters. The gate
//! owns it and calls down into it (an approval asked in a room is shown there).

mod members;
mod messages;
mod rate;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use countersign_core::rooms::{self, Room, room_event};
use countersign_core::{Clock, Decider, Event, EventKind, Groups, Principal, Timestamp};
use countersign_store::{ChangeFeed, Docs, Store, StoreError, Stored, collection, kinds};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::error::GateError;
use crate::ids::new_salt;

pub use countersign_core::rooms::{Attention, Member, MessageView};
pub use messages::HumanGate;
pub use rate::DEFAULT_MESSAGES_PER_MINUTE;

collection!(
    /// Rooms, by name.
    RoomDocs: kinds::ROOM => Room
);

collection!(
    /// Memberships, `{room}/{principal id}`.
    MemberDocs: kinds::MEMBER => Member
);

collection!(
    /// One per answered question or resolved blocker, inserted with the answer's event in
    /// one transaction: of two people answering at once, exactly one wins. The body is
    /// `{"ref": <message id>}`.
    ClosedDocs: kinds::ROOM_CLOSED => serde_json::Value
);

pub struct Rooms {
    store: Arc<dyn Store>,
    feed: ChangeFeed,
    clock: Arc<dyn Clock>,
    /// Where purged rooms' backups are written (no purging without one).
    backup_dir: Option<PathBuf>,
    /// Cancelled when the process shuts down: waits return at once.
    stopping: CancellationToken,
    /// The `[groups]` a room may be restricted to.
    groups: Groups,
    /// How fast one principal may post.
    rate: rate::RateLimit,
    /// Each room's open questions and blockers, as counted so far from its events.
    tallies: std::sync::Mutex<std::collections::HashMap<String, Tally>>,
    /// How many room events this service has read from the store (a measure of what
    /// listing and waiting cost, for tests and benchmarks).
    events_read: std::sync::atomic::AtomicU64,
}

/// A room's questions and blockers still open, counted from its events up to
/// `last_seq`; counting goes on from there.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    last_seq: u64,
    questions: std::collections::BTreeSet<String>,
    blockers: std::collections::BTreeSet<String>,
}

impl Tally {
    fn count(&mut self, seq: u64, entry: &countersign_core::LogEntry) {
        if seq <= self.last_seq {
            return;
        }
        self.last_seq = seq;
        let reference = || {
            entry
                .data
                .get("ref")
                .and_then(|r| r.as_str())
                .map(str::to_string)
        };
        match entry.kind {
            EventKind::MessagePosted => {
                match entry.data.get("type").and_then(|t| t.as_str()) {
                    Some("question") => self.questions.insert(format!("m{seq}")),
                    Some("blocker") => self.blockers.insert(format!("m{seq}")),
                    _ => false,
                };
            }
            EventKind::QuestionAnswered => {
                if let Some(r) = reference() {
                    self.questions.remove(&r);
                }
            }
            EventKind::BlockerResolved => {
                if let Some(r) = reference() {
                    self.blockers.remove(&r);
                }
            }
            _ => {}
        }
    }

    fn attention(&self) -> Attention {
        Attention {
            approvals: 0,
            questions: self.questions.len(),
            blockers: self.blockers.len(),
        }
    }
}

/// What a purge writes before erasing: the room and its messages with their texts.
#[derive(serde::Serialize)]
struct Backup<'a> {
    format: &'static str,
    room: &'a Room,
    messages: &'a [MessageView],
}

/// Writes a purge backup, mode 0600, durably, before anything is erased.
fn write_backup(dir: &Path, room: &str, at: Timestamp, bytes: &[u8]) -> Result<PathBuf, GateError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| {
        GateError::internal(
            &format!("could not write the backup in {}", dir.display()),
            e,
        )
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let path = dir.join(format!("room-{room}-{}.json", at.millis()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(fail)?;
    file.write_all(bytes).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    // And the directory entry, so the file survives a power cut too.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)?;
    Ok(path)
}

impl Rooms {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        feed: ChangeFeed,
        clock: Arc<dyn Clock>,
        backup_dir: Option<PathBuf>,
        stopping: CancellationToken,
        groups: Groups,
        messages_per_minute: u32,
    ) -> Self {
        Self {
            store,
            feed,
            clock,
            backup_dir,
            stopping,
            groups,
            rate: rate::RateLimit::new(messages_per_minute),
            tallies: std::sync::Mutex::new(std::collections::HashMap::new()),
            events_read: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many room events this service has read from the store so far.
    pub fn events_read(&self) -> u64 {
        self.events_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn tally(&self, room: &str) -> Result<Tally, GateError> {
        Ok(self
            .tallies
            .lock()
            .map_err(|_| GateError::Internal("the room tallies' lock was poisoned".into()))?
            .get(room)
            .cloned()
            .unwrap_or_default())
    }

    /// Keeps `tally` unless another caller counted further meanwhile.
    fn keep_tally(&self, room: &str, tally: Tally) -> Result<(), GateError> {
        let mut tallies = self
            .tallies
            .lock()
            .map_err(|_| GateError::Internal("the room tallies' lock was poisoned".into()))?;
        let entry = tallies.entry(room.to_string()).or_default();
        if tally.last_seq >= entry.last_seq {
            *entry = tally;
        }
        Ok(())
    }

    /// The `[groups]` rooms may be restricted to.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn docs(&self) -> Docs<'_, RoomDocs> {
        Docs::new(&*self.store)
    }

    /// Appends an event about a room and wakes its waiters.
    async fn append(&self, event: Event) -> Result<u64, GateError> {
        let seq = self.store.append_event(&event.seal(new_salt()?)).await?;
        self.feed.poke();
        Ok(seq)
    }

    async fn stored(&self, name: &str) -> Result<Option<Stored<Room>>, GateError> {
        let name = rooms::room_name(name)?;
        Ok(self.docs().get(&name).await?)
    }

    /// The room named `name`, if it exists (deleted or not).
    pub async fn room(&self, name: &str) -> Result<Option<Room>, GateError> {
        Ok(self.stored(name).await?.map(|r| r.body))
    }

    /// The room named `name`, or `not_found`.
    pub async fn existing(&self, name: &str) -> Result<Room, GateError> {
        self.room(name)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("room {name}")))
    }

    /// The room named `name`, if `who` may use it: `not_found` when it does not exist,
    /// `forbidden` when it is restricted to others.
    pub async fn admitted(&self, who: &Principal, name: &str) -> Result<Room, GateError> {
        let room = self.existing(name).await?;
        room.check_admits(who, &self.groups)?;
        Ok(room)
    }

    /// Refuses `who` in room `name` when the room exists and is in the trash or
    /// restricted to others (a room that does not exist yet is created on first use).
    pub async fn check_may_post(&self, who: &Principal, name: &str) -> Result<(), GateError> {
        if let Some(room) = self.room(name).await? {
            room.check_open()?;
            room.check_admits(who, &self.groups)?;
        }
        Ok(())
    }

    /// The rooms `who` may use (people who decide: every room, the trashed included).
    pub async fn list_for(&self, who: &Principal) -> Result<Vec<Room>, GateError> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .filter(|r| r.admits(who, &self.groups))
            .collect())
    }

    /// Every room, the trashed ones included.
    pub async fn list(&self) -> Result<Vec<Room>, GateError> {
        Ok(self
            .docs()
            .list("", 10_000)
            .await?
            .into_iter()
            .map(|r| r.body)
            .collect())
    }

    /// An open (not deleted) room; created when an agent or person first uses it.
    async fn open_room(&self, who: &Principal, name: &str) -> Result<Room, GateError> {
        match self.room(name).await? {
            Some(room) => {
                room.check_open()?;
                room.check_admits(who, &self.groups)?;
                Ok(room)
            }
            None => self.create(who, name, None).await,
        }
    }

    /// Creates a room (its title defaults to its name); one that exists is returned.
    pub async fn create(
        &self,
        who: &Principal,
        name: &str,
        title: Option<&str>,
    ) -> Result<Room, GateError> {
        let now = self.now();
        let room = Room::new(name, title, who, now)?;
        let event = room_event(
            EventKind::RoomCreated,
            &room.name,
            who,
            now,
            json!({"title": room.title}),
            None,
        );
        match self
            .docs()
            .insert(&room.name, None, &room, now, Some(&event.seal(new_salt()?)))
            .await
        {
            Ok(()) => {
                self.feed.poke();
                Ok(room)
            }
            // Created meanwhile by someone else: use theirs.
            Err(StoreError::Duplicate(_)) => self.existing(&room.name).await,
            Err(e) => Err(e.into()),
        }
    }

    /// Changes a room with `change` (false: nothing to do) and records `kind` with
    /// `data` when it did. Who may is for `change` to check (callers pass a `Decider`'s
    /// principal, except for restricting, which a room's creator may do too).
    async fn administer(
        &self,
        who: &Principal,
        name: &str,
        kind: EventKind,
        change: impl FnOnce(&mut Room, Timestamp) -> Result<bool, GateError>,
        data: impl FnOnce(&Room) -> serde_json::Value,
    ) -> Result<Room, GateError> {
        let mut stored = self
            .stored(name)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("room {name}")))?;
        let now = self.now();
        if !change(&mut stored.body, now)? {
            return Ok(stored.body);
        }
        let room = &stored.body;
        let event = room_event(kind, &room.name, who, now, data(room), None);
        self.docs()
            .update(&stored, room, now, Some(&event.seal(new_salt()?)))
            .await
            .map_err(|e| match e {
                StoreError::Conflict(_) => {
                    GateError::BadInput(format!("room {} changed meanwhile; reload", room.name))
                }
                other => other.into(),
            })?;
        self.feed.poke();
        Ok(stored.body)
    }

    /// Restricts room `name` to `allowed` (principal ids and `group:<name>`s; empty
    /// opens it again): its creator or an admin only. Logged as `room_restricted`.
    pub async fn restrict(
        &self,
        who: &Principal,
        name: &str,
        allowed: &[String],
    ) -> Result<Room, GateError> {
        let groups = &self.groups;
        self.administer(
            who,
            name,
            EventKind::RoomRestricted,
            |room, _| Ok(room.restrict(who, allowed, groups)?),
            |room| json!({"allowed": room.allowed}),
        )
        .await
    }

    /// Room admin: rename, trash, restore, purge. People who decide only.
    pub async fn rename(&self, who: &Decider, name: &str, title: &str) -> Result<Room, GateError> {
        self.administer(
            who.principal(),
            name,
            EventKind::RoomRenamed,
            |room, _| Ok(room.rename(title).map(|()| true)?),
            |room| json!({"title": room.title}),
        )
        .await
    }

    pub async fn trash(&self, who: &Decider, name: &str) -> Result<Room, GateError> {
        self.administer(
            who.principal(),
            name,
            EventKind::RoomDeleted,
            |room, now| Ok(room.trash(now)),
            |_| json!({}),
        )
        .await
    }

    pub async fn restore(&self, who: &Decider, name: &str) -> Result<Room, GateError> {
        self.administer(
            who.principal(),
            name,
            EventKind::RoomRestored,
            |room, _| Ok(room.restore()),
            |_| json!({}),
        )
        .await
    }

    /// Erases a trashed room's message texts after writing them, with the room, to a
    /// backup file (whose path is returned). The log entries stay: the room's history
    /// still verifies, its texts are gone.
    pub async fn purge(&self, who: &Decider, name: &str) -> Result<(Room, PathBuf), GateError> {
        let dir = self.backup_dir.clone().ok_or_else(|| {
            GateError::Forbidden(
                "this server has no backup directory, so rooms cannot be purged".into(),
            )
        })?;
        let room = self.existing(name).await?;
        room.check_purgeable()?;
        let messages = self.messages(&room.name, 0, usize::MAX).await?;
        let backup = serde_json::to_vec_pretty(&Backup {
            format: "countersign.room-backup/v1",
            room: &room,
            messages: &messages,
        })
        .map_err(|e| GateError::internal("encode a room backup", e))?;
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&backup));
        let path = write_backup(&dir, &room.name, self.now(), &backup)?;
        let seqs: Vec<u64> = self
            .store
            .events_of_subject(&rooms::subject(&room.name))
            .await?
            .iter()
            .map(|e| e.seq)
            .collect();
        // Record the purge (and the backup's digest) first, then erase.
        let room = self
            .administer(
                who.principal(),
                &room.name,
                EventKind::RoomPurged,
                |room, now| {
                    room.check_purgeable()?;
                    room.purged_at = Some(now);
                    Ok(true)
                },
                |_| json!({"backup_sha256": digest, "messages": messages.len()}),
            )
            .await?;
        self.store.erase_payloads(&seqs).await?;
        Ok((room, path))
    }
}
