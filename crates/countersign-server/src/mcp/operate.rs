//! The approval-gate profile's process tools (approval-gate-mcp's `process_status`,
//! `process_logs`, `restart_process`, `run_command`, `list_params`, `set_param`,
//! `clear_param`, and each `[[probe]]` by its name): thin wrappers over
//! [`Operations`], called as the authenticated operator. A change is that person's
//! approval request: the tool waits a bounded time for another person's (or a policy's)
//! decision, with progress notifications, and answers done, pending (who decides and how
//! to check back) or refused. The rules live in `operate/`; this file only speaks MCP.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::evidence::OutcomeStatus;
use countersign_core::{ApprovalRequest, AuthorizationType, Principal, Status};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ToolError;
use super::approval_gate::{ApprovalGateService, Shown};
use crate::error::GateError;
use crate::operate::{
    DetachedHold, Operation, Operations, ParamsList, Performed, ProbeOutput, ProcessStatus,
    REFUSAL_SHOWN,
};
use crate::views::OperationView;

/// How long a change waits for its decision unless the caller says (as
/// wait_for_approval), and at most.
const DEFAULT_WAIT_SECONDS: u64 = 45;
const MAX_WAIT_SECONDS: u64 = 300;
const DEFAULT_LOG_LINES: usize = 50;
/// The session every call of the profile asks in: the same change asked again by the
/// same person, over stdio or HTTP, joins the request still open.
const SESSION: &str = "mcp:approval-gate";
/// Tools whose names a `[[probe]]` may not take.
pub const TOOL_NAMES: &[&str] = &[
    "list_pending_approvals",
    "approve",
    "reject",
    "record_summary",
    "record_dashboard",
    "process_status",
    "process_logs",
    "restart_process",
    "run_command",
    "list_params",
    "set_param",
    "clear_param",
];

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessInput {
    /// Which [[process]] (needed only when several are configured).
    #[serde(default)]
    pub process: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogsInput {
    /// How many of the last lines (default 50, at most 10000).
    #[serde(default)]
    pub lines: Option<usize>,
    /// Which [[process]] (needed only when several are configured).
    #[serde(default)]
    pub process: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartInput {
    /// Which [[process]] (needed only when several are configured).
    #[serde(default)]
    pub process: Option<String>,
    /// Seconds to wait for the decision (default 45, at most 300); the request stays
    /// open after, and calling again joins it.
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunInput {
    /// The shell command, run by sh in the process's directory on its host.
    pub cmd: String,
    /// Which [[process]] (needed only when several are configured).
    #[serde(default)]
    pub process: Option<String>,
    /// Seconds to wait for the decision (default 45, at most 300).
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetParamInput {
    /// A parameter the manifest declares.
    pub name: String,
    /// Its new value, coerced to the declared type ("30" is the int 30; "yes" is true).
    pub value: Value,
    /// Seconds to wait for the decision (default 45, at most 300).
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearParamInput {
    /// The parameter whose override to remove, or "all" for every override.
    pub name: String,
    /// Seconds to wait for the decision (default 45, at most 300).
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogsAnswer {
    pub process: String,
    pub lines: usize,
    pub log: String,
}

#[tool_router(router = process_router, vis = "pub(crate)")]
impl ApprovalGateService {
    #[tool(
        description = "Is the process running: PID, uptime, CPU, memory, the disk its directory takes, and the last log line.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn process_status(
        &self,
        Parameters(input): Parameters<ProcessInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<ProcessStatus>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let process = one_process(&ops, input.process)?;
        let status = ops.status(&who, &process).await?;
        Ok(Shown {
            text: status.render(),
            value: status,
        })
    }

    #[tool(
        description = "The last `lines` lines of the process's log file (default 50).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn process_logs(
        &self,
        Parameters(input): Parameters<LogsInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<LogsAnswer>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let process = one_process(&ops, input.process)?;
        let lines = input.lines.unwrap_or(DEFAULT_LOG_LINES);
        let log = ops.logs(&who, &process, lines).await?;
        Ok(Shown {
            text: log.clone(),
            value: LogsAnswer {
                process,
                lines,
                log,
            },
        })
    }

    #[tool(
        description = "Restart the process with its start command, detached so that it survives the session. Gated: this is your approval request, decided by another approver (not you) or a policy; the call waits up to wait_seconds, then says whether it was done, is still pending (call again with the same arguments to join the request) or was refused. It runs once.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn restart_process(
        &self,
        Parameters(input): Parameters<RestartInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<OperationView>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let process = one_process(&ops, input.process)?;
        let op = Operation::Restart { process };
        perform(ops, &who, op, "restart_process", input.wait_seconds, &ctx).await
    }

    #[tool(
        description = "Run a one-off shell command in the process's directory on its host (the escape hatch for a check). Gated: your approval request, decided by another approver (not you) or a policy; the call waits up to wait_seconds, then answers done (exit code and output), pending (call again with the same arguments to join the request) or refused. It runs once.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_command(
        &self,
        Parameters(input): Parameters<RunInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<OperationView>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let process = one_process(&ops, input.process)?;
        let op = Operation::Run {
            process,
            command: input.cmd,
        };
        perform(ops, &who, op, "run_command", input.wait_seconds, &ctx).await
    }
}

#[tool_router(router = params_router, vis = "pub(crate)")]
impl ApprovalGateService {
    #[tool(
        description = "What this deployment declares tunable (name, type, description, bounds) and what is overridden now.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_params(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<ParamsList>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let list = ops.list_params(&who).await?;
        Ok(Shown {
            text: list.render(),
            value: list,
        })
    }

    #[tool(
        description = "Override one parameter, validated against the manifest (a value it refuses is refused at once, nothing asked). Gated: your approval request, decided by another approver (not you) or a policy; the call waits up to wait_seconds, then answers done (the value before and after), pending (call again to join the request) or refused.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn set_param(
        &self,
        Parameters(input): Parameters<SetParamInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<OperationView>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let op = Operation::SetParam {
            name: input.name,
            value: input.value,
        };
        perform(ops, &who, op, "set_param", input.wait_seconds, &ctx).await
    }

    #[tool(
        description = "Remove one parameter override (name), or every one (name \"all\"), so the process uses its default. Gated like set_param.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn clear_param(
        &self,
        Parameters(input): Parameters<ClearParamInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<OperationView>, ToolError> {
        let (ops, who) = self.operations(&ctx).await?;
        let name = (input.name != "all").then_some(input.name);
        let op = Operation::ClearParam { name };
        perform(ops, &who, op, "clear_param", input.wait_seconds, &ctx).await
    }
}

