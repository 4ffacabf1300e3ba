//! `/api/v1/operate`: the process operations, parameters and probes over REST, for
//! `countersign process|params|probe --server URL --token-file FILE` and any client
//! (docs/api.md). Approvers and admins (the `decide` scope), as in the approval-gate
//! profile; a change is the caller's own request, waited for up to `hold_seconds`,
//! answered `done`, `pending` or `refused`. The rules are `operate/`'s.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::auth::Approver;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery};
use crate::error::GateError;
use crate::operate::{
    DetachedHold, Operation, Operations, ParamsList, ProbeInfo, ProbeOutput, ProcessStatus,
};
use crate::views::OperationView;

/// How long a change waits for its decision unless told, and at most (the client asks
/// again to go on waiting: the same change joins the same request).
const DEFAULT_HOLD_SECONDS: u64 = 45;
pub const MAX_HOLD_SECONDS: u64 = 300;
/// The session REST asks in: the same change asked again by the same token joins.
const SESSION: &str = "api";

fn operations(state: &AppState) -> Result<Arc<Operations>, GateError> {
    state.operations.clone().ok_or_else(|| {
        GateError::NotFound(
            "process operations: this server has no [[process]], [params] or [[probe]] configured"
                .into(),
        )
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogsParams {
    lines: Option<usize>,
}

#[derive(Debug, Serialize)]
pub(super) struct LogsView {
    process: String,
    lines: usize,
    log: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HoldBody {
    #[serde(default)]
    hold_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunBody {
    cmd: String,
    #[serde(default)]
    hold_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetBody {
    name: String,
    value: Value,
    #[serde(default)]
    hold_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClearBody {
    /// One override, or (absent) every one: then `all` must be true.
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    hold_seconds: Option<u64>,
}

pub(super) async fn status(
    State(state): State<AppState>,
    Approver { decider, .. }: Approver,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ProcessStatus>, ApiError> {
    let ops = operations(&state)?;
    Ok(Json(ops.status(decider.principal(), &name).await?))
}

pub(super) async fn logs(
    State(state): State<AppState>,
    Approver { decider, .. }: Approver,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<LogsParams>,
) -> Result<Json<LogsView>, ApiError> {
    let ops = operations(&state)?;
    let lines = params.lines.unwrap_or(50);
    let log = ops.logs(decider.principal(), &name, lines).await?;
    Ok(Json(LogsView {
        process: name,
        lines,
        log,
    }))
}

pub(super) async fn restart(
    State(state): State<AppState>,
    approver: Approver,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<HoldBody>,
) -> Result<Json<OperationView>, ApiError> {
    let op = Operation::Restart { process: name };
    perform(&state, approver, op, body.hold_seconds).await
}

pub(super) async fn run(
    State(state): State<AppState>,
    approver: Approver,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<RunBody>,
) -> Result<Json<OperationView>, ApiError> {
    let op = Operation::Run {
        process: name,
        command: body.cmd,
    };
    perform(&state, approver, op, body.hold_seconds).await
}

pub(super) async fn list_params(
    State(state): State<AppState>,
    Approver { decider, .. }: Approver,
) -> Result<Json<ParamsList>, ApiError> {
    let ops = operations(&state)?;
    Ok(Json(ops.list_params(decider.principal()).await?))
}

pub(super) async fn set_param(
    State(state): State<AppState>,
    approver: Approver,
    ApiJson(body): ApiJson<SetBody>,
) -> Result<Json<OperationView>, ApiError> {
    let op = Operation::SetParam {
        name: body.name,
        value: body.value,
    };
    perform(&state, approver, op, body.hold_seconds).await
}

pub(super) async fn clear_params(
    State(state): State<AppState>,
    approver: Approver,
    ApiJson(body): ApiJson<ClearBody>,
) -> Result<Json<OperationView>, ApiError> {
    let name = match (body.name, body.all) {
        (Some(name), false) => Some(name),
        (None, true) => None,
        _ => {
            return Err(GateError::BadInput(
                "give name (one override) or all: true (every one), not both".into(),
            )
            .into());
        }
    };
    perform(
        &state,
        approver,
        Operation::ClearParam { name },
        body.hold_seconds,
    )
    .await
}

pub(super) async fn probes(
    State(state): State<AppState>,
    Approver { decider, .. }: Approver,
) -> Result<Json<Vec<ProbeInfo>>, ApiError> {
    let ops = operations(&state)?;
    Ok(Json(ops.probes(decider.principal())?))
}

/// A POST: it runs a command (read-only by configuration, but never on a GET).
pub(super) async fn probe(
    State(state): State<AppState>,
    Approver { decider, .. }: Approver,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ProbeOutput>, ApiError> {
    let ops = operations(&state)?;
    Ok(Json(ops.probe(decider.principal(), &name).await?))
}

async fn perform(
    state: &AppState,
    Approver { decider, .. }: Approver,
    op: Operation,
    hold_seconds: Option<u64>,
) -> Result<Json<OperationView>, ApiError> {
    let ops = operations(state)?;
    let seconds = hold_seconds.unwrap_or(DEFAULT_HOLD_SECONDS);
    if seconds > MAX_HOLD_SECONDS {
        return Err(GateError::BadInput(format!(
            "hold_seconds: give at most {MAX_HOLD_SECONDS} (the request stays open; ask again to join it)"
        ))
        .into());
    }
    let hold = DetachedHold {
        time: Duration::from_secs(seconds),
        waiting: Box::new(|_| {}),
        progress: Box::new(|_| {}),
        cancel: CancellationToken::new(),
    };
    let performed = ops
        .perform_detached(decider.principal().clone(), op, SESSION, hold)
        .await?;
    Ok(Json(OperationView::new(&performed)))
}
