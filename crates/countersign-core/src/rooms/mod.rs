//! Rooms where agents work under a human's eye: messages, presence, and two more gates
//! besides approvals — questions (a soft gate: the agent proceeds after a timeout) and
//! blockers (a hard gate: only a human resolves one). Every message and every human
//! answer is a log event about the room (subject `room:<name>`), so the room's history
//! is as tamper-evident as the approvals, and waiting agents are woken by the same feed.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::CoreError;
use crate::event::{Event, EventKind};
use crate::principal::Principal;
use crate::time::Timestamp;

mod history;
pub mod mentions;
mod room;

pub use history::{
    Attention, MessageView, is_chatter, message_seqs, messages, next_since, reply_to, seq_of,
};
pub use room::{ACTIVITY_EVERY_MS, Member, Room, roster_order};

/// Longest message text, in bytes.
pub const MAX_TEXT_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageType {
    Note,
    Question,
    Progress,
    Done,
    /// Only through `report_blocker`.
    Blocker,
    /// An approval request shown in the room.
    Approval,
}

impl MessageType {
    pub fn as_str(&self) -> &'static str {
        match self {
            MessageType::Note => "note",
            MessageType::Question => "question",
            MessageType::Progress => "progress",
            MessageType::Done => "done",
            MessageType::Blocker => "blocker",
            MessageType::Approval => "approval",
        }
    }

    /// What posting this says about its author: a question waits, a blocker blocks.
    pub fn presence(&self) -> Option<Presence> {
        match self {
            MessageType::Question => Some(Presence::Waiting),
            MessageType::Blocker => Some(Presence::Blocked),
            MessageType::Done => Some(Presence::Done),
            MessageType::Progress => Some(Presence::Working),
            MessageType::Note | MessageType::Approval => None,
        }
    }

    /// The types `post_message` accepts; the others come from their own tools.
    pub fn parse_postable(text: &str) -> Result<Self, CoreError> {
        match text {
            "note" => Ok(MessageType::Note),
            "question" => Ok(MessageType::Question),
            "progress" => Ok(MessageType::Progress),
            "done" => Ok(MessageType::Done),
            "blocker" => Err(CoreError::invalid(
                "type",
                "blockers are reported with report_blocker, which stops the agent until a human resolves it",
            )),
            "approval" => Err(CoreError::invalid(
                "type",
                "approvals are asked with request_approval (with a room), not posted",
            )),
            other => Err(CoreError::invalid(
                "type",
                format!("{other:?} is not one of note, question, progress, done"),
            )),
        }
    }
}

/// What an agent says it is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    Working,
    Waiting,
    Blocked,
    Done,
    Idle,
}

impl std::str::FromStr for Presence {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "working" => Presence::Working,
            "waiting" => Presence::Waiting,
            "blocked" => Presence::Blocked,
            "done" => Presence::Done,
            "idle" => Presence::Idle,
            other => {
                return Err(CoreError::invalid(
                    "status",
                    format!("{other:?} is not one of working, waiting, blocked, done, idle"),
                ));
            }
        })
    }
}

impl Presence {
    /// Roster order: what needs a human first (waiting > blocked > done > working > idle).
    pub fn rank(&self) -> u8 {
        match self {
            Presence::Waiting => 0,
            Presence::Blocked => 1,
            Presence::Done => 2,
            Presence::Working => 3,
            Presence::Idle => 4,
        }
    }
}

/// A room name: the handle agents and links use (`?room=<name>`).
pub fn room_name(name: &str) -> Result<String, CoreError> {
    let name = name.trim().to_ascii_lowercase();
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(name)
    } else {
        Err(CoreError::invalid(
            "room",
            format!("{name:?} is not a room name (1 to 64 of a-z, 0-9, - _ .)"),
        ))
    }
}

pub fn room_title(title: &str) -> Result<String, CoreError> {
    let title = title.trim();
    if title.is_empty() || title.len() > 128 || title.chars().any(char::is_control) {
        return Err(CoreError::invalid(
            "title",
            "must be 1 to 128 printable characters",
        ));
    }
    Ok(title.to_string())
}

