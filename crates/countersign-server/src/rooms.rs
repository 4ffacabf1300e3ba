//! Rooms: messages, presence, questions (a soft gate) and blockers (a hard gate), as
//! methods of the [`Gate`]. A room's history is its log events (subject `room:<name>`);
//! the room itself and its members are documents. Waiting agents are woken by the change
//! feed, exactly like approval waiters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use countersign_core::rooms::{self, MessageType, Presence, message_event, room_event};
use countersign_core::{EventKind, Principal, Role, Timestamp};
use countersign_store::{Doc, StoreError, StoredEvent};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

use crate::error::GateError;
use crate::gate::{Decider, Gate, new_salt};

const ROOM: &str = "room";
const MEMBER: &str = "member";
/// One per answered question or resolved blocker, inserted with the answer's event in one
/// transaction: of two people answering at once, exactly one wins.
const CLOSED: &str = "room.closed";
/// How often a member's last activity is written, at most.
const ACTIVITY_EVERY_MS: i64 = 5_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Room {
    pub name: String,
    pub title: String,
    pub created_at: Timestamp,
    pub created_by: String,
    /// Soft-deleted (in the trash) since.
    pub deleted_at: Option<Timestamp>,
    /// When its messages' texts were erased (after a backup).
    pub purged_at: Option<Timestamp>,
    #[serde(skip)]
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub room: String,
    pub id: String,
    pub display_name: String,
    pub role: Role,
    pub status: Presence,
    pub note: Option<String>,
    pub joined_at: Timestamp,
    pub last_activity: Timestamp,
}

/// A message as readers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MessageView {
    /// `m<seq>`: stable, and ordered like the room's history.
    pub id: String,
    pub seq: u64,
    /// note, question, progress, done, blocker, approval, answer, resolution, or an event
    /// of the room (joined, left, ...).
    #[serde(rename = "type")]
    pub kind: String,
    pub author_id: Option<String>,
    pub author: Option<String>,
    pub text: Option<String>,
    /// UTC, RFC 3339.
    pub at: String,
    /// The question, blocker or request this refers to.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    /// For questions and blockers: whether a human has answered or resolved it.
    pub open: Option<bool>,
}

/// What a room holds that waits for a human.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attention {
    pub approvals: usize,
    pub questions: usize,
    pub blockers: usize,
}

