//! Rooms over HTTP: one handler per operation, served under `/api/v1/rooms` (bearer
//! tokens) and `/ui/api/rooms` (dashboard sessions) alike. Answering, resolving and room
//! admin need an [`Approver`]; the rest any caller.

use axum::Json;
use countersign_core::rooms::{Member, MessageView, next_since};
use serde::Serialize;

use super::auth::{Approver, Caller};
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery};
use crate::error::GateError;
use crate::rooms::HumanGate;
use crate::views::RoomView;
#[derive(Debug, Serialize)]
pub(super) struct RoomList {
    rooms: Vec<RoomView>,
}

/// The rooms the caller may use, with what waits in each (people who decide: every
/// room).
pub(super) async fn list(Caller { gate, who, .. }: Caller) -> Result<Json<RoomList>, ApiError> {
    let rooms = gate.rooms();
    let listed = rooms.list_for(&who).await?;
    let attention = rooms.attention(&listed).await?;
    let rooms = listed
        .iter()
        .map(|r| RoomView {
            attention: Some(attention.get(&r.name).cloned().unwrap_or_default()),
            ..RoomView::new(r)
        })
        .collect();
    Ok(Json(RoomList { rooms }))
}

input!(CreateBody { name: String, #[serde(default)] title: Option<String> });

pub(super) async fn create(
    Caller { gate, who, .. }: Caller,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<RoomView>, ApiError> {
    let rooms = gate.rooms();
    if rooms.room(&body.name).await?.is_some() {
        return Err(GateError::BadInput(format!("room {} exists", body.name)).into());
    }
    let room = rooms
        .create(&who, &body.name, body.title.as_deref())
        .await?;
    Ok(Json(RoomView::new(&room)))
}

input!(MessagesParams {
    since: Option<u64>,
    limit: Option<usize>,
    /// The newest messages (before `before`, if given) instead of those after `since`.
    latest: Option<bool>,
    before: Option<u64>
});

#[derive(Debug, Serialize)]
pub(super) struct RoomMessages {
    room: RoomView,
    messages: Vec<MessageView>,
    next_since: u64,
    /// With `latest`: pass as `before` to load the page before these ("load older");
    /// absent when there is nothing older.
    #[serde(skip_serializing_if = "Option::is_none")]
    older_before: Option<u64>,
}

pub(super) async fn messages(
    Caller { gate, who, .. }: Caller,
    ApiPath(room): ApiPath<String>,
    ApiQuery(params): ApiQuery<MessagesParams>,
) -> Result<Json<RoomMessages>, ApiError> {
    let rooms = gate.rooms();
    let found = rooms.admitted(&who, &room).await?;
    let limit = params.limit.unwrap_or(200).clamp(1, 1000);
    if params.latest.unwrap_or(false) || params.before.is_some() {
        if params.since.is_some() {
            return Err(GateError::BadInput(
                "since reads forward, latest and before read backward: give one or the other"
                    .into(),
            )
            .into());
        }
        let messages = rooms
            .read_latest(&who, &found.name, params.before, limit)
            .await?;
        let older_before = match messages.first() {
            Some(first) if messages.len() == limit => Some(first.seq),
            _ => None,
        };
        let newest = messages.last().map(|m| m.seq);
        let next = match (params.before, newest) {
            // The newest page: new messages come after its last one.
            (None, Some(seq)) => seq,
            (None, None) => 0,
            (Some(before), _) => before.saturating_sub(1),
        };
        return Ok(Json(RoomMessages {
            room: RoomView::new(&found),
            next_since: next,
            older_before,
            messages,
        }));
    }
    let since = params.since.unwrap_or(0);
    let messages = rooms.read(&who, &found.name, since, limit).await?;
    Ok(Json(RoomMessages {
        room: RoomView::new(&found),
        next_since: next_since(&messages, since),
        older_before: None,
        messages,
    }))
}

input!(PostBody { text: String, #[serde(default, rename = "type")] kind: Option<String> });

pub(super) async fn post_message(
    Caller { gate, who, .. }: Caller,
    ApiPath(room): ApiPath<String>,
    ApiJson(body): ApiJson<PostBody>,
) -> Result<Json<MessageView>, ApiError> {
    let message = gate
        .rooms()
        .post_message(
            &who,
            &room,
            &body.text,
            body.kind.as_deref().unwrap_or("note"),
        )
        .await?;
    Ok(Json(message))
}

/// A room's members, to whoever the room admits.
pub(super) async fn members(
    Caller { gate, who, .. }: Caller,
    ApiPath(room): ApiPath<String>,
) -> Result<Json<MemberList>, ApiError> {
    gate.rooms().admitted(&who, &room).await?;
    let members = gate.rooms().members(&room).await?;
    Ok(Json(MemberList { members }))
}

/// Restricts a room to named principals and groups (an empty list opens it): its
/// creator or an admin.
pub(super) async fn restrict(
    Caller { gate, who, .. }: Caller,
    ApiPath(room): ApiPath<String>,
    ApiJson(AccessBody { allowed }): ApiJson<AccessBody>,
) -> Result<Json<RoomView>, ApiError> {
    Ok(Json(RoomView::new(
        &gate.rooms().restrict(&who, &room, &allowed).await?,
    )))
}

input!(AccessBody { allowed: Vec<String> });

input!(AnswerBody { text: String });
input!(ResolveBody { reply: String });

/// The body that closes a human gate: a question's answer, a blocker's reply.
pub(super) trait Closes: serde::de::DeserializeOwned + Send {
    const GATE: HumanGate;
    fn text(self) -> String;
}

impl Closes for AnswerBody {
    const GATE: HumanGate = HumanGate::Question;
    fn text(self) -> String {
        self.text
    }
}

impl Closes for ResolveBody {
    const GATE: HumanGate = HumanGate::Blocker;
    fn text(self) -> String {
        self.reply
    }
}

/// A person answers a question (`AnswerBody`) or resolves a blocker (`ResolveBody`).
pub(super) async fn close<B: Closes>(
    Approver { gate, decider, .. }: Approver,
    ApiPath((room, id)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<B>,
) -> Result<Json<MessageView>, ApiError> {
    let reply = gate
        .rooms()
        .close(&decider, &room, &id, B::GATE, &body.text())
        .await?;
    Ok(Json(reply))
}

input!(#[derive(Default)] AdminBody { #[serde(default)] title: Option<String> });

#[derive(Debug, Serialize)]
pub(super) struct AdminOutcome {
    room: RoomView,
    /// Where a purge wrote the room's backup.
    #[serde(skip_serializing_if = "Option::is_none")]
    backup: Option<String>,
}

pub(super) async fn admin(
    Approver { gate, decider, .. }: Approver,
    ApiPath((room, action)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<AdminBody>,
) -> Result<Json<AdminOutcome>, ApiError> {
    let rooms = gate.rooms();
    let (room, backup) = match action.as_str() {
        "rename" => {
            let title = body
                .title
                .ok_or_else(|| GateError::BadInput("rename needs a title".into()))?;
            (rooms.rename(&decider, &room, &title).await?, None)
        }
        "delete" => (rooms.trash(&decider, &room).await?, None),
        "restore" => (rooms.restore(&decider, &room).await?, None),
        "purge" => {
            let (purged, backup) = rooms.purge(&decider, &room).await?;
            (purged, Some(backup.display().to_string()))
        }
        other => {
            return Err(GateError::NotFound(format!(
                "room action {other} (rename, delete, restore, purge)"
            ))
            .into());
        }
    };
    Ok(Json(AdminOutcome {
        room: RoomView::new(&room),
        backup,
    }))
}

/// What `GET /rooms/{room}/members` answers.
#[derive(Debug, Serialize)]
pub(super) struct MemberList {
    members: Vec<Member>,
}