pub fn message_text(field: &str, text: &str) -> Result<String, CoreError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(CoreError::invalid(field, "must not be empty"));
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(CoreError::invalid(
            field,
            format!(
                "is {} bytes; at most {MAX_TEXT_BYTES} are allowed",
                text.len()
            ),
        ));
    }
    Ok(text.to_string())
}

/// The subject of a room's events.
pub fn subject(room: &str) -> String {
    format!("room:{room}")
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// An event about `room`, with public `data` and an optional committed `payload`.
pub fn room_event(
    kind: EventKind,
    room: &str,
    by: &Principal,
    at: Timestamp,
    data: Value,
    payload: Option<Value>,
) -> Event {
    let mut data = object(data);
    data.insert("room".into(), json!(room));
    Event {
        kind,
        at,
        actor: Some(by.id.clone()),
        subject: Some(subject(room)),
        data,
        payload,
    }
}

/// A member's arrival, departure or removal (`member` is its principal id; `by` who did
/// it).
pub fn member_event(
    kind: EventKind,
    room: &str,
    by: &Principal,
    member: &str,
    at: Timestamp,
) -> Event {
    room_event(kind, room, by, at, json!({"member": member}), None)
}

/// What a member says it is doing, with an optional note (committed, like a message).
pub fn presence_event(
    room: &str,
    by: &Principal,
    status: Presence,
    note: Option<&str>,
    at: Timestamp,
) -> Event {
    room_event(
        EventKind::PresenceSet,
        room,
        by,
        at,
        json!({"member": by.id, "status": status}),
        note.map(|n| json!({"note": n})),
    )
}

/// A message in a room: its type, author and (committed) text.
pub fn message_event(
    room: &str,
    kind: MessageType,
    text: &str,
    by: &Principal,
    at: Timestamp,
    reference: Option<&str>,
) -> Event {
    room_event(
        EventKind::MessagePosted,
        room,
        by,
        at,
        json!({
            "type": kind,
            "author": {"id": by.id, "display_name": by.display_name, "role": by.role},
            "ref": reference,
        }),
        Some(json!({"text": text})),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    #[test]
    fn names_types_and_texts_are_checked() {
        assert_eq!(room_name(" Release-Train ").unwrap(), "release-train");
        assert!(room_name("no spaces").is_err());
        assert!(room_name("").is_err());
        assert!(
            MessageType::parse_postable("blocker")
                .unwrap_err()
                .to_string()
                .contains("report_blocker")
        );
        assert!(MessageType::parse_postable("shout").is_err());
        assert_eq!(
            MessageType::parse_postable("progress").unwrap(),
            MessageType::Progress
        );
        assert!(message_text("text", &"x".repeat(MAX_TEXT_BYTES + 1)).is_err());
        assert!(message_text("text", "  ").is_err());
    }

    #[test]
    fn messages_commit_their_text() {
        let agent = Principal::from_token("bot", Role::Agent);
        let at = Timestamp::from_millis(0).unwrap();
        let event = message_event(
            "ops",
            MessageType::Question,
            "May I deploy?",
            &agent,
            at,
            None,
        );
        assert_eq!(event.subject.as_deref(), Some("room:ops"));
        assert_eq!(event.data["type"], "question");
        let sealed = event.seal([1; 32]);
        assert!(!String::from_utf8(sealed.bytes).unwrap().contains("deploy"));
    }

    #[test]
    fn roster_order_puts_humans_work_first() {
        let mut states = vec![
            Presence::Working,
            Presence::Done,
            Presence::Blocked,
            Presence::Waiting,
        ];
        states.sort_by_key(Presence::rank);
        assert_eq!(
            states,
            vec![
                Presence::Waiting,
                Presence::Blocked,
                Presence::Done,
                Presence::Working
            ]
        );
    }
}
