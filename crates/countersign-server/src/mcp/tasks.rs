//! MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663): for a client
//! that declares it, `request_approval` answers at once with a task, and the client
//! polls `tasks/get` until a person decides, however long that takes: no tool call is
//! held open, and no client timeout is in the way. `tasks/cancel` withdraws the request.
//!
//! The task *is* the approval request: its id is the request's id and its state the
//! request's, read from the store on every `tasks/get`. Nothing about a task lives in a
//! process's memory, so consecutive calls may land on different instances (several
//! `serve`s on PostgreSQL) and a restart loses nothing. A task is visible to whoever may
//! see its request (its requester, and people who decide), like `check_approval`.
//!
//! States: a pending request is `working`; a decided, timed-out or expired one is
//! `completed`, its result what `check_approval` returns (a rejection is an answer, not a
//! failure of the task); a withdrawn one is `cancelled`.

use countersign_core::{ApprovalRequest, Status};
use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask,
    GetTaskResult, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;

use super::McpService;
use crate::error::{ErrorKind, GateError};
use crate::views::{ApprovalView, RequestApprovalInput};

/// How often a client should poll, in milliseconds (a person decides in seconds at the
/// fastest; the dashboard's own updates are pushed, not polled).
const POLL_INTERVAL_MS: u64 = 1_000;

/// Whether the client behind `ctx` declared the tasks extension (in this request's
/// `_meta`, or at `initialize` for a session).
pub(super) fn wants_task(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// A gate error as the JSON-RPC error of a task method.
fn rpc_error(err: GateError) -> ErrorData {
    let message = format!("{}: {}", err.code(), err.public_message());
    match err.kind() {
        ErrorKind::Internal | ErrorKind::Unavailable => ErrorData::internal_error(message, None),
        _ => ErrorData::invalid_params(message, None),
    }
}

/// The task state of `request`.
fn task(request: &ApprovalRequest) -> Task {
    let updated = request
        .decision
        .as_ref()
        .map_or(request.requested_at, |d| d.decided_at);
    let (status, message) = match request.status {
        Status::Pending => (TaskStatus::Working, "waiting for a person's decision"),
        Status::Cancelled => (TaskStatus::Cancelled, "the request was withdrawn"),
        _ => (TaskStatus::Completed, "decided: tasks/get has the result"),
    };
    Task::new(
        request.id.clone(),
        status,
        request.requested_at.to_string(),
        updated.to_string(),
    )
    .with_status_message(message)
    .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// `tasks/get`'s answer for `request`: for a completed task, the tool result
/// `check_approval` would give.
fn detailed(request: &ApprovalRequest) -> Result<DetailedTask, ErrorData> {
    let task = task(request);
    let payload = match task.status {
        TaskStatus::Working => TaskPayload::Working,
        TaskStatus::Cancelled => TaskPayload::Cancelled,
        _ => {
            let view = serde_json::to_value(ApprovalView::new(request))
                .map_err(|e| ErrorData::internal_error(format!("encode the result: {e}"), None))?;
            let result = serde_json::to_value(CallToolResult::structured(view))
                .map_err(|e| ErrorData::internal_error(format!("encode the result: {e}"), None))?;
            let serde_json::Value::Object(result) = result else {
                return Err(ErrorData::internal_error(
                    "a tool result is an object",
                    None,
                ));
            };
            TaskPayload::Completed { result }
        }
    };
    Ok(DetailedTask::new(task, payload))
}

impl McpService {
    /// `request_approval` as a task: the request is made (its id is the task's id) and
    /// the task returned at once. In the chatroom profile, its timeout rules apply.
    pub(super) async fn request_as_task(
        &self,
        params: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let who = self.caller(&ctx).map_err(|e| rpc_error(e.0))?;
        let arguments = params.arguments.unwrap_or_default();
        let input: RequestApprovalInput =
            serde_json::from_value(serde_json::Value::Object(arguments))
                .map_err(|e| ErrorData::invalid_params(format!("request_approval: {e}"), None))?;
        let input = if self.blocking_requests {
            super::chatroom::timeout_checked(input).map_err(rpc_error)?
        } else {
            input
        };
        let quorum = input.quorum();
        let requested = self
            .gate
            .request_approval_with(&who, input.into(), quorum)
            .await
            .map_err(rpc_error)?;
        Ok(CallToolResponse::Task(CreateTaskResult::new(task(
            &requested.request,
        ))))
    }

    /// `tasks/get`: the request's state now, from the store.
    pub(super) async fn task_state(
        &self,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let who = self.caller(ctx).map_err(|e| rpc_error(e.0))?;
        let request = self.gate.get(&who, id).await.map_err(|e| match e {
            GateError::NotFound(_) => {
                ErrorData::invalid_params(format!("there is no task {id}"), None)
            }
            other => rpc_error(other),
        })?;
        Ok(GetTaskResult::new(detailed(&request)?))
    }

    /// `tasks/cancel`: withdraws the request, if it is still pending. A decision made
    /// first stands (the task then completes with it).
    pub(super) async fn cancel_task_of(
        &self,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let who = self.caller(ctx).map_err(|e| rpc_error(e.0))?;
        match self.gate.cancel(&who, id).await {
            Ok(_) => Ok(()),
            Err(GateError::NotFound(_)) => Err(ErrorData::invalid_params(
                format!("there is no task {id}"),
                None,
            )),
            // Already decided: cancellation is cooperative, and the decision won.
            Err(err) if matches!(err.kind(), ErrorKind::AlreadyDecided | ErrorKind::Expired) => {
                Ok(())
            }
            Err(err) => Err(rpc_error(err)),
        }
    }
}
