//! A remote gateway's REST routes, under `/api/v1/gateway` (docs/api.md): the held-call
//! flow of [`crate::held`] for a `countersign proxy`, `hook` or `exec` that runs next to
//! the agent and asks this server. Every route needs the `gateway` scope, which a token
//! has only when it is created with it: an agent's own token cannot pass its calls off
//! as a gateway's.

use std::time::Duration;

use axum::Json;

use super::auth::Caller;
use super::error::{ApiError, ApiJson, ApiPath};
use crate::gate::Gated;
use crate::held::{CallBody, ClaimBody, ForwardedBody, Ruling, SweepBody, Swept};
use crate::views::ApprovalView;

/// Classifies a call: `{"result": "pass"}`, or `{"result": "held", "request": ...}` with
/// the request that holds it (new, or the one a retry joins), in whatever state it is.
pub(super) async fn call(
    Caller { gate, who, .. }: Caller,
    ApiJson(body): ApiJson<CallBody>,
) -> Result<Json<Ruling>, ApiError> {
    let call = body.into_call()?;
    Ok(Json(match gate.gateway_call(&who, &call).await? {
        Gated::Pass => Ruling::Pass,
        Gated::Held { request, claimed } => Ruling::Held {
            request: Box::new(ApprovalView::new(&request)),
            claimed,
        },
    }))
}

/// Claims the approved call for its one forward (a second claim is refused).
pub(super) async fn claim(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ClaimBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    if body.instance.is_empty() || body.instance.len() > 200 {
        return Err(
            crate::error::GateError::BadInput("instance: give 1 to 200 characters".into()).into(),
        );
    }
    let request = gate.get(&who, &id).await?;
    let claimed = gate.claim_forward(&who, &request, &body.instance).await?;
    Ok(Json(ApprovalView::new(&claimed)))
}

/// Records what the forward gave.
pub(super) async fn outcome(
    Caller { gate, who, .. }: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForwardedBody>,
) -> Result<Json<ApprovalView>, ApiError> {
    let request = gate.forwarded(&who, &id, body.status, body.summary).await?;
    Ok(Json(ApprovalView::new(&request)))
}

/// Records `unknown` for the caller's forwards to an upstream that an earlier gateway
/// claimed and left without an outcome.
pub(super) async fn sweep(
    Caller { gate, who, .. }: Caller,
    ApiJson(body): ApiJson<SweepBody>,
) -> Result<Json<Swept>, ApiError> {
    let older_than = Duration::from_secs(body.older_than_seconds.max(1));
    let swept = gate.sweep_unknown(&who, &body.upstream, older_than).await?;
    Ok(Json(Swept { swept }))
}
