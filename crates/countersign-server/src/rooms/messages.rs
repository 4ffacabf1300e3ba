//! A room's messages: posting, reading and waiting, the two human gates (a question
//! answered, a blocker resolved, each exactly once), and what waits for a person.

use std::collections::BTreeMap;
use std::time::Duration;

use countersign_core::rooms::mentions;
use countersign_core::rooms::{
    self, Attention, MessageType, MessageView, Presence, Room, message_event, room_event,
};
use countersign_core::{ApprovalRequest, Decider, Event, EventKind, Principal, Role, Status};
use countersign_store::{Docs, RequestQuery, StoreError};
use serde_json::json;
use tokio::time::Instant;

use super::{ClosedDocs, Rooms};
use crate::error::GateError;
use crate::ids::new_salt;

/// The two kinds of message only a person can close: a question is answered, a blocker
/// resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HumanGate {
    Question,
    Blocker,
}

impl HumanGate {
    fn kind(self) -> &'static str {
        match self {
            HumanGate::Question => "question",
            HumanGate::Blocker => "blocker",
        }
    }
}

/// What an approval shown in a room says to a reader who neither decides nor asked for
/// it: the request's id, not its description.
pub const APPROVAL_SEEN_BY_OTHERS: &str =
    "approval requested (its description is shown to approvers and the requester only)";

/// `messages` as `who` may read them: the text of an approval shown in the room is the
/// requester's and the deciders' to read.
fn shown_to(who: &Principal, mut messages: Vec<MessageView>) -> Vec<MessageView> {
    if who.role.may_decide() {
        return messages;
    }
    for m in &mut messages {
        if m.kind == MessageType::Approval.as_str()
            && m.author_id.as_deref() != Some(who.id.as_str())
            && m.text.is_some()
        {
            m.text = Some(match &m.reference {
                Some(id) => format!("{id}: {APPROVAL_SEEN_BY_OTHERS}"),
                None => APPROVAL_SEEN_BY_OTHERS.to_string(),
            });
        }
    }
    messages
}

/// How many of a room's events one read takes at most.
const PAGE_EVENTS: usize = 500;

fn message_seq(id: &str) -> Result<u64, GateError> {
    // Messages count from m1, and the one before a message is read as `seq - 1`: m0
    // would overflow.
    rooms::seq_of(id).filter(|seq| *seq > 0).ok_or_else(|| {
        GateError::BadInput(format!("{id:?} is not a message id (m<number>, from m1)"))
    })
}

impl Rooms {
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
        // An approval is limited by the requests its agent may have pending instead.
        if kind != MessageType::Approval {
            self.rate.take(&who.id)?;
        }
        if who.role == Role::Agent {
            self.touch(who, &room.name, kind.presence(), None).await?;
        }
        let now = self.now();
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