impl ApprovalGateService {
    /// The operations and the caller, who must be an operator.
    async fn operations(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(Arc<Operations>, Principal), GateError> {
        let decider = self.operator(ctx).await?;
        let ops = self.ops.clone().ok_or_else(|| {
            GateError::NotFound(
                "process operations: no [[process]], [params] or [[probe]] is configured".into(),
            )
        })?;
        Ok((ops, decider.principal().clone()))
    }

    /// Runs the probe `name` as the caller.
    pub(super) async fn call_probe(
        &self,
        name: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Shown<ProbeOutput>, ToolError> {
        let (ops, who) = self.operations(ctx).await?;
        let out = ops.probe(&who, name).await?;
        Ok(Shown {
            text: render_probe(&out),
            value: out,
        })
    }
}

/// Each configured probe as a tool of its own name, taking no arguments.
pub(super) fn probe_tools(ops: &Operations) -> Vec<Tool> {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), "object".into());
    schema.insert("properties".into(), Value::Object(Default::default()));
    schema.insert("additionalProperties".into(), false.into());
    let schema = Arc::new(schema);
    ops.config()
        .probes
        .iter()
        .map(|p| {
            let description = if p.description.is_empty() {
                format!("Run the read-only probe {} and return its output.", p.name)
            } else {
                format!("{} (a read-only probe; returns its output)", p.description)
            };
            Tool::new(p.name.clone(), description, schema.clone())
                .with_annotations(ToolAnnotations::new().read_only(true).with_open_world(true))
        })
        .collect()
}

trait OpenWorld {
    fn with_open_world(self, open: bool) -> Self;
}

impl OpenWorld for ToolAnnotations {
    fn with_open_world(mut self, open: bool) -> Self {
        self.open_world_hint = Some(open);
        self
    }
}

/// The process a call means: the one it names, or the only one configured.
fn one_process(ops: &Operations, named: Option<String>) -> Result<String, GateError> {
    if let Some(name) = named {
        return Ok(name);
    }
    match ops.processes().as_slice() {
        [only] => Ok((*only).to_string()),
        [] => Err(GateError::NotFound(
            "process operations: no [[process]] is configured".into(),
        )),
        several => Err(GateError::BadInput(format!(
            "process: several processes are configured ({}); say which",
            several.join(", ")
        ))),
    }
}

