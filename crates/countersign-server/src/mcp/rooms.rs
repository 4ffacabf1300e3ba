//! Room tools: post, read and wait for messages, join and leave, presence, the soft gate
//! (`wait_for_feedback`) and the hard one (`report_blocker`, `wait_for_resolution`),
//! and, for people who decide, removing a member.

use countersign_core::rooms::{Member, MessageView, Room, next_since};
use countersign_core::{Decider, Principal};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{McpService, ToolError};
use crate::error::GateError;
use crate::gate::wait_time;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessageInput {
    /// The room's name (created on first use), e.g. "release-train".
    pub room: String,
    pub text: String,
    /// note (default), question, progress or done. Blockers go through report_blocker.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadMessagesInput {
    pub room: String,
    /// Only messages after this seq (the `next_since` of a previous read).
    #[serde(default)]
    pub since: Option<u64>,
    /// At most this many (default 50, max 500).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitMessageInput {
    pub room: String,
    #[serde(default)]
    pub since: Option<u64>,
    /// Seconds to wait (default 30, max 300).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Wake only for messages of others that mention you (`@your-name`: your token's
    /// name, or your username); the others are read past (`next_since` moves beyond
    /// them).
    #[serde(default)]
    pub mentions_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MessagesOutput {
    pub messages: Vec<MessageView>,
    /// Pass as `since` to read or wait for what comes next.
    pub next_since: u64,
    /// True when a wait ended without a new message.
    pub timed_out: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoomInput {
    pub room: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MemberView {
    pub id: String,
    pub display_name: String,
    /// working, waiting, blocked, done or idle.
    pub status: String,
    pub note: Option<String>,
    pub last_activity: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RoomOutput {
    pub room: String,
    pub title: String,
    pub members: Vec<MemberView>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresenceInput {
    pub room: String,
    /// working, waiting, blocked, done or idle.
    pub status: String,
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackInput {
    pub room: String,
    pub question: String,
    /// Seconds to wait for an answer before proceeding (default 30, max 300).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FeedbackOutput {
    pub question_id: String,
    pub answered: bool,
    pub answer: Option<String>,
    pub answered_by: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BlockerInput {
    pub room: String,
    /// What stops you, and what you need from a person.
    pub description: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BlockerOutput {
    pub blocker_id: String,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolutionInput {
    pub room: String,
    pub blocker_id: String,
    /// Seconds to wait (default 45, max 300). Call again to keep waiting.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ResolutionOutput {
    pub blocker_id: String,
    pub resolved: bool,
    pub reply: Option<String>,
    pub resolved_by: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestrictInput {
    pub room: String,
    /// Who besides you (its creator) and the people who decide may join, read and
    /// post: principal ids (token:deploy-bot, user:alice) and group:<name>s from the
    /// server's [groups]. An empty list opens the room to anyone again.
    pub allowed: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RestrictOutput {
    pub room: String,
    /// Empty: the room is open to anyone.
    pub allowed: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KickInput {
    pub room: String,
    /// The member's id, as listed by join_room (e.g. token:deploy-bot).
    pub member: String,
}

fn messages_output(messages: Vec<MessageView>, since: u64, timed_out: bool) -> MessagesOutput {
    MessagesOutput {
        next_since: next_since(&messages, since).max(since),
        messages,
        timed_out,
    }
}

#[tool_router(router = rooms_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Post a message to a room where people and other agents follow the work: type note (default), question, progress or done. To stop until a person helps, use report_blocker; to ask and wait briefly, wait_for_feedback.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn post_message(
        &self,
        Parameters(input): Parameters<PostMessageInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MessageView>, ToolError> {
        let who = self.caller(&ctx)?;
        let message = self
            .gate
            .rooms()
            .post_message(
                &who,
                &input.room,
                &input.text,
                input.kind.as_deref().unwrap_or("note"),
            )
            .await?;
        Ok(Json(message))
    }

    #[tool(
        description = "Read a room's messages, oldest first; pass next_since back as since to read what comes next.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_messages(
        &self,
        Parameters(input): Parameters<ReadMessagesInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MessagesOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let since = input.since.unwrap_or(0);
        let messages = self
            .gate
            .rooms()
            .read(
                &who,
                &input.room,
                since,
                input.limit.unwrap_or(50).clamp(1, 500),
            )
            .await?;
        Ok(Json(messages_output(messages, since, false)))
    }

    #[tool(
        description = "Wait until a new message arrives in a room (after since), or until timeout_seconds pass (default 30, max 300). Returns the moment a message is posted. With mentions_only, only a message that mentions you (@your-name) ends the wait.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_message(
        &self,
        Parameters(input): Parameters<WaitMessageInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MessagesOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let _open = self.gate.hold_wait(&who)?;
        let timeout = wait_time(input.timeout_seconds, 30)?;
        let since = input.since.unwrap_or(0);
        let (messages, read) = self
            .gate
            .rooms()
            .wait_for_message(&who, &input.room, since, timeout, input.mentions_only)
            .await?;
        let timed_out = messages.is_empty();
        Ok(Json(messages_output(messages, read, timed_out)))
    }

    #[tool(
        description = "Join a room (created if it does not exist) and see who is in it.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn join_room(
        &self,
        Parameters(input): Parameters<RoomInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let (room, _) = self.gate.rooms().join(&who, &input.room).await?;
        self.room_output(&who, room).await
    }

    #[tool(
        description = "Leave a room.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn leave_room(
        &self,
        Parameters(input): Parameters<RoomInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        self.gate.rooms().leave(&who, &input.room).await?;
        let room = self
            .gate
            .rooms()
            .room(&input.room)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("room {}", input.room)))?;
        self.room_output(&who, room).await
    }

    #[tool(
        description = "Say what you are doing in a room: working, waiting, blocked, done or idle (with an optional note). People see it in the room's roster.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn set_presence(
        &self,
        Parameters(input): Parameters<PresenceInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MemberView>, ToolError> {
        let who = self.caller(&ctx)?;
        let status = input.status.parse()?;
        let member = self
            .gate
            .rooms()
            .set_presence(&who, &input.room, status, input.note)
            .await?;
        Ok(Json(member_view(&member)))
    }

    #[tool(
        description = "Ask the people in a room a question and wait up to timeout_seconds (default 30) for an answer. A soft gate: if nobody answers in time, you get answered=false and may proceed with your best judgement.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn wait_for_feedback(
        &self,
        Parameters(input): Parameters<FeedbackInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FeedbackOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let timeout = wait_time(input.timeout_seconds, 30)?;
        let (asked, answer) = self
            .gate
            .rooms()
            .ask(&who, &input.room, &input.question, timeout)
            .await?;
        Ok(Json(match answer {
            Some(a) => FeedbackOutput {
                question_id: asked.id,
                answered: true,
                message: format!("{} answered.", a.author.clone().unwrap_or_default()),
                answer: a.text,
                answered_by: a.author,
            },
            None => FeedbackOutput {
                question_id: asked.id,
                answered: false,
                answer: None,
                answered_by: None,
                message: format!(
                    "No answer within {} seconds: you may proceed with your best judgement. The question stays open in the room.",
                    timeout.as_secs()
                ),
            },
        }))
    }

    #[tool(
        description = "Report that you are blocked and need a person. STOP working on the blocked task: call wait_for_resolution with the blocker_id until a person resolves it. Only a person can resolve a blocker.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn report_blocker(
        &self,
        Parameters(input): Parameters<BlockerInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<BlockerOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let blocker = self
            .gate
            .rooms()
            .report_blocker(&who, &input.room, &input.description)
            .await?;
        Ok(Json(BlockerOutput {
            message: format!(
                "Blocked. Do not continue the blocked work: call wait_for_resolution with room {} and blocker_id {} until a person resolves it.",
                input.room, blocker.id
            ),
            blocker_id: blocker.id,
        }))
    }

    #[tool(
        description = "Restrict a room you created (admins: any room) to named agents, people and groups; others are then refused. An empty list opens it again.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn restrict_room(
        &self,
        Parameters(input): Parameters<RestrictInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RestrictOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let room = self
            .gate
            .rooms()
            .restrict(&who, &input.room, &input.allowed)
            .await?;
        Ok(Json(RestrictOutput {
            room: room.name,
            allowed: room.allowed,
        }))
    }

    #[tool(
        description = "Wait until a person resolves your blocker (or timeout_seconds pass, default 45, max 300; call again to keep waiting). Returns their reply.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_resolution(
        &self,
        Parameters(input): Parameters<ResolutionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ResolutionOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let _open = self.gate.hold_wait(&who)?;
        let timeout = wait_time(input.timeout_seconds, 45)?;
        let reply = self
            .gate
            .rooms()
            .wait_for_reply(&who, &input.room, &input.blocker_id, timeout)
            .await?;
        Ok(Json(match reply {
            Some(r) => ResolutionOutput {
                blocker_id: input.blocker_id,
                resolved: true,
                message: "Resolved: follow the reply, then continue.".into(),
                reply: r.text,
                resolved_by: r.author,
            },
            None => ResolutionOutput {
                blocker_id: input.blocker_id,
                resolved: false,
                reply: None,
                resolved_by: None,
                message: "Still blocked: do not continue; call wait_for_resolution again.".into(),
            },
        }))
    }
}

#[tool_router(router = room_admin_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Room admin: remove a member from a room.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn kick(
        &self,
        Parameters(input): Parameters<KickInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let decider = Decider::new(who.clone())?;
        self.gate
            .rooms()
            .kick(&decider, &input.room, &input.member)
            .await?;
        let room = self
            .gate
            .rooms()
            .room(&input.room)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("room {}", input.room)))?;
        self.room_output(&who, room).await
    }
}

fn member_view(m: &Member) -> MemberView {
    MemberView {
        id: m.id.clone(),
        display_name: m.display_name.clone(),
        status: match serde_json::to_value(m.status) {
            Ok(serde_json::Value::String(s)) => s,
            _ => String::new(),
        },
        note: m.note.clone(),
        last_activity: m.last_activity.to_string(),
    }
}

impl McpService {
    /// A room and, when `who` may use it, its members.
    async fn room_output(
        &self,
        who: &Principal,
        room: Room,
    ) -> Result<Json<RoomOutput>, ToolError> {
        let rooms = self.gate.rooms();
        let members = if room.admits(who, rooms.groups()) {
            rooms.members(&room.name).await?
        } else {
            Vec::new()
        };
        Ok(Json(RoomOutput {
            room: room.name,
            title: room.title,
            members: members.iter().map(member_view).collect(),
        }))
    }
}