    /// A room's messages after `since` as `who` may read them: refused when the room is
    /// restricted to others; an approval shown there reads as its request id only,
    /// unless `who` decides or asked for it.
    pub async fn read(
        &self,
        who: &Principal,
        room: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<MessageView>, GateError> {
        self.admitted(who, room).await?;
        Ok(shown_to(who, self.messages(room, since, limit).await?))
    }

    /// A room's messages after `since` (a seq), oldest first, at most `limit`. Reads
    /// the room's events from `since` on, by index, never the history before it.
    pub(crate) async fn messages(
        &self,
        room: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        let mut out = Vec::new();
        let mut cursor = since;
        while out.len() < limit {
            let (page, read_to, more) = self.page_after(&room, cursor, limit - out.len()).await?;
            out.extend(page);
            cursor = read_to;
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// Up to `limit` messages after `after`, from one page of the room's events: the
    /// messages, the last seq read, and whether more events may follow.
    async fn page_after(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<(Vec<MessageView>, u64, bool), GateError> {
        let events = self
            .read_events(room, after, limit.clamp(1, PAGE_EVENTS))
            .await?;
        let Some(last) = events.last().map(|e| e.seq) else {
            return Ok((Vec::new(), after, false));
        };
        let more = events.len() >= limit.clamp(1, PAGE_EVENTS);
        let entries: Vec<(u64, &countersign_core::LogEntry)> =
            events.iter().map(|e| (e.seq, &e.entry)).collect();
        let payloads = self
            .store
            .payloads(&rooms::message_seqs(&entries, after, limit))
            .await?;
        let mut messages = rooms::messages(&entries, &payloads, after, limit);
        // A question's answer may lie beyond this page: whether it is still open is the
        // closing document's to say (written with the answer, in one transaction).
        let closed = Docs::<ClosedDocs>::new(&*self.store);
        for m in messages.iter_mut().filter(|m| m.open.is_some()) {
            m.open = Some(closed.get(&format!("{room}/{}", m.id)).await?.is_none());
        }
        // Cut at `limit` messages: continue after the last one returned.
        let read_to = if messages.len() >= limit {
            messages.last().map_or(last, |m| m.seq)
        } else {
            last
        };
        Ok((messages, read_to, more || read_to < last))
    }

    /// The room's events after `after`, at most `limit`, counted in [`Self::events_read`].
    pub(super) async fn read_events(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<countersign_store::StoredEvent>, GateError> {
        let events = self
            .store
            .events_of_subject_after(&rooms::subject(room), after, limit)
            .await?;
        self.events_read
            .fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(events)
    }

    /// The newest `limit` messages before seq `before` (`None`: the newest of all),
    /// oldest first, as `who` may read them: the end of a long room, and the page
    /// before it ("load older").
    pub async fn read_latest(
        &self,
        who: &Principal,
        room: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<MessageView>, GateError> {
        let room = self.admitted(who, room).await?.name;
        let mut before = before.unwrap_or(u64::MAX);
        let mut out: Vec<MessageView> = Vec::new();
        while out.len() < limit {
            let events = self
                .store
                .events_of_subject_before(&rooms::subject(&room), before, PAGE_EVENTS)
                .await?;
            self.events_read
                .fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let Some(first) = events.first().map(|e| e.seq) else {
                break;
            };
            let after = first.saturating_sub(1);
            let entries: Vec<(u64, &countersign_core::LogEntry)> =
                events.iter().map(|e| (e.seq, &e.entry)).collect();
            let seqs = rooms::message_seqs(&entries, after, usize::MAX);
            let payloads = self.store.payloads(&seqs).await?;
            let mut page = rooms::messages(&entries, &payloads, after, usize::MAX);
            let closed = Docs::<ClosedDocs>::new(&*self.store);
            for m in page.iter_mut().filter(|m| m.open.is_some()) {
                m.open = Some(closed.get(&format!("{room}/{}", m.id)).await?.is_none());
            }
            let keep = page.len().min(limit - out.len());
            let mut kept = page.split_off(page.len() - keep);
            kept.append(&mut out);
            out = kept;
            if events.len() < PAGE_EVENTS {
                break;
            }
            before = first;
        }
        Ok(shown_to(who, out))
    }

    /// Waits for a message after `since` (by anyone), up to `timeout`; returns the new
    /// messages (empty when the time ran out), as `who` may read them. Woken by the
    /// message itself; each wake reads only what came after what it read before.
    /// With `mentions_only`, only messages of others that mention `who` (`@name`, the
    /// grammar of [`countersign_core::rooms::mentions`]) end the wait; the others are
    /// read past. Returns the messages and how far the room was read (the `since` for
    /// the next call).
    pub async fn wait_for_message(
        &self,
        who: &Principal,
        room: &str,
        since: u64,
        timeout: Duration,
        mentions_only: bool,
    ) -> Result<(Vec<MessageView>, u64), GateError> {
        let room = rooms::room_name(room)?;
        self.admitted(who, &room).await?;
        let mut watch = self.feed.watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        let name = mentions::mention_name(who);
        let mut cursor = since;
        loop {
            let (page, read_to, more) = self.page_after(&room, cursor, 100).await?;
            cursor = read_to;
            let visible: Vec<MessageView> = page
                .into_iter()
                .filter(|m| !rooms::is_chatter(&m.kind))
                .collect();
            // Matched on the text as `who` is shown it: a redacted text mentions nobody.
            let new: Vec<MessageView> = shown_to(who, visible)
                .into_iter()
                .filter(|m| {
                    !mentions_only
                        || (m.author_id.as_deref() != Some(who.id.as_str())
                            && m.text
                                .as_deref()
                                .is_some_and(|t| mentions::mentions_name(t, name)))
                })
                .collect();
            // Without mentions_only, `since` moves only past messages returned, as before.
            let read = if mentions_only { cursor } else { since };
            if !new.is_empty() {
                return Ok((new, read));
            }
            if more {
                continue;
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok((Vec::new(), read)),
                _ = self.stopping.cancelled() => return Ok((Vec::new(), read)),
            }
        }
    }

    /// A question's or blocker's message, checked to be of that kind in that room.
    async fn gate_message(
        &self,
        room: &str,
        id: &str,
        gate: HumanGate,
    ) -> Result<(String, MessageView), GateError> {
        let room = rooms::room_name(room)?;
        let seq = message_seq(id)?;
        let mut messages = self.messages(&room, seq.saturating_sub(1), 1).await?;
        match messages.pop() {
            Some(m) if m.seq == seq && m.kind == gate.kind() => Ok((room, m)),
            _ => Err(GateError::NotFound(format!(
                "{} {id} in room {room}",
                gate.kind()
            ))),
        }
    }

    /// A person answers an agent's question, or resolves its blocker with a reply:
    /// once; whoever comes second is told it is closed. Never an agent: the `Decider`
    /// type makes that impossible to call with one. The asking agent, if it still shows
    /// as waiting on it, goes back to working.
    pub async fn close(
        &self,
        who: &Decider,
        room: &str,
        id: &str,
        gate: HumanGate,
        text: &str,
    ) -> Result<MessageView, GateError> {
        let (room, asked) = self.gate_message(room, id, gate).await?;
        let (field, kind, already, waiting) = match gate {
            HumanGate::Question => (
                "text",
                EventKind::QuestionAnswered,
                format!("question {id} was already answered"),
                Presence::Waiting,
            ),
            HumanGate::Blocker => (
                "reply",
                EventKind::BlockerResolved,
                format!("blocker {id} was already resolved"),
                Presence::Blocked,
            ),
        };
        let text = rooms::message_text(field, text)?;
        let by = who.principal();
        let event: Event = room_event(
            kind,
            &room,
            by,
            self.now(),
            json!({"ref": id, "author": {"id": by.id, "display_name": by.display_name}}),
            Some(json!({ field: text })),
        );
        if asked.open == Some(false) {
            return Err(GateError::BadInput(already));
        }
        match Docs::<ClosedDocs>::new(&*self.store)
            .insert(
                &format!("{room}/{}", asked.id),
                None,
                &json!({"ref": asked.id}),
                self.now(),
                Some(&event.seal(new_salt()?)),
            )
            .await
        {
            Ok(()) => self.feed.poke(),
            Err(StoreError::Duplicate(_)) => return Err(GateError::BadInput(already)),
            Err(e) => return Err(e.into()),
        }
        let reply = rooms::reply_to(
            self.messages(&room, asked.seq, usize::MAX).await?,
            &asked.id,
        )
        .ok_or_else(|| {
            GateError::Unavailable(format!(
                "the reply to {} was stored but cannot be read back",
                asked.id
            ))
        })?;
        if let Some(agent) = &asked.author_id {
            self.release(&room, agent, waiting).await?;
        }
        Ok(reply)
    }

    /// Waits up to `timeout` for the answer or resolution of message `id` (a question
    /// or blocker); `None` when none came.
    pub async fn wait_for_reply(
        &self,
        who: &Principal,
        room: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        self.admitted(who, &room).await?;
        let seq = message_seq(id)?;
        let mut watch = self.feed.watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        // From the question on, then only what is new on each wake.
        let mut cursor = seq;
        loop {
            loop {
                let (page, read_to, more) = self.page_after(&room, cursor, PAGE_EVENTS).await?;
                cursor = read_to;
                if let Some(reply) = rooms::reply_to(page, id) {
                    return Ok(shown_to(who, vec![reply]).into_iter().next());
                }
                if !more {
                    break;
                }
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
                _ = self.stopping.cancelled() => return Ok(None),
            }
        }
    }

    /// Shows an approval request in its room.
    pub(crate) async fn post_approval(
        &self,
        who: &Principal,
        room: &str,
        request: &ApprovalRequest,
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

    /// The open questions and blockers of `room`, from its tally: only the events
    /// after the last one counted are read (the first call in a process reads the
    /// room's history once).
    async fn open_gates(&self, room: &str) -> Result<Attention, GateError> {
        let mut tally = self.tally(room)?;
        loop {
            let events = self.read_events(room, tally.last_seq, PAGE_EVENTS).await?;
            for event in &events {
                tally.count(event.seq, &event.entry);
            }
            if events.len() < PAGE_EVENTS {
                break;
            }
        }
        let attention = tally.attention();
        self.keep_tally(room, tally)?;
        Ok(attention)
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
        let answer = self.wait_for_reply(who, room, &asked.id, timeout).await?;
        if answer.is_some() {
            self.touch(who, &rooms::room_name(room)?, Some(Presence::Working), None)
                .await?;
        }
        Ok((asked, answer))
    }

    /// What waits for a person in each of `listed` that is open: pending approvals
    /// shown there, open questions, open blockers.
    pub async fn attention(
        &self,
        listed: &[Room],
    ) -> Result<BTreeMap<String, Attention>, GateError> {
        let mut out = BTreeMap::new();
        for room in listed.iter().filter(|r| r.deleted_at.is_none()) {
            out.insert(room.name.clone(), self.open_gates(&room.name).await?);
        }
        let now = self.now();
        for request in self
            .store
            .list_requests(&RequestQuery {
                status: Some(Status::Pending),
                requested_by: None,
                limit: 10_000,
            })
            .await?
        {
            if let Some(room) = &request.room
                && let Some(a) = out.get_mut(room)
                && !request.is_past_expiry(now)
            {
                a.approvals += 1;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_count_from_one() {
        assert_eq!(message_seq("m1").ok(), Some(1));
        let err = message_seq("m0").err().map(|e| e.code());
        assert_eq!(err, Some("invalid_input"));
        assert!(message_seq("m18446744073709551615").is_ok());
        assert!(message_seq("x1").is_err());
    }
}