/// Asks for `op`, waits for the decision (reporting progress), carries it out once if
/// approved, and says where it stands.
async fn perform(
    ops: Arc<Operations>,
    who: &Principal,
    op: Operation,
    tool: &str,
    wait_seconds: Option<u64>,
    ctx: &RequestContext<RoleServer>,
) -> Result<Shown<OperationView>, ToolError> {
    let seconds = wait_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
    if seconds > MAX_WAIT_SECONDS {
        return Err(GateError::BadInput(format!(
            "wait_seconds: give at most {MAX_WAIT_SECONDS} (the request stays open after; call again to join it)"
        ))
        .into());
    }
    let mut report = super::progress_reporter(ctx, seconds as f64);
    let waiting = move |request: &ApprovalRequest| {
        report(
            0.0,
            &format!(
                "request {} waits for another approver's decision",
                request.id
            ),
        );
    };
    let mut report = super::progress_reporter(ctx, seconds as f64);
    let progress = move |waited: Duration| {
        report(
            waited.as_secs_f64(),
            "waiting for another approver's decision",
        )
    };
    let hold = DetachedHold {
        time: Duration::from_secs(seconds),
        waiting: Box::new(waiting),
        progress: Box::new(progress),
        cancel: ctx.ct.clone(),
    };
    let performed = ops.perform_detached(who.clone(), op, SESSION, hold).await?;
    Ok(answer(performed, tool))
}

fn answer(performed: Performed, tool: &str) -> Shown<OperationView> {
    match performed {
        Performed::Done { request, executed } => {
            let how = decided_by(&request);
            let headline = match executed.status {
                OutcomeStatus::Succeeded => "Done",
                _ => "Ran once, and it failed",
            };
            let mut text = format!(
                "{headline}: {}\n\n  Request:  {}\n  Approved: {how}\n  Result:   {}\n",
                request.action.description, request.id, executed.summary
            );
            if let Some(before) = &executed.before {
                let after = executed.after.clone().unwrap_or(Value::Null);
                text.push_str(&format!(
                    "  Before:   {}\n  After:    {}\n",
                    unset(before),
                    unset(&after)
                ));
            }
            if let Some(output) = executed.output.as_deref().filter(|o| !o.is_empty()) {
                text.push_str(&format!("\n{output}"));
                if !output.ends_with('\n') {
                    text.push('\n');
                }
            }
            Shown {
                text,
                value: OperationView::new(&Performed::Done { request, executed }),
            }
        }
        Performed::Pending { request } => {
            let text = format!(
                "Waiting for a decision: {}\n\n  Request:  {}\n  Status:   pending (nothing has run)\n  Decides:  another approver, not you (a requester may not approve their own request), or a policy that allows it\n            from the dashboard, Slack, email or `countersign approve {}`\n  Expires:  {}\n\nCall {tool} again with the same arguments to check back: it joins this request (it does not ask twice) and, once the request is approved, carries it out, once. Nothing runs until you call again.",
                request.action.description, request.id, request.id, request.expires_at
            );
            Shown {
                text,
                value: OperationView::new(&Performed::Pending { request }),
            }
        }
        Performed::Refused { request, reason } => {
            let mut text = format!(
                "Refused: {}\n\n  Request:  {}\n  Reason:   {reason}\n",
                request.action.description, request.id
            );
            if request.status != Status::Approved {
                text.push_str(&format!(
                    "\nNothing ran. Asking again within {} minutes of the decision gives this answer; after that it is a new request.\n",
                    REFUSAL_SHOWN.as_secs() / 60
                ));
            }
            Shown {
                text,
                value: OperationView::new(&Performed::Refused { request, reason }),
            }
        }
    }
}

/// Who approved: the people, or the policy or grant.
fn decided_by(request: &ApprovalRequest) -> String {
    let Some(decision) = &request.decision else {
        return "-".into();
    };
    match decision.authorization_type {
        AuthorizationType::Human => decision
            .approvers
            .iter()
            .map(|a| a.display_name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        other => {
            let kind = match other {
                AuthorizationType::Policy => "policy",
                AuthorizationType::Fallback => "fallback",
                _ => "grant",
            };
            match &decision.policy {
                Some(policy) => format!("by {kind} {}", policy.id),
                None => format!("by {kind}"),
            }
        }
    }
}

fn unset(value: &Value) -> String {
    if value.is_null() {
        "unset".into()
    } else {
        value.to_string()
    }
}

fn render_probe(out: &ProbeOutput) -> String {
    let mut text = out.output.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if out.truncated {
        text.push_str("[output cut at the probe's max_output_bytes]\n");
    }
    if out.timed_out {
        text.push_str("[the probe timed out and was stopped]\n");
    } else if out.exit_code != Some(0) {
        let code = out
            .exit_code
            .map_or_else(|| "a signal".to_string(), |c| format!("exit {c}"));
        text.push_str(&format!("[the probe failed: {code}]\n"));
    }
    text
}
