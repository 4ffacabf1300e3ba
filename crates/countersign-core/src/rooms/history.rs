//! A room's history as people and agents read it: messages built from the room's log
//! events (with the texts their payloads open), which questions and blockers are still
//! open, the reply to one, and what waits for a person.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::event::{EventKind, LogEntry, PayloadOpening};

/// A message as readers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

impl Attention {
    /// The open questions and blockers among `messages` (approvals are counted from the
    /// pending requests, which the messages do not know).
    pub fn of(messages: &[MessageView]) -> Self {
        let mut attention = Attention::default();
        for m in messages {
            match (m.kind.as_str(), m.open) {
                ("question", Some(true)) => attention.questions += 1,
                ("blocker", Some(true)) => attention.blockers += 1,
                _ => {}
            }
        }
        attention
    }
}

/// The seq of a message id (`m<seq>`).
pub fn seq_of(message_id: &str) -> Option<u64> {
    message_id.strip_prefix('m').and_then(|s| s.parse().ok())
}

/// Membership and creation events: shown in the room, but not what a waiting agent
/// waits for.
pub fn is_chatter(kind: &str) -> bool {
    kind.starts_with("member_") || kind == "room_created"
}

fn shown<'a>(
    events: &'a [(u64, &'a LogEntry)],
    since: u64,
    limit: usize,
) -> impl Iterator<Item = &'a (u64, &'a LogEntry)> {
    events
        .iter()
        .filter(move |(seq, e)| *seq > since && !matches!(e.kind, EventKind::PresenceSet))
        .take(limit)
}

/// The seqs of the messages [`messages`] would build: the payloads to fetch.
pub fn message_seqs(events: &[(u64, &LogEntry)], since: u64, limit: usize) -> Vec<u64> {
    shown(events, since, limit).map(|(seq, _)| *seq).collect()
}

/// The messages after `since`, oldest first, at most `limit`, from all of a room's
/// events in order (`(seq, entry)`) and the openings of their payloads (a purged room's
/// texts are gone: `text` is then `None`).
pub fn messages(
    events: &[(u64, &LogEntry)],
    payloads: &BTreeMap<u64, PayloadOpening>,
    since: u64,
    limit: usize,
) -> Vec<MessageView> {
    let closed: BTreeSet<&str> = events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e.kind,
                EventKind::QuestionAnswered | EventKind::BlockerResolved
            )
        })
        .filter_map(|(_, e)| e.data.get("ref").and_then(|r| r.as_str()))
        .collect();
    shown(events, since, limit)
        .map(|(seq, e)| {
            let data = &e.data;
            let kind = match e.kind {
                EventKind::MessagePosted => data
                    .get("type")
                    .and_then(|t| t.as_str())
                    .unwrap_or("note")
                    .to_string(),
                EventKind::QuestionAnswered => "answer".into(),
                EventKind::BlockerResolved => "resolution".into(),
                other => other.as_str().into(),
            };
            let text = payloads.get(seq).and_then(|p| {
                p.payload
                    .get("text")
                    .or_else(|| p.payload.get("reply"))
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
            });
            let id = format!("m{seq}");
            let open = matches!(kind.as_str(), "question" | "blocker")
                .then(|| !closed.contains(id.as_str()));
            MessageView {
                author_id: e.actor.clone(),
                author: data
                    .get("author")
                    .and_then(|a| a.get("display_name"))
                    .and_then(|n| n.as_str())
                    .map(str::to_string)
                    .or_else(|| e.actor.clone()),
                id,
                seq: *seq,
                text,
                at: e.at.to_string(),
                reference: data.get("ref").and_then(|r| r.as_str()).map(str::to_string),
                open,
                kind,
            }
        })
        .collect()
}

/// Where a reader continues after `messages`, read after `since`: the last seq seen.
pub fn next_since(messages: &[MessageView], since: u64) -> u64 {
    messages.iter().map(|m| m.seq).max().unwrap_or(since)
}

/// The answer to question `id`, or the resolution of blocker `id`, among `messages`.
pub fn reply_to(messages: Vec<MessageView>, id: &str) -> Option<MessageView> {
    messages.into_iter().find(|m| {
        matches!(m.kind.as_str(), "answer" | "resolution") && m.reference.as_deref() == Some(id)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rooms::{MessageType, message_event, room_event};
    use crate::{Principal, Role, Timestamp};

    #[test]
    fn questions_stay_open_until_answered_and_texts_come_from_payloads() {
        let bot = Principal::from_token("bot", Role::Agent);
        let alice = Principal::user("alice", "Alice", Role::Approver);
        let at = Timestamp::from_millis(1_800_000_000_000).unwrap();
        let question = message_event("ops", MessageType::Question, "Deploy?", &bot, at, None);
        let presence = room_event(EventKind::PresenceSet, "ops", &bot, at, json!({}), None);
        let blocker = message_event("ops", MessageType::Blocker, "No key", &bot, at, None);
        let answer = room_event(
            EventKind::QuestionAnswered,
            "ops",
            &alice,
            at,
            json!({"ref": "m1", "author": {"id": alice.id, "display_name": "Alice"}}),
            Some(json!({"text": "Yes"})),
        );
        let sealed: Vec<_> = [&question, &presence, &blocker, &answer]
            .iter()
            .map(|e| (*e).clone().seal([7; 32]))
            .collect();
        let entries: Vec<LogEntry> = sealed.iter().map(|s| s.entry.clone()).collect();
        let events: Vec<(u64, &LogEntry)> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e))
            .collect();
        assert_eq!(
            message_seqs(&events, 0, 10),
            [1, 3, 4],
            "presence is not a message"
        );
        let payloads: BTreeMap<u64, PayloadOpening> = sealed
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.payload.clone().map(|o| (i as u64 + 1, o)))
            .filter(|(seq, _)| *seq != 3)
            .collect();
        let all = messages(&events, &payloads, 0, 10);
        let kinds: Vec<&str> = all.iter().map(|m| m.kind.as_str()).collect();
        assert_eq!(kinds, ["question", "blocker", "answer"]);
        assert_eq!(all[0].open, Some(false), "answered");
        assert_eq!(all[1].open, Some(true), "not resolved");
        assert_eq!(all[0].text.as_deref(), Some("Deploy?"));
        assert_eq!(all[1].text, None, "its payload is gone");
        assert_eq!(all[2].author.as_deref(), Some("Alice"));
        assert_eq!(
            Attention::of(&all),
            Attention {
                approvals: 0,
                questions: 0,
                blockers: 1
            }
        );
        assert_eq!(reply_to(all.clone(), "m1").map(|m| m.seq), Some(4));
        assert_eq!(reply_to(all, "m3"), None);
        assert_eq!(messages(&events, &payloads, 1, 1)[0].id, "m3");
        assert_eq!(seq_of("m42"), Some(42));
        assert_eq!(seq_of("42"), None);
        assert!(is_chatter("member_joined") && !is_chatter("note"));
    }
}
