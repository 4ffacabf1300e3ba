//! The chatroom profile: the agent chatroom's tools (shared/seeds/004), for agents
//! written for it. Its `request_approval` is a blocking gate, as the seed's is: the call
//! returns when a person decides or when `timeout_seconds` pass, and `timeout_seconds`
//! is both the request's expiry and the wait, so an unanswered request has timed out
//! when the call returns (it fails closed). The room tools are countersign's own, which
//! carry the seed's names (`post_message`, `read_messages`, `wait_for_message`,
//! `wait_for_feedback`, `report_blocker`, ...). Served by `countersign mcp --profile
//! chatroom` and at `/mcp/profile/chatroom`; docs/rooms.md.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};

use super::{McpService, ToolError};
use crate::error::GateError;
use crate::views::{ApprovalView, RequestApprovalInput};

/// The profile's name, in `--profile` and in its HTTP path.
pub const PROFILE: &str = "chatroom";

/// `timeout_seconds` when the agent gives none: five minutes.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 300;
/// The longest a blocking request may wait: a day. Longer waits belong to
/// `request_approval` + `wait_for_approval` of the native tools.
pub const MAX_TIMEOUT_SECONDS: u64 = 86_400;

/// The wait runs this much past the expiry, so that it ends on the timeout itself.
const GRACE: Duration = Duration::from_secs(2);

pub(super) const INSTRUCTIONS: &str = "countersign's chatroom profile. Before a dangerous or \
hard-to-undo action (deploy, delete, external call), call request_approval: it stops you \
until a person approves or rejects on the dashboard (or timeout_seconds pass). Act only if \
the status it returns is approved, only on exactly the approved details, and call \
record_action when you act; on any other status, do not act. Use the room tools to report \
progress (post_message), ask (wait_for_feedback, a soft gate) and stop on a blocker \
(report_blocker).";

/// The profile's rules for `timeout_seconds` (the wait and the expiry in one): 1 to
/// [`MAX_TIMEOUT_SECONDS`], [`DEFAULT_TIMEOUT_SECONDS`] when absent, and no
/// `timeout_hours`. Also for `request_approval` run as a task ([`super::tasks`]).
pub(super) fn timeout_checked(
    mut input: RequestApprovalInput,
) -> Result<RequestApprovalInput, GateError> {
    if input.timeout_hours.is_some() {
        return Err(GateError::BadInput(
            "the chatroom profile's request_approval takes timeout_seconds (the wait and the expiry in one), not timeout_hours".into(),
        ));
    }
    let seconds = input.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if seconds == 0 || seconds > MAX_TIMEOUT_SECONDS {
        return Err(GateError::BadInput(format!(
            "timeout_seconds is {seconds}; give 1 to {MAX_TIMEOUT_SECONDS}"
        )));
    }
    input.timeout_seconds = Some(seconds);
    Ok(input)
}

#[tool_router(router = chatroom_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        name = "request_approval",
        description = "Stop until a person approves or rejects this action, or until timeout_seconds pass (default 300, at most 86400): the call returns the decision (approved with a signed proof, rejected with the reason) or timed_out. timeout_seconds is also the request's expiry, so a request nobody answered is closed as timed_out: never act on anything but approved. Progress notifications are sent while waiting.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn request_approval_blocking(
        &self,
        Parameters(mut input): Parameters<RequestApprovalInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let who = self.caller(&ctx)?;
        input = timeout_checked(input)?;
        let seconds = input.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        let quorum = input.quorum();
        let requested = self
            .gate
            .request_approval_with(&who, input.into(), quorum)
            .await?;
        let id = requested.request.id.clone();
        let timeout = Duration::from_secs(seconds) + GRACE;
        let mut report = super::progress_reporter(&ctx, timeout.as_secs_f64());
        let mut progress =
            move |waited: Duration| report(waited.as_secs_f64(), "waiting for a person's decision");
        let wait = self.gate.wait(&who, &id, timeout, &mut progress);
        let request = tokio::select! {
            result = wait => result?,
            _ = ctx.ct.cancelled() => {
                // Nobody waits for it any more: withdraw it, so it cannot be approved
                // for an agent that has moved on. A decision that won the race stands.
                let _ = self.gate.cancel(&who, &id).await;
                return Err(GateError::BadInput(format!(
                    "the client cancelled the call; request {id} was withdrawn"
                ))
                .into());
            }
        };
        Ok(Json(ApprovalView::new(&request)))
    }
}
