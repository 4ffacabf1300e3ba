//! A room's messages: posting, reading and waiting, the two human gates (a question
//! answered, a blocker resolved, each exactly once), and what waits for a person.

use std::collections::BTreeMap;
use std::time::Duration;

use countersign_core::rooms::{
    self, Attention, MessageType, MessageView, Presence, message_event, room_event,
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

    /// A room's messages after `since` (a seq), oldest first, at most `limit`.
    pub async fn messages(
        &self,
        room: &str,
        since: u64,
        limit: usize,
    ) -> Result<Vec<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        let events = self.store.events_of_subject(&rooms::subject(&room)).await?;
        let entries: Vec<(u64, &countersign_core::LogEntry)> =
            events.iter().map(|e| (e.seq, &e.entry)).collect();
        let payloads = self
            .store
            .payloads(&rooms::message_seqs(&entries, since, limit))
            .await?;
        Ok(rooms::messages(&entries, &payloads, since, limit))
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
        self.existing(&room).await?;
        let mut watch = self.feed.watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        loop {
            let new: Vec<MessageView> = self
                .messages(&room, since, 100)
                .await?
                .into_iter()
                .filter(|m| !rooms::is_chatter(&m.kind))
                .collect();
            if !new.is_empty() {
                return Ok(new);
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                _ = self.stopping.cancelled() => return Ok(Vec::new()),
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
        room: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<MessageView>, GateError> {
        let room = rooms::room_name(room)?;
        let seq = message_seq(id)?;
        let mut watch = self.feed.watch(&rooms::subject(&room));
        let deadline = Instant::now() + timeout;
        loop {
            let reply = rooms::reply_to(self.messages(&room, seq, usize::MAX).await?, id);
            if reply.is_some() {
                return Ok(reply);
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
            self.touch(who, &rooms::room_name(room)?, Some(Presence::Working), None)
                .await?;
        }
        Ok((asked, answer))
    }

    /// What waits for a person in each open room: pending approvals shown there, open
    /// questions, open blockers.
    pub async fn attention(&self) -> Result<BTreeMap<String, Attention>, GateError> {
        let mut out = BTreeMap::new();
        for room in self
            .list()
            .await?
            .into_iter()
            .filter(|r| r.deleted_at.is_none())
        {
            let messages = self.messages(&room.name, 0, usize::MAX).await?;
            out.insert(room.name.clone(), Attention::of(&messages));
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