/// Writes a purge backup, mode 0600, durably, before anything is erased.
fn write_backup(
    dir: &std::path::Path,
    room: &str,
    at: Timestamp,
    bytes: &[u8],
) -> Result<std::path::PathBuf, GateError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| {
        GateError::Store(StoreError::Backend(format!(
            "could not write the backup in {}: {e}",
            dir.display()
        )))
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

fn seq_of(message_id: &str) -> Option<u64> {
    message_id.strip_prefix('m').and_then(|s| s.parse().ok())
}

fn to_doc<T: Serialize>(
    kind: &str,
    id: &str,
    version: u64,
    body: &T,
    at: Timestamp,
) -> Result<Doc, GateError> {
    Ok(Doc {
        kind: kind.into(),
        id: id.into(),
        version,
        key: None,
        body: serde_json::to_value(body).map_err(|e| GateError::BadInput(e.to_string()))?,
        updated_at: at,
    })
}

fn from_doc<T: for<'de> Deserialize<'de>>(doc: &Doc) -> Result<T, GateError> {
    serde_json::from_value(doc.body.clone())
        .map_err(|e| GateError::Store(StoreError::Corrupt(format!("{} {}: {e}", doc.kind, doc.id))))
}

impl Gate {
    async fn append(&self, event: countersign_core::Event) -> Result<u64, GateError> {
        let seq = self.store().append_event(&event.seal(new_salt()?)).await?;
        self.feed().poke();
        Ok(seq)
    }

    /// The room named `name`, if it exists (deleted or not).
    pub async fn room(&self, name: &str) -> Result<Option<Room>, GateError> {
        let name = rooms::room_name(name)?;
        match self.store().doc_get(ROOM, &name).await? {
            Some(doc) => {
                let mut room: Room = from_doc(&doc)?;
                room.version = doc.version;
                Ok(Some(room))
            }
            None => Ok(None),
        }
    }

    /// Every room, the trashed ones included.
    pub async fn rooms(&self) -> Result<Vec<Room>, GateError> {
        let mut out = Vec::new();
        for doc in self.store().doc_list(ROOM, "", 10_000).await? {
            let mut room: Room = from_doc(&doc)?;
            room.version = doc.version;
            out.push(room);
        }
        Ok(out)
    }

    /// An open (not deleted) room; created when an agent or person first uses it.
    async fn open_room(&self, who: &Principal, name: &str) -> Result<Room, GateError> {
        let name = rooms::room_name(name)?;
        if let Some(room) = self.room(&name).await? {
            if room.deleted_at.is_some() {
                return Err(GateError::BadInput(format!(
                    "room {name} is in the trash; an admin can restore it"
                )));
            }
            return Ok(room);
        }
        self.create_room(who, &name, None).await
    }

    /// Creates a room (its title defaults to its name).
    pub async fn create_room(
        &self,
        who: &Principal,
        name: &str,
        title: Option<&str>,
    ) -> Result<Room, GateError> {
        let name = rooms::room_name(name)?;
        let title = rooms::room_title(title.unwrap_or(&name))?;
        let now = self.clock().now();
        let room = Room {
            name: name.clone(),
            title: title.clone(),
            created_at: now,
            created_by: who.id.clone(),
            deleted_at: None,
            purged_at: None,
            version: 1,
        };
        let event = room_event(
            EventKind::RoomCreated,
            &name,
            who,
            now,
            json!({"title": title}),
            None,
        );
        match self
            .store()
            .doc_insert(
                &to_doc(ROOM, &name, 1, &room, now)?,
                Some(&event.seal(new_salt()?)),
            )
            .await
        {
            Ok(()) => {
                self.feed().poke();
                Ok(room)
            }
            // Created meanwhile by someone else: use theirs.
            Err(StoreError::Duplicate(_)) => self
                .room(&name)
                .await?
                .ok_or_else(|| GateError::NotFound(format!("room {name}"))),
            Err(e) => Err(e.into()),
        }
    }

    async fn save_room(
        &self,
        room: &mut Room,
        event: countersign_core::Event,
    ) -> Result<(), GateError> {
        room.version += 1;
        let now = self.clock().now();
        self.store()
            .doc_update(
                &to_doc(ROOM, &room.name, room.version, room, now)?,
                Some(&event.seal(new_salt()?)),
            )
            .await
            .map_err(|e| match e {
                StoreError::Conflict(_) => {
                    GateError::BadInput(format!("room {} changed meanwhile; reload", room.name))
                }
                other => other.into(),
            })?;
        self.feed().poke();
        Ok(())
    }

    async fn existing_room(&self, name: &str) -> Result<Room, GateError> {
        self.room(name)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("room {name}")))
    }

    /// Room admin: rename, trash, restore, purge. People who decide only.
    pub async fn rename_room(
        &self,
        who: &Decider,
        name: &str,
        title: &str,
    ) -> Result<Room, GateError> {
        let mut room = self.existing_room(name).await?;
        room.title = rooms::room_title(title)?;
        let event = room_event(
            EventKind::RoomRenamed,
            &room.name,
            who.principal(),
            self.clock().now(),
            json!({"title": room.title}),
            None,
        );
        self.save_room(&mut room, event).await?;
        Ok(room)
    }

    pub async fn delete_room(&self, who: &Decider, name: &str) -> Result<Room, GateError> {
        let mut room = self.existing_room(name).await?;
        if room.deleted_at.is_some() {
            return Ok(room);
        }
        let now = self.clock().now();
        room.deleted_at = Some(now);
        let event = room_event(
            EventKind::RoomDeleted,
            &room.name,
            who.principal(),
            now,
            json!({}),
            None,
        );
        self.save_room(&mut room, event).await?;
        Ok(room)
    }

    pub async fn restore_room(&self, who: &Decider, name: &str) -> Result<Room, GateError> {
        let mut room = self.existing_room(name).await?;
        if room.deleted_at.is_none() {
            return Ok(room);
        }
        room.deleted_at = None;
        let event = room_event(
            EventKind::RoomRestored,
            &room.name,
            who.principal(),
            self.clock().now(),
            json!({}),
            None,
        );
        self.save_room(&mut room, event).await?;
        Ok(room)
    }

    /// Erases a trashed room's message texts after writing them, with the room, to
    /// `backup` (returned as bytes for the caller to store). The log entries stay: the
    /// room's history still verifies, its texts are gone.
    pub async fn purge_room(
        &self,
        who: &Decider,
        name: &str,
    ) -> Result<(Room, std::path::PathBuf), GateError> {
        let dir = self.settings().backup_dir.clone().ok_or_else(|| {
            GateError::Forbidden(
                "this server has no backup directory, so rooms cannot be purged".into(),
            )
        })?;
        let mut room = self.existing_room(name).await?;
        if room.deleted_at.is_none() {
            return Err(GateError::BadInput(format!(
                "room {} is not in the trash: delete it first, then purge",
                room.name
            )));
        }
        let messages = self.messages(&room.name, 0, usize::MAX).await?;
        let backup = serde_json::to_vec_pretty(&json!({
            "format": "countersign.room-backup/v1",
            "room": room,
            "messages": messages,
        }))
        .map_err(|e| GateError::BadInput(e.to_string()))?;
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&backup));
        let path = write_backup(&dir, &room.name, self.clock().now(), &backup)?;
        let seqs: Vec<u64> = self
            .store()
            .events_of_subject(&rooms::subject(&room.name))
            .await?
            .iter()
            .map(|e| e.seq)
            .collect();
        let now = self.clock().now();
        room.purged_at = Some(now);
        let event = room_event(
            EventKind::RoomPurged,
            &room.name,
            who.principal(),
            now,
            json!({"backup_sha256": digest, "messages": messages.len()}),
            None,
        );
        // Record the purge (and the backup's digest) first, then erase.
        self.save_room(&mut room, event).await?;
        self.store().erase_payloads(&seqs).await?;
        Ok((room, path))
    }

    // ---- members and presence -----------------------------------------------------

    pub async fn members(&self, room: &str) -> Result<Vec<Member>, GateError> {
        let room = rooms::room_name(room)?;
        let mut members: Vec<Member> = self
            .store()
            .doc_list(MEMBER, &format!("{room}/"), 10_000)
            .await?
            .iter()
            .map(from_doc)
            .collect::<Result<_, _>>()?;
        members.sort_by(|a, b| {
            a.status
                .rank()
                .cmp(&b.status.rank())
                .then(b.last_activity.cmp(&a.last_activity))
        });
        Ok(members)
    }

    async fn touch_member(
        &self,
        who: &Principal,
        room: &str,
        status: Option<Presence>,
        note: Option<String>,
    ) -> Result<Member, GateError> {
        let id = format!("{room}/{}", who.id);
        let now = self.clock().now();
        for _ in 0..20 {
            match self.store().doc_get(MEMBER, &id).await? {
                Some(doc) => {
                    let mut member: Member = from_doc(&doc)?;
                    let changes = status.is_some_and(|s| s != member.status) || note.is_some();
                    // Activity alone is refreshed at most every few seconds: many messages
                    // from one agent need not all write its membership.
                    if !changes && member.last_activity.millis_until(now) < ACTIVITY_EVERY_MS {
                        return Ok(member);
                    }
                    member.last_activity = now;
                    if let Some(status) = status {
                        member.status = status;
                    }
                    if note.is_some() {
                        member.note = note.clone();
                    }
                    match self
                        .store()
                        .doc_update(&to_doc(MEMBER, &id, doc.version + 1, &member, now)?, None)
                        .await
                    {
                        Ok(()) => return Ok(member),
                        // Someone else refreshed it just now; for activity alone that will do.
                        Err(StoreError::Conflict(_)) if !changes => return Ok(member),
                        Err(StoreError::Conflict(_) | StoreError::NotFound { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                None => {
                    let member = Member {
                        room: room.to_string(),
                        id: who.id.clone(),
                        display_name: who.display_name.clone(),
                        role: who.role,
                        status: status.unwrap_or(Presence::Working),
                        note: note.clone(),
                        joined_at: now,
                        last_activity: now,
                    };
                    let event = room_event(
                        EventKind::MemberJoined,
                        room,
                        who,
                        now,
                        json!({"member": who.id}),
                        None,
                    );
                    match self
                        .store()
                        .doc_insert(
                            &to_doc(MEMBER, &id, 1, &member, now)?,
                            Some(&event.seal(new_salt()?)),
                        )
                        .await
                    {
                        Ok(()) => {
                            self.feed().poke();
                            return Ok(member);
                        }
                        Err(StoreError::Duplicate(_)) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Err(GateError::Store(StoreError::Unavailable(format!(
            "room {room}: membership kept changing; retry"
        ))))
    }

    pub async fn join_room(
        &self,
        who: &Principal,
        room: &str,
    ) -> Result<(Room, Member), GateError> {
        let room = self.open_room(who, room).await?;
        let member = self.touch_member(who, &room.name, None, None).await?;
        Ok((room, member))
    }

    pub async fn leave_room(&self, who: &Principal, room: &str) -> Result<(), GateError> {
        let room = self.existing_room(room).await?;
        if self
            .store()
            .doc_delete(MEMBER, &format!("{}/{}", room.name, who.id))
            .await?
        {
            self.append(room_event(
                EventKind::MemberLeft,
                &room.name,
                who,
                self.clock().now(),
                json!({"member": who.id}),
                None,
            ))
            .await?;
        }
        Ok(())
    }

    /// Removes `member` (a principal id) from the room. People who decide only.
    pub async fn kick(&self, who: &Decider, room: &str, member: &str) -> Result<(), GateError> {
        let room = self.existing_room(room).await?;
        if !self
            .store()
            .doc_delete(MEMBER, &format!("{}/{member}", room.name))
            .await?
        {
            return Err(GateError::NotFound(format!(
                "member {member} of room {}",
                room.name
            )));
        }
        self.append(room_event(
            EventKind::MemberKicked,
            &room.name,
            who.principal(),
            self.clock().now(),
            json!({"member": member}),
            None,
        ))
        .await?;
        Ok(())
    }

    pub async fn set_presence(
        &self,
        who: &Principal,
        room: &str,
        status: Presence,
        note: Option<String>,
    ) -> Result<Member, GateError> {
        let room = self.open_room(who, room).await?;
        let note = note.map(|n| rooms::message_text("note", &n)).transpose()?;
        let member = self
            .touch_member(who, &room.name, Some(status), note.clone())
            .await?;
        self.append(room_event(
            EventKind::PresenceSet,
            &room.name,
            who,
            self.clock().now(),
            json!({"member": who.id, "status": status}),
            note.map(|n| json!({"note": n})),
        ))
        .await?;
        Ok(member)
    }

    // ---- messages -------------------------------------------------------------------

    /// Posts a message (note, question, progress, done). Blockers have their own tool.
    pub async fn post_message(
        &self,
        who: &Principal,
        room: &str,
        text: &str,
        kind: &str,
    ) -> Result<MessageView, GateError> {
        let kind = MessageType::parse_postable(kind)?;
        self.post(who, room, text, kind, None).await
    }

    async fn post(
        &self,
        who: &Principal,
        room: &str,
        text: &str,
        kind: MessageType,
        reference: Option<&str>,
    ) -> Result<MessageView, GateError> {
        let text = rooms::message_text("text", text)?;
        let room = self.open_room(who, room).await?;
        let status = match kind {
            MessageType::Question => Some(Presence::Waiting),
            MessageType::Blocker => Some(Presence::Blocked),
            MessageType::Done => Some(Presence::Done),
            MessageType::Progress => Some(Presence::Working),
            _ => None,
        };
        if who.role == Role::Agent {
            self.touch_member(who, &room.name, status, None).await?;
        }
        let now = self.clock().now();
        let seq = self
            .append(message_event(&room.name, kind, &text, who, now, reference))
            .await?;
        Ok(MessageView {
            id: format!("m{seq}"),
            seq,
            kind: kind.as_str().into(),
            author_id: Some(who.id.clone()),
            author: Some(who.display_name.clone()),
            text: Some(text),
            at: now.to_string(),
            reference: reference.map(str::to_string),
            open: matches!(kind, MessageType::Question | MessageType::Blocker).then_some(true),
        })
    }

    /// A room's messages after `since` (a seq), oldest first, at most `limit`.
    pub async fn messages(
        &self,
        room: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        let events: Vec<StoredEvent> = self
            .store()
            .events_of_subject(&rooms::subject(&room))
            .await?;
        let closed: BTreeSet<String> = events
            .iter()
            .filter(|e| {
                matches!(
                    e.entry.kind,
                    EventKind::QuestionAnswered | EventKind::BlockerResolved
                )
            })
            .filter_map(|e| {
                e.entry
                    .data
                    .get("ref")
                    .and_then(|r| r.as_str())
                    .map(str::to_string)
            })
            .collect();
        let wanted: Vec<&StoredEvent> = events
            .iter()
            .filter(|e| e.seq > since && !matches!(e.entry.kind, EventKind::PresenceSet))
            .take(limit)
            .collect();
        let seqs: Vec<u64> = wanted.iter().map(|e| e.seq).collect();
        let payloads = self.store().payloads(&seqs).await?;
        Ok(wanted
            .into_iter()
            .map(|e| {
                let data = &e.entry.data;
                let kind = match e.entry.kind {
                    EventKind::MessagePosted => data
                        .get("type")
                        .and_then(|t| t.as_str())
                        .unwrap_or("note")
                        .to_string(),
                    EventKind::QuestionAnswered => "answer".into(),
                    EventKind::BlockerResolved => "resolution".into(),
                    other => other.as_str().into(),
                };
                let text = payloads.get(&e.seq).and_then(|p| {
                    p.payload
                        .get("text")
                        .or_else(|| p.payload.get("reply"))
                        .and_then(|t| t.as_str())
                        .map(str::to_string)
                });
                let id = format!("m{}", e.seq);
                let open =
                    matches!(kind.as_str(), "question" | "blocker").then(|| !closed.contains(&id));
                MessageView {
                    author_id: e.entry.actor.clone(),
                    author: data
                        .get("author")
                        .and_then(|a| a.get("display_name"))
                        .and_then(|n| n.as_str())
                        .map(str::to_string)
                        .or_else(|| e.entry.actor.clone()),
                    id,
                    seq: e.seq,
                    text,
                    at: e.entry.at.to_string(),
                    reference: data.get("ref").and_then(|r| r.as_str()).map(str::to_string),
                    open,
                    kind,
                }
            })
            .collect())
    }

    /// Waits for a message after `since` (by anyone), up to `timeout`; returns the new
    /// messages (empty when the time ran out). Woken by the message itself.
    pub async fn wait_for_message(
        &self,
        room: &str,
        since: u64,
        timeout: Duration,
    ) -> Result<Vec<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        self.existing_room(&room).await?;
        let mut watch = self.feed().watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        loop {
            let new = self.messages(&room, since, 100).await?;
            let new: Vec<MessageView> = new
                .into_iter()
                .filter(|m| !m.kind.starts_with("member_") && m.kind != "room_created")
                .collect();
            if !new.is_empty() {
                return Ok(new);
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                _ = self.stopping() => return Ok(Vec::new()),
            }
        }
    }

    // ---- questions and blockers -----------------------------------------------------

    /// A question's or blocker's message, checked to be of that kind in that room.
    async fn gate_message(
        &self,
        room: &str,
        id: &str,
        kind: &str,
    ) -> Result<(String, MessageView), GateError> {
        let room = rooms::room_name(room)?;
        let seq = seq_of(id).ok_or_else(|| {
            GateError::BadInput(format!("{id:?} is not a message id (m<number>)"))
        })?;
        let mut messages = self.messages(&room, seq - 1, 1).await?;
        match messages.pop() {
            Some(m) if m.seq == seq && m.kind == kind => Ok((room, m)),
            _ => Err(GateError::NotFound(format!("{kind} {id} in room {room}"))),
        }
    }

    /// Closes question or blocker `asked` with `event` (its answer or resolution), once:
    /// `already` is the error when someone closed it first. The asking agent, if it still
    /// shows as waiting on it, goes back to working.
    async fn close_gate(
        &self,
        room: &str,
        asked: &MessageView,
        event: countersign_core::Event,
        already: String,
    ) -> Result<MessageView, GateError> {
        if asked.open == Some(false) {
            return Err(GateError::BadInput(already));
        }
        let now = self.clock().now();
        let marker = to_doc(
            CLOSED,
            &format!("{room}/{}", asked.id),
            1,
            &json!({"ref": asked.id}),
            now,
        )?;
        match self
            .store()
            .doc_insert(&marker, Some(&event.seal(new_salt()?)))
            .await
        {
            Ok(()) => self.feed().poke(),
            Err(StoreError::Duplicate(_)) => return Err(GateError::BadInput(already)),
            Err(e) => return Err(e.into()),
        }
        let reply = self
            .messages(room, asked.seq, usize::MAX)
            .await?
            .into_iter()
            .find(|m| {
                matches!(m.kind.as_str(), "answer" | "resolution")
                    && m.reference.as_deref() == Some(asked.id.as_str())
            })
            .ok_or_else(|| {
                GateError::Store(StoreError::Unavailable(format!(
                    "the reply to {} was stored but cannot be read back",
                    asked.id
                )))
            })?;
        if let Some(agent) = &asked.author_id {
            let waiting = if asked.kind == "blocker" {
                Presence::Blocked
            } else {
                Presence::Waiting
            };
            self.release_member(room, agent, waiting).await?;
        }
        Ok(reply)
    }

    /// Moves member `id` from `from` back to working (without counting it as the agent's
    /// own activity). A member who has moved on, or left, is left alone.
    async fn release_member(&self, room: &str, id: &str, from: Presence) -> Result<(), GateError> {
        let key = format!("{room}/{id}");
        for _ in 0..20 {
            let Some(doc) = self.store().doc_get(MEMBER, &key).await? else {
                return Ok(());
            };
            let mut member: Member = from_doc(&doc)?;
            if member.status != from {
                return Ok(());
            }
            member.status = Presence::Working;
            match self
                .store()
                .doc_update(
                    &to_doc(MEMBER, &key, doc.version + 1, &member, self.clock().now())?,
                    None,
                )
                .await
            {
                Ok(()) => {
                    self.feed().poke();
                    return Ok(());
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// A person answers an agent's question.
    pub async fn answer_question(
        &self,
        who: &Decider,
        room: &str,
        question: &str,
        text: &str,
    ) -> Result<MessageView, GateError> {
        let (room, asked) = self.gate_message(room, question, "question").await?;
        let text = rooms::message_text("text", text)?;
        let event = room_event(
            EventKind::QuestionAnswered,
            &room,
            who.principal(),
            self.clock().now(),
            json!({"ref": question, "author": {"id": who.principal().id, "display_name": who.principal().display_name}}),
            Some(json!({"text": text})),
        );
        self.close_gate(
            &room,
            &asked,
            event,
            format!("question {question} was already answered"),
        )
        .await
    }

    /// A person resolves an agent's blocker with a reply. Never an agent: the `Decider`
    /// type makes that impossible to call with one.
    pub async fn resolve_blocker(
        &self,
        who: &Decider,
        room: &str,
        blocker: &str,
        reply: &str,
    ) -> Result<MessageView, GateError> {
        let (room, asked) = self.gate_message(room, blocker, "blocker").await?;
        let reply = rooms::message_text("reply", reply)?;
        let event = room_event(
            EventKind::BlockerResolved,
            &room,
            who.principal(),
            self.clock().now(),
            json!({"ref": blocker, "author": {"id": who.principal().id, "display_name": who.principal().display_name}}),
            Some(json!({"reply": reply})),
        );
        self.close_gate(
            &room,
            &asked,
            event,
            format!("blocker {blocker} was already resolved"),
        )
        .await
    }

    /// Waits up to `timeout` for the answer or resolution of message `id` (a question
    /// or blocker); `None` when none came.
    pub async fn wait_for_reply(
        &self,
        room: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        let seq = seq_of(id).ok_or_else(|| {
            GateError::BadInput(format!("{id:?} is not a message id (m<number>)"))
        })?;
        let mut watch = self.feed().watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        loop {
            let reply = self
                .messages(&room, seq, usize::MAX)
                .await?
                .into_iter()
                .find(|m| {
                    matches!(m.kind.as_str(), "answer" | "resolution")
                        && m.reference.as_deref() == Some(id)
                });
            if reply.is_some() {
                return Ok(reply);
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
                _ = self.stopping() => return Ok(None),
            }
        }
    }

    /// Shows an approval request in its room.
    pub(crate) async fn post_approval(
        &self,
        who: &Principal,
        room: &str,
        request: &countersign_core::ApprovalRequest,
    ) -> Result<(), GateError> {
        self.post(
            who,
            room,
            &request.action.description,
            MessageType::Approval,
            Some(&request.id),
        )
        .await?;
        Ok(())
    }

    /// Reports a blocker: the agent stops until a person resolves it.
    pub async fn report_blocker(
        &self,
        who: &Principal,
        room: &str,
        description: &str,
    ) -> Result<MessageView, GateError> {
        self.post(who, room, description, MessageType::Blocker, None)
            .await
    }

    /// Asks a question and waits up to `timeout` for a person's answer (a soft gate).
    pub async fn ask(
        &self,
        who: &Principal,
        room: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<(MessageView, Option<MessageView>), GateError> {
        let asked = self
            .post(who, room, question, MessageType::Question, None)
            .await?;
        let answer = self.wait_for_reply(room, &asked.id, timeout).await?;
        if answer.is_some() {
            self.touch_member(who, &rooms::room_name(room)?, Some(Presence::Working), None)
                .await?;
        }
        Ok((asked, answer))
    }

    /// What waits for a person in each room: pending approvals shown there, open
    /// questions, open blockers.
    pub async fn attention(&self) -> Result<BTreeMap<String, Attention>, GateError> {
        let mut out = BTreeMap::new();
        for room in self
            .rooms()
            .await?
            .into_iter()
            .filter(|r| r.deleted_at.is_none())
        {
            let messages = self.messages(&room.name, 0, usize::MAX).await?;
            let mut attention = Attention::default();
            for m in &messages {
                match (m.kind.as_str(), m.open) {
                    ("question", Some(true)) => attention.questions += 1,
                    ("blocker", Some(true)) => attention.blockers += 1,
                    _ => {}
                }
            }
            out.insert(room.name.clone(), attention);
        }
        for request in self
            .store()
            .list_requests(&countersign_store::RequestQuery {
                status: Some(countersign_core::Status::Pending),
                requested_by: None,
                limit: 10_000,
            })
            .await?
        {
            if let Some(room) = &request.room
                && let Some(a) = out.get_mut(room)
                && !request.is_past_expiry(self.clock().now())
            {
                a.approvals += 1;
            }
        }
        Ok(out)
    }
}
